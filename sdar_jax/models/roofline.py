"""What the hardware allows: the FLOPs and the bytes that must move for the sampler's prefill and
decode steps and for the update, from a `ModelConfig` and the batch, and the time and fraction
they bound. Pure arithmetic on ints, like `models.flops` (whose FLOPs it uses); the benchmarks
(bench/sampling.py, bench/train_step.py, bench/gpu_check.py) print each figure's fraction of it,
and docs/throughput.md plans from it.

A piece of work bounds the time of any implementation from below by max(FLOPs / peak FLOP/s,
bytes / memory bandwidth) (the roofline); the achieved fraction is that bound over the time
measured, 1.0 at the roofline. The bytes are what any implementation must move between memory
and the chip, no more:

* weights: the decoder's matmul weights, the norms and the lm_head once per forward (the
  embedding only as the gathered rows, negligible; tied, the embedding is the lm_head), at the
  compute dtype (`config.dtype`): a sampler may keep a compute-dtype copy, so weights stored
  wider (fp32 master weights) are counted at the compute width;
* the KV cache: 2 x layers x kv heads x head_dim values per slot per row at the compute dtype,
  written once, and read at its filled length by every decode step (the slots written so far,
  not the buffer);
* logits: float32 [rows, V] written and read once per position through the lm_head;
* the update: the weights read by each forward and by the backward pass, the float32 gradient
  written and read, and AdamW reading parameter, gradient and both moments and writing parameter
  and moments (7 float32 words per parameter); activations are not counted (they may stay on chip
  or be rematerialised).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sdar_jax.models.config import ModelConfig
from sdar_jax.models.flops import forward_flops, update_flops

ADAMW_WORDS = 7  # float32 words per parameter: read p, g, m, v; write p, m, v


@dataclasses.dataclass(frozen=True)
class Work:
  """FLOPs and bytes that must move, of one piece of work."""

  flops: float
  bytes: float

  def __add__(self, other: Work) -> Work:
    return Work(self.flops + other.flops, self.bytes + other.bytes)

  def seconds(self, peak_flops: float, bandwidth: float) -> float:
    """The roofline time: max(FLOPs / peak FLOP/s, bytes / bandwidth in bytes/s)."""
    return max(self.flops / peak_flops, self.bytes / bandwidth)

  def bound_by(self, peak_flops: float, bandwidth: float) -> str:
    """ "memory" or "compute": which of the two terms sets `seconds`."""
    return "memory" if self.bytes / bandwidth >= self.flops / peak_flops else "compute"

  def fraction(self, measured_s: float, peak_flops: float, bandwidth: float) -> float:
    """The roofline time over the measured time (1.0 = at the bound)."""
    return self.seconds(peak_flops, bandwidth) / measured_s


def _itemsize(dtype: str) -> int:
  return int(np.dtype(dtype).itemsize) if dtype != "bfloat16" else 2


def weight_bytes(config: ModelConfig) -> int:
  """Bytes of the weights one forward reads, at the compute dtype: every parameter but the
  embedding table (its gathered rows are negligible), which is read as the lm_head when tied."""
  untied_embedding = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
  return (config.num_params - untied_embedding) * _itemsize(config.dtype)


def kv_slot_bytes(config: ModelConfig) -> int:
  """Bytes of one cache slot of one row: keys and values of every layer, at the compute dtype."""
  c = config
  return 2 * c.num_layers * c.num_kv_heads * c.head_dim * _itemsize(c.dtype)


def prefill_work(config: ModelConfig, rows: int, prompt_len: int) -> Work:
  """A sampler's prefill of `rows` prompts of `prompt_len` tokens: the forward (lm_head at the
  last position only), the weights once, the cache written, one row of logits per prompt."""
  flops = forward_flops(config, rows, prompt_len, 1)
  moved = weight_bytes(config) + rows * prompt_len * kv_slot_bytes(config)
  return Work(flops, moved + 2 * rows * config.vocab_size * 4)


def decode_work(config: ModelConfig, rows: int, filled: int) -> Work:
  """One decode step of `rows` rows whose cache holds `filled` slots after this step's write:
  one token per row through the layers and the lm_head, attending over the filled slots; the
  weights once, the filled cache read, one slot written, the logits written and read."""
  c = config
  per_token = forward_flops(c, 1, 1, 1) - 4 * c.num_heads * c.head_dim * c.num_layers
  flops = rows * (per_token + 4 * filled * c.num_heads * c.head_dim * c.num_layers)
  cache = rows * (filled + 1) * kv_slot_bytes(c)
  return Work(flops, weight_bytes(c) + cache + 2 * rows * c.vocab_size * 4)


def sampler_work(
  config: ModelConfig, prefill_rows: int, rows: int, prompt_len: int, new_tokens: int
) -> Work:
  """A whole sampler call as the sampler runs it: the prefill of `prefill_rows` distinct prompts
  (the first token comes from its logits), then `new_tokens` - 1 decode steps of `rows` rows,
  step s (1-based) filling prompt_len + s slots."""
  work = prefill_work(config, prefill_rows, prompt_len)
  for step in range(1, new_tokens):
    work = work + decode_work(config, rows, prompt_len + step)
  return work


def update_work(
  config: ModelConfig,
  batch_size: int,
  prompt_len: int,
  response_len: int,
  *,
  with_ref: bool = False,
  teacher_prompt_len: int | None = None,
) -> Work:
  """One update (`models.flops.update_flops`' FLOPs): the weights read by the student's forward
  and backward (2x), by the reference and the teacher forwards when they run, the float32
  gradient written and read, AdamW's 7 float32 words per parameter, and the float32 logits of
  the response positions (student: written in the forward, read in the backward; reference and
  teacher: written and read once each)."""
  flops = sum(
    update_flops(
      config,
      batch_size,
      prompt_len,
      response_len,
      with_ref=with_ref,
      teacher_prompt_len=teacher_prompt_len,
    ).values()
  )
  forwards = 2 + int(with_ref) + int(teacher_prompt_len is not None)
  params = config.num_params
  logits = batch_size * response_len * config.vocab_size * 4
  moved = forwards * weight_bytes(config) + 2 * params * 4 + ADAMW_WORDS * params * 4
  return Work(flops, moved + 2 * forwards * logits)


# Per-chip dense bf16 peak FLOP/s and HBM bandwidth (bytes/s), by a substring of
# jax.Device.device_kind (first match wins): the vendors' datasheets (NVIDIA's SXM parts without
# 2:4 sparsity; Google's Cloud TPU system-architecture pages).
DEVICE_PEAKS = (
  ("H200", 989e12, 4.8e12),
  ("H100", 989e12, 3.35e12),
  ("A100", 312e12, 2.039e12),
  ("L4", 121e12, 0.3e12),
  ("TPU v6", 918e12, 1.64e12),
  ("TPU v5p", 459e12, 2.765e12),
  ("TPU v5 lite", 197e12, 0.819e12),
  ("TPU v5e", 197e12, 0.819e12),
  ("TPU v4", 275e12, 1.2e12),
)


def device_peaks(device_kind: str) -> tuple[float, float] | None:
  """(peak bf16 FLOP/s, memory bandwidth bytes/s) of a device kind from `DEVICE_PEAKS`, or None."""
  for key, flops, bandwidth in DEVICE_PEAKS:
    if key.lower() in device_kind.lower():
      return flops, bandwidth
  return None
