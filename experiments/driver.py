"""What the experiments' drivers (experiments.powered, experiments.long_budget and
experiments.contexts) share: a plan's steps and their command lines, the loop that plays the steps
not yet done (resumable: a finished step is skipped), the tidy tables' records of the finished
steps (experiments.records) and their restoring, and the command line's `plan`, `status`,
`cost`, `record`, `restore` and `run` (experiments.status_lines writes what `status` prints). Each
driver keeps its design: its arms, the order of its steps, what its `status` says and what it
decides between steps."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import time
import types
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Protocol, TypeVar

from envs.common import file_lock, lock_held
from experiments import records, stopping
from experiments.stopping import STOP
from sdar_jax.observe import collect, stats
from sdar_jax.run import evaluation

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NICE = ("nice", "-n", "19")
RECORDS = "docs/results"  # the tables' folder


# ---------------------------------------------------------------------------- the steps
def rate_name(rate: float) -> str:
  return f"lr{rate:.1e}"


@dataclasses.dataclass(frozen=True)
class Step:
  """One process of a plan: a training run or an evaluation of one."""

  kind: str  # "train", else the evaluation's (or another step's) kind: "heldout", ...
  arm: str
  rate: float | None
  seed: int | None
  workdir: str  # the run folder (for an evaluation, the run evaluated)
  command: tuple[str, ...]

  @property
  def label(self) -> str:
    what = "initial policy" if self.arm == "initial" else f"{self.arm} {rate_name(self.rate)}"
    seed = "" if self.seed is None else f" seed {self.seed}"
    return f"{self.kind} {what}{seed}"

  @property
  def results(self) -> str:
    """Where the step's results go (its done marker lives there): a training run's folder, else
    the folder below it named after the step's kind."""
    return results_dir(self.workdir, self.kind)


def results_dir(workdir: str, kind: str) -> str:
  return workdir if kind == "train" else os.path.join(workdir, kind)


def command(
  module: str, algo: str, overrides: Sequence[str], python: str, config: str
) -> tuple[str, ...]:
  """`python -m module` at the preset `algo` of `config` with `overrides`, under `nice -n 19`."""
  return (
    *NICE,
    python,
    "-m",
    module,
    f"--config={config}:algo={algo}",
    *(f"--config.{kv}" for kv in overrides),
  )


def train_step(
  step: type[Step], arm: str, rate: float, seed: int, workdir: str, cmd: Sequence[str]
) -> Step:
  """A training run of `cmd` (a `sdar_jax.train` command) into `workdir`."""
  return step("train", arm, rate, seed, workdir, (*cmd, f"--workdir={workdir}"))


def evaluation_step(
  step: type[Step],
  kind: str,
  arm: str,
  rate: float | None,
  seed: int | None,
  workdir: str,
  cmd: Sequence[str],
) -> Step:
  """An evaluation (`cmd`, a `sdar_jax.evaluate` command) of the final policy of the run in
  `workdir`, into <workdir>/<kind>; arm "initial": of the config's starting policy."""
  initial = ("--initial_policy",) if arm == "initial" else ()  # no run in that workdir, on purpose
  output = f"--output={results_dir(workdir, kind)}"
  return step(kind, arm, rate, seed, workdir, (*cmd, *initial, f"--workdir={workdir}", output))


def heldout_overrides(num_heldout: int, heldout_seed: int) -> tuple[str, ...]:
  """An evaluation on the held-out panels (`num_heldout` games each, generator `heldout_seed`),
  each episode's draws keyed by its game and turn (common random numbers)."""
  return (
    "eval.split=heldout_seen",
    "eval.splits=heldout_unseen",
    "eval.num_tasks=-1",
    "eval.streams=task",
    f"env.offline.num_heldout={num_heldout}",
    f"env.offline.heldout_seed={heldout_seed}",
  )


def evaluated(folder: str) -> bool:
  """Whether an evaluation finished into `folder` (a killed one's step is still to do)."""
  return evaluation.eval_finished(folder)


def step_done(step: Step) -> bool:
  if step.kind == "train":
    return collect.run_state(step.workdir) == "finished"
  return evaluated(step.results)


def has_final_checkpoint(run: str) -> bool:
  """Whether a finished run still holds the checkpoint of its last step (an evaluation reads the
  final policy from it; without one it would evaluate the warm-started weights instead)."""
  from sdar_jax.run.checkpoint import CheckpointManager

  folder = os.path.join(run, "checkpoints")
  total = (
    collect.read_run(run).iterations if os.path.isfile(os.path.join(run, "config.json")) else None
  )
  if total is None or not os.path.isdir(folder):
    return False
  with CheckpointManager(folder, read_only=True) as ckpt:
    return total in ckpt.all_steps()


def _numerics(run: str) -> dict[tuple[int, str], float]:
  """(iteration, metric) -> value of a run's metrics.jsonl, less what measures the machine rather
  than the run (perf/*, seconds, compilation counts)."""
  found = {}
  for row in collect.read_metrics(os.path.join(run, "metrics.jsonl")):
    for key, value in row.items():
      timing = key.startswith("perf/") or key.endswith(("seconds", "compilations"))
      if key != "step" and not timing and isinstance(value, (int, float)):
        found[(int(row["step"]), key)] = float(value)
  return found


def compare_retrained(recorded: str, again: str) -> str:
  """Whether a run trained again (`again`) reproduced the one recorded in the tables (restored
  into `recorded`): its metrics compared value by value, NaN equal to NaN."""
  a, b = _numerics(recorded), _numerics(again)
  shared = sorted(set(a) & set(b))
  differ = [k for k in shared if a[k] != b[k] and not (a[k] != a[k] and b[k] != b[k])]
  line = f"retrained {again}: {len(differ)} of {len(shared)} recorded metric values differ"
  if differ:
    largest = max((abs(a[k] - b[k]) for k in differ if a[k] == a[k] and b[k] == b[k]), default=0.0)
    first = differ[0]
    line += f" (first: {first[1]} at iteration {first[0]}, {a[first]!r} -> {b[first]!r}; "
    line += f"largest finite difference {largest:.3g})"
  return line


def move_aside(workdir: str, suffix: str = "restored") -> str:
  """Moves a folder aside to <folder>.<suffix>[-N] (a run that lost its weights: "restored"; an
  evaluation to play again: "redo"), never over an earlier one; returns where."""
  aside, n = f"{workdir}.{suffix}", 1
  while os.path.exists(aside):
    n += 1
    aside = f"{workdir}.{suffix}-{n}"
  os.rename(workdir, aside)
  return aside


def cost_table(
  steps: Iterable[Step], seconds: Callable[[Step], float]
) -> list[tuple[str, int, float]]:
  """(step kind, how many, machine-hours each) of `steps` by the cost plan's `seconds`."""
  kinds: dict[str, list[float]] = {}
  for s in steps:
    name = s.kind if s.kind != "train" else f"train {s.arm}"
    kinds.setdefault(name, []).append(seconds(s) / 3600)
  return [(k, len(v), v[0]) for k, v in kinds.items()]


# ---------------------------------------------------------------------------- the loop
def clock(seconds: float) -> str:
  seconds = round(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


EVALUATIONS_LOCK = ".evaluations.lock"  # beside the stages' folders (runs/)


def evaluations_lock(out: str) -> str:
  """The lock every driver whose runs sit beside `out` (runs/<stage>) holds while one of its
  held-out evaluations plays: a 1,280-game evaluation holds 8-12 GB, and two at once on a 24 GB
  machine were killed by the kernel's OOM killer (2026-12-07)."""
  return os.path.join(os.path.dirname(os.path.abspath(out)), EVALUATIONS_LOCK)


def one_at_a_time(
  path: str | None, label: str, echo: Callable[[str], None] = print
) -> contextlib.AbstractContextManager[None]:
  """Holds the lock `path` (None: none; `envs.common.file_lock`) for the step `label`, saying once
  whom it waits for when another process holds it (the holder's label is kept in the file)."""
  if path is None:
    return contextlib.nullcontext()

  def waiting(holder: str) -> None:
    echo(
      f"{label}: waiting for {holder or 'another evaluation'} to finish (one held-out "
      f"evaluation at a time: {path})"
    )

  return file_lock(path, holder=f"{label} (pid {os.getpid()})", waiting=waiting)


class Retrain(NamedTuple):
  """An evaluation whose run lost its weights, played as the training of that run instead."""

  step: Step  # the training step
  note: str  # said before it starts
  after: Callable[[], str] | None = None  # said once it finished


def _later_seed(training: Step, evaluation: Step) -> bool:
  return None not in (training.seed, evaluation.seed) and training.seed > evaluation.seed


def play(
  plan: Callable[[], Sequence[Step]],
  *,
  done: Callable[[Step], bool] = step_done,
  runner: Callable[..., object] | None = None,
  echo: Callable[[str], None] = lambda line: print(line, flush=True),
  max_steps: int | None = None,
  lost: Callable[[Step], Retrain | None] = lambda step: None,
  record: Callable[[records.Tables], int] | None = None,
  records_to: str | None = None,
  total: Callable[[Sequence[Step]], object] = len,
  hours: Callable[[Step], float] | None = None,
  evaluations: str | None = None,
) -> int:
  """Plays the steps of `plan` (called again before each step: a decision may add steps) not yet
  `done`, one after another; returns the number of failed steps. A step's output goes to its
  results folder's <kind>.log, its wall time and attempts to run_status.json (run from the repo).
  `lost`: the training that replaces an evaluation whose run lost its weights, else None.
  `record`, when `records_to` is given: after each step, appends the finished steps to the tables
  there and returns how many. The start line counts the steps of `total` and, with `hours`, says
  the cost plan's hours of the step. `evaluations`: the lock an evaluation step holds while it
  plays (`evaluations_lock`), so that drivers side by side play one at a time; while another
  holds it, a training step still to do is played first, unless it is of a later seed than the
  evaluation (the driver then waits for the lock). Steps run through `stopping.STOP`
  unless `runner` is given: after a SIGTERM (`run_command`) the step playing stops at its safe
  point and no other step starts."""
  runner = runner or STOP.run
  failed: set[str] = set()
  played, start = 0, time.time()
  while max_steps is None or played < max_steps:
    steps = plan()
    todo = [s for s in steps if not done(s) and s.label not in failed]
    if not todo:
      break
    step, after = todo[0], None
    if step.kind not in ("train", "panels") and evaluations and lock_held(evaluations):
      training = next((s for s in todo if s.kind == "train"), None)
      if training is not None and not _later_seed(training, step):
        # trains meanwhile: a step's outcome does not hang on the order, but a plan played
        # seed-major keeps its seeds in order (seed 1 of every arm finishes before any seed 2)
        echo(
          f"{step.label}: another driver's evaluation holds {evaluations}; {training.label} first"
        )
        step = training
    retrain = lost(step)
    if retrain is not None:
      step, after = retrain.step, retrain.after
      echo(retrain.note)
    expected = "" if hours is None else f", expected {hours(step):.2f} h"
    echo(
      f"[{len(steps) - len(todo) + 1}/{total(steps)}] {step.label}: starting, elapsed "
      f"{clock(time.time() - start)}{expected}; output in {step.results}"
    )
    os.makedirs(step.results, exist_ok=True)
    log = os.path.join(step.results, f"{step.kind}.log")
    exclusive = None if step.kind in ("train", "panels") else evaluations
    with one_at_a_time(exclusive, step.label, echo):
      code = collect.run_and_record(
        step.command, step.results, cwd=REPO, log_path=log, runner=runner
      )
    played += 1
    if STOP.requested:
      again = "`run` plays it again (a training from its last checkpoint)"
      echo(f"{step.label}: stopped by SIGTERM (exit code {code}); " + (again if code else "done"))
    elif code:
      failed.add(step.label)
      echo(f"{step.label}: failed with exit code {code}; see {log}")
    elif after is not None:
      echo(after())
    if records_to and record is not None:
      with STOP.deferred():  # a SIGTERM now: the tables' appends end first
        added = record(records.Tables(records_to))
      echo(f"records: {added} finished step(s) appended to the tables in {records_to}")
    if STOP.requested:  # during the step, or during the appends just now
      break
  echo(f"stopped after {played} step(s) in {clock(time.time() - start)}; {len(failed)} failed")
  return len(failed)


# ---------------------------------------------------------------------------- the records
def step_key(
  step: Step, out: str, experiment: str, stage: int, arm: str | None = None
) -> dict[str, object]:
  """The tables' key of a step of a plan whose runs sit below `out` (`arm`: the step's own
  unless given)."""
  return {
    "experiment": experiment,
    "stage": stage,
    "run": os.path.relpath(step.workdir, out),
    "kind": step.kind,
    "arm": step.arm if arm is None else arm,
    "seed": step.seed,
    "lr": step.rate,
  }


def record(
  steps: Iterable[Step],
  out: str,
  tables: records.Tables,
  experiment: str,
  stage: int,
  *,
  done: Callable[[Step], bool] = step_done,
  arm: Callable[[Step], str] = lambda step: step.arm,
) -> int:
  """Appends every finished training or evaluation step of `steps` that the tables do not hold
  yet (a step is appended once: its manifest row comes last); returns how many."""
  added = 0
  for step in steps:
    if step.kind == "panels" or not done(step):
      continue
    key = step_key(step, out, experiment, stage, arm(step))
    if not tables.has(experiment, key["run"], step.kind):
      added += tables.add(*records.step_rows(step.results, **key))
  return added


def restore(tables: records.Tables, out: str, experiment: str) -> int:
  """Writes every step of `experiment` the tables hold back into `out` as run records (no
  weights; a file already there is kept); returns the files written. `run` then skips those steps
  and trains a run again before an evaluation needs its weights."""
  written = 0
  for row in tables.read("runs", experiment=experiment):
    folder = results_dir(os.path.join(out, row["run"]), row["kind"])
    written += records.restore_step(tables, experiment, row["run"], row["kind"], folder)
  return written


# ---------------------------------------------------------------------------- the command line
def add_flags(
  parser: argparse.ArgumentParser,
  *,
  out: str | None,
  out_help: str,
  dest: str | None = None,
  dest_help: str,
  resamples: int,
  resamples_help: str | None = None,
  smoke: bool = False,
) -> None:
  """The flags every driver takes: --out (default `out`), --smoke where it has a tiny budget,
  --max-steps, --records, --dest (default `dest`) and --resamples."""
  parser.add_argument("--out", default=out, help=out_help)
  if smoke:
    parser.add_argument("--smoke", action="store_true", help="the tiny budget (plan.SMOKE)")
  parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
  parser.add_argument(
    "--records",
    default=None,
    help=f"the tables' folder (report and restore read it, default {RECORDS}; run appends each "
    "finished step to it when given; record appends every finished step now)",
  )
  parser.add_argument(
    "--step",
    default=None,
    help="redo: the label of the finished evaluation step to play again, as `status` and `run` "
    'print it (e.g. "heldout grpo lr5.0e-04 seed 0")',
  )
  parser.add_argument("--dest", default=dest, help=dest_help)
  parser.add_argument("--resamples", type=int, default=resamples, help=resamples_help)


class Design(Protocol):
  out: str  # the runs' default parent folder


D = TypeVar("D", bound=Design)


def design_parser(description: str, actions: Sequence[str], dest: str) -> argparse.ArgumentParser:
  """The command line of a driver whose design has a tiny version (--smoke): the `actions`, the
  runs' folder (default: the design's) and the report's (default `dest`)."""
  parser = argparse.ArgumentParser(description=description.split("\n")[0])
  parser.add_argument("action", choices=actions)
  add_flags(
    parser,
    out=None,
    out_help="the runs' parent folder (default: the design's)",
    dest=dest,
    dest_help=f"where the report goes ({dest})",
    resamples=stats.RESAMPLES,
    smoke=True,
  )
  return parser


def design_of(args: argparse.Namespace, full: D, smoke: D) -> tuple[D, str]:
  """(the design: `smoke` with --smoke, else `full`; the runs' folder: --out, else the design's)."""
  design = smoke if args.smoke else full
  return design, args.out or design.out


def command_line(
  action: str,
  out: str,
  tables: records.Tables,
  *,
  restore: Callable[[records.Tables, str], int],
  record: Callable[[records.Tables], int],
  plan: Callable[[], Sequence[Step]],
  done: Callable[[Step], bool],
  status: Callable[[], str],
  cost: Callable[[], Sequence[tuple[str, int, float]]] | None = None,
  plan_notes: Callable[[Sequence[Step]], Iterable[str]] = lambda steps: (),
  redo: Callable[[], str] | None = None,
) -> int | None:
  """The actions every driver has, printed alike: `restore`, `record`, `plan` (each step's
  command, done or todo, then `plan_notes`), `cost`, `status`, `stop` and, where given, `redo`.
  Returns the exit code, or None for another action (the driver's own, and `run`:
  `run_command`)."""
  if action == "stop":
    return stopping.stop_driver(out)
  if action == "redo" and redo is not None:
    try:
      print(redo())
    except ValueError as e:
      print(f"redo: {e}", file=sys.stderr)
      return 2
  elif action == "restore":
    print(f"{restore(tables, out)} file(s) restored into {out}")
  elif action == "record":
    print(f"{record(tables)} step(s) appended to {tables.folder}")
  elif action == "plan":
    steps = plan()
    for step in steps:
      print(("done  " if done(step) else "todo  ") + " ".join(step.command))
    for line in plan_notes(steps):
      print(line)
  elif action == "cost" and cost is not None:
    total = 0.0
    for kind, n, hours in cost():
      total += n * hours
      print(f"{kind:22s} {n:3d} x {hours:5.2f} h = {n * hours:6.2f} h")
    print(f"{'total':22s}             {total:6.2f} machine-hours")
  elif action == "status":
    print(status())
  else:
    return None
  return 0


def design_actions(
  args: argparse.Namespace,
  design: Design,
  out: str,
  tables: records.Tables,
  plan: types.ModuleType,
  run: types.ModuleType,
  plan_notes: Callable[[Sequence[Step]], Iterable[str]] = lambda steps: (),
) -> int:
  """`command_line`, else `run_command`, of a driver with a design (`design_parser`; its own
  actions come first): `plan`, its plan module (plan, step_done, cost_table), and `run`, its run
  module (restore, record, status, run), each taking the design and the runs' folder."""
  code = command_line(
    args.action,
    out,
    tables,
    restore=run.restore,
    record=lambda tables: run.record(design, out, tables),
    plan=lambda: plan.plan(design, out, smoke=args.smoke),
    done=plan.step_done,
    status=lambda: run.status(design, out),
    cost=lambda: plan.cost_table(design),
    plan_notes=plan_notes,
    redo=lambda: redo_evaluation(
      args.step, plan.plan(design, out), out, tables, plan.EXPERIMENT, plan.step_done
    ),
  )
  if code is not None:
    return code
  return run_command(
    lambda: run.run(
      design, out, max_steps=args.max_steps, records_to=args.records, smoke=args.smoke
    ),
    out,
  )


def redo_evaluation(
  label: str | None,
  steps: Sequence[Step],
  out: str,
  tables: records.Tables,
  experiment: str,
  done: Callable[[Step], bool] = step_done,
) -> str:
  """`redo --step LABEL`: a finished evaluation step to be played again (its run lost episodes,
  or ran on a broken machine): its rows are withdrawn from `tables` and its results folder moved
  aside (<folder>.redo[-N], nothing deleted), so `run` plays it again in its place in the plan.
  Returns what was done; a ValueError names a label that is not a finished evaluation. The tables
  are rewritten: run it while no driver appends to them (between its steps, or stopped)."""
  evaluations = [s for s in steps if s.kind not in ("train", "panels") and done(s)]
  step = next((s for s in evaluations if s.label == label), None)
  if step is None:
    known = "; ".join(f'"{s.label}"' for s in evaluations) or "none yet"
    raise ValueError(
      f"--step={label!r} is not a finished evaluation step of this plan (a training run resumes "
      f"by itself). Fix: one of {known}"
    )
  removed = tables.withdraw(experiment, os.path.relpath(step.workdir, out), step.kind)
  aside = move_aside(step.results, "redo")
  return (
    f"{step.label}: {removed} row(s) withdrawn from the tables in {tables.folder}, its folder "
    f"moved to {aside}; `run` plays it again"
  )


AUTOGROUP = "/proc/self/autogroup"  # this process's session's scheduling group (tests move it)


def lowest_priority(autogroup: str | None = None) -> bool:
  """Puts this process's session at the lowest CPU priority where Linux groups processes by
  session (sched_autogroup; `autogroup`: default AUTOGROUP): there a step's `nice -n 19` ranks it
  only within the driver's own session, and the session competes with every other as an equal.
  True when it was set. Every process of the session is lowered with it."""
  try:
    with open(autogroup or AUTOGROUP, "w") as f:
      f.write("19")
    return True
  except OSError:  # no autogroup (another OS, or a kernel without it): nice alone applies
    return False


def run_command(run: Callable[[], int], out: str | None = None) -> int:
  """`run`: plays the plan (`run` returns its failed steps' number) at the lowest CPU priority
  (`lowest_priority`), this process's id in <out>/run.pid for `stop`. A SIGTERM (`stop`, kill)
  stops the step playing at its safe point (a training saves its last finished iteration) and
  the driver after it, exit code 143 (experiments.stopping). Exit code 1 when a step failed."""
  STOP.install()
  if out is not None:
    stopping.write_pid(out)
  lowest_priority()
  failed = run()
  return 128 + signal.SIGTERM if STOP.requested else 1 if failed else 0
