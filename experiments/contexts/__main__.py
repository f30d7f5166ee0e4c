"""The contexts stage's command: run, status, plan, record, restore, cost, report, redo and stop
(see experiments.contexts.plan for the design and the commands)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from experiments import driver, records
from experiments.contexts import plan as plan_mod
from experiments.contexts import report as report_mod
from experiments.contexts import run as run_mod
from experiments.driver import RECORDS


def main(argv: Sequence[str] | None = None) -> int:
  actions = ("run", "status", "plan", "record", "restore", "cost", "report", "redo", "stop")
  args = driver.design_parser(plan_mod.__doc__, actions, report_mod.DEST).parse_args(argv)
  design, out = driver.design_of(args, plan_mod.FULL, plan_mod.SMOKE)
  tables = records.Tables(args.records or RECORDS)
  if args.action == "report":
    print(
      report_mod.report(
        tables, args.dest, args.resamples, seeds=design.seeds, pilot_seeds=design.pilot_seeds
      )
    )
    return 0

  def plan_notes(steps: Sequence[plan_mod.Step]) -> list[str]:
    """After the plan's steps: how many the rate adds, the two decisions and the power."""
    more = plan_mod.total_steps(design) - len(steps)
    return [
      *([f"... and {more} more once the pilot decides the rate"] if more > 0 else []),
      run_mod.vocab_line(out),
      run_mod.rate_line(out),
      *plan_mod.power_lines(design),
    ]

  return driver.design_actions(args, design, out, tables, plan_mod, run_mod, plan_notes)


if __name__ == "__main__":
  sys.exit(main())
