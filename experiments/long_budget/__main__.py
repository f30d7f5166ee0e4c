"""The long-budget stage's command: run, status, plan, panels, record, restore, cost, report, redo
and stop (see experiments.long_budget.plan for the design and the commands)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from experiments import driver, records
from experiments.driver import RECORDS
from experiments.long_budget import plan as plan_mod
from experiments.long_budget import report as report_mod
from experiments.long_budget import run as run_mod


def main(argv: Sequence[str] | None = None) -> int:
  actions = (
    "run", "status", "plan", "panels", "record", "restore", "cost", "report", "redo", "stop"
  )  # fmt: skip
  args = driver.design_parser(plan_mod.__doc__, actions, report_mod.DEST).parse_args(argv)
  design, out = driver.design_of(args, plan_mod.FULL, plan_mod.SMOKE)
  tables = records.Tables(args.records or RECORDS)
  if args.action == "report":
    print(report_mod.report(tables, args.dest, resamples=args.resamples, seeds=design.seeds))
    return 0
  if args.action == "panels":
    try:
      print(run_mod.make_panels(design, out))
    except RuntimeError as e:
      print(e, file=sys.stderr)
      return 1
    return 0
  return driver.design_actions(args, design, out, tables, plan_mod, run_mod)


if __name__ == "__main__":
  sys.exit(main())
