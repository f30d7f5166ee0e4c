"""Plays the long-budget plan (experiments.long_budget.plan) step by step: generates and checks the
held-out panels, records each finished step in the tidy tables (experiments.records), restores a
lost machine's state from them and says how far the plan got and what is left to pay."""

from __future__ import annotations

import glob
import json
import os
import re
import sys
from collections.abc import Callable

from experiments import driver, records, status_lines
from experiments.driver import Retrain, has_final_checkpoint
from experiments.long_budget import plan as plan_mod
from experiments.long_budget.plan import EXPERIMENT, FULL, STAGE, Design, Step, step_done

_NAME = re.compile(r"\(\s*problem\s+[^)\s]+\s*\)")
_NUMBER = re.compile(r"\d+")


def problem_key(gamefile: str) -> str:
  """A game's PDDL problem without its name (which holds the trial, never the problem) and with
  every number ignored (object and receptacle numbers, scenes): two games with equal keys count
  as sharing their problem, a stricter test than equal problem texts."""
  with open(gamefile) as f:
    text = json.load(f)["pddl_problem"]
  return " ".join(_NUMBER.sub("#", _NAME.sub("(problem)", text)).split())


def _problems(folder: str) -> dict[str, str]:
  """problem key -> one game file, over the game files below `folder`."""
  found = {}
  for path in sorted(glob.glob(os.path.join(folder, "**", "*.tw-pddl"), recursive=True)):
    found.setdefault(problem_key(path), path)
  return found


def make_panels(design: Design, out: str) -> dict[str, object]:
  """Generates the design's held-out panels (and the train, valid and earlier panels they are
  checked against, where missing), then checks that no PDDL problem of a new panel is in any other
  game set or in the other new panel. Writes <out>/PANELS_FILE only when none is shared; raises
  RuntimeError naming the shared games otherwise."""
  from configs import default
  from envs.alfworld import data

  config = default.get_config("algo=grpo")
  env = config.env
  base = {
    s: os.path.join(data.offline_dir(env, s), s) for s in ("train", "valid_seen", "valid_unseen")
  }
  sets = {name: _problems(folder) for name, folder in base.items()}

  def panels(num: int, seed: int) -> dict[str, dict[str, str]]:
    env.offline.num_heldout, env.offline.heldout_seed = num, seed
    found = {}
    for panel, split in data.HELDOUT_SPLITS.items():
      found[f"{panel} n{num} s{seed}"] = _problems(
        os.path.join(data.offline_dir(env, panel), split)
      )
    return found

  for num, seed in plan_mod.EARLIER_PANELS:
    sets.update(panels(num, seed))
  new = panels(design.num_heldout, design.heldout_seed)
  shared = []
  for name, problems in new.items():
    others = {**sets, **{n: p for n, p in new.items() if n != name}}
    for other, theirs in others.items():
      shared += [(name, other, problems[k]) for k in sorted(set(problems) & set(theirs))]
    if len(problems) < design.num_heldout:
      shared.append((name, name, f"{design.num_heldout - len(problems)} duplicate(s) inside"))
  if shared:
    lines = "\n".join(f"  {a} shares with {b}: {g}" for a, b, g in shared[:20])
    raise RuntimeError(f"{len(shared)} held-out game(s) share a PDDL problem:\n{lines}")
  record = {
    "panels": {name: len(p) for name, p in new.items()},
    "checked_against": {name: len(p) for name, p in sets.items()},
    "shared_problems": 0,
    "num_heldout": design.num_heldout,
    "heldout_seed": design.heldout_seed,
  }
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, plan_mod.PANELS_FILE), "w") as f:
    json.dump(record, f, indent=1)
  return record


def step_key(
  step: Step, out: str, experiment: str = EXPERIMENT, stage: int = STAGE
) -> dict[str, object]:
  """The tables' key of a step of the plan whose runs sit below `out`."""
  return driver.step_key(step, out, experiment, stage)


def record(
  design: Design,
  out: str,
  tables: records.Tables,
  python: str = sys.executable,
  *,
  plan: Callable[..., list[Step]] = plan_mod.plan,
  experiment: str = EXPERIMENT,
  stage: int = STAGE,
) -> int:
  """Appends every finished training or evaluation step of `plan` (this stage's, or another
  stage's built on it: experiments.contexts) not in the tables yet; returns how many."""
  steps = plan(design, out, python)
  return driver.record(steps, out, tables, experiment, stage, done=step_done)


def restore(tables: records.Tables, out: str, experiment: str = EXPERIMENT) -> int:
  """Writes every step the tables hold back into `out` as run records (no weights); `run` then
  skips those steps and trains a run again before its evaluation needs the weights."""
  return driver.restore(tables, out, experiment)


def lost_weights(step: Step, retrain: Callable[[], Step]) -> Retrain | None:
  """A held-out evaluation whose run lost its weights: the run's folder moves aside to
  <run>.restored[-N] and the run's training (`retrain`) is played again from the start; once it
  finished, its metrics are compared with the recorded run's (`driver.compare_retrained`)."""
  if step.kind != "heldout" or step.arm == "initial" or has_final_checkpoint(step.workdir):
    return None
  aside = driver.move_aside(step.workdir)
  again = retrain()
  return Retrain(
    again,
    f"{again.label}: its final weights are gone; training again",
    after=lambda: driver.compare_retrained(aside, again.workdir),
  )


def run(
  design: Design = FULL,
  out: str | None = None,
  python: str = sys.executable,
  runner: Callable[..., object] | None = None,
  echo: Callable[[str], None] = lambda line: print(line, flush=True),
  max_steps: int | None = None,
  records_to: str | None = None,
  smoke: bool = False,
) -> int:
  """Plays the steps not yet done in order; returns the number of failed steps. A step's output
  goes to its results folder's <kind>.log, its wall time and attempts to run_status.json."""
  out = out or design.out
  return driver.play(
    lambda: plan_mod.plan(design, out, python, smoke),
    done=step_done,
    runner=runner,
    echo=echo,
    max_steps=max_steps,
    lost=lambda step: lost_weights(
      step, lambda: plan_mod.train_step(design, out, step.arm, step.seed, python)
    ),
    record=lambda tables: record(design, out, tables, python),
    records_to=records_to,
    hours=lambda step: expected_hours(step, design),
    evaluations=driver.evaluations_lock(out),
  )


def expected_hours(step: Step, design: Design = FULL) -> float:
  return plan_mod.expected_seconds(step, design) / 3600


def status(design: Design = FULL, out: str | None = None, python: str = sys.executable) -> str:
  """Steps done, the wall time they took, the next ones, the cost plan's hours left."""
  out = out or design.out
  steps = plan_mod.plan(design, out, python)
  done = [s for s in steps if step_done(s)]
  left = [s for s in steps if not step_done(s)]
  lines = status_lines.cost_lines(done, left, len(steps), lambda s: expected_hours(s, design))
  seeds_done = {
    arm: sum(
      step_done(s) for s in steps if s.arm == arm and s.kind == "heldout" and s.seed is not None
    )
    for arm in plan_mod.ARMS
  }
  lines.append("seeds finished (trained and evaluated) per arm: " + str(seeds_done))
  played = [s for s in done if s.kind != "panels"]  # trainings and evaluations: both lose episodes
  lines += status_lines.check_lines(played, played)
  return "\n".join(lines)
