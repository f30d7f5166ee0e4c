"""`sdar_jax.models.roofline` against sums written out by hand for one small config."""

from __future__ import annotations

import pytest

from sdar_jax.models import ModelConfig
from sdar_jax.models.roofline import Work, decode_work, device_peaks, kv_slot_bytes, weight_bytes


def test_decode_bytes_follow_the_filled_length_and_the_bound_picks_the_larger_term():
  c = ModelConfig.tiny(
    "qwen3",
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    dtype="bfloat16",
  )
  assert kv_slot_bytes(c) == 2 * 2 * 2 * 16 * 2  # k and v, layers, kv heads, head_dim, bf16
  assert weight_bytes(c) == (c.num_params - 256 * 64) * 2  # untied: the embedding is gathered
  short, long = decode_work(c, 8, 100), decode_work(c, 8, 1000)
  assert long.bytes - short.bytes == 8 * 900 * kv_slot_bytes(c)
  assert long.flops - short.flops == 8 * 900 * 4 * 4 * 16 * 2  # q.k and p.v over 900 more slots
  work = Work(flops=1e9, bytes=1e5)
  assert work.seconds(1e12, 1e9) == pytest.approx(1e-3) and work.bound_by(1e12, 1e9) == "compute"
  assert work.fraction(2e-3, 1e12, 1e9) == pytest.approx(0.5)
  assert device_peaks("NVIDIA H200") == (989e12, 4.8e12) and device_peaks("cpu") is None
