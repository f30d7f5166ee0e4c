r"""Expands a config file's `sweep()` into training runs: prints the commands, or runs them.

  python launch/sweep.py --config=configs/alfworld.py:local=True                 # print 48 commands
  python launch/sweep.py --config=configs/alfworld.py:local=True --only algo.gate=gap --run
  python launch/sweep.py --config=configs/paper.py --rows --only env=alfworld    # paper table rows

Each sweep point is a dict of dotted config keys ({"algo.beta": 2.5, ...}) turned into
`--config.<key>=<value>` overrides of `python -m sdar_jax.train`, with its own workdir
`<root>/<key=value,...>`. `--run` executes them one after another on this machine (a finished
run is skipped: its workdir has a checkpoint at the last step and the trainer resumes otherwise);
for a cluster, pipe the printed commands to your scheduler.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import subprocess
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module(path: str):
  spec = importlib.util.spec_from_file_location("_sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, _REPO)
  spec.loader.exec_module(module)
  return module


def _matches(point: dict, only: list[str]) -> bool:
  for cond in only:
    key, _, value = cond.partition("=")
    if str(point.get(key)) != value:
      return False
  return True


def commands(
  config_spec: str, root: str, only: list[str], rows: bool, extra: list[str]
) -> list[list[str]]:
  path, _, arg = config_spec.partition(":")
  module = _module(path)
  out = []
  if rows:  # configs/paper.py: one run per table row argument
    for row_arg in module.rows():
      point = dict(kv.split("=", 1) for kv in row_arg.split(","))
      if _matches(point, only):
        out.append(
          [
            sys.executable,
            "-m",
            "sdar_jax.train",
            f"--config={path}:{row_arg}",
            f"--workdir={os.path.join(root, row_arg.replace('=', '-').replace(',', '_'))}",
            *extra,
          ]
        )
    return out
  if not hasattr(module, "sweep"):
    raise SystemExit(f"{path} has no sweep() function.")
  for point in module.sweep():
    if not _matches(point, only):
      continue
    name = ",".join(f"{k.split('.')[-1]}={v}" for k, v in point.items())
    cmd = [sys.executable, "-m", "sdar_jax.train", f"--config={config_spec}"]
    cmd += [f"--config.{k}={v}" for k, v in point.items()]
    cmd += [f"--workdir={os.path.join(root, name)}", *extra]
    out.append(cmd)
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--config", required=True, help="config file[:arg] with a sweep() (or rows())"
  )
  parser.add_argument("--root", default="runs/sweep", help="parent of the runs' workdirs")
  parser.add_argument("--only", action="append", default=[], help="key=value filter (repeatable)")
  parser.add_argument("--rows", action="store_true", help="use rows() (configs/paper.py)")
  parser.add_argument("--run", action="store_true", help="run the commands here, sequentially")
  args, extra = parser.parse_known_args(argv)
  cmds = commands(args.config, args.root, args.only, args.rows, extra)
  print(f"# {len(cmds)} run(s)", file=sys.stderr)
  for i, cmd in enumerate(cmds):
    print(shlex.join(cmd))
    if args.run:
      print(f"# [{i + 1}/{len(cmds)}] running", file=sys.stderr, flush=True)
      subprocess.run(cmd, check=True, cwd=_REPO)


if __name__ == "__main__":
  main()
