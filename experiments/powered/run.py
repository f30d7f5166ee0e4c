"""Plays the powered ablation's plan (experiments.powered.plan) step by step, records each finished
step in the tidy tables (experiments.records), restores a lost machine's state from them and says
how far the plan got."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from experiments import records
from experiments.powered.plan import (
  REPO,
  RESULTS_DIRS,
  STAGES,
  Step,
  adopted_rates,
  chosen_rates,
  evaluated,
  has_final_checkpoint,
  plan,
  step_done,
  train_step,
)
from sdar_jax.observe import collect, pairing

EXPERIMENT = "powered"


def step_key(step: Step, out: str, stage: int) -> dict[str, object]:
  """The tables' key of a plan step: its run (the run folder below `out`), kind, arm (the commit
  check's is `grpo`), seed and rate."""
  return {
    "experiment": EXPERIMENT,
    "stage": stage,
    "run": os.path.relpath(step.workdir, out),
    "kind": step.kind,
    "arm": "grpo" if step.arm == "grpo_commit_check" else step.arm,
    "seed": step.seed,
    "lr": step.rate,
  }


def record(out: str, tables: records.Tables, stage: int, python: str = sys.executable) -> int:
  """Appends every finished step of the stage's plan that the tables do not hold yet (a step is
  appended once: its manifest row comes last); returns how many."""
  added = 0
  for step in plan(out, python, stage=stage):
    key = step_key(step, out, stage)
    if step_done(step) and not tables.has(EXPERIMENT, key["run"], step.kind):
      added += tables.add(*records.step_rows(step.results, **key))
  return added


def restore(tables: records.Tables, out: str) -> int:
  """Writes every step the tables hold back into `out` as run records (no weights; a file already
  there is kept); returns the files written. `run` then skips those steps and trains a run again
  before an evaluation needs its weights (`retrain_lost`)."""
  written = 0
  for row in tables.read("runs", experiment=EXPERIMENT):
    folder = os.path.join(out, row["run"])
    if row["kind"] != "train":
      folder = os.path.join(folder, RESULTS_DIRS[row["kind"]])
    written += records.restore_step(tables, EXPERIMENT, row["run"], row["kind"], folder)
  return written


def retrain_lost(step: Step, out: str, python: str) -> tuple[Step, str]:
  """An evaluation whose finished run lost its weights (restored from the tables): the run's
  folder moves aside to <run>.restored[-N] and the returned train step trains it again into its
  own folder. Returns (that step, the folder aside); `after_retrain` then brings back the
  evaluations that had finished and compares the two trainings."""
  aside, n = f"{step.workdir}.restored", 1
  while os.path.exists(aside):
    n += 1
    aside = f"{step.workdir}.restored-{n}"
  os.rename(step.workdir, aside)
  arm = "grpo" if step.arm == "grpo_commit_check" else step.arm
  return train_step(out, arm, step.rate, step.seed, python), aside


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


def _clock(seconds: float) -> str:
  seconds = round(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


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
  import subprocess

  runner = runner or subprocess.run
  failed: set[str] = set()
  played = 0
  start = time.time()
  while max_steps is None or played < max_steps:
    steps = plan(out, python, stage=stage)
    todo = [s for s in steps if not step_done(s) and s.label not in failed]
    if not todo:
      break
    step, total = todo[0], len(steps)
    aside = None
    if step.kind != "train" and step.arm != "initial" and not has_final_checkpoint(step.workdir):
      step, aside = retrain_lost(step, out, python)
      echo(f"{step.label}: its final weights are gone (records kept in {aside}); training again")
    echo(
      f"[{total - len(todo) + 1}/{total}+] {step.label}: starting, elapsed "
      f"{_clock(time.time() - start)}; output in {step.results}"
    )
    os.makedirs(step.results, exist_ok=True)
    log = os.path.join(step.results, f"{step.kind}.log")
    code = collect.run_and_record(step.command, step.results, cwd=REPO, log_path=log, runner=runner)
    played += 1
    if code:
      failed.add(step.label)
      echo(f"{step.label}: failed with exit code {code}; see {log}")
    elif aside:
      echo(after_retrain(step.workdir, aside))
    if records_to:
      added = record(out, records.Tables(records_to), stage, python)
      echo(f"records: {added} finished step(s) appended to the tables in {records_to}")
  echo(f"stopped after {played} step(s) in {_clock(time.time() - start)}; {len(failed)} failed")
  return len(failed)


def lost_episodes(steps: Sequence[Step]) -> list[tuple[str, int, str, int]]:
  """(step label, iteration, metric, episodes) for every metrics row of the steps' folders that
  counts episodes lost to env failures (a `*/env_failures` above 0: an env that raised, hung
  past its limit, or whose worker died). An evaluation with such a row scored fewer games than
  its panel holds, and a training iteration learned from fewer episodes."""
  lost = []
  for step in steps:
    for row in collect.read_metrics(os.path.join(step.results, "metrics.jsonl")):
      for key, value in sorted(row.items()):
        if key.endswith("/env_failures") and value:
          lost.append((step.label, int(row["step"]), key, int(value)))
  return lost


def _lost_lines(lost: Sequence[tuple[str, int, str, int]]) -> list[str]:
  if not lost:
    return ["no episode was lost to an env failure"]
  return [
    f"episodes lost to env failures: {label}, iteration {it}: {key}={n}"
    for label, it, key, n in lost
  ]


def step_commits(steps: Sequence[Step]) -> dict[str, list[str]]:
  """commit -> the labels of the steps whose attempts ran at it (`collect.code_commit`, kept in
  each step's run_status.json; "not recorded" for attempts from before it was kept). A step
  resumed by a later commit counts under both."""
  found: dict[str, list[str]] = {}
  for step in steps:
    attempts = (collect.read_status(step.results) or {}).get("attempts", [])
    for commit in sorted({a.get("commit") or "not recorded" for a in attempts}):
      found.setdefault(commit, []).append(step.label)
  return found


def _commit_lines(found: Mapping[str, list[str]]) -> list[str]:
  return [f"code at {commit}: {len(labels)} step(s)" for commit, labels in sorted(found.items())]


def status(out: str, python: str = sys.executable, stage: int = 1) -> str:
  """How far the plan got: steps done of those known, the wall time they cost, the chosen rates."""
  st = STAGES[stage]
  steps = plan(out, python, stage=stage)
  done = [s for s in steps if step_done(s)]
  seconds = 0.0
  for s in done:
    wall = collect.wall_seconds(s.results)
    seconds += wall or 0.0
  total = st.total_with(tuple(adopted_rates(out)))
  more = f" (more are planned once every arm's rate is chosen: {total} in all)"
  lines = [
    (
      f"{len(done)}/{len(steps)} steps done{more if len(steps) < total else ''}, "
      f"{seconds / 3600:.2f} h of wall time"
    ),
    f"chosen rates: {chosen_rates(out, (*st.reused, *st.arms), st.rates_file) or 'none yet'}",
  ]
  lines += [f"  next: {s.label}" for s in steps if not step_done(s)][:3]
  lines += _lost_lines(lost_episodes(done))
  lines += _commit_lines(step_commits(done))
  return "\n".join(lines)
