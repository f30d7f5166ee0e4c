r"""Expands a config file's `sweep()` into training runs: prints the commands, or runs them;
`collect` merges the runs of a sweep into one table and plots.

  python launch/sweep.py --config=configs/alfworld.py:local=True                 # print 48 commands
  python launch/sweep.py --config=configs/alfworld.py:local=True --only algo.gate=gap --run
  python launch/sweep.py --config=configs/paper.py --rows --only env=alfworld    # paper table rows
  python launch/sweep.py collect --root=runs/sweep [--out=DIR]                  # table + plots

Each sweep point is a dict of dotted config keys ({"algo.beta": 2.5, ...}) turned into
`--config.<key>=<value>` overrides of `python -m sdar_jax.train`, with its own workdir
`<root>/<key=value,...>`. `--run` executes them one after another on this machine, each one's
output in `<workdir>/train.log`, its attempts and wall time in `<workdir>/run_status.json`; a
finished run (run_status.json says so, or its metrics reached train.total_steps) is skipped, an
interrupted one resumes from its latest checkpoint; the sweep is collected at the end. For a
cluster, pipe the printed commands to your scheduler and collect once they are done.

`collect` reads every run under --root (a directory with config.json and metrics.jsonl, however
deep) and writes `sweep.csv` and `sweep.md` (one row per run: algo, gate, beta, lambda, seed,
steps, validation success before / final / area under the curve, wall time) and `sweep.png`
(final validation success against beta and against lambda, one line per gate); see
sdar_jax/collect.py for the definitions.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import subprocess
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

from sdar_jax import collect  # noqa: E402 (after the sys.path line)


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


def workdir_of(cmd: list[str]) -> str:
  """The --workdir=... of a training command."""
  for arg in cmd:
    if arg.startswith("--workdir="):
      return arg.split("=", 1)[1]
  raise ValueError(f"command has no --workdir=...: {shlex.join(cmd)}")


def run_sequentially(cmds: list[list[str]], runner=subprocess.run) -> list[tuple[str, int]]:
  """Runs the commands one after another (finished runs skipped, see the module doc); returns
  (workdir, return code or "skipped") of each. A failed run does not stop the others."""
  results = []
  for i, cmd in enumerate(cmds):
    workdir = os.path.join(_REPO, workdir_of(cmd))
    state = collect.run_state(workdir)
    if state == "finished":
      print(f"# [{i + 1}/{len(cmds)}] {workdir}: finished, skipped", file=sys.stderr, flush=True)
      results.append((workdir, "skipped"))
      continue
    verb = "resuming" if state == "partial" else "running"
    log_path = os.path.join(workdir, "train.log")
    print(f"# [{i + 1}/{len(cmds)}] {verb}, output in {log_path}", file=sys.stderr, flush=True)
    os.makedirs(workdir, exist_ok=True)
    code = collect.run_and_record(cmd, workdir, cwd=_REPO, log_path=log_path, runner=runner)
    if code:
      print(f"# run failed (exit code {code}); see {log_path}", file=sys.stderr, flush=True)
    results.append((workdir, code))
  return results


def collect_main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(
    prog="launch/sweep.py collect", description="Merges the runs of a sweep into a table and plots."
  )
  parser.add_argument("--root", default="runs/sweep", help="the sweep's --root (runs below it)")
  parser.add_argument("--out", default=None, help="where sweep.csv/.md/.png go (default: --root)")
  args = parser.parse_args(argv)
  try:
    written = collect.collect_sweep(args.root, args.out)
  except FileNotFoundError as e:
    raise SystemExit(str(e)) from None
  for kind, path in written.items():
    print(f"{kind}: {path}")


def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv and argv[0] == "collect":
    return collect_main(argv[1:])
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
  for cmd in cmds:
    print(shlex.join(cmd))
  if args.run and cmds:
    results = run_sequentially(cmds)
    written = collect.collect_sweep(os.path.join(_REPO, args.root))
    print(f"# collected: {', '.join(written.values())}", file=sys.stderr)
    failed = [w for w, code in results if code not in (0, "skipped")]
    if failed:
      raise SystemExit(f"{len(failed)} run(s) failed: {failed}")


if __name__ == "__main__":
  main()
