"""Where the time goes: an XLA:CPU per-op profile of the update and sampler benchmark workloads.

    .venv/bin/python bench/profile_ops.py update [--top 30] [--steps 3]   # bench/train_step.py's
    .venv/bin/python bench/profile_ops.py sample [--top 30] [--steps 3]   # bench/sampling.py's

`update` is bench/train_step.py's comparison step (student forward + backward of -sum(mask * log p)
and a no-grad teacher forward, B=8, T=256, the benchmark model of bench/_common.py); `sample` is
bench/sampling.py's call (16 prompts x 64 tokens, 64 new tokens, greedy). The workload runs twice
to warm up, then `--steps` times under `jax.profiler`; the trace is read back
(`jax.profiler.ProfileData`) and every op XLA's worker threads ran is summed per step. Each op is
named after the optimized HLO (dumped by XLA to a temporary folder): its output shape and the JAX
operation it comes from (`op_name` metadata: `transpose(jvp(...))` is the backward pass).

Printed: busy time per worker thread, time by the JAX operation each op comes from (dot_general
= the matmuls, transpose, reduce_max, mul, ...; a fusion counts as the operation XLA named it
after), ops run more than 10 times per
step vs at most 10 (for the sampler: the decode loop vs prefill and setup), and the top ops. Op
times are wall durations on their thread, so on a loaded machine they include preemption; compare
shares within a run.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import sys
import tempfile

_DUMP = tempfile.mkdtemp(prefix="profile_ops_hlo_")
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "")
  + f" --xla_dump_to={_DUMP} --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=NONE"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _common import peer_model  # noqa: E402

# Container events (a thunk sequence, a loop, Python frames): their children are counted instead.
_CONTAINERS = ("ThunkExecutor", "while", "conditional", "call", "$")


def update_workload():
  """bench/train_step.py's comparison step (teacher on), compiled; returns a call."""
  import train_step as ts

  from sdar_jax.models import load_pretrained

  with tempfile.TemporaryDirectory() as d:
    peer_model(0).save_pretrained(d)
    config, params = load_pretrained(d, dtype="float32")
  batch = ts.make_batch(np.random.default_rng(0), config.vocab_size, 8, 64, 64, 192, 96)
  return ts.prepare_ours_grad(config, params, batch, teacher=True)["call"]


def sample_workload():
  """bench/sampling.py's greedy call of our sampler; returns a call."""
  from sdar_jax.core.sampling import Sampler, SamplingParams
  from sdar_jax.models import load_pretrained

  with tempfile.TemporaryDirectory() as d:
    peer_model(0).save_pretrained(d)
    config, params = load_pretrained(d)
  prompts = np.random.default_rng(0).integers(1, config.vocab_size, (16, 64)).tolist()
  sampler = Sampler(config)
  sp = SamplingParams(max_new_tokens=64, temperature=0.0, stop_token_ids=())
  return lambda: sampler.generate(params, prompts, sp)


def hlo_ops(dump: str) -> dict[str, tuple[str, str]]:
  """Op name -> (output shape, JAX op_name) in the largest optimized module XLA dumped (the
  workload's program; the small helper programs reuse the same op names)."""
  ops = {}
  pattern = re.compile(r"\s*(?:ROOT )?%(\S+) = (\S+) [\w-]+\(")
  path = max(glob.glob(os.path.join(dump, "*cpu_after_optimizations.txt")), key=os.path.getsize)
  with open(path) as f:
    for line in f:
      match = pattern.match(line)
      if match:
        origin = re.search(r'op_name="([^"]*)"', line)
        ops[match.group(1)] = (match.group(2), origin.group(1) if origin else "")
  return ops


def kind_of(name: str, origin: str) -> str:
  """The JAX primitive an op comes from (the last part of its op_name: dot_general, reduce_max,
  transpose, mul, ...), else the fusion's root op in its name."""
  if origin:
    return re.sub(r"^jit\((\w+)\)$", r"\1", origin.split("/")[-1])
  return re.sub(r"[._]?\d+$", "", name).split("_")[0]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workload", choices=("update", "sample"))
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--top", type=int, default=30)
  args = parser.parse_args()
  call = update_workload() if args.workload == "update" else sample_workload()
  for _ in range(2):
    call()
  trace_dir = tempfile.mkdtemp(prefix="profile_ops_trace_")
  with jax.profiler.trace(trace_dir):
    for _ in range(args.steps):
      call()
  (path,) = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
  trace = jax.profiler.ProfileData.from_file(path)
  shutil.rmtree(trace_dir, ignore_errors=True)
  per_op, count, per_thread = collections.Counter(), collections.Counter(), collections.Counter()
  for plane in trace.planes:
    for line in plane.lines:
      if not line.name.startswith("tf_XLA"):  # XLA's worker and client threads
        continue
      for event in line.events:
        if event.name.startswith(_CONTAINERS) or "ThreadPool" in event.name:
          continue
        ms = event.duration_ns / 1e6 / args.steps
        per_op[event.name] += ms
        count[event.name] += 1
        per_thread[line.name] += ms
  ops = hlo_ops(_DUMP)
  total = sum(per_op.values())
  print(f"{args.workload}: XLA op time per step {total:.1f} ms (summed over threads)")
  for thread, ms in per_thread.most_common():
    print(f"  thread {thread}: {ms:.1f} ms")
  kinds = collections.Counter()
  for name, ms in per_op.items():
    kinds[kind_of(name, ops.get(name, ("", ""))[1])] += ms
  print("by the JAX operation an op comes from:")
  for kind, ms in kinds.most_common(14):
    print(f"  {kind:<24} {ms:8.1f} ms  {100 * ms / total:5.1f}%")
  loop = sum(ms for name, ms in per_op.items() if count[name] / args.steps > 10)
  print(f"ops run > 10 times per step (a loop body): {loop:.1f} ms; the rest {total - loop:.1f} ms")
  print(f"top {args.top} ops (ms per step, runs per step, output shape, JAX operation):")
  for name, ms in per_op.most_common(args.top):
    shape, origin = ops.get(name, ("?", "?"))
    print(f"  {ms:8.2f}  x{count[name] / args.steps:<5.0f} {name:<34} {shape:<32} {origin[-70:]}")


if __name__ == "__main__":
  try:
    sys.exit(main())
  finally:
    shutil.rmtree(_DUMP, ignore_errors=True)
