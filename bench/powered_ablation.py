r"""The powered, paired ablation (first stage): GRPO against our vocabulary form and its no-skills
control, on the demo's work, 8 seeds an arm, each arm at the learning rate its own search chose,
the final policies measured on two held-out panels.

    nohup .venv/bin/python bench/powered_ablation.py run > runs/powered/run.log 2>&1 &
    .venv/bin/python bench/powered_ablation.py status      # how far it got, what it cost
    .venv/bin/python bench/powered_ablation.py plan        # every command, in order, run nothing

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

How it runs: one process after another, each under `nice -n 19` (the lowest CPU priority: it
yields to anything else on the machine); resumable at any point, per arm, rate and seed (a
finished run or evaluation is skipped, an interrupted training resumes from its checkpoint).
Stop it before a test run (`kill <pid>`: the running step stops with it). Its state is the run
folders under --out (default runs/powered) and <out>/chosen_rates.json.
"""

from __future__ import annotations

import argparse
import dataclasses
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

from sdar_jax.observe import collect  # noqa: E402

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
    todo = [s for s in plan(out, python) if not step_done(s) and s.label not in failed]
    if not todo:
      break
    step = todo[0]
    total = len(plan(out, python))
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


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("action", choices=("run", "status", "plan"))
  parser.add_argument("--out", default="runs/powered", help="the runs' parent folder")
  parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
  args = parser.parse_args(argv)
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
