"""One-GPU check: the parity tests on the device, the bf16 SDAR update at Qwen2.5-3B shapes
(tokens/s and MFU) and the sampler's tokens/s, printed as one table. Run it through
`bench/gpu_check.sh` (which picks the interpreter and the JAX platform).

    bench/gpu_check.sh              # on a GPU host: the full check, about 5 minutes
    bench/gpu_check.sh --dry-run    # prints the plan, then runs every step on CPU at tiny sizes

Steps (each in its own process, so each starts with the whole GPU):
1. parity: `pytest tests/unit/models/test_attention.py` on the device: xla vs chunked (logits, gradients,
   sampler log-probs), and the GPU-only cuDNN tests (fused kernel vs float64, its gradients vs
   float32 autodiff, model logits xla vs cudnn); the Pallas-interpreter and CPU-memory tests are
   left out. Plus transformers parity of the fp32 logits (`tests/unit/models/test_models.py`).
2. update: `TrainStep` (SDAR preset, teacher scored in the step, AdamW) on a random-weight
   Qwen2.5-3B (`model.random_init`: nothing is downloaded), bf16 compute, fp32 master weights;
   16 turn-samples, student prompt 512 + response 512, teacher prompt 1,024 + response 512,
   micro-batch 2, attention "auto" (cuDNN). tokens/s = student + teacher positions per second;
   MFU = model FLOPs (`sdar_jax.models.flops.update_flops`: 6 N per student token, 2 N per
   teacher token, plus the full T^2 attention matmuls) / time / peak. Peak: 989 TFLOP/s, the dense
   (no 2:4 sparsity) bf16 figure of the H100 / H200 SXM; other GPUs use bench/train_step.py's
   table, or --peak-tflops.
3. sampler: `Sampler.generate` on the same model with fresh random weights, 64 prompts x 512
   tokens, 256 new tokens each (temperature 1, no stop), whole call timed (prefill included);
   tokens/s = generated tokens / median seconds.
4. profile: one sampler call of step 3 under `jax.profiler`; the device's kernels summed by name,
   the top 12 printed with their share of the call.
5. iteration: two iterations of the real trainer (`python -m sdar_jax.train`, configs/alfworld.py
   on offline generated games) at the model's shapes with random weights, bf16, remat, sized to
   fit the check (`FULL.iteration`: 4 tasks x 8 episodes, 4 turns, 64 new tokens a turn); each
   iteration split from its `perf/*` metrics into rollout (decode), environment, teacher scoring
   and update seconds, and the compile share.
Steps 2 and 3 print each figure's fraction of the roofline (`sdar_jax.models.roofline`, peaks
from its datasheet table). Each step runs in its own process under a time limit (260 + 120 +
120 + 90 + 300 s), so the whole check ends within 15 minutes; a step that fails or runs out of
time leaves its row in the table. Steps 4 and 5 were written on 2026-12-06 without a GPU and
checked only by the dry run (tiny sizes on CPU). On a
fresh machine (no compilation cache) the parity tests take about 2-3 minutes, the update and the
sampler about 30 s each (H200, 2026-12-04).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import re
import shlex
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H200_PEAK_TFLOPS = 989.0  # H100 / H200 SXM, dense bf16 (NVIDIA's datasheet, without sparsity)


@dataclasses.dataclass(frozen=True)
class Sizes:
  model: str
  batch: int
  prompt: int
  teacher_prompt: int
  response: int
  micro_batch: int
  sampler_prompts: int
  sampler_prompt_len: int
  sampler_new_tokens: int
  repeats: int
  parity_tests: tuple[str, ...]
  seconds: tuple[int, ...]  # time limits: parity, update, sampler, profile, iteration
  iteration: dict  # the trainer iteration's config overrides (configs/alfworld.py, local=True)


FULL = Sizes(
  model="qwen2.5-3b",
  batch=16,
  prompt=512,
  teacher_prompt=1024,
  response=512,
  micro_batch=2,
  sampler_prompts=64,
  sampler_prompt_len=512,
  sampler_new_tokens=256,
  repeats=3,
  parity_tests=(
    "tests/unit/models/test_attention.py",
    "-k",
    "not splash and not keeps_no_t_by_t",
    "tests/unit/models/test_models.py::test_logits_match_transformers_fp32",
  ),
  seconds=(260, 120, 120, 90, 300),
  # Sized to fit the check, not the paper's iteration (16 tasks x 8 episodes x 50 turns):
  # random weights never stop, so every turn decodes max_new_tokens.
  iteration={
    "env.tasks_per_iteration": 4,
    "env.group_size": 8,
    "env.max_turns": 4,
    "rollout.max_new_tokens": 64,
    "train.mini_batch_size": 64,
    "train.micro_batch_size": 8,
  },
)
DRY = Sizes(
  model="tiny",
  batch=2,
  prompt=16,
  teacher_prompt=24,
  response=16,
  micro_batch=1,
  sampler_prompts=4,
  sampler_prompt_len=16,
  sampler_new_tokens=8,
  repeats=1,
  parity_tests=(
    "tests/unit/models/test_attention.py",
    "-k",
    "rotation or on_gpu",  # one CPU test (the GPU ones skip there): the step's plumbing
  ),
  seconds=(300, 300, 300, 300, 300),
  iteration={
    "env.tasks_per_iteration": 1,
    "env.group_size": 2,
    "env.max_turns": 2,
    "rollout.max_new_tokens": 8,
    "train.mini_batch_size": 4,
    "train.micro_batch_size": 2,
  },
)


def describe(sizes: Sizes, peak_tflops: float) -> list[str]:
  """What the check runs, one line per step."""
  return [
    f"1. parity: pytest {shlex.join(sizes.parity_tests)}  (limit {sizes.seconds[0]} s)",
    (
      f"2. update: {sizes.model} random weights, bf16 compute, fp32 master weights, SDAR "
      f"preset; {sizes.batch} turn-samples, student {sizes.prompt}+{sizes.response}, teacher "
      f"{sizes.teacher_prompt}+{sizes.response}, micro-batch {sizes.micro_batch}, "
      f"{sizes.repeats} timed repeats; MFU against {peak_tflops:g} TFLOP/s  "
      f"(limit {sizes.seconds[1]} s)"
    ),
    (
      f"3. sampler: {sizes.model}, {sizes.sampler_prompts} prompts x "
      f"{sizes.sampler_prompt_len} tokens, {sizes.sampler_new_tokens} new tokens each, "
      f"{sizes.repeats} timed repeats; the call and its decode steps against the roofline "
      f"(limit {sizes.seconds[2]} s)"
    ),
    (
      f"4. profile: one such sampler call under jax.profiler, the top operations by time "
      f"(limit {sizes.seconds[3]} s)"
    ),
    (
      f"5. iteration: two iterations of python -m sdar_jax.train on offline ALFWorld, "
      f"{sizes.model} random weights, bf16, "
      + ", ".join(f"{k.split('.')[-1]} {v}" for k, v in sizes.iteration.items())
      + f"; rollout / env / teacher scoring / update seconds (limit {sizes.seconds[4]} s)"
    ),
  ]


# ---------------------------------------------------------------------------------- the steps
def _peaks(peak_tflops: float | None):
  from _common import machine_peaks  # bench/ is on sys.path (main puts it there)

  return machine_peaks(peak_tflops)


def bound_line(work, seconds: float, peaks) -> str:
  from _common import bound_line as line

  return line(work, seconds, peaks)


def run_parity(sizes: Sizes, platform: str) -> tuple[str, str]:
  env = dict(os.environ, JAX_PLATFORMS=platform)
  command = [sys.executable, "-m", "pytest", *sizes.parity_tests, "-q", "-p", "no:cacheprovider"]
  try:
    proc = subprocess.run(
      command,
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=sizes.seconds[0],
      check=False,
    )
  except subprocess.TimeoutExpired:
    return "TIMEOUT", f"over {sizes.seconds[0]} s"
  summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "no output"
  if proc.returncode != 0:
    print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n", file=sys.stderr)
  return ("ok" if proc.returncode == 0 else "FAILED"), re.sub(r"=+", "", summary).strip()


def _model_config(sizes: Sizes):
  from sdar_jax.models import ModelConfig

  if sizes.model == "tiny":
    return ModelConfig.tiny("qwen2", dtype="bfloat16", param_dtype="float32")
  return ModelConfig.preset(sizes.model, dtype="bfloat16", param_dtype="float32")


def run_update(sizes: Sizes, peak_tflops: float) -> tuple[str, str]:
  import jax
  import numpy as np
  from _common import median_time  # bench/ is on sys.path (main puts it there)
  from train_step import make_batch, prepare_ours_update  # bench/train_step.py

  from sdar_jax.algos import get_preset
  from sdar_jax.models import init_params
  from sdar_jax.models.flops import update_flops
  from sdar_jax.models.roofline import update_work

  config = _model_config(sizes)
  B, ps, pt, r = sizes.batch, sizes.prompt, sizes.teacher_prompt, sizes.response
  batch = make_batch(np.random.default_rng(0), config.vocab_size, B, ps, pt, r, r)
  algo = dataclasses.replace(get_preset("sdar"), kl_coef=0.0, teacher_source="update")
  params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(0))
  result = prepare_ours_update(
    config,
    params,
    jax.device_put(batch),
    algo,
    micro_batch_size=sizes.micro_batch,
    copy_params=False,
  )
  del params
  seconds = median_time(result["call"], sizes.repeats)
  tokens = B * (ps + r) + B * (pt + r)
  flops = sum(update_flops(config, B, ps, r, with_ref=False, teacher_prompt_len=pt).values())
  mfu = flops / seconds / (peak_tflops * 1e12)
  del result
  gc.collect()
  work = update_work(config, B, ps, r, teacher_prompt_len=pt)
  return (
    f"{tokens / seconds:,.0f} tokens/s; MFU {100 * mfu:.1f}%",
    f"{seconds:.3f} s/update, {flops / seconds / 1e12:.1f} TFLOP/s, "
    f"{bound_line(work, seconds, _peaks(peak_tflops))}",
  )


def _sampler_setup(sizes: Sizes):
  import jax
  import numpy as np

  from sdar_jax.core.sampling import Sampler
  from sdar_jax.models import init_params

  config = _model_config(sizes)
  params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(1))
  rng = np.random.default_rng(2)
  prompts = [
    rng.integers(1, min(config.vocab_size, 150_000), size=sizes.sampler_prompt_len).tolist()
    for _ in range(sizes.sampler_prompts)
  ]
  return config, params, prompts, Sampler(config, max_prompt_len=sizes.sampler_prompt_len)


def run_sampler(sizes: Sizes, peak_tflops: float | None = None) -> tuple[str, str]:
  """tokens/s of whole calls; the call's and the decode steps' fractions of the roofline (decode
  seconds per step = (call of N new tokens - call of 1) / (N - 1): the prefill cancels)."""
  import jax
  from _common import median_time

  from sdar_jax.core.sampling import SamplingParams
  from sdar_jax.models.roofline import decode_work, sampler_work

  config, params, prompts, sampler = _sampler_setup(sizes)
  P, N, rows = sizes.sampler_prompt_len, sizes.sampler_new_tokens, sizes.sampler_prompts

  def call(new):
    sampling = SamplingParams(max_new_tokens=new, temperature=1.0, stop_token_ids=())
    return lambda: sampler.generate(params, prompts, sampling, jax.random.key(3))

  start = time.perf_counter()
  first = call(N)()
  first_s = time.perf_counter() - start
  assert all(len(t) == N for t in first.tokens), "sampler stopped early"
  seconds = median_time(call(N), sizes.repeats)
  call(1)()  # compiles the one-token call
  prefill_s = median_time(call(1), sizes.repeats)
  generated = rows * N
  peaks = _peaks(peak_tflops)
  decode = [decode_work(config, rows, P + step) for step in range(1, N)]
  decode_total = decode[0]
  for work in decode[1:]:
    decode_total = decode_total + work
  step_s = max(seconds - prefill_s, 1e-9) / (N - 1)
  return (
    f"{generated / seconds:,.0f} tokens/s; decode {1e3 * step_s:.2f} ms/step",
    f"{seconds:.3f} s/call, first {first_s:.1f} s; call "
    f"{bound_line(sampler_work(config, rows, rows, P, N), seconds, peaks)}; decode steps "
    f"{bound_line(decode_total, step_s * (N - 1), peaks)}",
  )


def run_profile(sizes: Sizes, peak_tflops: float | None = None, top: int = 12) -> tuple[str, str]:
  """The sampler call under `jax.profiler`: the device's kernels (or, on CPU, XLA's thread ops)
  summed by name over the traced calls; prints the top `top` by time with their share."""
  import collections
  import glob
  import shutil
  import tempfile

  import jax

  from sdar_jax.core.sampling import SamplingParams

  config, params, prompts, sampler = _sampler_setup(sizes)
  sampling = SamplingParams(
    max_new_tokens=sizes.sampler_new_tokens, temperature=1.0, stop_token_ids=()
  )
  sampler.generate(params, prompts, sampling, jax.random.key(3))  # compile
  trace_dir = tempfile.mkdtemp(prefix="gpu_check_trace_")
  with jax.profiler.trace(trace_dir):
    sampler.generate(params, prompts, sampling, jax.random.key(3))
  (path,) = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
  trace = jax.profiler.ProfileData.from_file(path)
  shutil.rmtree(trace_dir, ignore_errors=True)
  device_ops, host_ops = collections.Counter(), collections.Counter()
  for plane in trace.planes:
    on_device = plane.name.startswith("/device:")
    for line in plane.lines:
      if not on_device and not line.name.startswith("tf_XLA"):
        continue
      for event in line.events:
        if not on_device and event.name.startswith(("ThunkExecutor", "while", "call", "$")):
          continue
        (device_ops if on_device else host_ops)[event.name] += event.duration_ns / 1e6
  ops = device_ops or host_ops
  total = sum(ops.values()) or 1.0
  print(f"profile: one sampler call, {total:.1f} ms of {'device' if device_ops else 'XLA'} ops")
  for name, ms in ops.most_common(top):
    print(f"  {ms:9.2f} ms {100 * ms / total:5.1f}%  {name[:100]}")
  head = ", ".join(f"{name[:40]} {100 * ms / total:.0f}%" for name, ms in ops.most_common(3))
  return f"top ops: {head}", f"{len(ops)} op names, {total:.0f} ms summed"


def run_iteration(sizes: Sizes, peak_tflops: float | None = None) -> tuple[str, str]:
  """Two iterations of the real trainer (`python -m sdar_jax.train`) on offline ALFWorld games
  at the model's shapes with random weights; each iteration split from its metrics into rollout
  (decode; env stepping apart), environment, teacher scoring and update seconds."""
  import json
  import tempfile

  overrides = {
    "model.preset": sizes.model,
    "model.random_init": True,
    "model.dtype": "bfloat16",
    "model.remat": sizes.model != "tiny",
    "warm_start.steps": 0,
    "train.iterations": 2,
    "train.eval_before_train": False,
    "train.eval_every": 0,
    "checkpoint.every": 0,
    "checkpoint.export_hf": False,
    **sizes.iteration,
  }
  with tempfile.TemporaryDirectory() as workdir:
    command = [
      sys.executable,
      "-m",
      "sdar_jax.train",
      "--config=configs/alfworld.py:algo=sdar,local=True",
      f"--workdir={workdir}",
      *(f"--config.{k}={v}" for k, v in overrides.items()),
    ]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
      print(proc.stdout[-2000:], proc.stderr[-4000:], sep="\n", file=sys.stderr)
      return "FAILED", (proc.stderr.strip().splitlines() or ["no output"])[-1][:160]
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f if "perf/iteration_seconds" in line]
  parts = []
  for row in rows:
    total = row["perf/iteration_seconds"]
    env = row.get("perf/env_wait_share", 0.0) * total
    rollout = row.get("perf/phase_rollout_seconds", 0.0) - env
    teacher = row.get("perf/phase_teacher_scoring_seconds", 0.0)
    update = row.get("perf/phase_update_seconds", 0.0)
    parts.append(
      f"{total:.1f} s = rollout {rollout:.1f} + env {env:.1f} + teacher {teacher:.1f} + "
      f"update {update:.1f} (compile {100 * row.get('perf/compile_share', 0.0):.0f}%)"
    )
  return f"{len(rows)} iterations", "; ".join(parts)


# --------------------------------------------------------------------------------------- main
STEPS = {
  "update": run_update,
  "sampler": run_sampler,
  "profile": run_profile,
  "iteration": run_iteration,
}
_RESULT = "GPU_CHECK_RESULT"  # the line a step's process ends with: marker, result, detail


def _step_process(step: str, sizes: Sizes, args, platform: str) -> tuple[str, str]:
  """Runs `step` in a fresh process (the whole device for it, a hard time limit)."""
  limit = sizes.seconds[1 + list(STEPS).index(step)]
  command = [sys.executable, os.path.abspath(__file__), f"--step={step}"]
  command += ["--dry-run"] if args.dry_run else []
  command += [f"--peak-tflops={args.peak_tflops}"] if args.peak_tflops else []
  env = dict(os.environ, JAX_PLATFORMS=platform)
  try:
    proc = subprocess.run(
      command, cwd=REPO, env=env, capture_output=True, text=True, timeout=limit, check=False
    )
  except subprocess.TimeoutExpired:
    return "TIMEOUT", f"over {limit} s"
  for line in reversed(proc.stdout.splitlines()):
    if line.startswith(_RESULT):
      _, result, detail = line.split("\t")
      return result, detail
  print(proc.stdout[-2000:], proc.stderr[-4000:], sep="\n", file=sys.stderr)
  last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
  return "FAILED", last[:160]


def _timed(name: str, fn, *args) -> tuple[str, str, str, float]:
  start = time.perf_counter()
  result, detail = fn(*args)
  return name, result, detail, time.perf_counter() - start


def table(rows) -> str:
  lines = ["| step | result | detail | wall s |", "|---|---|---|---:|"]
  lines += [f"| {name} | {result} | {detail} | {wall:.0f} |" for name, result, detail, wall in rows]
  return "\n".join(lines)


def peak_for(device_kind: str, override: float | None) -> float:
  """The bf16 peak (TFLOP/s) MFU is reported against: --peak-tflops, else 989 on H100 / H200,
  else bench/train_step.py's table entry for the device, else 989."""
  if override:
    return override
  if any(g in device_kind for g in ("H100", "H200")):
    return H200_PEAK_TFLOPS
  sys.path.insert(0, os.path.join(REPO, "bench"))
  from train_step import PEAK_BF16_FLOPS

  known = [f for key, f in PEAK_BF16_FLOPS if key.lower() in device_kind.lower()]
  return known[0] / 1e12 if known else H200_PEAK_TFLOPS


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dry-run", action="store_true", help="tiny sizes on CPU")
  parser.add_argument("--peak-tflops", type=float, default=None, help="bf16 peak for the MFU")
  parser.add_argument(
    "--skip",
    default="",
    help="comma-separated steps to leave out (update,sampler,profile,iteration)",
  )
  parser.add_argument("--step", choices=sorted(STEPS), help=argparse.SUPPRESS)  # one step's process
  args = parser.parse_args(argv)
  sizes = DRY if args.dry_run else FULL
  platform = "cpu" if args.dry_run else "cuda"
  os.environ["JAX_PLATFORMS"] = platform
  # The repository itself and bench/ importable whatever the interpreter (a GPU image's own
  # python has no editable install of sdar_jax); the step processes inherit PYTHONPATH.
  os.environ["PYTHONPATH"] = os.pathsep.join([REPO, *filter(None, [os.environ.get("PYTHONPATH")])])
  sys.path[:0] = [REPO, os.path.join(REPO, "bench")]
  import jax

  if not args.dry_run and jax.default_backend() != "gpu":
    print(
      f"no GPU: JAX runs on {jax.default_backend()}. Fix: install jax[cuda12]==0.10.2 into the "
      "venv (README, 'Installing on GPU / TPU'), or pass --dry-run.",
      file=sys.stderr,
    )
    return 2
  device = jax.devices()[0].device_kind
  peak = peak_for(device, args.peak_tflops)
  if args.step:
    fn = STEPS[args.step]
    result, detail = fn(sizes, peak if args.step == "update" else args.peak_tflops)
    print(f"{_RESULT}\t{result}\t{detail}", flush=True)
    return 0

  print("On a GPU this check runs (JAX_PLATFORMS=cuda):")
  for line in describe(FULL, peak):
    print("  " + line)
  if args.dry_run:
    print("Dry run: the same steps on CPU at tiny sizes:")
    for line in describe(DRY, peak):
      print("  " + line)
  sys.stdout.flush()
  rows = [_timed("parity tests", run_parity, sizes, platform)]
  for step in STEPS:
    if step in args.skip.split(","):
      continue
    rows.append(_timed(f"{step} {sizes.model} bf16", _step_process, step, sizes, args, platform))
    print(f"{rows[-1][0]}: {rows[-1][1]} ({rows[-1][2]})", flush=True)
  print(f"\n{device}; MFU against {peak:g} TFLOP/s (dense bf16 peak)\n{table(rows)}")
  return 0 if all(row[1] not in ("FAILED", "TIMEOUT") for row in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
