r"""Expands a config file's `sweep()` into training runs: prints the commands, or runs them;
`collect` merges the runs of a sweep into one table and plots.

  python launch/sweep.py --config=configs/alfworld.py:local=True                 # print 39 commands
  python launch/sweep.py --config=configs/alfworld.py:local=True --only algo.gate=gap --run
  python launch/sweep.py --config=configs/paper.py --rows --only env=alfworld    # paper table rows
  python launch/sweep.py collect --root=runs/sweep [--out=DIR]                  # table + plots
  python launch/sweep.py --config=configs/alfworld.py --emit=slurm \
      --job-args="--nodes=2 --gpus-per-node=8"                                 # sbatch lines
  python launch/sweep.py --config=configs/alfworld.py --emit=tpu --root=gs://b/sweep  # TPU pods

Each sweep point is a dict of dotted config keys ({"algo.beta": 2.5, ...}) turned into
`--config.<key>=<value>` overrides of `python -m sdar_jax.train`, with its own workdir
`<root>/<key=value,...>`. A key the point's other settings make inert is dropped and repeated
points are run once (`distinct_points`): β with a gate that ignores it (the constant gate), gate,
β and form when the distillation term is off (algo.distill "none", or λ = 0) or is Skill-SD's
(which has no gate). `--run` executes them one after another on this machine, each one's
output in `<workdir>/train.log`, its attempts and wall time in `<workdir>/run_status.json`; a
finished run (run_status.json says so, or its metrics reached train.iterations) is skipped, an
interrupted one resumes from its latest checkpoint; the sweep is collected at the end.

`--emit=slurm|tpu` prints one job per run instead, to run side by side: `slurm` an sbatch
submission of `launch/gpu.sh --slurm` (`--job-args` are extra sbatch options, e.g. nodes and
GPUs; the job's log goes to `<workdir>/slurm-<job id>.log`), `tpu` a `launch/tpu_pod.sh` call
on its own slice named `$TPU_NAME-r<i>` (ZONE, ACCELERATOR, ... come from the environment; the
root should be shared storage, gs://...). Collect once the jobs are done.

`collect` reads every run under --root (a directory with config.json and metrics.jsonl, however
deep) and writes `sweep.csv` and `sweep.md` (one row per run: algo, gate, beta, lambda, seed,
steps, validation success before / final / area under the curve, wall time) and `sweep.png`
(final validation success against beta and against lambda, one line per gate); see
sdar_jax/observe/collect.py for the definitions.
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

from sdar_jax.algos import BETA_FREE_GATES  # noqa: E402 (after the sys.path line)
from sdar_jax.observe import collect  # noqa: E402

_GATE_KEYS = ("algo.gate", "algo.beta", "algo.form")


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


def inert_keys(point: dict, base=None) -> set[str]:
  """The keys of sweep point `point` that change nothing given its other settings (or, for a
  setting the point leaves out, the config `base`'s value)."""

  def value(key: str):
    if key in point:
      return point[key]
    try:
      return base[key.split(".")[0]][key.split(".", 1)[1]] if base is not None else None
    except (KeyError, AttributeError):
      return None

  inert = set()
  lam = value("algo.lam")
  if value("algo.distill") in ("none", "skill_sd") or (lam is not None and float(lam) == 0.0):
    inert.update(_GATE_KEYS)  # no gated term: gate, β and form are never read
  elif value("algo.gate") in BETA_FREE_GATES:
    inert.add("algo.beta")
  return inert & set(point)


def distinct_points(points: list[dict], base=None) -> list[dict]:
  """`points` without their inert keys (`inert_keys`), each distinct run once, in order."""
  out, seen = [], set()
  for point in points:
    inert = inert_keys(point, base)
    kept = {k: v for k, v in point.items() if k not in inert}
    key = tuple(sorted((k, str(v)) for k, v in kept.items()))
    if key not in seen:
      seen.add(key)
      out.append(kept)
  return out


def commands(
  config_spec: str,
  root: str,
  only: list[str],
  rows: bool,
  extra: list[str],
  model_dirs: dict[str, str] | None = None,
) -> list[list[str]]:
  """The runs' command lines. With `rows`, `model_dirs` (preset name -> the model's folder) gives
  each row of that model `--config.model.path=<folder>`; given at all, the rows of the models it
  does not name are left out (they could not start: the paper's rows need real weights)."""
  path, _, arg = config_spec.partition(":")
  module = _module(path)
  out = []
  if rows:  # configs/paper.py: one run per table row argument, plus the config's own argument
    given = [kv for kv in (p.strip() for p in arg.split(",")) if kv]
    for row_arg in module.rows():
      point = dict(kv.split("=", 1) for kv in row_arg.split(","))
      clash = sorted(k for k in (kv.partition("=")[0] for kv in given) if k in point)
      if clash:
        raise SystemExit(
          f"--config={config_spec} with --rows: {', '.join(clash)} is set by every table row. "
          f"Fix: pick rows with --only {clash[0]}=<value>, and keep in the config argument only "
          "what the rows leave open (e.g. local=True)."
        )
      if model_dirs and point.get("model") not in model_dirs:
        continue
      weights = [f"--config.model.path={model_dirs[point['model']]}"] if model_dirs else []
      if _matches(point, only):
        out.append(
          [
            sys.executable,
            "-m",
            "sdar_jax.train",
            f"--config={path}:{','.join([row_arg, *given])}",
            *weights,
            f"--workdir={os.path.join(root, row_arg.replace('=', '-').replace(',', '_'))}",
            *extra,
          ]
        )
    return out
  if not hasattr(module, "sweep"):
    raise SystemExit(f"{path} has no sweep() function.")
  # the config the points override: a setting a point leaves out (e.g. its algo preset's gate)
  # decides what is inert as well
  base = (
    (module.get_config(arg) if arg else module.get_config())
    if hasattr(module, "get_config")
    else None
  )
  for point in distinct_points(module.sweep(), base):
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


EMIT_KINDS = ("slurm", "tpu")


def emit_jobs(cmds: list[list[str]], kind: str, job_args: str = "") -> list[str]:
  """One shell line per training command: a SLURM submission (`kind="slurm"`) or a TPU pod
  launch (`kind="tpu"`) of the same config, workdir and overrides (see the module doc)."""
  if kind not in EMIT_KINDS:
    raise ValueError(f"--emit={kind!r}; choose one of {EMIT_KINDS}.")
  lines = []
  for i, cmd in enumerate(cmds):
    train_args = cmd[cmd.index("sdar_jax.train") + 1 :]
    config = next(a.split("=", 1)[1] for a in train_args if a.startswith("--config="))
    workdir = workdir_of(cmd)
    overrides = [a for a in train_args if not a.startswith(("--config=", "--workdir="))]
    launch = [config, workdir, *overrides]
    if kind == "slurm":
      wrapped = shlex.join(["launch/gpu.sh", "--slurm", *launch])
      sbatch = ["sbatch", f"--job-name=sdar-{i}", f"--output={workdir}/slurm-%j.log"]
      sbatch += shlex.split(job_args) + [f"--wrap={wrapped}"]
      lines.append(f"mkdir -p {shlex.quote(workdir)} && {shlex.join(sbatch)}")
    else:
      lines.append(f'TPU_NAME="$TPU_NAME-r{i}" {shlex.join(["launch/tpu_pod.sh", *launch])}')
  return lines


def collect_main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(
    prog="launch/sweep.py collect", description="Merges the runs of a sweep into a table and plots."
  )
  parser.add_argument("--root", default="runs/sweep", help="the sweep's --root (runs below it)")
  parser.add_argument("--out", default=None, help="where sweep.csv/.md/.png go (default: --root)")
  parser.add_argument(
    "--overwrite", action="store_true", help="replace a table that holds more finished runs"
  )
  args = parser.parse_args(argv)
  try:
    written = collect.collect_sweep(args.root, args.out, overwrite=args.overwrite)
  except (FileNotFoundError, collect.ReportShrinkError) as e:
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
  parser.add_argument(
    "--model_dir",
    action="append",
    default=[],
    metavar="PRESET=FOLDER",
    help="--rows: the Hugging Face folder of a model preset (repeatable), e.g. "
    "qwen2.5-3b=/data/Qwen2.5-3B-Instruct; rows of other models are left out",
  )
  parser.add_argument("--run", action="store_true", help="run the commands here, sequentially")
  parser.add_argument("--emit", choices=EMIT_KINDS, help="print one SLURM / TPU pod job per run")
  parser.add_argument("--job-args", default="", help="--emit=slurm: extra sbatch options")
  args, extra = parser.parse_known_args(argv)
  if args.emit and args.run:
    raise SystemExit("--emit prints jobs for a scheduler; --run runs here. Fix: pass one of them.")
  bad = [d for d in args.model_dir if "=" not in d]
  if bad:
    raise SystemExit(f"--model_dir {bad[0]!r}: expected PRESET=FOLDER, e.g. qwen2.5-3b=/data/q3b.")
  model_dirs = dict(d.split("=", 1) for d in args.model_dir)
  cmds = commands(args.config, args.root, args.only, args.rows, extra, model_dirs)
  print(f"# {len(cmds)} run(s)", file=sys.stderr)
  if args.rows and not model_dirs and not any("model.path" in e for e in extra):
    print(
      "# the paper's rows need real weights: each command is refused without model.path. "
      "Pass --model_dir PRESET=FOLDER per model (docs/scaling.md).",
      file=sys.stderr,
    )
  for line in emit_jobs(cmds, args.emit, args.job_args) if args.emit else map(shlex.join, cmds):
    print(line)
  if args.run and cmds:
    results = run_sequentially(cmds)
    written = collect.collect_sweep(os.path.join(_REPO, args.root))
    print(f"# collected: {', '.join(written.values())}", file=sys.stderr)
    failed = [w for w, code in results if code not in (0, "skipped")]
    if failed:
      raise SystemExit(f"{len(failed)} run(s) failed: {failed}")


if __name__ == "__main__":
  main()
