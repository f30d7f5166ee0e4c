"""Plays the powered ablation's plan (experiments.powered.plan) step by step, records each finished
step in the tidy tables (experiments.records), restores a lost machine's state from them and says
how far the plan got."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from experiments import driver, records, status_lines
from experiments.driver import Retrain, evaluated, has_final_checkpoint
from experiments.powered.plan import (
  RESULTS_DIRS,
  STAGES,
  Step,
  adopted_rates,
  chosen_rates,
  plan,
  step_done,
  train_step,
)
from sdar_jax.observe import pairing

EXPERIMENT = "powered"
# the parts of `status`'s last lines, in the shared base (the names this module gave them)
step_commits, _commit_lines = status_lines.step_commits, status_lines.commit_lines


def step_key(step: Step, out: str, stage: int) -> dict[str, object]:
  """The tables' key of a plan step: its run (the run folder below `out`), kind, arm (the commit
  check's is `grpo`), seed and rate."""
  return driver.step_key(step, out, EXPERIMENT, stage, _arm(step))


def _arm(step: Step) -> str:
  return "grpo" if step.arm == "grpo_commit_check" else step.arm


def record(out: str, tables: records.Tables, stage: int, python: str = sys.executable) -> int:
  """Appends every finished step of the stage's plan that the tables do not hold yet (a step is
  appended once: its manifest row comes last); returns how many."""
  return driver.record(plan(out, python, stage=stage), out, tables, EXPERIMENT, stage, arm=_arm)


def restore(tables: records.Tables, out: str) -> int:
  """Writes every step the tables hold back into `out` as run records (no weights; a file already
  there is kept); returns the files written. `run` then skips those steps and trains a run again
  before an evaluation needs its weights (`retrain_lost`)."""
  return driver.restore(tables, out, EXPERIMENT)


def retrain_lost(step: Step, out: str, python: str) -> tuple[Step, str]:
  """An evaluation whose finished run lost its weights (restored from the tables): the run's
  folder moves aside to <run>.restored[-N] and the returned train step trains it again into its
  own folder. Returns (that step, the folder aside); `after_retrain` then brings back the
  evaluations that had finished and compares the two trainings."""
  aside = driver.move_aside(step.workdir)
  return train_step(out, _arm(step), step.rate, step.seed, python), aside


def after_retrain(run: str, aside: str) -> str:
  """Moves the finished evaluations of the folder aside back into the retrained run and says
  whether the two trainings' valid_seen outcomes agree game by game."""
  import shutil

  for name in RESULTS_DIRS.values():
    src, dst = os.path.join(aside, name), os.path.join(run, name)
    if evaluated(src) and not os.path.exists(dst):
      shutil.copytree(src, dst)
  a, b = pairing.eval_outcomes(aside), pairing.eval_outcomes(run)
  pairs = [
    (a[s][g], b[s][g]) for s in sorted(set(a) & set(b)) for g in sorted(set(a[s]) & set(b[s]))
  ]
  differ = sum(x != y for x, y in pairs)
  return (
    f"retrained {run}: {differ} of {len(pairs)} valid_seen outcomes differ from the records "
    f"kept in {aside}"
  )


def run(
  out: str,
  python: str = sys.executable,
  runner: Callable[..., object] | None = None,
  echo: Callable[[str], None] = lambda line: print(line, flush=True),
  max_steps: int | None = None,
  stage: int = 1,
  records_to: str | None = None,
) -> int:
  """Plays the plan's steps not yet done, one after another, re-planning after each (a chosen
  rate adds steps); returns the number of failed steps. A step's output goes to its results
  folder's log (train.log / heldout.log), its wall time and attempts to run_status.json. An
  evaluation of a run that lost its weights trains that run again first (`retrain_lost`).
  `records_to`: after each step, the finished steps' rows are appended to the tables there."""

  def lost(step: Step) -> Retrain | None:
    if step.kind == "train" or step.arm == "initial" or has_final_checkpoint(step.workdir):
      return None
    again, aside = retrain_lost(step, out, python)
    note = f"{again.label}: its final weights are gone (records kept in {aside}); training again"
    return Retrain(again, note, lambda: after_retrain(again.workdir, aside))

  return driver.play(
    lambda: plan(out, python, stage=stage),
    runner=runner,
    echo=echo,
    max_steps=max_steps,
    lost=lost,
    record=lambda tables: record(out, tables, stage, python),
    records_to=records_to,
    total=lambda steps: f"{len(steps)}+",
    evaluations=driver.evaluations_lock(out),
  )


def status(out: str, python: str = sys.executable, stage: int = 1) -> str:
  """How far the plan got: steps done of those known, the wall time they cost, the chosen rates."""
  st = STAGES[stage]
  steps = plan(out, python, stage=stage)
  done = [s for s in steps if step_done(s)]
  total = st.total_with(tuple(adopted_rates(out)))
  more = f" (more are planned once every arm's rate is chosen: {total} in all)"
  lines = [
    (
      f"{len(done)}/{len(steps)} steps done{more if len(steps) < total else ''}, "
      f"{status_lines.wall_hours(done):.2f} h of wall time"
    ),
    f"chosen rates: {chosen_rates(out, (*st.reused, *st.arms), st.rates_file) or 'none yet'}",
  ]
  lines += [f"  next: {s.label}" for s in steps if not step_done(s)][:3]
  lines += status_lines.check_lines(done, done)
  return "\n".join(lines)
