"""The contexts stage's command: run, status, plan, record, restore, cost and report (see
experiments.contexts.plan for the design and the commands)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from experiments import records
from experiments.contexts import plan as plan_mod
from experiments.contexts import report as report_mod
from experiments.contexts import run as run_mod
from sdar_jax.observe import stats

RECORDS = "docs/results"  # the tables' folder


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=plan_mod.__doc__.split("\n")[0])
  parser.add_argument(
    "action", choices=("run", "status", "plan", "record", "restore", "cost", "report")
  )
  parser.add_argument("--out", default=None, help="the runs' parent folder (default: the design's)")
  parser.add_argument("--smoke", action="store_true", help="the tiny budget (plan.SMOKE)")
  parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
  parser.add_argument(
    "--records",
    default=None,
    help=f"the tables' folder (report and restore read it, default {RECORDS}; run appends each "
    "finished step to it when given; record appends every finished step now)",
  )
  parser.add_argument("--dest", default=None, help=f"where the report goes ({report_mod.DEST})")
  parser.add_argument("--resamples", type=int, default=stats.RESAMPLES)
  args = parser.parse_args(argv)
  design = plan_mod.SMOKE if args.smoke else plan_mod.FULL
  out = args.out or design.out
  tables = records.Tables(args.records or RECORDS)
  if args.action == "report":
    dest = args.dest or report_mod.DEST
    print(
      report_mod.report(
        tables, dest, args.resamples, seeds=design.seeds, pilot_seeds=design.pilot_seeds
      )
    )
    return 0
  if args.action == "restore":
    print(f"{run_mod.restore(tables, out)} file(s) restored into {out}")
    return 0
  if args.action == "record":
    print(f"{run_mod.record(design, out, tables)} step(s) appended to {tables.folder}")
    return 0
  if args.action == "plan":
    steps = plan_mod.plan(design, out, smoke=args.smoke)
    for step in steps:
      print(("done  " if plan_mod.step_done(step) else "todo  ") + " ".join(step.command))
    if len(steps) < plan_mod.total_steps(design):
      print(
        f"... and {plan_mod.total_steps(design) - len(steps)} more once the pilot decides the rate"
      )
    print(run_mod.vocab_line(out))
    print(run_mod.rate_line(out))
    print("\n".join(plan_mod.power_lines(design)))
    return 0
  if args.action == "cost":
    total = 0.0
    for kind, n, hours in plan_mod.cost_table(design):
      total += n * hours
      print(f"{kind:22s} {n:3d} x {hours:5.2f} h = {n * hours:6.2f} h")
    print(f"{'total':22s}             {total:6.2f} machine-hours")
    return 0
  if args.action == "status":
    print(run_mod.status(design, out))
    return 0
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # kill: the running step stops with it
  failed = run_mod.run(
    design, out, max_steps=args.max_steps, records_to=args.records, smoke=args.smoke
  )
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
