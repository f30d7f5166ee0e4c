"""Shared by the benchmarks: the benchmark workload of docs/design.md model and interleaved timing.

Every peer comparison runs the same random Qwen3 (vocab 4096, hidden 256, intermediate 768,
4 layers, 8 heads, 4 kv heads, head_dim 32, untied, rope theta 1e6, fp32; matrices N(0, 0.02),
norm scales 1 + 0.1 N(0, 1)), saved once as a Hugging Face checkpoint so every peer loads the
same weights. Timed repeats run round-robin over the peers, so background load on this shared
2-core machine hits every peer alike; compare peers within one run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

PEER_HF_CONFIG = dict(
  vocab_size=4096,
  hidden_size=256,
  intermediate_size=768,
  num_hidden_layers=4,
  num_attention_heads=8,
  num_key_value_heads=4,
  head_dim=32,
  rope_theta=1e6,
  rms_norm_eps=1e-6,
  tie_word_embeddings=False,
  max_position_embeddings=4096,
)


def peer_model(seed: int = 0, attn_implementation: str = "sdpa"):
  """The transformers (PyTorch) model of the benchmark workload of docs/design.md, fp32, eval mode."""
  import torch
  import transformers

  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(
    transformers.Qwen3Config(**PEER_HF_CONFIG), attn_implementation=attn_implementation
  )
  model = model.float().eval()
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
      else:
        p.copy_(0.02 * torch.randn(p.shape, generator=gen))
  return model


def interleaved(
  calls: dict[str, Callable[[], Any]], repeats: int
) -> dict[str, tuple[float, float, Any]]:
  """name -> (first-call s, median s, last output); the repeats run round-robin over the calls."""
  first, outputs, times = {}, {}, {name: [] for name in calls}
  for name, call in calls.items():
    start = time.perf_counter()
    outputs[name] = call()
    first[name] = time.perf_counter() - start
  for _ in range(repeats):
    for name, call in calls.items():
      start = time.perf_counter()
      outputs[name] = call()
      times[name].append(time.perf_counter() - start)
  return {name: (first[name], statistics.median(times[name]), outputs[name]) for name in calls}


def median_time(fn: Callable[[], Any], repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


# --------------------------------------------------------------------------- the machine's bound
def probe_cpu_peaks(repeats: int = 5) -> tuple[float, float]:
  """(FLOP/s, bytes/s) this machine gives JAX, measured: the median of `repeats` timed calls of
  a jitted 2048 x 2048 x 2048 float32 matmul (2 * 2048^3 FLOPs), and the fastest of the medians
  of a jitted scale (read + write) of float32 arrays of 4, 16, 64 and 256 MiB: a working set that
  fits a CPU's caches moves faster than main memory, and the bound is what the machine allows
  the benchmark's own working set. What XLA:CPU reaches on its best kernels, not a vendor's
  peak: on a machine shared with other work both come out lower."""
  import jax
  import jax.numpy as jnp

  n = 2048
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  matmul = jax.jit(lambda x: x @ x)
  matmul(a).block_until_ready()
  flops = 2 * n**3 / median_time(lambda: matmul(a).block_until_ready(), repeats)
  scale = jax.jit(lambda x: x * 1.0001)
  bandwidth = 0.0
  for mib in (4, 16, 64, 256):
    x = jnp.ones((mib * 2**18,), jnp.float32)
    scale(x).block_until_ready()
    seconds = median_time(lambda x=x: scale(x).block_until_ready(), repeats)
    bandwidth = max(bandwidth, 2 * x.nbytes / seconds)
  return flops, bandwidth


def machine_peaks(peak_tflops: float | None = None) -> tuple[float, float, str]:
  """(peak FLOP/s, memory bytes/s, where they come from) of JAX's first device: the datasheet
  table `sdar_jax.models.roofline.DEVICE_PEAKS` for a GPU / TPU (bf16 peak), else
  `probe_cpu_peaks` (float32); `peak_tflops` overrides the FLOP/s."""
  import jax

  from sdar_jax.models.roofline import device_peaks

  device = jax.devices()[0]
  known = device_peaks(device.device_kind) if device.platform != "cpu" else None
  if known:
    flops, bandwidth = known
    how = f"{device.device_kind} datasheet"
  else:
    flops, bandwidth = probe_cpu_peaks()
    how = f"{device.platform} measured (2048^3 f32 matmul; 4-256 MiB scale, fastest)"
  if peak_tflops:
    flops, how = peak_tflops * 1e12, how + f", peak {peak_tflops:g} TFLOP/s given"
  return flops, bandwidth, how


def bound_line(work, seconds: float, peaks: tuple[float, float, str]) -> str:
  """'x% of bound (memory|compute-bound, bound y ms)' of a `roofline.Work` measured in `seconds`."""
  flops, bandwidth, _ = peaks
  return (
    f"{100 * work.fraction(seconds, flops, bandwidth):.1f}% of bound "
    f"({work.bound_by(flops, bandwidth)}-bound, {1e3 * work.seconds(flops, bandwidth):.2f} ms)"
  )
