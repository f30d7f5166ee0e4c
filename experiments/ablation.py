r"""The ablation: GRPO vs GRPO+OPSD vs SDAR (and other gates) on the demo setup, several seeds each.

    .venv/bin/python experiments/ablation.py                      # grpo, grpo_opsd, sdar x seeds 0,1,2
    .venv/bin/python experiments/ablation.py --arms grpo,grpo_opsd,sdar,sdar_entropy,sdar_soft_or,skill_grpo
    .venv/bin/python experiments/ablation.py --set train.eval_every=5 --set train.iterations=40
    .venv/bin/python experiments/ablation.py --collect-only       # the table and figure from what ran
    nohup .venv/bin/python experiments/ablation.py > runs/ablation.log 2>&1 &   # in the background

Arms are algorithm presets (sdar_jax.algos.ALGO_PRESETS): grpo (plain GRPO), grpo_opsd (GRPO + the
ungated distillation term, β = 0 so g = 0.5), sdar (the gap gate), and optionally sdar_entropy,
sdar_soft_or, skill_grpo or any other preset. Every arm gets the same budget: the config
(default configs/default.py, the demo) with the same overrides (`--set key=value`, applied to
every run), so the same iterations, environment episodes per iteration and validation episodes;
only the algorithm and the seed differ. Each arm and seed is one run

    python -m sdar_jax.train --config=<config>:algo=<arm> --config.train.seed=<seed> \
        [--config.<key>=<value> ...] --workdir=<out>/<arm>/seed<seed>

played one after another (a progress line per run; the run's output in <workdir>/train.log, its
attempts and wall time in <workdir>/run_status.json). Resumable: a finished run (its run record
says so, or its metrics reached train.iterations) is skipped; an interrupted one is started again
on its workdir and the trainer resumes it from its latest checkpoint (checkpoint.every; the warm
start is reloaded from <workdir>/warm_start_policy), dropping metric rows logged after that
checkpoint. A run that fails is reported and the others go on (exit code 1 at the end). Stopping
the ablation (Ctrl-C, or kill PID) stops the running training run with it.

Then the table and the figure (sdar_jax/observe/collect.py reads the runs), written to --md and
--png (default <out>/ablation.md and <out>/ablation.png; the committed runs' tables are in
docs/results.md, their figure is docs/ablation.png), and each finished run's outcomes, metrics and
manifest row appended to the tidy tables in --results (default docs/results/; experiments.records):
* final validation success: the last evaluation's val/success_rate, mean ± sample standard
  deviation (ddof 1) over the seeds whose run finished (table and figure use finished runs only;
  the per-seed table lists interrupted ones too);
* area under the validation-success curve (AUC): the trapezoid rule over the evaluation steps
  divided by the step span (last − first evaluation step), i.e. the mean success over training, in
  [0, 1]; mean ± std over the seeds. With only the evaluations before and after training it is
  their average: pass --set train.eval_every=N for a finer curve (the same for every arm);
* the budget of each run (iterations, training episodes, validation episodes per evaluation) and
  the wall time per run (mean over the seeds, from the run records; attempts cut by a kill count
  until their last metrics row);
* the figure: validation success against the iteration, per arm the mean over the seeds with a
  band from the lowest to the highest seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

import numpy as np  # noqa: E402 (after the sys.path line)

from sdar_jax.observe import collect, pairing  # noqa: E402

CORE_ARMS = ("grpo", "grpo_opsd", "sdar")
OPTIONAL_ARMS = ("sdar_entropy", "sdar_soft_or", "skill_grpo")
LABELS = {
  "grpo": "GRPO",
  "grpo_opsd": "GRPO+OPSD",
  "opsd": "OPSD",
  "sdar": "SDAR (gap gate)",
  "sdar_entropy": "SDAR (entropy gate)",
  "sdar_soft_or": "SDAR (soft-OR gate)",
  "sdar_constant": "SDAR (constant gate)",
  "sdar_vocab": "SDAR (gate over the vocabulary, frozen teacher)",
  "skill_grpo": "Skill-GRPO",
}
# The budget columns: (dotted config key, column name); equal across arms by construction.
BUDGET_KEYS = (
  ("train.iterations", "iterations"),
  ("env.tasks_per_iteration", "tasks per iteration"),
  ("env.group_size", "episodes per task"),
  ("eval.num_tasks", "validation episodes"),
  ("train.eval_every", "eval every"),
)


@dataclasses.dataclass(frozen=True)
class Run:
  """One arm and seed of the ablation."""

  arm: str
  seed: int
  workdir: str
  command: tuple[str, ...]


def plan_runs(
  arms: Sequence[str],
  seeds: Sequence[int],
  out: str,
  config: str = "configs/default.py",
  overrides: Sequence[str] = (),
  python: str = sys.executable,
) -> list[Run]:
  """The runs, arm-major (every seed of an arm, then the next arm). `config` is a config file,
  optionally with its argument ("configs/alfworld.py:model=tiny,local=True"): algo=<arm> is
  added to that argument."""
  runs = []
  sep = "," if ":" in config else ":"
  for arm in arms:
    for seed in seeds:
      workdir = os.path.join(out, arm, f"seed{seed}")
      cmd = (
        python,
        "-m",
        "sdar_jax.train",
        f"--config={config}{sep}algo={arm}",
        f"--config.train.seed={seed}",
        *(f"--config.{kv}" for kv in overrides),
        f"--workdir={workdir}",
      )
      runs.append(Run(arm, seed, workdir, cmd))
  return runs


def _clock(seconds: float) -> str:
  seconds = round(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def run_all(
  runs: Sequence[Run],
  runner: Callable[..., object] = subprocess.run,
  cwd: str = _REPO,
  echo: Callable[[str], None] = lambda line: print(line, flush=True),
  clock: Callable[[], float] = time.time,
) -> dict[tuple[str, int], str]:
  """Plays the runs one after another: finished ones are skipped, the others run (an interrupted
  one resumes); returns {(arm, seed): "skipped" | "ok" | "failed (exit N)"}. One progress line
  per run: its position, state, the elapsed time and an ETA from the runs done so far."""
  outcome: dict[tuple[str, int], str] = {}
  start = clock()
  durations: list[float] = []
  for i, run in enumerate(runs):
    workdir = os.path.join(cwd, run.workdir)
    state = collect.run_state(workdir)
    head = f"[{i + 1}/{len(runs)}] {run.arm} seed {run.seed}"
    if state == "finished":
      echo(f"{head}: finished, skipped ({run.workdir})")
      outcome[(run.arm, run.seed)] = "skipped"
      continue
    todo = sum(1 for r in runs[i:] if collect.run_state(os.path.join(cwd, r.workdir)) != "finished")
    eta = f", ETA {_clock(np.mean(durations) * todo)}" if durations else ""
    verb = "resuming" if state == "partial" else "starting"
    log_path = os.path.join(workdir, "train.log")
    echo(f"{head}: {verb}, elapsed {_clock(clock() - start)}{eta}; output in {log_path}")
    os.makedirs(workdir, exist_ok=True)
    t0 = clock()
    code = collect.run_and_record(
      run.command, workdir, cwd=cwd, log_path=log_path, runner=runner, clock=clock
    )
    durations.append(clock() - t0)
    outcome[(run.arm, run.seed)] = "ok" if code == 0 else f"failed (exit {code})"
    if code:
      echo(f"{head}: failed with exit code {code}; see {log_path}")
  echo(f"done in {_clock(clock() - start)}")
  return outcome


# ------------------------------------------------------------------------------------ table
@dataclasses.dataclass
class ArmResult:
  """The runs of one arm, read back."""

  arm: str
  runs: list[collect.RunRecord]
  seeds: list[int]

  @property
  def label(self) -> str:
    return LABELS.get(self.arm, self.arm)

  @property
  def finished_runs(self) -> list[collect.RunRecord]:
    return [r for r in self.runs if r.finished]


def read_arms(out: str, arms: Sequence[str], seeds: Sequence[int]) -> list[ArmResult]:
  """Each arm's runs that exist under `out` (<out>/<arm>/seed<seed> with a config.json)."""
  results = []
  for arm in arms:
    runs, found = [], []
    for seed in seeds:
      path = os.path.join(out, arm, f"seed{seed}")
      if os.path.isfile(os.path.join(path, "config.json")):
        runs.append(collect.read_run(path, out))
        found.append(seed)
    results.append(ArmResult(arm, runs, found))
  return results


TABLE_COLUMNS = (
  "arm",
  "finished runs",
  "final val success",
  "val success AUC",
  "val success before",
  "iterations",
  "train episodes / run",
  "wall time / run (min)",
)
SEED_COLUMNS = ("arm", "seed", "steps", "val before", "val final", "AUC", "wall (min)")


def table_rows(arms: Sequence[ArmResult], planned_seeds: int) -> list[dict[str, object]]:
  """One row per arm: mean ± std over its FINISHED runs (an interrupted run's last evaluation is
  not a final one; the per-seed table shows it) of the final success, the AUC and the success
  before training; the budget; the mean wall time of a finished run."""
  rows = []
  for arm in arms:
    done = arm.finished_runs
    final = collect.mean_std(r.final_success for r in done)
    auc = collect.mean_std(r.auc for r in done)
    before = collect.mean_std(r.initial_success for r in done)
    walls = [r.wall_seconds for r in done if r.wall_seconds is not None]
    steps = {r.iterations for r in arm.runs}
    episodes = {
      r.get("train.iterations", 0)
      * r.get("env.tasks_per_iteration", 0)
      * r.get("env.group_size", 0)
      for r in arm.runs
    }
    rows.append(
      {
        "arm": arm.label,
        "finished runs": f"{len(done)}/{planned_seeds}",
        "final val success": collect.pm(final[0], final[1]),
        "val success AUC": collect.pm(auc[0], auc[1]),
        "val success before": collect.pm(before[0], before[1]),
        "iterations": "/".join(str(s) for s in sorted(steps, key=str)) or None,
        "train episodes / run": "/".join(str(e) for e in sorted(episodes)) or None,
        "wall time / run (min)": float(np.mean(walls)) / 60.0 if walls else None,
        # unformatted, for the CSV
        "final_mean": final[0],
        "final_std": final[1],
        "auc_mean": auc[0],
        "auc_std": auc[1],
      }
    )
  return rows


def seed_rows(arms: Sequence[ArmResult]) -> list[dict[str, object]]:
  rows = []
  for arm in arms:
    for seed, r in zip(arm.seeds, arm.runs):
      rows.append(
        {
          "arm": arm.label,
          "seed": seed,
          "steps": f"{r.last_step if r.last_step is not None else 0}/{r.iterations}",
          "val before": r.initial_success,
          "val final": r.final_success,
          "AUC": r.auc,
          "wall (min)": None if r.wall_seconds is None else r.wall_seconds / 60.0,
        }
      )
  return rows


def budget_differences(arms: Sequence[ArmResult]) -> list[str]:
  """The budget settings that are not the same in every run (the arms must not differ in them)."""
  out = []
  for key, name in BUDGET_KEYS:
    values = {str(r.get(key)) for a in arms for r in a.runs}
    if len(values) > 1:
      out.append(f"{name} ({key}): {sorted(values)}")
  return out


def curves(
  arm: ArmResult, key: str = collect.SUCCESS_KEY
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(steps, mean, min, max) of metric `key` (default: the validation success) over the arm's
  finished runs at every step that logged it (each statistic over the runs that have that step)."""
  by_step: dict[int, list[float]] = {}
  for r in arm.finished_runs:
    for step, value in r.curve(key):
      by_step.setdefault(step, []).append(value)
  steps = np.asarray(sorted(by_step), np.float64)
  values = [by_step[int(s)] for s in steps]
  return (
    steps,
    np.asarray([np.mean(v) for v in values]),
    np.asarray([np.min(v) for v in values]),
    np.asarray([np.max(v) for v in values]),
  )


def draw_curves(ax, arms: Sequence[ArmResult], key: str = collect.SUCCESS_KEY) -> int:
  """Draws metric `key` against the iteration on `ax`: per arm the mean over its finished runs and
  a band from the lowest to the highest (colour k for the k-th arm given, so an arm keeps its
  colour across panels); returns how many arms had the metric."""
  drawn = 0
  for k, arm in enumerate(arms):
    if not any(r.curve(key) for r in arm.finished_runs):
      continue
    steps, mean, low, high = curves(arm, key)
    label = f"{arm.label} (n={len(arm.finished_runs)})"
    ax.plot(steps, mean, marker="o", ms=4, color=f"C{k}", label=label)
    ax.fill_between(steps, low, high, color=f"C{k}", alpha=0.2, lw=0)
    drawn += 1
  ax.set_xlabel("iteration")
  ax.grid(alpha=0.3)
  if drawn:
    ax.legend(fontsize=8)
  return drawn


def plot_curves(arms: Sequence[ArmResult], out_path: str) -> str | None:
  """Validation success against the iteration: per arm the mean over seeds, a min-max band."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  drawn = [a for a in arms if any(r.curve() for r in a.finished_runs)]
  if not drawn:
    return None
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  draw_curves(ax, drawn)
  ax.set_ylabel("validation success rate")
  ax.set_title("validation success: mean over seeds, band from min to max", fontsize=10)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  fig.savefig(out_path, dpi=110)
  plt.close(fig)
  return out_path


def paired_sections(arms: Sequence[ArmResult]) -> list[str]:
  """Each arm against the last one listed (the baseline, e.g. GRPO), paired on the seeds both
  finished and the validation games both played (`sdar_jax.observe.pairing.paired_arms`: the
  difference with its 95% two-way bootstrap interval and the seed-level sign-flip test); runs
  without per-game outcome files are left out and named."""
  if len(arms) < 2:
    return []
  base = arms[-1]
  sections = []
  for arm in arms[:-1]:
    every = [r.path for r in arm.finished_runs] + [r.path for r in base.finished_runs]
    dirs = [d for d in every if pairing.eval_outcomes(d)]  # runs with per-game outcomes
    if len(dirs) < len(every):
      left = ", ".join(os.path.basename(os.path.dirname(d)) + "/" + os.path.basename(d)
                       for d in every if d not in dirs)  # fmt: skip
      sections.append(
        f"{arm.label} vs {base.label}: runs without per-game outcomes left out: {left}"
      )
    try:
      result = pairing.paired_arms(dirs)
    except pairing.CompareError as e:
      sections.append(f"{arm.label} vs {base.label}: not compared ({e})")
      continue
    if result is not None:
      sections.append(result.markdown(arm.label, base.label))
  return sections


def record_runs(arms: Sequence[ArmResult], folder: str, experiment: str = "demo_ablation") -> int:
  """Appends each finished run's validation outcomes, metrics and manifest row to the tidy tables
  in `folder` (experiments.records; a run already there is skipped), so that
  `python -m experiments.report demo_ablation` recomputes the report from the tables alone.
  Returns the runs appended."""
  from experiments import records

  tables, added = records.Tables(folder), 0
  for arm in arms:
    for run in arm.finished_runs:
      seed = int(run.get("train.seed", 0))
      rows = records.step_rows(
        run.path, experiment=experiment, stage=1, run=f"{arm.arm}/seed{seed}", kind="train",
        arm=arm.arm, seed=seed, lr=run.get("optim.lr"),
      )  # fmt: skip
      added += tables.add(*rows)
  return added


def report(
  arms: Sequence[ArmResult],
  planned_seeds: Sequence[int],
  command: str,
  config: str,
  overrides: Sequence[str],
  png_path: str | None,
  md_path: str,
) -> str:
  """The markdown page: what was run, the table per arm, per seed, the figure, the definitions."""
  lines = [
    "# Ablation: GRPO vs GRPO+OPSD vs SDAR",
    "",
    f"Made by `{command}`: every arm runs `{config}` with "
    + (f"the overrides `{' '.join(overrides)}`" if overrides else "no overrides")
    + f", seeds {', '.join(str(s) for s in planned_seeds)}; only `algo` and `train.seed` differ "
    "between runs.",
    "",
  ]
  differ = budget_differences(arms)
  if differ:
    lines += ["**The runs do not share one budget:** " + "; ".join(differ) + ".", ""]
  columns = TABLE_COLUMNS
  lines += [collect.markdown_table(table_rows(arms, len(planned_seeds)), columns), ""]
  lines += ["Per seed:", "", collect.markdown_table(seed_rows(arms), SEED_COLUMNS), ""]
  paired = paired_sections(arms)
  if paired:
    lines += ["Paired on seeds and validation games (each arm minus the last):", ""]
    lines += [*paired, ""]
  if png_path:
    rel = os.path.relpath(os.path.abspath(png_path), os.path.dirname(os.path.abspath(md_path)))
    lines += [f"![validation success per arm]({rel})", ""]
  lines += [
    (
      "Final val success: the last evaluation's `val/success_rate`, mean ± sample standard "
      "deviation (ddof 1) over the seeds whose run finished (the per-seed table also lists "
      "interrupted runs). AUC: the area under the validation-success curve by the "
      "trapezoid rule over the evaluation steps, divided by the step span (the mean success over "
      "training, in [0, 1]). Before: the evaluation before training. Wall time: per run, mean over "
      "the seeds (attempts cut by a kill count until their last metrics row). Figure: the mean "
      "over seeds, the band from the lowest to the highest seed."
    ),
    "",
  ]
  return "\n".join(lines)


def write_report(
  out: str,
  arms_names: Sequence[str],
  seeds: Sequence[int],
  command: str,
  config: str,
  overrides: Sequence[str],
  md_path: str,
  png_path: str,
  results_dir: str | None = None,
  overwrite: bool = False,
) -> tuple[str, str | None]:
  """Reads the runs under `out` and writes the markdown (and the figure, a CSV of the table next
  to the markdown and, with `results_dir`, the runs' rows appended to the tables there:
  `record_runs`);
  returns (markdown path, figure path or None)."""
  arms = read_arms(out, arms_names, seeds)
  collect.refuse_shrinking_report(  # e.g. --collect-only in a clone without the runs
    os.path.splitext(md_path)[0] + ".csv",
    sum(len(a.finished_runs) for a in arms),
    lambda old: sum(int(str(r.get("finished runs", "0/0")).split("/")[0]) for r in old),
    out,
    overwrite,
  )
  if results_dir:
    record_runs(arms, results_dir)
  png = plot_curves(arms, png_path)
  page = report(arms, seeds, command, config, overrides, png, md_path)
  os.makedirs(os.path.dirname(os.path.abspath(md_path)), exist_ok=True)
  with open(md_path, "w") as f:
    f.write(page)
  csv_columns = ("arm", "finished runs", "final_mean", "final_std", "auc_mean", "auc_std")
  csv_columns += ("iterations", "train episodes / run", "wall time / run (min)")
  with open(os.path.splitext(md_path)[0] + ".csv", "w") as f:
    f.write(collect.csv_text(table_rows(arms, len(seeds)), csv_columns))
  return md_path, png


# ------------------------------------------------------------------------------------ main
def _parse_list(text: str, kind=str) -> list:
  return [kind(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--config",
    default="configs/default.py",
    help="the config every arm runs, optionally with its argument (algo=<arm> is added to it)",
  )
  parser.add_argument(
    "--arms",
    default=",".join(CORE_ARMS),
    help=f"comma-separated algo presets (default {','.join(CORE_ARMS)}; optional "
    f"{','.join(OPTIONAL_ARMS)})",
  )
  parser.add_argument("--seeds", default="0,1,2", help="comma-separated train.seed values")
  parser.add_argument("--out", default="runs/ablation", help="the runs' parent directory")
  parser.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="config override applied to every run (repeatable), e.g. train.eval_every=5",
  )
  parser.add_argument(
    "--md",
    default=None,
    help="the markdown report, a CSV of its table beside it (default <out>/ablation.md; "
    "docs/results.md holds the committed one)",
  )
  parser.add_argument(
    "--png", default=None, help="the figure of the curves (default <out>/ablation.png)"
  )
  parser.add_argument(
    "--results",
    default="docs/results",
    help="the tidy tables each finished run's outcomes, metrics and manifest row are appended to "
    "('' to skip)",
  )
  parser.add_argument("--collect-only", action="store_true", help="only write the report")
  parser.add_argument(
    "--overwrite", action="store_true", help="replace a report that holds more finished runs"
  )
  parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
  args = parser.parse_args(argv)
  from sdar_jax.algos import ALGO_PRESETS

  args.arms = _parse_list(args.arms)
  unknown = [a for a in args.arms if a not in ALGO_PRESETS]
  if unknown or not args.arms:
    parser.error(
      f"--arms {','.join(unknown) or '(none)'}: not algorithm presets. Fix: choose from "
      f"{', '.join(sorted(ALGO_PRESETS))}."
    )
  try:
    args.seeds = _parse_list(args.seeds, int)
  except ValueError:
    parser.error(f"--seeds {args.seeds!r}: give comma-separated integers, e.g. 0,1,2.")
  bad = [kv for kv in args.set if "=" not in kv or kv.startswith("=")]
  if bad:
    parser.error(
      f"--set {bad[0]!r}: write KEY=VALUE with a dotted config key, e.g. train.eval_every=5"
    )
  if any(kv.split("=", 1)[0] in ("algo", "train.seed") for kv in args.set):
    parser.error("--set may not change algo or train.seed: they are what the ablation varies.")
  return args


def _stop_on_sigterm(signum, frame) -> None:
  """SIGTERM (kill PID) stops like Ctrl-C: the running training run is killed with the ablation
  instead of living on and holding its workdir's lock."""
  raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parse_args(argv)
  command = shlex.join(["python", "experiments/ablation.py", *argv])
  runs = plan_runs(args.arms, args.seeds, args.out, args.config, args.set)
  if args.dry_run:
    for run in runs:
      print(shlex.join(run.command))
    return 0
  failed = []
  if not args.collect_only:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    outcome = run_all(runs)
    failed = [f"{arm} seed {seed}: {o}" for (arm, seed), o in outcome.items() if o.startswith("f")]
  # relative paths are the repository's, as for the runs (they run in the repository root)
  md = args.md or os.path.join(args.out, "ablation.md")
  png = args.png or os.path.join(args.out, "ablation.png")
  out, md_path, png_path = (os.path.join(_REPO, p) for p in (args.out, md, png))
  results = os.path.join(_REPO, args.results) if args.results else None
  try:
    md, png = write_report(
      out, args.arms, args.seeds, command, args.config, args.set, md_path, png_path, results,
      overwrite=args.overwrite,
    )  # fmt: skip
  except collect.ReportShrinkError as e:
    print(f"report not written: {e}", file=sys.stderr)
    return 2
  print(f"report: {md}" + (f", figure: {png}" if png else " (no validation results yet)"))
  if failed:
    print("failed runs:\n  " + "\n  ".join(failed), file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
