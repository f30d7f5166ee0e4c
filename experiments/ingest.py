r"""Turns the run folders of the first experiments into the tidy tables (experiments.records).

    python -m experiments.ingest --dest docs/results      # from a checkout of 1d2997d's folders

The folders were committed up to 1d2997d: docs/results/powered_state/ (both powered stages: every
training run with its validation outcomes and metrics, every held-out evaluation, the commit
check, the warm-started policy's evaluations) and docs/results/ablation/ (the demo's three-seed
ablation). They left the repository once their rows were in the tables; each manifest row names
where its files are at that commit (`files_at`), e.g. `git show 1d2997d:<path>/metrics.jsonl`.
Run from a worktree of that commit (`git worktree add --detach /tmp/records 1d2997d`) with
--root pointing at it; the rows come out in a fixed order, so the tables are the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence

from experiments import records

HOLDER = "1d2997d"  # the last commit whose tree holds the run folders
POWERED = "docs/results/powered_state"
ABLATION = "docs/results/ablation"
STAGE1_ARMS = ("grpo", "sdar_vocab", "sdar_vocab_noskills")
# the commit that recorded the demo ablation's runs (their run records predate commit tracking)
ABLATION_COMMIT = "07d41be"
_RATE = re.compile(r"^lr(\d\.\de[-+]\d\d)$")
_SEED = re.compile(r"^seed(\d+)$")


def _add(tables: records.Tables, folder: str, root: str, **key) -> int:
  if not os.path.isdir(folder):
    return 0
  rel = os.path.relpath(folder, root)
  outcomes, metrics, manifest = records.step_rows(folder, files_at=f"{HOLDER}:{rel}", **key)
  return int(tables.add(outcomes, metrics, manifest))


def powered(root: str, tables: records.Tables) -> int:
  """Both powered stages' steps from <root>/POWERED; returns the steps added."""
  base = os.path.join(root, POWERED)
  added = 0
  for kind, stage in (("heldout", 1), ("heldout_skills", 2)):
    added += _add(
      tables, os.path.join(base, "initial", kind), root, experiment="powered", stage=stage,
      run="initial", kind=kind, arm="initial", seed=None, lr=None,
    )  # fmt: skip
  runs = []
  for arm in sorted(os.listdir(base)):
    if arm in ("initial",) or not os.path.isdir(os.path.join(base, arm)):
      continue
    parent = os.path.join(base, arm, "grpo") if arm == "commit_check" else os.path.join(base, arm)
    for rate in sorted(os.listdir(parent)):
      for seed in sorted(os.listdir(os.path.join(parent, rate)), key=lambda s: (len(s), s)):
        if _RATE.match(rate) and _SEED.match(seed):
          runs.append((arm, os.path.join(parent, rate, seed), float(_RATE.match(rate)[1])))
  for arm, folder, lr in runs:
    seed = int(_SEED.match(os.path.basename(folder))[1])
    run = os.path.relpath(folder, base)
    label = "grpo" if arm == "commit_check" else arm
    stage = 1 if arm in STAGE1_ARMS else 2
    key = {"experiment": "powered", "run": run, "arm": label, "seed": seed, "lr": lr}
    added += _add(tables, folder, root, stage=stage, kind="train", **key)
    added += _add(tables, os.path.join(folder, "heldout"), root, stage=stage, kind="heldout", **key)
    added += _add(
      tables, os.path.join(folder, "heldout_skills"), root, stage=2, kind="heldout_skills", **key
    )
  return added


def ablation(root: str, tables: records.Tables) -> int:
  """The demo ablation's runs from <root>/ABLATION (no run records: the commit and the rate come
  from ABLATION_COMMIT and each run's config.json)."""
  base = os.path.join(root, ABLATION)
  added = 0
  for arm in sorted(os.listdir(base)):
    for seed in sorted(os.listdir(os.path.join(base, arm))):
      folder = os.path.join(base, arm, seed)
      with open(os.path.join(folder, "config.json")) as f:
        lr = float(json.load(f)["optim"]["lr"])
      added += _add(
        tables, folder, root, experiment="demo_ablation", stage=1, run=f"{arm}/{seed}",
        kind="train", arm=arm, seed=int(_SEED.match(seed)[1]), lr=lr, commit=ABLATION_COMMIT,
      )  # fmt: skip
  return added


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--root", default=".", help="a checkout holding the folders (1d2997d)")
  parser.add_argument("--dest", default="docs/results", help="where the tables go")
  args = parser.parse_args(argv)
  if not os.path.isdir(os.path.join(args.root, POWERED)):
    print(
      f"--root={args.root} has no {POWERED}. Fix: git worktree add --detach /tmp/records "
      f"{HOLDER}, then --root=/tmp/records.",
      file=sys.stderr,
    )
    return 2
  tables = records.Tables(args.dest)
  n = powered(args.root, tables) + ablation(args.root, tables)
  print(f"{n} step(s) added to {args.dest}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
