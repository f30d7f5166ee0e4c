r"""Finished runs beside the paper's table, and two arms against each other, as markdown.

  python -m sdar_jax.compare runs/sdar-3b                       # one run vs its paper row
  python -m sdar_jax.compare runs/ablation/sdar_vocab_s{0,1,2} runs/ablation/grpo_s{0,1,2}

Each run's final validation metrics go beside the figures its paper row reports (read from the
run's own config.json, set by configs/paper.py; a run of another config is shown without them),
with the environment's averaging rule, the differences, and what in the run's setup differs from
the paper's. With the runs of exactly two arms (run.arm, default algo.name) on common seeds, the
paired difference of final success and of the area under the success curve follows, over the
games both played (matched by game file), with its 95% two-way bootstrap interval, the bootstrap
p and the exact seed-level sign-flip test (sdar_jax.observe.stats). Nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sdar_jax.infra.errors import add_verbosity_argument, exit_on_user_error
from sdar_jax.observe import stats
from sdar_jax.observe.pairing import compare_runs


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m sdar_jax.compare", description=__doc__.splitlines()[0]
  )
  parser.add_argument("runs", nargs="+", help="run folders (a training run's --workdir)")
  parser.add_argument("--resamples", type=int, default=stats.RESAMPLES, help="bootstrap resamples")
  parser.add_argument("--rng_seed", type=int, default=stats.RNG_SEED, help="bootstrap RNG seed")
  parser.add_argument(
    "--arm",
    action="append",
    default=[],
    metavar="RUN_DIR=LABEL",
    help="a run's arm where its config has no run.arm (runs from before 2026-12-06: the arm "
    "column of the experiment's runs.csv); repeat per run",
  )
  add_verbosity_argument(parser)
  args = parser.parse_args(argv)
  # A CompareError prints "Cannot compare: ..." and exits with status 2.
  bad = [a for a in args.arm if "=" not in a]
  if bad:
    parser.error(f"--arm {bad[0]!r}: expected RUN_DIR=LABEL, e.g. --arm runs/x/seed0=grpo")
  labels = dict(a.split("=", 1) for a in args.arm)
  runs = compare_runs(args.runs, resamples=args.resamples, rng_seed=args.rng_seed, labels=labels)
  print(runs, end="")
  return 0


if __name__ == "__main__":
  sys.exit(main())
