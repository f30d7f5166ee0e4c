"""The powered ablation's command: run, status, plan, record, restore and report (see
experiments.powered.plan for the design and the commands)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from experiments import records, report, specs
from experiments.powered import plan as plan_mod
from experiments.powered import run as run_mod
from experiments.powered.plan import STAGES
from sdar_jax.observe import stats

RECORDS = "docs/results"  # the tables' folder


def spec(stage: int, dest: str | None = None) -> specs.Spec:
  """The report of a stage (experiments.specs.powered)."""
  return specs.powered(stage, dest)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=plan_mod.__doc__.split("\n")[0])
  parser.add_argument("action", choices=("run", "status", "plan", "record", "restore", "report"))
  parser.add_argument("--stage", type=int, choices=sorted(STAGES), default=1, help="which stage")
  parser.add_argument("--out", default="runs/powered", help="the runs' parent folder")
  parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
  parser.add_argument(
    "--records",
    default=None,
    help=f"the tables' folder (report and restore read it, default {RECORDS}; run appends each "
    "finished step to it when given; record appends every finished step now)",
  )
  parser.add_argument("--dest", default=None, help="where the report goes (default: the stage's)")
  parser.add_argument(
    "--resamples", type=int, default=stats.RESAMPLES, help="bootstrap resamples of the report"
  )
  parser.add_argument(
    "--before-stage-1-ends",
    action="store_true",
    help="run stage 2 although stage 1 has steps left (they then share the machine)",
  )
  parser.add_argument(
    "--adopt",
    default=None,
    help="run: a JSON file of rates an earlier search chose (arm -> chosen, source, search); "
    "those arms skip the search and train every seed at that rate",
  )
  args = parser.parse_args(argv)
  tables = records.Tables(args.records or RECORDS)
  if args.action == "report":
    print(report.report(tables, spec(args.stage, args.dest), resamples=args.resamples))
    return 0
  if args.action == "restore":
    print(f"{run_mod.restore(tables, args.out)} file(s) restored into {args.out}")
    return 0
  if args.action == "record":
    print(f"{run_mod.record(args.out, tables, args.stage)} step(s) appended to {tables.folder}")
    return 0
  if args.adopt:
    try:
      print(f"adopted rates: {plan_mod.adopt(args.out, args.adopt)}")
    except (OSError, ValueError) as e:
      print(f"--adopt={args.adopt}: {e}", file=sys.stderr)
      return 2
  if args.action == "plan":
    for step in plan_mod.plan(args.out, stage=args.stage):
      print(("done  " if plan_mod.step_done(step) else "todo  ") + " ".join(step.command))
    return 0
  if args.action == "status":
    print(run_mod.status(args.out, stage=args.stage))
    return 0
  if args.stage > 1 and not args.before_stage_1_ends and (left := plan_mod.steps_left(args.out, 1)):
    total = STAGES[1].total_with(tuple(plan_mod.adopted_rates(args.out)))
    print(
      f"stage {args.stage} not started: stage 1 has {left} of its {total} steps left in "
      f"{args.out}. Fix: wait until `status` says {total}/{total}, or pass "
      "--before-stage-1-ends to share the machine with it.",
      file=sys.stderr,
    )
    return 2
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # kill: the running step stops with it
  failed = run_mod.run(
    args.out, max_steps=args.max_steps, stage=args.stage, records_to=args.records
  )
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
