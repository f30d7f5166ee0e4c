"""Builds an environment's tfds dataset (ArrayRecord) from its real files or its generated data.

    python -m envs.datasets webshop --out data/tfds                       # generated catalogue
    python -m envs.datasets webshop --out data/tfds --data_dir /data/webshop [--full] [--human_goals]
    python -m envs.datasets search_qa --out data/tfds                     # generated world
    python -m envs.datasets search_qa --out data/tfds --data_dir /data/search_r1 [--corpus FILE]
    python -m envs.datasets alfworld --out data/tfds --data_dir /data/alfworld

It prints the dataset's folder; train on it with --config.env.data_dir=<out> (all three; ALFWorld's
game files stay in the --data_dir folder the dataset lists them from).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from envs.datasets import build
from envs.errors import add_verbosity_argument, exit_on_env_error


@exit_on_env_error
def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("env", choices=("webshop", "search_qa", "alfworld"))
  parser.add_argument("--out", required=True, help="tfds data folder to write into")
  parser.add_argument("--data_dir", default=None, help="the real files (default: generated data)")
  parser.add_argument("--full", action="store_true", help="webshop: items_shuffle.json (not _1000)")
  parser.add_argument("--human_goals", action="store_true", help="webshop: human instructions")
  parser.add_argument("--data_seed", type=int, default=None, help="webshop 233, search_qa 0")
  parser.add_argument("--corpus", default=None, help="search_qa: a wiki-18 style .jsonl corpus")
  add_verbosity_argument(parser)
  args = parser.parse_args(argv)
  for flag in ("data_dir", "corpus"):  # a given path that is not there is a mistake, not a default
    given = getattr(args, flag)
    if given is not None and not os.path.exists(os.path.expanduser(given)):
      parser.error(
        f"--{flag}={given}: no such {'folder' if flag == 'data_dir' else 'file'}. Fix: point it "
        f"at the real {args.env} files, or leave --{flag} out to build from the generated data."
      )
  settings = {}
  if args.env == "webshop":
    settings.update(use_small=not args.full, human_goals=args.human_goals)
  if args.env == "search_qa" and args.corpus:
    settings["corpus"] = args.corpus
  if args.data_seed is not None:
    settings["data_seed"] = args.data_seed
  print(build(args.env, args.out, args.data_dir, **settings))


if __name__ == "__main__":
  main()
