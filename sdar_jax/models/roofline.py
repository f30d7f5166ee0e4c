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


def score_work(config: ModelConfig, rows: int, prompt_len: int, response_len: int) -> Work:
  """A no-grad scoring forward of `rows` prompt + response rows (the teacher's log-probs at
  θ_old, once per iteration): the forward with the lm_head at the response positions, the
  weights once, the float32 logits of the response positions written and read."""
  flops = forward_flops(config, rows, prompt_len + response_len, response_len)
  logits = rows * response_len * config.vocab_size * 4
  return Work(flops, weight_bytes(config) + 2 * logits)


@dataclasses.dataclass(frozen=True)
class IterationPlan:
  """Projected seconds of one training iteration by phase (`plan_iteration`), with the token
  counts they come from. A projection from the roofline and assumed fractions, not a
  measurement."""

  rollout_s: float  # the sampler's calls (prefill and decode), every turn of every episode
  env_s: float  # the environments' steps, not overlapped with the sampler (rollout.overlap=off)
  teacher_s: float  # the teacher's scoring forward over every turn-sample, once per iteration
  update_s: float  # every mini-batch's update (forward, backward, reference forward, AdamW)
  turn_samples: int
  updates: int
  prefill_tokens: int  # prompt tokens prefilled, every turn (the history window re-prefilled)
  decode_tokens: int  # decode slots run: rows x new tokens per call, padding rows included
  teacher_tokens: int  # prompt + response tokens the teacher forward runs
  update_tokens: int  # student prompt + response tokens the updates run

  @property
  def total_s(self) -> float:
    return self.rollout_s + self.env_s + self.teacher_s + self.update_s

  @property
  def phases(self) -> dict[str, float]:
    return {
      "rollout": self.rollout_s,
      "environment": self.env_s,
      "teacher": self.teacher_s,
      "update": self.update_s,
    }

  @property
  def dominant(self) -> str:
    """The phase that takes the most time."""
    return max(self.phases, key=self.phases.get)


def plan_iteration(
  config: ModelConfig,
  *,
  active_rows: list[int],
  prompt_len: int,
  teacher_prompt_len: int | None,
  response_len: int,
  new_tokens: int,
  mini_batch_size: int,
  chips: int,
  peak_flops: float,
  bandwidth: float,
  sampler_fraction: float,
  update_fraction: float,
  env_step_s: float,
  env_workers: int,
  with_ref: bool = True,
) -> IterationPlan:
  """The projected time of one synchronous iteration (rollout, then teacher scoring, then the
  updates), each phase as its roofline time per chip over an achieved fraction.

  Args:
    active_rows: the episodes still playing at each turn (one sampler call and one env step per
      entry); their sum is the iteration's turn-samples.
    prompt_len: the student prompt as the sampler and the update run it (padded to its bucket);
      every call prefills it for every row (the history window makes each turn's prompt new).
    teacher_prompt_len: the teacher's prompt (the student's with the skill block, padded); None:
      no teacher scoring (GRPO).
    response_len: response slots of each turn-sample in the teacher forward and the update.
    new_tokens: tokens each call generates (the loop runs until its longest row stops).
    mini_batch_size: turn-samples per update; ceil(turn_samples / mini_batch_size) updates, the
      last counted full.
    chips, peak_flops, bandwidth: the slice; per chip peak bf16 FLOP/s and bytes/s.
    sampler_fraction, update_fraction: achieved fraction of the roofline of the sampler's calls
      and of the update (the teacher's forward is taken at the update's).
    env_step_s, env_workers: seconds per env step on one worker process, and the workers: a turn
      steps its active episodes ceil(rows / workers) at a time.
    with_ref: the update also runs the reference forward (the KL term, algo.kl_coef > 0).

  The sampler's rows are split over the chips, and every chip reads all the weights at each
  decode step (a replicated or gathered copy; the gathering itself is not counted). The teacher
  and update FLOPs split evenly over the chips.
  """
  rollout_s = env_s = 0.0
  decode_tokens = 0
  for rows in active_rows:
    per_chip = -(-rows // chips)
    work = sampler_work(config, per_chip, per_chip, prompt_len, new_tokens)
    rollout_s += work.seconds(peak_flops, bandwidth) / sampler_fraction
    env_s += -(-rows // env_workers) * env_step_s
    decode_tokens += per_chip * chips * new_tokens
  turn_samples = sum(active_rows)
  updates = -(-turn_samples // mini_batch_size)
  per_chip_batch = -(-mini_batch_size // chips)
  update = update_work(
    config,
    per_chip_batch,
    prompt_len,
    response_len,
    with_ref=with_ref,
  )
  update_s = updates * update.seconds(peak_flops, bandwidth) / update_fraction
  teacher_s = 0.0
  teacher_tokens = 0
  if teacher_prompt_len is not None:
    score = score_work(config, -(-turn_samples // chips), teacher_prompt_len, response_len)
    teacher_s = score.seconds(peak_flops, bandwidth) / update_fraction
    teacher_tokens = turn_samples * (teacher_prompt_len + response_len)
  return IterationPlan(
    rollout_s=rollout_s,
    env_s=env_s,
    teacher_s=teacher_s,
    update_s=update_s,
    turn_samples=turn_samples,
    updates=updates,
    prefill_tokens=turn_samples * prompt_len,
    decode_tokens=decode_tokens,
    teacher_tokens=teacher_tokens,
    update_tokens=updates * mini_batch_size * (prompt_len + response_len),
  )
