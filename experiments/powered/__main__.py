"""The powered ablation's command: run, status, plan, record, restore, report and stop (see
experiments.powered.plan for the design and the commands)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from experiments import driver, records, report, specs
from experiments.driver import RECORDS
from experiments.powered import plan as plan_mod
from experiments.powered import run as run_mod
from experiments.powered.plan import STAGES
from sdar_jax.observe import stats


def spec(stage: int, dest: str | None = None) -> specs.Spec:
  """The report of a stage (experiments.specs.powered)."""
  return specs.powered(stage, dest)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=plan_mod.__doc__.split("\n")[0])
  parser.add_argument(
    "action", choices=("run", "status", "plan", "record", "restore", "report", "stop")
  )
  parser.add_argument("--stage", type=int, choices=sorted(STAGES), default=1, help="which stage")
  driver.add_flags(
    parser,
    out="runs/powered",
    out_help="the runs' parent folder",
    dest_help="where the report goes (default: the stage's)",
    resamples=stats.RESAMPLES,
    resamples_help="bootstrap resamples of the report",
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
  out, tables = args.out, records.Tables(args.records or RECORDS)
  if args.action == "report":
    print(report.report(tables, spec(args.stage, args.dest), resamples=args.resamples))
    return 0
  if args.adopt and args.action in ("run", "plan", "status"):
    try:
      print(f"adopted rates: {plan_mod.adopt(out, args.adopt)}")
    except (OSError, ValueError) as e:
      print(f"--adopt={args.adopt}: {e}", file=sys.stderr)
      return 2
  code = driver.command_line(
    args.action,
    out,
    tables,
    restore=run_mod.restore,
    record=lambda tables: run_mod.record(out, tables, args.stage),
    plan=lambda: plan_mod.plan(out, stage=args.stage),
    done=plan_mod.step_done,
    status=lambda: run_mod.status(out, stage=args.stage),
  )
  if code is not None:
    return code
  if args.stage > 1 and not args.before_stage_1_ends and (left := plan_mod.steps_left(out, 1)):
    total = STAGES[1].total_with(tuple(plan_mod.adopted_rates(out)))
    print(
      f"stage {args.stage} not started: stage 1 has {left} of its {total} steps left in "
      f"{out}. Fix: wait until `status` says {total}/{total}, or pass "
      "--before-stage-1-ends to share the machine with it.",
      file=sys.stderr,
    )
    return 2
  return driver.run_command(
    lambda: run_mod.run(out, max_steps=args.max_steps, stage=args.stage, records_to=args.records),
    out,
  )


if __name__ == "__main__":
  sys.exit(main())
