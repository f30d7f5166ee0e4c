"""Plays the contexts plan (experiments.contexts.plan) step by step: records the vocab arm's
context before the first step, decides the rate once after the pilot, records each finished step
in the tidy tables (experiments.records), restores a lost machine's state from them and says how
far the plan got and what is left to pay."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

from experiments import driver, records, status_lines
from experiments.contexts import plan as plan_mod
from experiments.contexts.plan import EXPERIMENT, FULL, REPO, STAGE, Design, Step, step_done
from experiments.long_budget import run as long_budget_run


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
  out = out or design.out
  try:
    vocab = plan_mod.decide_vocab_context(out, policy)
  except (FileNotFoundError, ValueError) as e:
    echo(f"not started: {e}")
    return 1
  echo(f"the vocab arm's context: {vocab} (recorded in {os.path.join(out, plan_mod.VOCAB_FILE)})")

  announced = plan_mod.rate_decision(out) is not None

  def steps() -> list[Step]:
    # The decision is written by `plan` or by `record` (which plans to find the finished steps):
    # announced at the first call that finds it, whichever wrote it.
    nonlocal announced
    found = plan_mod.plan(design, out, python, smoke, vocab=vocab)
    if not announced and plan_mod.rate_decision(out) is not None:
      announced = True
      echo("rate decided: " + rate_line(out))
    return found

  def retrain(step: Step) -> Step:
    return plan_mod.train_step(design, out, step.arm, step.rate, step.seed, vocab, python)

  return driver.play(
    steps,
    done=step_done,
    runner=runner,
    echo=echo,
    max_steps=max_steps,
    lost=lambda step: long_budget_run.lost_weights(step, lambda: retrain(step)),
    record=lambda tables: record(design, out, tables, python),
    records_to=records_to,
    total=lambda _: plan_mod.total_steps(design),
    hours=lambda step: expected_hours(step, design),
    evaluations=driver.evaluations_lock(out),
  )


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
  # no time: the file is written again when a fresh machine restores the runs from the tables
  return f"the rate: {found['chosen']:g} (the rule on the pilot's final successes: {pilot})"


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
  left = [s for s in whole if not step_done(s)]
  lines = status_lines.cost_lines(
    done,
    left,
    plan_mod.total_steps(design),
    lambda s: expected_hours(s, design),
    notes=(vocab_line(out), rate_line(out)),
  )
  if rate is not None:
    seeds_done = {
      arm: sum(step_done(s) for s in steps if s.arm == arm and s.kind == "heldout")
      for arm in plan_mod.ARMS
    }
    lines.append("seeds finished (trained and evaluated) per arm: " + str(seeds_done))
  played = [s for s in done if s.kind != "panels"]  # trainings and evaluations: both lose episodes
  lines += status_lines.check_lines(played, played)
  return "\n".join(lines)
