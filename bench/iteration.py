"""Training-iteration wall time of the demo setup: serial vs overlapped rollouts vs asynchronous.

    .venv/bin/python bench/iteration.py [--iterations 6] [--modes serial,halves,async]
        [--config configs/default.py] [--out DIR]

Each mode is a real training run of the demo (configs/default.py: the committed warm-started
policy, 2 generated ALFWorld tasks x 8 episodes per iteration, up to 15 turns, SDAR update on
updates of 32 turn-samples) for `--iterations` iterations, without evaluation or checkpoints,
started as `python -m sdar_jax.train` in its own process with the mode's overrides:

* serial: `rollout.overlap=off`, `train.max_staleness=0` (every env steps, then the whole batch
  decodes; the update waits for the rollout and the rollout for the update);
* halves: `rollout.overlap=halves` (one half of the episodes decodes while the other's envs step);
* async: `train.max_staleness=1` (a rollout thread plays iteration k+1 while k updates);
* async_halves: both;
* inproc: the serial loop with the environments in the trainer's process (`env.num_workers=0`);
* dp2 / tp2: the serial loop on a 2-device CPU mesh (one device per core), the batch split (dp2)
  or the model's heads, MLP columns and vocabulary (tp2). The same algorithm and samples as serial;
  only float rounding differs.

Reported per mode: the median of `perf/iteration_seconds` over the iterations after the first
(the first compiles the sampler and the update), the mean env-wait and compile shares of those
iterations, the whole process's wall time, and the speed-up of the median against the serial
mode's. In the asynchronous modes an iteration's seconds are the main thread's: the update plus
the wait for the next queued rollout, i.e. the period at which iterations complete. Every mode
plays the same tasks (the same seed); the asynchronous modes train on samples one version old,
so their episodes (and lengths) drift from the serial run's after the first iteration. The modes
run one after another, so background load does not hit them alike: the load average is printed
before and after each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from sdar_jax.observe.metrics import read_history

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEVICES = "cpu_devices"  # not a config key: how many CPU devices the mode's process gets
MODES: dict[str, dict[str, object]] = {
  "serial": {"rollout.overlap": "off", "train.max_staleness": 0},
  "halves": {"rollout.overlap": "halves", "train.max_staleness": 0},
  "async": {"rollout.overlap": "off", "train.max_staleness": 1},
  "async_halves": {"rollout.overlap": "halves", "train.max_staleness": 1},
  # The serial loop on two CPU devices (XLA_FLAGS --xla_force_host_platform_device_count=2), each
  # device's programs on its own core: the batch split (dp2) or heads, MLP columns and vocabulary
  # split (tp2, tensor parallel: each core streams half the weights).
  # The serial loop with the envs in the trainer's process (no worker processes, no pickling).
  "inproc": {"rollout.overlap": "off", "train.max_staleness": 0, "env.num_workers": 0},
  "dp2": {"mesh.data": 2, "mesh.tensor": 1, DEVICES: 2},
  "tp2": {"mesh.data": 1, "mesh.tensor": 2, DEVICES: 2},
}


def mode_command(config: str, workdir: str, iterations: int, overrides: dict) -> list[str]:
  """The `python -m sdar_jax.train` command line of one mode's run."""
  flags = {
    "train.iterations": iterations,
    "train.eval_every": 0,
    "train.eval_before_train": False,
    "checkpoint.every": 0,
    "checkpoint.export_hf": False,
    "logging.plots": False,
    **overrides,
  }
  return [
    sys.executable,
    "-m",
    "sdar_jax.train",
    f"--config={config}",
    f"--workdir={workdir}",
    *(f"--config.{key}={value}" for key, value in flags.items() if key != DEVICES),
  ]


def summarize(rows: list[dict]) -> dict[str, float]:
  """Median iteration seconds and mean shares over the iterations after the first."""
  timed = [r for r in rows if "perf/iteration_seconds" in r]
  if len(timed) < 2:
    raise ValueError(
      f"only {len(timed)} timed iteration(s) in the run: need 2 or more; pass --iterations >= 2"
    )
  steady = sorted(timed, key=lambda r: r["step"])[1:]
  return {
    "median_s": statistics.median(r["perf/iteration_seconds"] for r in steady),
    "env_wait": statistics.fmean(r["perf/env_wait_share"] for r in steady),
    "compile": statistics.fmean(r["perf/compile_share"] for r in steady),
    "iterations": len(steady),
  }


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--iterations", type=int, default=6, help="training iterations per mode")
  parser.add_argument("--modes", default="serial,halves,async", help=f"of {', '.join(MODES)}")
  parser.add_argument("--config", default="configs/default.py")
  parser.add_argument("--out", help="keep the runs here (default: a temporary folder)")
  args = parser.parse_args()
  modes = [m for m in args.modes.split(",") if m]
  unknown = [m for m in modes if m not in MODES]
  if unknown:
    parser.error(f"--modes: unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
  if args.iterations < 2:
    parser.error(f"--iterations={args.iterations}: need >= 2 (the first one compiles)")

  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.setdefault("JAX_PLATFORMS", "cpu")
  results = {}
  with tempfile.TemporaryDirectory() as tmp:
    out = args.out or tmp
    for mode in modes:
      workdir = os.path.join(out, mode)
      if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
        parser.error(f"{workdir} already holds a run; pass another --out")
      os.makedirs(workdir, exist_ok=True)
      cmd = mode_command(args.config, workdir, args.iterations, MODES[mode])
      load = os.getloadavg()[0]
      print(f"{mode}: {args.iterations} iterations, load average {load:.2f} ...", flush=True)
      start = time.perf_counter()
      devices = int(MODES[mode].get(DEVICES, 1))
      mode_env = dict(env)
      if devices > 1:
        mode_env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
      with open(os.path.join(workdir, "train.log"), "w") as log:
        code = subprocess.run(
          cmd, check=False, cwd=ROOT, env=mode_env, stdout=log, stderr=subprocess.STDOUT
        ).returncode
      wall = time.perf_counter() - start
      if code != 0:
        print(f"{mode}: the run failed (exit {code}); its output: {workdir}/train.log")
        return 1
      results[mode] = {
        **summarize(read_history(os.path.join(workdir, "metrics.jsonl"))),
        "wall_s": wall,
        "load": (load, os.getloadavg()[0]),
      }
      print(f"{mode}: done in {wall:.0f}s, load average {os.getloadavg()[0]:.2f}", flush=True)

  base = results.get("serial", {}).get("median_s")
  print()
  print("| mode | median s / iteration | vs serial | env wait | compile | process wall s | load |")
  print("|---|---:|---:|---:|---:|---:|---|")
  for mode, r in results.items():
    ratio = f"{base / r['median_s']:.2f}x" if base else "-"
    print(
      f"| {mode} | {r['median_s']:.1f} | {ratio} | {r['env_wait']:.0%} | {r['compile']:.0%} "
      f"| {r['wall_s']:.0f} | {r['load'][0]:.1f} -> {r['load'][1]:.1f} |"
    )
  print(f"\n(median over iterations 2..{args.iterations}; cpu count {os.cpu_count()})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
