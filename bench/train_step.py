"""Update throughput and memory: our jitted train step vs transformers' PyTorch, same weights.

    .venv/bin/python bench/train_step.py [--repeats 7]               # the CPU comparison
    .venv/bin/python bench/train_step.py --mfu                       # Qwen2.5-3B bf16 MFU (GPU/TPU)
    .venv/bin/python bench/train_step.py --mfu --model tiny --batch 4 --prompt 32 \
        --teacher-prompt 48 --response 32 --repeats 2 --peak-tflops 1   # MFU path, CPU dry run
    JAX_PLATFORMS=cpu .venv/bin/python bench/train_step.py --mfu --compile-only   # 3B: compiles?

Comparison (default): the benchmark workload of docs/design.md (train step). Model vocab 4096, hidden 256, inter 768,
4 layers, 8 heads, 4 kv heads, head_dim 32, fp32; B=8, T=256 = prompt 64 + completion 192, each
completion of random length 96-192, right-padded with id 0.
* student: forward, loss = -sum(mask * log p(completion token)), backward (grads of all params);
* teacher: a no-grad forward of a second [8, 256] batch (other prompt, same completion) giving the
  completion log-probs.
tokens/s = processed positions (8*256 student + 8*256 teacher when on) / median step time; the
variants are timed in interleaved rounds so that background load hits all of them alike; "cpu s"
is the median process CPU time (all threads) per step, a load-independent cost figure.
transformers: eager torch, sdpa attention, full [B, T, V] logits (as a transformers user writes it),
no attention mask, use_cache=False, zero_grad(set_to_none=True), with torch's default threads and
pinned to one ("1thr": on a CPU shared with other work the default threads wait on each other and
can be several times slower; the speed-up line divides by the faster of the two). Ours: one jit
of value_and_grad + a stop_gradient teacher call (`response_logprobs`: the lm_head runs on the 192
completion slots only). Also our full update (`TrainStep`: SDAR loss, AdamW, non-finite guard) with the teacher on
(SDAR) and off (GRPO). Peak memory: ours from XLA's compiled memory analysis (arguments + outputs +
temporaries - aliased/donated); torch: the peak process RSS during its first step (sampled every
millisecond) minus the RSS just before it, after malloc_trim (approximate: allocator slack).

MFU (--mfu): the full update of a Qwen2.5-3B-shaped model (bf16 compute, fp32 master weights,
random init), teacher on. Model FLOPs per update = `sdar_jax.models.flops.update_flops` (the TPU
planner's): 3 * F(student) + F(teacher),
  F(x) = B * [2 * N_matmul * T_x + 2 * D * V * R + 4 * L * H_q * d_h * T_x^2]
(N_matmul: the decoder layers' matmul weights; the lm_head is counted on the R response slots it
runs on; the attention term counts the full T^2 score and value matmuls that the kernel computes).
MFU = FLOPs / median time / peak bf16 FLOP/s of the device kind (table below, or --peak-tflops).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import os
import statistics
import sys
import tempfile
import threading
import time

if "--mfu" not in sys.argv:  # the comparison is a CPU benchmark; --mfu runs on the accelerator
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import bound_line, machine_peaks, median_time, peer_model  # noqa: E402

from sdar_jax.algos import AlgoConfig, get_preset  # noqa: E402
from sdar_jax.core.batch import TurnBatch  # noqa: E402
from sdar_jax.core.scoring import response_logprobs  # noqa: E402
from sdar_jax.core.train_state import create_train_state, make_optimizer  # noqa: E402
from sdar_jax.core.train_step import TrainStep  # noqa: E402
from sdar_jax.models import ModelConfig, init_params  # noqa: E402
from sdar_jax.models.flops import update_flops  # noqa: E402
from sdar_jax.models.roofline import ADAMW_WORDS, Work, update_work  # noqa: E402

# Dense bf16 peak FLOP/s per chip, by a substring of jax.Device.device_kind (first match wins).
PEAK_BF16_FLOPS = (
  ("H200", 989e12),
  ("H100", 989e12),
  ("A100", 312e12),
  ("L4", 121e12),
  ("TPU v6", 918e12),
  ("TPU v5p", 459e12),
  ("TPU v5 lite", 197e12),
  ("TPU v5e", 197e12),
  ("TPU v4", 275e12),
)


def _peak_bytes(compiled) -> int:
  m = compiled.memory_analysis()
  return (
    m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
  )


def _trim_heap() -> None:
  """Returns freed heap pages to the OS (glibc), so an RSS baseline holds no cached free memory."""
  try:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
  except (OSError, AttributeError):
    pass


def _rss_bytes() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _RssSampler:
  """Samples the process RSS every millisecond in a thread (torch ops release the GIL); `.peak`."""

  def __init__(self):
    self.peak = _rss_bytes()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _run(self):
    while not self._stop.is_set():
      self.peak = max(self.peak, _rss_bytes())
      time.sleep(0.001)

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()
    self.peak = max(self.peak, _rss_bytes())


def _mib(n: float) -> str:
  return f"{n / 2**20:.1f} MiB"


def make_batch(
  rng: np.random.Generator, vocab: int, B: int, ps: int, pt: int, r: int, min_len: int
) -> TurnBatch:
  """Full prompts (no left padding), completions of random length in [min_len, r], pad id 0."""
  comp = np.zeros((B, r), np.int32)
  mask = np.zeros((B, r), np.float32)
  for i, n in enumerate(rng.integers(min_len, r + 1, B)):
    comp[i, :n], mask[i, :n] = rng.integers(1, vocab, n), 1
  st = np.concatenate([rng.integers(1, vocab, (B, ps)), comp], 1).astype(np.int32)
  tt = np.concatenate([rng.integers(1, vocab, (B, pt)), comp], 1).astype(np.int32)
  return TurnBatch(
    student_tokens=st,
    student_mask=np.ones_like(st),
    response_mask=mask,
    old_logp=np.zeros((B, r), np.float32),
    advantages=rng.normal(size=B).astype(np.float32),
    teacher_tokens=tt,
    teacher_mask=np.ones_like(tt),
  )


# ----------------------------------------------------------------------------- ours
def ours_grad_step(config: ModelConfig, teacher: bool):
  """The exact HF workload: grads of -sum(mask * logp) + (optionally) stop_gradient teacher logp."""

  def step(params, b: TurnBatch):
    def loss(p):
      lp, _ = response_logprobs(config, p, b.student_tokens, b.student_mask, b.response_len)
      return -jnp.sum(lp * b.response_mask)

    value, grads = jax.value_and_grad(loss)(params)
    if not teacher:
      return value, grads, None
    tlp, _ = response_logprobs(
      config, jax.lax.stop_gradient(params), b.teacher_tokens, b.teacher_mask, b.response_len
    )
    return value, grads, tlp

  return jax.jit(step)


def prepare_ours_grad(config, params, batch, teacher: bool) -> dict:
  start = time.perf_counter()
  compiled = ours_grad_step(config, teacher).lower(params, batch).compile()
  compile_s = time.perf_counter() - start
  call = lambda: jax.block_until_ready(compiled(params, batch))  # noqa: E731
  start = time.perf_counter()
  out = call()
  first = time.perf_counter() - start
  return dict(call=call, first=first, compile=compile_s, peak=_peak_bytes(compiled), out=out)


def prepare_ours_update(
  config,
  params,
  batch,
  algo: AlgoConfig,
  lr: float = 1e-6,
  micro_batch_size: int | None = None,
  copy_params: bool = True,
) -> dict:
  """Compiles and runs once the full update; `copy_params=False` donates `params` to the state."""
  optimizer = make_optimizer(lr=lr)
  step = TrainStep(config, algo, optimizer, micro_batch_size=micro_batch_size)
  state = create_train_state(jax.tree.map(jnp.copy, params) if copy_params else params, optimizer)
  batch = batch.replace(old_logp=step.score_student(state.params, batch))
  start = time.perf_counter()
  compiled = step.lower(state, batch).compile()
  compile_s = time.perf_counter() - start
  holder = [state]

  def call():
    holder[0], metrics = compiled(*step.call_args(holder[0], batch))
    jax.block_until_ready(metrics)
    return metrics

  start = time.perf_counter()
  metrics = call()
  first = time.perf_counter() - start
  return dict(
    call=call, first=first, compile=compile_s, peak=_peak_bytes(compiled), metrics=metrics
  )


# ----------------------------------------------------------------------------- torch
def prepare_torch(model, batch: TurnBatch, teacher: bool, threads: int | None = None) -> dict:
  """One transformers step; `threads` pins torch's thread count for the call (on a CPU shared
  with other work, torch's default threads wait on each other and can be several times slower)."""
  import torch

  ps = batch.student_tokens.shape[1] - batch.response_len
  pt = batch.teacher_tokens.shape[1] - batch.response_len
  s_ids = torch.tensor(batch.student_tokens, dtype=torch.long)
  t_ids = torch.tensor(batch.teacher_tokens, dtype=torch.long)
  mask = torch.tensor(batch.response_mask)

  def completion_logp(logits, ids, p):
    lp = torch.log_softmax(logits[:, p - 1 : -1].float(), dim=-1)
    return lp.gather(-1, ids[:, p:, None])[..., 0]

  def step():
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=s_ids, use_cache=False).logits
    loss = -(completion_logp(logits, s_ids, ps) * mask).sum()
    loss.backward()
    tlp = None
    if teacher:
      with torch.no_grad():
        tlp = completion_logp(model(input_ids=t_ids, use_cache=False).logits, t_ids, pt)
    return loss.detach(), tlp

  def call():
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
      return step()
    finally:
      torch.set_num_threads(before)

  gc.collect()
  _trim_heap()
  rss_before = _rss_bytes()
  with _RssSampler() as sampler:
    start = time.perf_counter()
    out = call()
    first = time.perf_counter() - start
  return dict(call=call, first=first, peak=sampler.peak - rss_before, out=out)


def compare(args) -> None:
  import torch

  from sdar_jax.models import load_pretrained

  hf = peer_model(0, attn_implementation="sdpa").train()
  with tempfile.TemporaryDirectory() as d:
    hf.save_pretrained(d)
    config, params = load_pretrained(d, dtype="float32")
  batch = make_batch(
    np.random.default_rng(0),
    config.vocab_size,
    args.batch,
    args.prompt,
    args.prompt,
    args.response,
    args.response // 2,
  )
  B, T = batch.student_tokens.shape

  # torch first, so JAX's buffers and thread pools do not move the RSS under it.
  t_off = prepare_torch(hf, batch, False)
  t_on = prepare_torch(hf, batch, True)
  t1_off = prepare_torch(hf, batch, False, threads=1)
  t1_on = prepare_torch(hf, batch, True, threads=1)
  o_on = prepare_ours_grad(config, params, batch, True)
  o_off = prepare_ours_grad(config, params, batch, False)
  sdar = dataclasses.replace(get_preset("sdar"), kl_coef=0.0, teacher_source="update")
  u_on = prepare_ours_update(config, params, batch, sdar)
  u_off = prepare_ours_update(
    config, params, batch, dataclasses.replace(get_preset("grpo"), kl_coef=0.0)
  )
  rows = [
    ("sdar-jax", "fwd+bwd + teacher fwd", 2, o_on),
    ("transformers", "fwd+bwd + teacher fwd", 2, t_on),
    ("transformers 1thr", "fwd+bwd + teacher fwd", 2, t1_on),
    ("sdar-jax", "fwd+bwd (teacher off)", 1, o_off),
    ("transformers", "fwd+bwd (teacher off)", 1, t_off),
    ("transformers 1thr", "fwd+bwd (teacher off)", 1, t1_off),
    ("sdar-jax", "update SDAR (teacher on)", 2, u_on),
    ("sdar-jax", "update GRPO (teacher off)", 1, u_off),
  ]
  # Interleaved rounds: every variant sees the same background load (this machine is shared).
  times = [[] for _ in rows]
  cpu_times = [[] for _ in rows]
  for _ in range(args.repeats):
    for i, (_, _, _, r) in enumerate(rows):
      start, cpu_start = time.perf_counter(), time.process_time()
      r["call"]()
      times[i].append(time.perf_counter() - start)
      cpu_times[i].append(time.process_time() - cpu_start)
  for (_, _, _, r), ts, cs in zip(rows, times, cpu_times):
    r["median"], r["cpu"] = statistics.median(ts), statistics.median(cs)

  ours_loss, _, ours_tlp = o_on["out"]
  torch_loss, torch_tlp = t_on["out"]
  m = batch.response_mask > 0
  tlp_diff = float(np.max(np.abs(np.asarray(ours_tlp)[m] - torch_tlp.numpy()[m])))
  print(
    f"train-step workload: B={B}, T={T} (prompt {args.prompt} + completion {args.response}, "
    f"lengths {args.response // 2}-{args.response}), vocab {config.vocab_size}, fp32; "
    f"{jax.device_count()} {jax.devices()[0].platform} device(s), torch threads "
    f"{torch.get_num_threads()}, repeats {args.repeats}"
  )
  print(
    f"{'peer':<18}{'variant':<28}{'median s':>10}{'tokens/s':>10}{'cpu s':>8}{'first s':>9}"
    f"{'compile s':>11}{'peak memory':>14}"
  )
  for peer, variant, branches, r in rows:
    tokens = branches * B * T
    compile_s = f"{r['compile']:.2f}" if "compile" in r else "-"
    print(
      f"{peer:<18}{variant:<28}{r['median']:>10.4f}{tokens / r['median']:>10.0f}"
      f"{r['cpu']:>8.2f}{r['first']:>9.2f}{compile_s:>11}{_mib(r['peak']):>14}"
    )
  peaks = machine_peaks()
  print(
    f"bound: {peaks[0] / 1e9:.0f} GFLOP/s, {peaks[1] / 1e9:.1f} GB/s ({peaks[2]}); "
    "x% of bound = roofline time (sdar_jax.models.roofline) / measured time"
  )
  for peer, variant, branches, r in rows:
    work = update_work(
      config,
      B,
      args.prompt,
      args.response,
      teacher_prompt_len=args.prompt if branches == 2 else None,
    )
    if "update" not in variant:  # no optimizer step: AdamW's bytes are not moved
      work = Work(work.flops, work.bytes - ADAMW_WORDS * config.num_params * 4)
    print(f"{peer:<18}{variant:<28}{bound_line(work, r['median'], peaks)}")
  print(
    f"parity: student loss ours {float(ours_loss):.4f} vs torch {float(torch_loss):.4f}; "
    f"teacher log-probs max |diff| {tlp_diff:.2e}"
  )
  fastest_on = min(t_on["median"], t1_on["median"])
  fastest_off = min(t_off["median"], t1_off["median"])
  print(
    f"speed-up vs the faster transformers row: fwd+bwd + teacher "
    f"{fastest_on / o_on['median']:.2f}x, teacher off {fastest_off / o_off['median']:.2f}x "
    f"(vs default threads {t_on['median'] / o_on['median']:.2f}x / "
    f"{t_off['median'] / o_off['median']:.2f}x); load average {os.getloadavg()[0]:.1f}"
  )
  print(
    f"teacher branch adds {_mib(o_on['peak'] - o_off['peak'])} (ours, grad step), "
    f"{_mib(u_on['peak'] - u_off['peak'])} (ours, update)"
  )
  print(
    "peak memory: ours = XLA compiled memory analysis (args + outputs + temps - donated); "
    "torch = sampled peak-RSS growth during its first step (approximate)."
  )


# ----------------------------------------------------------------------------- MFU
def peak_flops(device) -> float | None:
  kind = device.device_kind
  for key, flops in PEAK_BF16_FLOPS:
    if key.lower() in kind.lower():
      return flops
  return None


def compile_only(
  config: ModelConfig, batch: TurnBatch, algo: AlgoConfig, micro: int | None
) -> None:
  """Lowers and compiles the update on abstract arrays (nothing allocated): checks that a size
  compiles and prints XLA's memory estimate on this backend, without running it."""
  optimizer = make_optimizer(lr=1e-6)
  step = TrainStep(config, algo, optimizer, micro_batch_size=micro)
  state = jax.eval_shape(
    lambda: create_train_state(init_params(config, jax.random.key(0)), optimizer)
  )
  start = time.perf_counter()
  m = step.lower(state, batch).compile().memory_analysis()
  print(
    f"compile-only {config.name} ({config.num_params / 1e9:.2f} B params) on "
    f"{jax.devices()[0].device_kind}: {time.perf_counter() - start:.1f} s; arguments "
    f"{_mib(m.argument_size_in_bytes)}, temporaries {_mib(m.temp_size_in_bytes)}, outputs "
    f"{_mib(m.output_size_in_bytes)}, donated {_mib(m.alias_size_in_bytes)}"
  )


def mfu(args) -> None:
  if args.model == "tiny":
    config = ModelConfig.tiny("qwen2", dtype="bfloat16", param_dtype=args.param_dtype)
  else:
    config = ModelConfig.preset(args.model, dtype="bfloat16", param_dtype=args.param_dtype)
  config = config.replace(remat=args.remat)
  B, ps, pt, r = args.batch, args.prompt, args.teacher_prompt, args.response
  batch = make_batch(np.random.default_rng(0), config.vocab_size, B, ps, pt, r, r)
  algo = dataclasses.replace(get_preset("sdar"), kl_coef=0.0, teacher_source="update")
  if args.compile_only:
    compile_only(config, batch, algo, args.micro_batch)
    return
  params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(0))
  result = prepare_ours_update(
    config,
    params,
    jax.device_put(batch),
    algo,
    micro_batch_size=args.micro_batch,
    copy_params=False,
  )
  del params
  result["median"] = median_time(result["call"], args.repeats)
  flops = sum(update_flops(config, B, ps, r, with_ref=False, teacher_prompt_len=pt).values())
  achieved = flops / result["median"]
  device = jax.devices()[0]
  peak = args.peak_tflops * 1e12 if args.peak_tflops else peak_flops(device)
  print(
    f"MFU bench: {config.name} ({config.num_params / 1e9:.2f} B params), "
    f"compute {config.dtype}, "
    f"params {config.param_dtype}, remat {config.remat}; B={B}, student {ps}+{r}, teacher "
    f"{pt}+{r}, micro-batch {args.micro_batch or B}; device {device.device_kind}"
  )
  print(
    f"update: median {result['median']:.4f} s, first call {result['first']:.2f} s, compile "
    f"{result['compile']:.1f} s, peak memory {_mib(result['peak'])}"
  )
  print(
    f"model FLOPs / update {flops:.3e}; achieved {achieved / 1e12:.2f} TFLOP/s; "
    + (
      f"MFU {100 * achieved / peak:.1f}% of {peak / 1e12:.0f} TFLOP/s"
      if peak
      else f"MFU n/a: no peak-FLOPs entry for {device.device_kind!r} (pass --peak-tflops)"
    )
  )
  work = update_work(config, B, ps, r, teacher_prompt_len=pt)
  peaks = machine_peaks(args.peak_tflops)
  print(f"roofline ({peaks[2]}): {bound_line(work, result['median'], peaks)}")
  print(
    f"loss {float(result['metrics']['train/loss']):.4f}, skipped "
    f"{float(result['metrics']['train/skipped_update']):.0f}"
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--mfu", action="store_true", help="Qwen2.5-3B-shaped bf16 MFU run")
  parser.add_argument("--model", default="qwen2.5-3b", help="--mfu: a preset name or 'tiny'")
  parser.add_argument("--param-dtype", default="float32", help="--mfu: master weight dtype")
  parser.add_argument("--remat", action="store_true", help="--mfu: rematerialise layers")
  parser.add_argument("--micro-batch", type=int, default=None, help="--mfu: micro-batch size (2)")
  parser.add_argument(
    "--compile-only",
    action="store_true",
    help="--mfu: compile on abstract arrays and print the memory estimate",
  )
  parser.add_argument("--peak-tflops", type=float, default=None, help="--mfu: override the peak")
  parser.add_argument("--batch", type=int, default=None)
  parser.add_argument("--prompt", type=int, default=None)
  parser.add_argument("--teacher-prompt", type=int, default=None)
  parser.add_argument("--response", type=int, default=None)
  parser.add_argument("--repeats", type=int, default=None)
  args = parser.parse_args()
  defaults = (
    dict(batch=16, prompt=512, teacher_prompt=1024, response=512, repeats=5, micro_batch=2)
    if args.mfu
    else dict(batch=8, prompt=64, teacher_prompt=64, response=192, repeats=7)
  )
  for k, v in defaults.items():
    if getattr(args, k) is None:
      setattr(args, k, v)
  (mfu if args.mfu else compare)(args)


if __name__ == "__main__":
  main()
