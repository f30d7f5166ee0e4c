"""`sdar_jax.models.roofline` against sums written out by hand for one small config."""

from __future__ import annotations

import dataclasses

import pytest

from sdar_jax.models.roofline import Work, decode_work, device_peaks, kv_slot_bytes, weight_bytes
from tests.helpers import SMALL_QWEN3

BF16_QWEN3 = dataclasses.replace(SMALL_QWEN3, dtype="bfloat16")  # the helpers' small Qwen3 in bf16


def test_decode_bytes_follow_the_filled_length_and_the_bound_picks_the_larger_term():
  c = BF16_QWEN3
  assert kv_slot_bytes(c) == 2 * 2 * 2 * 16 * 2  # k and v, layers, kv heads, head_dim, bf16
  assert weight_bytes(c) == (c.num_params - 256 * 64) * 2  # untied: the embedding is gathered
  short, long = decode_work(c, 8, 100), decode_work(c, 8, 1000)
  assert long.bytes - short.bytes == 8 * 900 * kv_slot_bytes(c)
  assert long.flops - short.flops == 8 * 900 * 4 * 4 * 16 * 2  # q.k and p.v over 900 more slots
  work = Work(flops=1e9, bytes=1e5)
  assert work.seconds(1e12, 1e9) == pytest.approx(1e-3) and work.bound_by(1e12, 1e9) == "compute"
  assert work.fraction(2e-3, 1e12, 1e9) == pytest.approx(0.5)
  assert device_peaks("NVIDIA H200") == (989e12, 4.8e12) and device_peaks("cpu") is None


def test_plan_iteration_matches_a_hand_worked_iteration():
  """Two turns (4 then 2 episodes) on 2 chips, 3 env workers, mini-batches of 4: every figure
  below is worked out by hand from the tiny config (no roofline function is called for them)."""
  from sdar_jax.models.roofline import plan_iteration

  c = BF16_QWEN3
  # embedding + 2 x (q 4096, k 2048, v 2048, o 4096, MLP 24576, norms 128 + q/k norms 32)
  # + final norm 64 + untied lm_head
  assert c.num_params == 16384 + 2 * 37024 + 64 + 16384
  shape = {
    "active_rows": [4, 2],
    "prompt_len": 8,
    "teacher_prompt_len": 12,
    "response_len": 4,
    "new_tokens": 3,
    "mini_batch_size": 4,
    "chips": 2,
    "sampler_fraction": 0.5,
    "update_fraction": 0.25,
    "env_step_s": 0.5,
    "env_workers": 3,
  }
  # Memory-bound: each chip's bytes at 1e9 bytes/s. Weights (106880 - 16384) x 2 = 180992 bytes,
  # a cache slot 2 x 2 x 2 x 16 x 2 = 256 bytes, logits 2 x 256 x 4 = 2048 bytes a row.
  # 2 rows a chip: prefill 180992 + 2*8*256 + 2*2048, decode steps filling 9 and 10 slots
  # (+ the one written): 180992 + 2*10*256 + 4096, 180992 + 2*11*256 + 4096 -> 570112 bytes;
  # 1 row a chip: 185088 + 185600 + 185856 = 556544 bytes.
  plan = plan_iteration(c, peak_flops=1e30, bandwidth=1e9, **shape)
  assert plan.rollout_s == pytest.approx((570112 + 556544) / 1e9 / 0.5)
  assert plan.env_s == pytest.approx(2 * 0.5 + 1 * 0.5)  # ceil(4 / 3) + ceil(2 / 3) rounds
  assert (plan.turn_samples, plan.updates) == (6, 2)
  assert (plan.prefill_tokens, plan.decode_tokens) == (6 * 8, (2 + 1) * 2 * 3)
  assert (plan.teacher_tokens, plan.update_tokens) == (6 * 16, 2 * 4 * 12)
  assert plan.dominant == "environment"
  # Compute-bound at 1e9 FLOP/s. A forward of r rows x T tokens, h head positions:
  # 2 x 36864 x 2 layers x r T + 4 T x 4 x 16 x 2 x r T + 2 x 64 x 256 x r h.
  # Update, 2 rows a chip, T = 12, h = 4: 3,948,544 a forward; x (3 student + 1 reference).
  # Teacher, 3 rows a chip, T = 16, h = 4: 7,077,888 + 393,216 + 393,216.
  plan = plan_iteration(c, peak_flops=1e9, bandwidth=1e30, **shape)
  assert plan.update_s == pytest.approx(2 * 4 * 3_948_544 / 1e9 / 0.25)
  assert plan.teacher_s == pytest.approx(7_864_320 / 1e9 / 0.25)
  assert plan.total_s == pytest.approx(sum(plan.phases.values()))
  no_teacher = plan_iteration(
    c, peak_flops=1e9, bandwidth=1e30, **{**shape, "teacher_prompt_len": None}
  )
  assert no_teacher.teacher_s == 0 and no_teacher.teacher_tokens == 0
