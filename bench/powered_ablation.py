r"""The powered, paired ablation (first stage): GRPO against our vocabulary form and its no-skills
control, on the demo's work, 8 seeds an arm, each arm at the learning rate its own search chose,
the final policies measured on two held-out panels.

    nohup .venv/bin/python bench/powered_ablation.py run > runs/powered/run.log 2>&1 &
    .venv/bin/python bench/powered_ablation.py status      # how far it got, what it cost
    .venv/bin/python bench/powered_ablation.py plan        # every command, in order, run nothing
    .venv/bin/python bench/powered_ablation.py report      # docs/results/powered/: tables, CSVs

Fixed before any run (docs/results.md states the same):
* Arms: `grpo`, `sdar_vocab` (ours: the gated forward KL from the frozen warm-started teacher
  given the skills) and `sdar_vocab_noskills` (the same with `env.skills.strategy=none`: the
  teacher sees no skills, so only the pull toward the frozen policy is left).
* Budget: the demo's (configs/default.py: 16 iterations x 2 tasks x 8 episodes, validation on the
  64 valid_seen games every 8 iterations), the same for every arm; only the algorithm, the
  learning rate and the seed differ.
* Learning rate: each arm trains at 2.5e-4, 5e-4 and 1e-3 on seeds 0 and 1; the rate with the
  highest mean final valid_seen success over those two seeds is chosen (a tie: the higher mean
  area under the valid_seen curve, then the demo's 5e-4). Only valid_seen decides. Seeds 2-7 then
  run at the chosen rate; seeds 0 and 1 at that rate are reused.
* Held-out panels: each final policy of the chosen rate (seeds 0-7) is evaluated by
  `python -m sdar_jax.evaluate` on `heldout_seen` (128 fresh games of the valid_seen distribution,
  generator seed 1) and `heldout_unseen` (128 games in scenes no train game uses, seed 1), with
  the same sampling keys for every arm (eval.seed 0); so is the warm-started policy, once.
* Primary comparison: final held-out success of `sdar_vocab` against `grpo`, paired over seeds and
  games. Secondary: `sdar_vocab_noskills` against `grpo` and against `sdar_vocab`.

The report (`report`): per arm, the final held-out success on both panels and the area under the
valid_seen curve (mean and sample standard deviation over seeds), the warm-started policy's
held-out success, and each comparison's paired difference (over the seeds both arms finished and
the games of the panel) with its interval from the two-way bootstrap of sdar_jax.observe.stats;
the intervals are Holm-corrected across every comparison shown (each drawn at Holm's step-down
level for the rank of its bootstrap p-value). Written to --dest (default docs/results/powered):
report.md, summary.csv, curves.png and each run's per-game outcome CSVs, config and metrics; it
refuses to replace a report holding more finished seeds unless --overwrite.

How it runs: one process after another, each under `nice -n 19` (the lowest CPU priority: it
yields to anything else on the machine); resumable at any point, per arm, rate and seed (a
finished run or evaluation is skipped, an interrupted training resumes from its checkpoint).
Stop it before a test run (`kill <pid>`: the running step stops with it). Its state is the run
folders under --out (default runs/powered) and <out>/chosen_rates.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

import numpy as np  # noqa: E402

from sdar_jax.observe import collect, compare, stats, transcripts  # noqa: E402

CONFIG = "configs/default.py"
# arm -> (algo preset, extra overrides)
ARMS: dict[str, tuple[str, tuple[str, ...]]] = {
  "grpo": ("grpo", ()),
  "sdar_vocab": ("sdar_vocab", ()),
  "sdar_vocab_noskills": ("sdar_vocab", ("env.skills.strategy=none",)),
}
RATES = (2.5e-4, 5e-4, 1e-3)
DEFAULT_RATE = 5e-4
SEARCH_SEEDS = (0, 1)
SEEDS = tuple(range(8))
HELDOUT = (
  "eval.split=heldout_seen",
  "eval.splits=heldout_unseen",
  "eval.num_tasks=-1",
  "env.offline.num_heldout=128",
  "env.offline.heldout_seed=1",
)
HELDOUT_DIR = "heldout"  # <run>/heldout: the evaluation's results
NICE = ("nice", "-n", "19")


def rate_name(rate: float) -> str:
  return f"lr{rate:.1e}"


@dataclasses.dataclass(frozen=True)
class Step:
  """One process of the plan: a training run or a held-out evaluation."""

  kind: str  # "train" | "heldout"
  arm: str
  rate: float | None
  seed: int | None
  workdir: str  # the run folder (for "heldout", the run evaluated)
  command: tuple[str, ...]

  @property
  def label(self) -> str:
    what = "initial policy" if self.arm == "initial" else f"{self.arm} {rate_name(self.rate)}"
    seed = "" if self.seed is None else f" seed {self.seed}"
    return f"{self.kind} {what}{seed}"

  @property
  def results(self) -> str:
    """Where the step's results go (its done marker lives there)."""
    return self.workdir if self.kind == "train" else os.path.join(self.workdir, HELDOUT_DIR)


def run_dir(out: str, arm: str, rate: float, seed: int) -> str:
  return os.path.join(out, arm, rate_name(rate), f"seed{seed}")


def _overrides(arm: str, rate: float, seed: int) -> list[str]:
  _, extra = ARMS[arm]
  return [f"optim.lr={rate}", f"train.seed={seed}", *extra]


def _command(module: str, arm: str, overrides: Sequence[str], python: str) -> tuple[str, ...]:
  algo = ARMS[arm][0] if arm in ARMS else "grpo"
  return (
    *NICE,
    python,
    "-m",
    module,
    f"--config={CONFIG}:algo={algo}",
    *(f"--config.{kv}" for kv in overrides),
  )


def train_step(out: str, arm: str, rate: float, seed: int, python: str) -> Step:
  workdir = run_dir(out, arm, rate, seed)
  cmd = _command("sdar_jax.train", arm, _overrides(arm, rate, seed), python)
  return Step("train", arm, rate, seed, workdir, (*cmd, f"--workdir={workdir}"))


def heldout_step(out: str, arm: str, rate: float, seed: int, python: str) -> Step:
  workdir = run_dir(out, arm, rate, seed)
  cmd = _command("sdar_jax.evaluate", arm, [*_overrides(arm, rate, seed), *HELDOUT], python)
  results = os.path.join(workdir, HELDOUT_DIR)
  return Step(
    "heldout", arm, rate, seed, workdir, (*cmd, f"--workdir={workdir}", f"--output={results}")
  )


def initial_step(out: str, python: str) -> Step:
  """The warm-started policy (every arm's start) on the held-out panels."""
  workdir = os.path.join(out, "initial")
  cmd = _command("sdar_jax.evaluate", "initial", HELDOUT, python)
  return Step(
    "heldout",
    "initial",
    None,
    None,
    workdir,
    (*cmd, f"--workdir={workdir}", f"--output={os.path.join(workdir, HELDOUT_DIR)}"),
  )


def final_success(run: str) -> tuple[float, float] | None:
  """(final valid_seen success, AUC of the valid_seen curve) of a finished run, else None."""
  if collect.run_state(run) != "finished":
    return None
  record = collect.read_run(run)
  if record.final_success is None:
    return None
  return float(record.final_success), float(record.auc)


def choose_rate(results: dict[float, list[tuple[float, float]]]) -> float:
  """The rule fixed before any run: the highest mean final valid_seen success over the search
  seeds; a tie, the higher mean AUC; then the demo's rate. `results`: rate -> [(final, auc)]."""

  def key(rate: float) -> tuple[float, float, bool]:
    rows = np.asarray(results[rate], np.float64)
    return (
      round(float(rows[:, 0].mean()), 9),
      round(float(rows[:, 1].mean()), 9),
      rate == DEFAULT_RATE,
    )

  return max(sorted(results), key=key)


def chosen_rates(out: str, arms: Sequence[str] = tuple(ARMS)) -> dict[str, float]:
  """Each arm whose search runs all finished -> its chosen rate (also written to
  <out>/chosen_rates.json with the figures that chose it)."""
  chosen, record = {}, {}
  for arm in arms:
    results = {}
    for rate in RATES:
      finals = [final_success(run_dir(out, arm, rate, s)) for s in SEARCH_SEEDS]
      if any(f is None for f in finals):
        break
      results[rate] = finals
    else:
      chosen[arm] = choose_rate(results)
      record[arm] = {
        "chosen": chosen[arm],
        "search": {
          rate_name(r): {"final": [f for f, _ in v], "auc": [a for _, a in v]}
          for r, v in results.items()
        },
      }
  if record:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "chosen_rates.json"), "w") as f:
      json.dump(record, f, indent=1)
  return chosen


def plan(out: str, python: str = sys.executable, arms: Sequence[str] = tuple(ARMS)) -> list[Step]:
  """Every step in order, as far as it is known now: the search (arm-major: every rate and search
  seed of an arm), the initial policy's held-out evaluation, then seed by seed every arm whose
  rate is chosen (so the arms stay paired as the seeds complete), each run followed by its
  held-out evaluation. Call again after steps finish: a chosen rate adds its steps."""
  steps = [train_step(out, a, r, s, python) for a in arms for r in RATES for s in SEARCH_SEEDS]
  steps.append(initial_step(out, python))
  chosen = chosen_rates(out, arms)
  for seed in SEEDS:
    for arm in arms:
      if arm in chosen:
        rate = chosen[arm]
        if seed not in SEARCH_SEEDS:
          steps.append(train_step(out, arm, rate, seed, python))
        steps.append(heldout_step(out, arm, rate, seed, python))
  return steps


def step_done(step: Step) -> bool:
  if step.kind == "train":
    return collect.run_state(step.workdir) == "finished"
  return os.path.isfile(os.path.join(step.results, "evaluation.json"))


def _clock(seconds: float) -> str:
  seconds = round(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def run(
  out: str,
  python: str = sys.executable,
  runner: Callable[..., object] | None = None,
  echo: Callable[[str], None] = lambda line: print(line, flush=True),
  max_steps: int | None = None,
) -> int:
  """Plays the plan's steps not yet done, one after another, re-planning after each (a chosen
  rate adds steps); returns the number of failed steps. A step's output goes to its results
  folder's log (train.log / heldout.log), its wall time and attempts to run_status.json."""
  import subprocess

  runner = runner or subprocess.run
  failed: set[str] = set()
  played = 0
  start = time.time()
  while max_steps is None or played < max_steps:
    steps = plan(out, python)
    todo = [s for s in steps if not step_done(s) and s.label not in failed]
    if not todo:
      break
    step, total = todo[0], len(steps)
    echo(
      f"[{total - len(todo) + 1}/{total}+] {step.label}: starting, elapsed "
      f"{_clock(time.time() - start)}; output in {step.results}"
    )
    os.makedirs(step.results, exist_ok=True)
    log = os.path.join(step.results, f"{step.kind}.log")
    code = collect.run_and_record(
      step.command, step.results, cwd=_REPO, log_path=log, runner=runner
    )
    played += 1
    if code:
      failed.add(step.label)
      echo(f"{step.label}: failed with exit code {code}; see {log}")
  echo(f"stopped after {played} step(s) in {_clock(time.time() - start)}; {len(failed)} failed")
  return len(failed)


def status(out: str, python: str = sys.executable) -> str:
  """How far the plan got: steps done of those known, the wall time they cost, the chosen rates."""
  steps = plan(out, python)
  done = [s for s in steps if step_done(s)]
  seconds = 0.0
  for s in done:
    wall = collect.wall_seconds(s.results)
    seconds += wall or 0.0
  lines = [
    f"{len(done)}/{len(steps)} steps done (more are planned once every arm's rate is chosen: "
    f"{len(ARMS) * (len(RATES) * len(SEARCH_SEEDS) + len(SEEDS) * 2 - len(SEARCH_SEEDS)) + 1} in all), "
    f"{seconds / 3600:.2f} h of wall time",
    f"chosen rates: {chosen_rates(out) or 'none yet'}",
  ]
  lines += [f"  next: {s.label}" for s in steps if not step_done(s)][:3]
  return "\n".join(lines)


# ------------------------------------------------------------------------------------ report
# (panel, the evaluation's metric prefix in <run>/heldout: eval.split is heldout_seen)
PANELS = (("heldout_seen", "val"), ("heldout_unseen", "val_heldout_unseen"))
COMPARISONS = (  # A - B; the first is the primary comparison
  ("sdar_vocab", "grpo"),
  ("sdar_vocab_noskills", "grpo"),
  ("sdar_vocab", "sdar_vocab_noskills"),
)
MEASURES = ("final heldout_seen", "final heldout_unseen", "valid_seen AUC")
SUMMARY_COLUMNS = (
  "arm", "rate", "seeds", "heldout_seen", "heldout_seen_sd", "heldout_unseen",
  "heldout_unseen_sd", "valid_seen_final", "valid_seen_auc", "valid_seen_auc_sd", "wall_min",
)  # fmt: skip


def finished_runs(out: str) -> dict[str, dict[int, str]]:
  """arm -> {seed: run folder} of the runs at the arm's chosen rate whose training and held-out
  evaluation both finished."""
  found: dict[str, dict[int, str]] = {}
  for arm, rate in chosen_rates(out).items():
    for seed in SEEDS:
      run = run_dir(out, arm, rate, seed)
      held = heldout_step(out, arm, rate, seed, sys.executable)
      if collect.run_state(run) == "finished" and step_done(held):
        found.setdefault(arm, {})[seed] = run
  return found


def panel_outcomes(folder: str, prefix: str) -> dict[int, float]:
  """{task id: success} of an evaluation folder's outcomes_<prefix>.csv (repeats averaged)."""
  path = os.path.join(folder, f"{transcripts.OUTCOMES_PREFIX}{prefix}.csv")
  if not os.path.isfile(path):
    return {}
  sums: dict[int, list[float]] = {}
  for row in transcripts.read_outcomes(path):
    sums.setdefault(row["task_id"], []).append(float(row["success"]))
  return {task: float(np.mean(v)) for task, v in sums.items()}


def outcome_grids(run: str) -> dict[str, tuple[list[int], np.ndarray] | None]:
  """Per measure of MEASURES: (games, outcomes per game) of one run."""
  out: dict[str, tuple[list[int], np.ndarray] | None] = {}
  for (panel, prefix), measure in zip(PANELS, MEASURES):
    games = panel_outcomes(os.path.join(run, HELDOUT_DIR), prefix)
    out[measure] = (sorted(games), np.array([games[g] for g in sorted(games)])) if games else None
  curves = compare.eval_outcomes(run)  # {step: {task: success}} on valid_seen
  steps = sorted(curves)
  games = sorted(set.intersection(*(set(curves[s]) for s in steps))) if len(steps) >= 2 else []
  if games:
    grid = np.array([[curves[s][g] for g in games] for s in steps])  # [steps, games]
    out[MEASURES[2]] = (games, stats.per_game_auc(steps, grid))
  else:
    out[MEASURES[2]] = None
  return out


def paired_rows(
  runs: dict[str, dict[int, str]], resamples: int = stats.RESAMPLES
) -> list[dict[str, object]]:
  """Every comparison x measure with both arms present: the paired difference on the common
  seeds and games, its bootstrap p, the Holm-corrected level and the interval at that level."""
  grids = {
    arm: {seed: outcome_grids(run) for seed, run in seeds.items()} for arm, seeds in runs.items()
  }
  rows = []
  for a, b in COMPARISONS:
    if a not in grids or b not in grids:
      continue
    seeds = sorted(set(grids[a]) & set(grids[b]))
    for measure in MEASURES:
      have = [s for s in seeds if grids[a][s][measure] and grids[b][s][measure]]
      if not have:
        continue
      games = sorted(
        set.intersection(*(set(grids[arm][s][measure][0]) for arm in (a, b) for s in have))
      )

      def grid(arm, have=have, games=games, measure=measure):
        rows_ = []
        for s in have:
          ids, values = grids[arm][s][measure]
          index = {g: i for i, g in enumerate(ids)}
          rows_.append([values[index[g]] for g in games])
        return np.asarray(rows_, np.float64)

      d = grid(a) - grid(b)
      rows.append(
        {
          "comparison": f"{a} - {b}",
          "measure": measure,
          "seeds": len(have),
          "games": len(games),
          "difference": float(d.mean()),
          "p": stats.bootstrap_p(d, resamples),
          "_d": d,
        }
      )
  adjusted, levels = stats.holm([r["p"] for r in rows])
  for row, p_adj, level in zip(rows, adjusted, levels):
    low, high = stats.bootstrap_interval(row.pop("_d"), resamples, level=level)
    row.update(holm_p=p_adj, level=level, ci_low=low, ci_high=high)
  return rows


def summary_rows(out: str, runs: dict[str, dict[int, str]]) -> list[dict[str, object]]:
  rates = chosen_rates(out)
  rows = []
  for arm in ARMS:
    if arm not in runs:
      continue
    per_seed = [outcome_grids(run) for run in runs[arm].values()]
    records = [collect.read_run(run) for run in runs[arm].values()]

    def ms(measure, per_seed=per_seed):
      values = [float(g[measure][1].mean()) for g in per_seed if g[measure]]
      return collect.mean_std(values)[:2]

    walls = [
      (collect.wall_seconds(run) or 0.0)
      + (collect.wall_seconds(os.path.join(run, HELDOUT_DIR)) or 0.0)
      for run in runs[arm].values()
    ]
    seen, unseen, auc = ms(MEASURES[0]), ms(MEASURES[1]), ms(MEASURES[2])
    rows.append(
      {
        "arm": arm,
        "rate": rates[arm],
        "seeds": len(runs[arm]),
        "heldout_seen": seen[0],
        "heldout_seen_sd": seen[1],
        "heldout_unseen": unseen[0],
        "heldout_unseen_sd": unseen[1],
        "valid_seen_final": collect.mean_std(r.final_success for r in records)[0],
        "valid_seen_auc": auc[0],
        "valid_seen_auc_sd": auc[1],
        "wall_min": float(np.mean(walls)) / 60.0,
      }
    )
  return rows


def export(out: str, runs: dict[str, dict[int, str]], dest: str) -> int:
  """Copies each run's config, metrics and per-game outcome CSVs (valid_seen at every
  evaluation, both held-out panels) under dest/<arm>/seed<k>/; returns the number of files."""
  import shutil

  copied = 0
  initial = os.path.join(out, "initial", HELDOUT_DIR)
  sources = [(initial, os.path.join(dest, "initial"))]
  sources += [
    (run, os.path.join(dest, arm, f"seed{s}"))
    for arm, seeds in runs.items()
    for s, run in seeds.items()
  ]
  for src, dst in sources:
    for pattern in (
      "config.json",
      "metrics.jsonl",
      "eval/step_*/outcomes_*.csv",
      f"{HELDOUT_DIR}/outcomes_*.csv",
      "outcomes_*.csv",
    ):
      for path in glob.glob(os.path.join(src, pattern)):
        target = os.path.join(dst, os.path.relpath(path, src))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(path, target)
        copied += 1
  chosen = os.path.join(out, "chosen_rates.json")
  if os.path.isfile(chosen):
    shutil.copyfile(chosen, os.path.join(dest, "chosen_rates.json"))
  return copied


def plot_curves(runs: dict[str, dict[int, str]], path: str) -> str | None:
  """valid_seen success against the iteration: per arm the mean over seeds, a min-max band
  (bench/ablation.py's figure)."""
  if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import ablation

  arms = [
    ablation.ArmResult(arm, [collect.read_run(r) for r in seeds.values()], sorted(seeds))
    for arm, seeds in runs.items()
  ]
  return ablation.plot_curves(arms, path)


def _f(x: object, digits: int = 3) -> str:
  return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{digits}f}"


def report(out: str, dest: str, overwrite: bool = False, resamples: int = stats.RESAMPLES) -> str:
  """Writes dest/report.md, summary.csv, curves.png and the runs' files; returns report.md."""
  runs = finished_runs(out)
  finished = sum(len(s) for s in runs.values())
  summary_csv = os.path.join(dest, "summary.csv")
  collect.refuse_shrinking_report(
    summary_csv, finished, lambda rows: sum(int(r["seeds"]) for r in rows), out, overwrite
  )
  os.makedirs(dest, exist_ok=True)
  summary = summary_rows(out, runs)
  with open(summary_csv, "w") as f:
    f.write(collect.csv_text(summary, SUMMARY_COLUMNS))
  initial = {
    panel: panel_outcomes(os.path.join(out, "initial", HELDOUT_DIR), prefix)
    for panel, prefix in PANELS
  }
  lines = [
    "# The powered ablation, first stage: report",
    "",
    f"Written by `python bench/powered_ablation.py report` from {finished} finished run(s) "
    f"({', '.join(f'{a}: seeds {sorted(s)}' for a, s in runs.items()) or 'none'}).",
    "",
    "| arm | rate | seeds | held-out seen | held-out unseen | valid_seen final | valid_seen AUC | wall / run (min) |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for r in summary:
    lines.append(
      f"| `{r['arm']}` | {r['rate']:g} | {r['seeds']} | {_f(r['heldout_seen'])} ± {_f(r['heldout_seen_sd'])} "
      f"| {_f(r['heldout_unseen'])} ± {_f(r['heldout_unseen_sd'])} | {_f(r['valid_seen_final'])} "
      f"| {_f(r['valid_seen_auc'])} ± {_f(r['valid_seen_auc_sd'])} | {_f(r['wall_min'], 1)} |"
    )
  if any(initial.values()):
    shown = " / ".join(
      f"{panel} {np.mean(list(v.values())):.3f} ({len(v)} games)"
      for panel, v in initial.items()
      if v
    )
    lines += ["", f"The warm-started policy (every arm's start): {shown}."]
  pairs = paired_rows(runs, resamples)
  if pairs:
    lines += [
      "",
      "Paired differences (A - B) over the seeds both arms finished and the panel's games; "
      f"two-way bootstrap ({resamples} resamples), intervals Holm-corrected across the "
      f"{len(pairs)} comparisons shown (level = Holm's step-down level of the row).",
      "",
      "| comparison | measure | seeds x games | difference | interval | level | p | Holm p |",
      "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in pairs:
      lines.append(
        f"| {r['comparison']} | {r['measure']} | {r['seeds']} x {r['games']} | {r['difference']:+.3f} "
        f"| [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['level']:.4f} | {r['p']:.3g} | {r['holm_p']:.3g} |"
      )
  png = plot_curves(runs, os.path.join(dest, "curves.png"))
  if png:
    lines += ["", "![valid_seen curves](curves.png)"]
  lines += [
    "",
    "Each run's command is in its run_status.json (`command`); `python bench/powered_ablation.py "
    "plan` prints them all. Per-game outcomes: <arm>/seed<k>/eval/step_<N>/outcomes_val.csv "
    "(valid_seen) and <arm>/seed<k>/heldout/outcomes_val.csv, outcomes_val_heldout_unseen.csv.",
  ]
  export(out, runs, dest)
  path = os.path.join(dest, "report.md")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return path


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("action", choices=("run", "status", "plan", "report"))
  parser.add_argument("--out", default="runs/powered", help="the runs' parent folder")
  parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
  parser.add_argument("--dest", default="docs/results/powered", help="where the report goes")
  parser.add_argument(
    "--overwrite", action="store_true", help="replace a report that holds more finished seeds"
  )
  args = parser.parse_args(argv)
  if args.action == "report":
    try:
      print(report(args.out, args.dest, args.overwrite))
    except collect.ReportShrinkError as e:
      print(f"report not written: {e}", file=sys.stderr)
      return 2
    return 0
  if args.action == "plan":
    for step in plan(args.out):
      print(("done  " if step_done(step) else "todo  ") + " ".join(step.command))
    return 0
  if args.action == "status":
    print(status(args.out))
    return 0
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # kill: the running step stops with it
  return 1 if run(args.out, max_steps=args.max_steps) else 0


if __name__ == "__main__":
  sys.exit(main())
