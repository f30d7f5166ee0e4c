"""Plays the contexts plan (experiments.contexts.plan) step by step: records the vocab arm's
context before the first step, decides the rate once after the pilot, records each finished step
in the tidy tables (experiments.records), restores a lost machine's state from them and says how
far the plan got and what is left to pay."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

from experiments import records
from experiments.contexts import plan as plan_mod
from experiments.contexts.plan import EXPERIMENT, FULL, REPO, STAGE, Design, Step, step_done
from experiments.long_budget import run as long_budget_run
from experiments.powered.plan import has_final_checkpoint
from experiments.powered.run import _clock, _commit_lines, _lost_lines, lost_episodes, step_commits
from sdar_jax.observe import collect

PGID_FILE = "run.pgid"  # <out>/run.pgid: the driver's process group (stop it for a test run)


def record(design: Design, out: str, tables: records.Tables, python: str = sys.executable) -> int:
  """Appends every finished training or evaluation step not in the tables yet; returns how many
  (the long-budget stage's recorder over this plan)."""
  return long_budget_run.record(
    design, out, tables, python, plan=plan_mod.plan, experiment=EXPERIMENT, stage=STAGE
  )


def restore(tables: records.Tables, out: str) -> int:
  """Writes every step the tables hold back into `out` as run records (no weights); `run` then
  skips those steps and trains a run again before its evaluation needs the weights."""
  return long_budget_run.restore(tables, out, EXPERIMENT)


def _retrain_lost(design: Design, step: Step, out: str, vocab: str, python: str) -> Step:
  """An evaluation whose run lost its weights: the run's folder moves aside to <run>.restored[-N]
  and its training step is returned (played again from the start)."""
  aside, n = f"{step.workdir}.restored", 1
  while os.path.exists(aside):
    n += 1
    aside = f"{step.workdir}.restored-{n}"
  os.rename(step.workdir, aside)
  return plan_mod.train_step(design, out, step.arm, step.rate, step.seed, vocab, python)


def run(
  design: Design = FULL,
  out: str | None = None,
  python: str = sys.executable,
  runner: Callable[..., object] | None = None,
  echo: Callable[[str], None] = lambda line: print(line, flush=True),
  max_steps: int | None = None,
  records_to: str | None = None,
  smoke: bool = False,
  policy: str = os.path.join(REPO, plan_mod.CONTEXT_POLICY),
) -> int:
  """Plays the steps not yet done in order; returns the number of failed steps (1 when the vocab
  rule cannot be applied: nothing runs then). A step's output goes to its results folder's
  <kind>.log, its wall time and attempts to run_status.json."""
  import subprocess

  out = out or design.out
  try:
    vocab = plan_mod.decide_vocab_context(out, policy)
  except (FileNotFoundError, ValueError) as e:
    echo(f"not started: {e}")
    return 1
  echo(f"the vocab arm's context: {vocab} (recorded in {os.path.join(out, plan_mod.VOCAB_FILE)})")
  with open(os.path.join(out, PGID_FILE), "w") as f:
    f.write(f"{os.getpgid(0)}\n")
  runner = runner or subprocess.run
  failed: set[str] = set()
  played, start = 0, time.time()
  while max_steps is None or played < max_steps:
    decided = plan_mod.rate_decision(out) is not None
    steps = plan_mod.plan(design, out, python, smoke, vocab=vocab)
    if not decided and plan_mod.rate_decision(out) is not None:
      echo("rate decided: " + rate_line(out))
    todo = [s for s in steps if not step_done(s) and s.label not in failed]
    if not todo:
      break
    step = todo[0]
    if step.kind == "heldout" and step.arm != "initial" and not has_final_checkpoint(step.workdir):
      step = _retrain_lost(design, step, out, vocab, python)
      echo(f"{step.label}: its final weights are gone; training again")
    echo(
      f"[{len(steps) - len(todo) + 1}/{plan_mod.total_steps(design)}] {step.label}: starting, "
      f"elapsed {_clock(time.time() - start)}, expected {expected_hours(step, design):.2f} h; "
      f"output in {step.results}"
    )
    os.makedirs(step.results, exist_ok=True)
    log = os.path.join(step.results, f"{step.kind}.log")
    code = collect.run_and_record(step.command, step.results, cwd=REPO, log_path=log, runner=runner)
    played += 1
    if code:
      failed.add(step.label)
      echo(f"{step.label}: failed with exit code {code}; see {log}")
    if records_to:
      added = record(design, out, records.Tables(records_to), python)
      echo(f"records: {added} finished step(s) appended to the tables in {records_to}")
  echo(f"stopped after {played} step(s) in {_clock(time.time() - start)}; {len(failed)} failed")
  return len(failed)


def expected_hours(step: Step, design: Design = FULL) -> float:
  return plan_mod.expected_seconds(step, design) / 3600


def rate_line(out: str) -> str:
  found = plan_mod.rate_decision(out)
  if found is None:
    return "the rate: not decided (the pilot has not finished; runs at 5e-4 and 1e-3 until then)"
  pilot = "; ".join(
    f"{arm}: "
    + ", ".join(
      f"{r} mean {v['mean']:.3f} {v['final']}" for r, v in by.items() if r.startswith("lr")
    )
    for arm, by in found["pilot"].items()
  )
  return f"the rate: {found['chosen']:g} (decided {found['decided']}; {pilot})"


def vocab_line(out: str, policy: str = os.path.join(REPO, plan_mod.CONTEXT_POLICY)) -> str:
  path = os.path.join(out, plan_mod.VOCAB_FILE)
  if os.path.isfile(path):
    with open(path) as f:
      found = json.load(f)
    return f"the vocab arm's context: {found['context']} (recorded; gaps {found['gaps']})"
  try:
    context, gaps = plan_mod.vocab_context(policy)
  except (FileNotFoundError, ValueError) as e:
    return f"the vocab arm's context: undecided, and `run` will not start: {e}"
  return f"the vocab arm's context: {context} by the rule now (gaps {gaps}); recorded at `run`"


def status(design: Design = FULL, out: str | None = None, python: str = sys.executable) -> str:
  """Steps done, the wall time they took, the decisions, the next steps, the hours left."""
  out = out or design.out
  steps = plan_mod.plan(design, out, python)
  rate = plan_mod.decide_rate(out, design)
  whole = plan_mod.plan(design, out, python, rate=rate if rate is not None else plan_mod.RATE)
  done = [s for s in steps if step_done(s)]
  spent = sum(collect.wall_seconds(s.results) or 0.0 for s in done)
  left = [s for s in whole if not step_done(s)]
  hours_left = sum(expected_hours(s, design) for s in left)
  partial = [s for s in left if s.kind == "train" and collect.run_state(s.workdir) == "partial"]
  lines = [
    (
      f"{len(done)}/{plan_mod.total_steps(design)} steps done, {spent / 3600:.2f} h of wall time; "
      f"{len(left)} left, about {hours_left:.1f} machine-hours by the cost plan "
      "(a partial run counts in full)"
    ),
    vocab_line(out),
    rate_line(out),
    *(f"  next: {s.label} ({expected_hours(s, design):.2f} h)" for s in left[:3]),
    *(f"  partial: {s.label} (resumes from its checkpoint)" for s in partial),
  ]
  if rate is not None:
    seeds_done = {
      arm: sum(step_done(s) for s in steps if s.arm == arm and s.kind == "heldout")
      for arm in plan_mod.ARMS
    }
    lines.append("seeds finished (trained and evaluated) per arm: " + str(seeds_done))
  trained = [s for s in done if s.kind == "train"]
  lines += _lost_lines(lost_episodes(trained))
  lines += _commit_lines(step_commits([s for s in done if s.kind != "panels"]))
  return "\n".join(lines)
