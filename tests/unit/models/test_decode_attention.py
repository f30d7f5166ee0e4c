"""The decode step's attention over the written cache slots only (`attention.decode_attention`):
against float64 NumPy attention over the real written slots, against the masked product over
the whole buffer (`xla_attention`), slots past the last read block never affecting it, and the
sampler's tokens and log-probs with small blocks against one block and against the update's
log-probs (`core.scoring.response_logprobs`).

Float bounds are a few float32 eps times the size of what is summed, as in test_attention.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdar_jax.core.sampling import Sampler, SamplingParams
from sdar_jax.core.scoring import response_logprobs
from sdar_jax.models import attention, init_params
from tests.helpers import SMALL_QWEN3

EPS = float(np.finfo(np.float32).eps)
S = 80  # cache slots


def _cache(seed: int, B=4, N=4, K=2, H=16):
  rng = np.random.default_rng(seed)
  q = (1.5 * rng.normal(size=(B, 1, N, H))).astype(np.float32)
  k = (1.5 * rng.normal(size=(B, K, H, S))).astype(np.float32)
  v = rng.normal(size=(B, K, S, H)).astype(np.float32)
  valid = np.ones((B, S), bool)
  valid[0, :30] = False  # left padding longer than a block
  valid[1, :3] = False
  valid[3, :-1] = False  # a row with one real slot only (its last)
  return q, k, v, valid


def _reference(q, k, v, seen):
  """float64 attention of q [B, 1, N, H] over the slots `seen` [B, S]."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  N, K, H = q.shape[2], k.shape[1], q.shape[3]
  kv_of = np.arange(N) // (N // K)
  scores = np.einsum("btnh,bnhs->bnts", q, k[:, kv_of]) / np.sqrt(H)
  scores = np.where(seen[:, None, None, :], scores, -np.inf)
  p = np.exp(scores - scores.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("bnts,bnsh->btnh", p, v[:, kv_of])


@pytest.mark.parametrize("block", [16, 24, 128])  # divides S, does not (clamped last block), > S
@pytest.mark.parametrize("filled", [1, 16, 17, 50, S])
def test_decode_attention_equals_float64_over_written_slots(block, filled):
  q, k, v, valid = _cache(0)
  valid[:, filled - 1] = True  # the slot the step wrote is real in every row
  seen = valid & (np.arange(S) < filled)[None]
  want = _reference(q, k, v, seen)
  if block < S:  # slots past the last block read: garbage that must not be read
    read = -(-filled // block) * block
    k[..., read:] = np.nan
    v[:, :, read:] = np.nan
  fn = jax.jit(attention.decode_attention, static_argnames="block")
  got = np.asarray(fn(q, k, v, valid, jnp.int32(filled), block=block))
  assert np.all(np.isfinite(got))
  # an output is a convex combination of the values: a few eps of their largest magnitude
  tol = 16 * EPS * float(np.nanmax(np.abs(v)))
  assert np.max(np.abs(got - want)) <= tol


def test_one_block_buffer_is_the_masked_product_bit_for_bit():
  q, k, v, valid = _cache(1)
  got = attention.decode_attention(q, k, v, valid, jnp.int32(S), block=S)
  want = attention.xla_attention(q, k, v, valid[:, None, :])
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_sampler_with_small_decode_blocks_keeps_tokens_and_logprobs(monkeypatch):
  """Blocks of 8 slots (a 32 + 16 slot cache: up to 6 blocks a step) against one block (the
  masked product over the whole buffer): the same tokens, log-probs within float rounding, and
  both equal to the update's log-probs of the sampled responses."""
  config = SMALL_QWEN3
  params = init_params(config, jax.random.key(3), std=0.3)
  rng = np.random.default_rng(4)
  prompts = [rng.integers(1, 256, size=n).tolist() for n in (19, 4, 27, 1)]
  sampling = SamplingParams(max_new_tokens=12, temperature=1.0, stop_token_ids=())
  results = {}
  monkeypatch.setattr(attention, "DECODE_BLOCKED_FROM", 0)  # the sampler's short buffers too
  for block in (1024, 8):
    monkeypatch.setattr(attention, "DECODE_BLOCK", block)
    sampler = Sampler(config, max_prompt_len=32)  # a new Sampler traces anew
    results[block] = sampler.generate(params, prompts, sampling, jax.random.key(5))
  whole, blocked = results[1024], results[8]
  assert blocked.tokens == whole.tokens
  rows = [p + t for p, t in zip(prompts, whole.tokens)]
  R = max(map(len, whole.tokens))
  width = max(len(p) for p in prompts) + R
  tokens = np.zeros((len(rows), width), np.int32)
  mask = np.zeros_like(tokens)
  for i, (p, t) in enumerate(zip(prompts, whole.tokens)):
    tokens[i, width - R - len(p) : width - R + len(t)] = p + t
    mask[i, width - R - len(p) : width - R + len(t)] = 1
  logp, _ = jax.jit(response_logprobs, static_argnums=(0, 4))(config, params, tokens, mask, R)
  logp = np.asarray(logp)
  # a log-prob is a logit minus a logsumexp: a few eps of the largest |log-prob| and logit scale
  for i, (a, b) in enumerate(zip(blocked.logprobs, whole.logprobs)):
    a, b = np.asarray(a), np.asarray(b)
    tol = 64 * EPS * max(1.0, float(np.max(np.abs(b))))
    assert np.max(np.abs(a - b)) <= tol
    # the update's log-probs of the same tokens
    assert np.max(np.abs(a - logp[i, : len(a)])) <= 1e-4 * max(1.0, float(np.max(np.abs(b))))
