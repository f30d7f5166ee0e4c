"""Attention implementations: grouped-query causal attention of queries [B, T, N, H] over the cache
layout (keys [B, K, H, S], values [B, K, S, H]), one function per backend, each tested against the
others and against float64.

* "xla" (`xla_attention`): the float32 [B, N, T, S] scores materialised, with a hand-written
  backward pass (FlashAttention-2's form on the whole block); over a sequence
  (`causal_xla_attention`) in a few query blocks, each over its causal key prefix only.
* `decode_attention`: the decode step's product, over the cache slots written so far only (a
  loop over blocks of `DECODE_BLOCK` slots up to the filled length, online softmax), so a step's
  cost follows the filled length, not the buffer; a buffer of one block uses `xla_attention`.
* "chunked" (`chunked_attention`): an online softmax over key blocks with its own backward, so
  no more than [B, N, block, block] scores exist at once.
* "cudnn" (`fused_gpu_attention`): cuDNN's fused kernel through `jax.nn.dot_product_attention`.
* "splash" (`splash_attention`): the Pallas splash-attention kernel for TPU.

`attention_implementation` resolves `config.attention="auto"` per backend and length, and
`sequence_attention` returns the chosen one as `attend(q, k, v)` for a whole sequence. The
decoder itself (`sdar_jax.models.qwen`) only calls these.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from sdar_jax.models.config import ModelConfig

# Large finite negative for masked attention scores: a query whose keys are all masked (a left-pad
# position) gets a uniform, finite distribution instead of NaN.
MASKED = -1e30


# ------------------------------------------------------------------- grouped-query attention
def _group_queries(x: jax.Array, num_kv_heads: int) -> jax.Array:
  """[B, T, N, H] -> [B, K, T * G, H]: the queries (or their gradients) of each kv head in rows
  (row = token * G + group), so both attention products are plain batched matmuls; at T = 1 (a
  decode step) every reshape and transpose here only moves unit axes."""
  B, T, N, H = x.shape
  G = N // num_kv_heads
  return x.reshape(B, T, num_kv_heads, G, H).transpose(0, 2, 1, 3, 4).reshape(B, -1, T * G, H)


def _ungroup_queries(x: jax.Array, length: int) -> jax.Array:
  """The inverse of `_group_queries`: [B, K, T * G, H] -> [B, T, N, H]."""
  B, K, rows, H = x.shape
  G = rows // length
  return x.reshape(B, K, length, G, H).transpose(0, 2, 1, 3, 4).reshape(B, length, K * G, H)


def _attention_parts(
  q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Float32 (output [B, K, T * G, H], unnormalised probabilities [B, K, T * G, S], their row sums
  [B, K, T * G]) of `xla_attention`. The softmax is normalised after the product with the values,
  on [.., H] instead of [.., S]: one pass over the T x S scores fewer."""
  B, T, N, H = q.shape
  K, S = k.shape[1], k.shape[3]
  qg = _group_queries(q, K)
  scores = jnp.einsum("bkqh,bkhs->bkqs", qg, k, preferred_element_type=jnp.float32) * H**-0.5
  scores = jnp.where(mask[:, None, :, None], scores.reshape(B, K, T, N // K, S), MASKED)
  weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True)).reshape(B, K, -1, S)
  total = jnp.sum(weights, axis=-1)  # >= 1: the maximum's own term is exp(0)
  out = jnp.einsum(
    "bkqs,bksh->bkqh", weights.astype(v.dtype), v, preferred_element_type=jnp.float32
  )
  return out / total[..., None], weights, total


@jax.custom_vjp
def xla_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
  """Grouped-query attention of queries q [B, T, N, H] over keys k [B, K, H, S] and values
  v [B, K, S, H] (the cache layout); mask [B, T, S] says which keys each query sees. Query head n
  reads kv head n // (N / K); scores and softmax are float32.

  The backward pass is written out (the FlashAttention-2 form, on the whole T x S block): from
  the saved unnormalised probabilities, dS = P * (dP - rowsum(dO * O)), where autodiff of the
  softmax would make more passes over the T x S arrays (on XLA:CPU those passes, not the
  matmuls, were most of the attention's time)."""
  out, _, _ = _attention_parts(q, k, v, mask)
  return _ungroup_queries(out, q.shape[1]).astype(v.dtype)


def _attention_fwd(q, k, v, mask):
  out, weights, total = _attention_parts(q, k, v, mask)
  return _ungroup_queries(out, q.shape[1]).astype(v.dtype), (q, k, v, mask, weights, total, out)


def _attention_bwd(residuals, d_out):
  q, k, v, mask, weights, total, out = residuals
  B, T, N, H = q.shape
  K, S = k.shape[1], k.shape[3]
  d_out = _group_queries(d_out.astype(jnp.float32), K) / total[..., None]  # dO / rowsum
  delta = jnp.sum(d_out * out, axis=-1)  # rowsum(dO * O) / rowsum, [B, K, T * G]
  dv = jnp.einsum("bkqs,bkqh->bksh", weights, d_out)
  dp = jnp.einsum("bkqh,bksh->bkqs", d_out, v.astype(jnp.float32))
  ds = weights * (dp - delta[..., None])  # = P * (dP - rowsum(dO * O)), P = weights / rowsum
  ds = jnp.where(mask[:, None, :, None], ds.reshape(B, K, T, N // K, S), 0.0) * H**-0.5
  ds = ds.reshape(B, K, -1, S)
  dq = jnp.einsum("bkqs,bkhs->bkqh", ds, k.astype(jnp.float32))
  dk = jnp.einsum("bkqs,bkqh->bkhs", ds, _group_queries(q, K).astype(jnp.float32))
  return _ungroup_queries(dq, T).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


xla_attention.defvjp(_attention_fwd, _attention_bwd)


# "xla" attention over a sequence cuts its queries into at most this many blocks, none shorter
# than CAUSAL_BLOCK_MIN queries: at T = 256 on XLA:CPU, 4 blocks took 8-11% off the update's time
# and 8 blocks gained less (docs/throughput.md, 2026-12-06).
CAUSAL_BLOCKS = 4
CAUSAL_BLOCK_MIN = 32


def causal_xla_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, blocks: int | None = None
) -> jax.Array:
  """Causal grouped-query attention of the last T of S positions: queries q [B, T, N, H] over
  keys k [B, K, H, S] and values v [B, K, S, H] (the cache layout), query i (position S - T + i)
  seeing the keys s <= S - T + i that `key_valid` [B, S] marks. At every query that sees a key,
  the same function as `xla_attention(q, k, v, causal & key_valid)`.

  The queries go in `blocks` static blocks (None: `CAUSAL_BLOCKS`, fewer when T is short), and
  each block attends with `xla_attention` over the keys up to its last query only, so the scores
  right of the diagonal blocks are never formed: (n + 1) / 2n of the T x S work at S = T, in the
  backward pass as well. Masked keys add exact zeros, so only the order of the softmax's sums
  differs from the whole product. A query that sees no key (a left-pad position) gets the mean
  of the values up to its block's end instead of all S values; nothing reads it."""
  T, S = q.shape[1], k.shape[3]
  if blocks is None:
    blocks = max(1, min(CAUSAL_BLOCKS, T // CAUSAL_BLOCK_MIN))
  bounds = sorted({min(T, round(i * T / blocks / 8) * 8) for i in range(blocks)} | {T})
  valid = key_valid.astype(jnp.bool_)
  outs = []
  for start, stop in itertools.pairwise(bounds):
    end = S - T + stop  # keys the block's last query sees
    positions = S - T + jnp.arange(start, stop)
    causal = jnp.arange(end)[None, :] <= positions[:, None]  # [stop - start, end]
    mask = causal[None] & valid[:, None, :end]
    outs.append(xla_attention(q[:, start:stop], k[..., :end], v[:, :, :end], mask))
  return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


# -------------------------------------------------------------------------- decode attention
# Cache slots per block of `decode_attention`: a step reads ceil(filled / DECODE_BLOCK) blocks of
# keys and values, so at most DECODE_BLOCK - 1 unwritten slots per step; buffers of at most one
# block take the masked product over the whole buffer (one pass, no loop).
DECODE_BLOCK = 256
# Buffers shorter than this take the masked product too when no block is given: on XLA:CPU the
# block loop cost 2.4x the masked product at a nearly full 2,048-slot buffer and saved 40% only
# when it was short (docs/throughput.md, 2026-12-06, one loaded run), and the demo's buffers are
# 288-416 slots; its accelerator timing is bench/gpu_check.sh's to measure.
DECODE_BLOCKED_FROM = 1024


def decode_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  valid: jax.Array,
  filled: jax.Array,
  block: int | None = None,
) -> jax.Array:
  """Attention of decode queries q [B, T, N, H] (T = 1 in the sampler) over a KV cache, keys
  k [B, K, H, S] and values v [B, K, S, H], of which slots 0 .. `filled` - 1 are written (a scalar,
  the same for every row: prompts are left-padded to one length); `valid` [B, S] marks the real
  slots (left padding is not). Every query sees every valid written slot.

  The same function as `xla_attention(q, k, v, valid[:, None, :] & (slot < filled))`, computed
  over ceil(filled / `block`) blocks of slots in a `lax.fori_loop` with an online softmax (running
  maximum, running sum, float32 accumulator, FlashAttention's rescaling), so the keys and values
  beyond the last written block are never read: a step's bytes and FLOPs follow the filled length.
  The last block of a buffer that is not a multiple of `block` starts at S - `block` and skips
  the slots an earlier block counted. With S <= `block` (default `DECODE_BLOCK`, read at the
  call), or no `block` given and S < `DECODE_BLOCKED_FROM`, it is the masked product over the
  whole buffer (`xla_attention`), bit for bit. Not
  differentiable in reverse mode (the trip count is traced)."""
  short = block is None and k.shape[3] < DECODE_BLOCKED_FROM
  block = int(block or DECODE_BLOCK)
  B, T, N, H = q.shape
  K, S = k.shape[1], k.shape[3]
  filled = jnp.asarray(filled, jnp.int32)
  if S <= block or short:
    seen = valid.astype(jnp.bool_) & (jnp.arange(S) < filled)[None]
    return xla_attention(q, k, v, jnp.broadcast_to(seen[:, None, :], (B, T, S)))
  qg = _group_queries(q, K)  # [B, K, rows, H], rows = T * G
  rows = qg.shape[2]
  scale = H**-0.5
  valid = valid.astype(jnp.bool_)

  def body(j, carry):
    m, l, acc = carry
    start = jnp.minimum(j * block, S - block)
    k_j = lax.dynamic_slice_in_dim(k, start, block, axis=3)
    v_j = lax.dynamic_slice_in_dim(v, start, block, axis=2)
    slot = start + jnp.arange(block)
    # real, written, and not counted by an earlier block (the clamped last block overlaps)
    seen = lax.dynamic_slice_in_dim(valid, start, block, axis=1)
    seen = (seen & (slot >= j * block) & (slot < filled))[:, None, None, :]  # [B, 1, 1, block]
    s = jnp.einsum("bkqh,bkhs->bkqs", qg, k_j, preferred_element_type=jnp.float32) * scale
    s = jnp.where(seen, s, MASKED)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    p = jnp.where(seen, jnp.exp(s - m_new[..., None]), 0.0)
    alpha = jnp.exp(m - m_new)
    pv = jnp.einsum("bkqs,bksh->bkqh", p.astype(v.dtype), v_j, preferred_element_type=jnp.float32)
    return m_new, alpha * l + jnp.sum(p, axis=-1), alpha[..., None] * acc + pv

  init = (
    jnp.full((B, K, rows), MASKED, jnp.float32),
    jnp.zeros((B, K, rows), jnp.float32),
    jnp.zeros((B, K, rows, H), jnp.float32),
  )
  blocks = (filled + block - 1) // block
  _, l, acc = lax.fori_loop(0, blocks, body, init)
  out = acc / jnp.where(l > 0, l, 1.0)[..., None]  # a row that saw no slot: zeros
  return _ungroup_queries(out, T).astype(v.dtype)


# ------------------------------------------------------------------------ sequence attention
# "auto" picks "chunked" over "xla" from this query length on (CPU, and GPU without cuDNN's
# dtypes): below it the T x T scores stay small, and "xla" is the path checked against
# transformers.
CHUNKED_FROM = 2048
_CUDNN_DTYPES = ("bfloat16", "float16")


def attention_implementation(config: ModelConfig, length: int, backend: str | None = None) -> str:
  """The implementation `config.attention` names for a sequence of `length` tokens on `backend`
  (default: JAX's default backend). "auto" is "splash" on TPU; on GPU "cudnn" when the compute
  dtype is bf16/fp16 and head_dim is a multiple of 8 up to 128 (what cuDNN's kernel takes);
  elsewhere "chunked" from `CHUNKED_FROM` tokens on and "xla" below."""
  if config.attention != "auto":
    return config.attention
  backend = backend or jax.default_backend()
  if backend == "tpu":
    return "splash"
  cudnn_takes_it = config.dtype in _CUDNN_DTYPES and config.head_dim % 8 == 0
  if backend in ("gpu", "cuda", "rocm") and cudnn_takes_it and config.head_dim <= 128:
    return "cudnn"
  return "chunked" if length >= CHUNKED_FROM else "xla"


def sequence_attention(
  config: ModelConfig, attention_mask: jax.Array
) -> Callable[[jax.Array, jax.Array, jax.Array], jax.Array]:
  """`attend(q, k, v)` for a whole sequence attending to itself: query t sees the real keys
  (`attention_mask` [B, T], True = real token) at positions up to t, in the implementation
  `config.attention` resolves to. Every implementation gives the same output at every real
  query; a query that sees no key (a left-pad position) gets the mean of all values under
  "chunked", of the values up to its query block's end under "xla" (`causal_xla_attention`), and
  another finite vector under "cudnn" and "splash" (nothing reads it)."""
  T = attention_mask.shape[1]
  implementation = attention_implementation(config, T)
  if implementation == "xla":
    return functools.partial(causal_xla_attention, key_valid=attention_mask)
  if implementation == "chunked":
    return functools.partial(
      chunked_attention, key_valid=attention_mask, block=config.attention_block
    )
  if implementation == "cudnn":
    return functools.partial(fused_gpu_attention, key_valid=attention_mask)
  return functools.partial(splash_attention, key_valid=attention_mask)


def chunked_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, block: int = 512
) -> jax.Array:
  """Causal grouped-query attention of q [B, T, N, H] over k [B, K, H, T] and v [B, K, T, H] (the
  cache layout), query t seeing the keys s <= t with `key_valid` [B, T]; the same function as
  `xla_attention` with the causal mask, computed block by block.

  Queries and keys are cut into ceil(T / `block`) blocks of equal length (a multiple of 8, at
  most `block` rounded up to one); for each query block an online softmax
  (running max, running sum, float32 accumulator) runs over the key blocks at or before it, so no
  more than [B, N, block, block] scores exist at once, and blocks above the diagonal are skipped.
  The backward pass is written by hand (FlashAttention-2: recompute each block's probabilities
  from the saved log-sum-exp), so the gradient keeps no T x T residual either. A query that sees
  no key gets the mean of the T values, as the masked softmax of `xla_attention` gives it."""
  B, T, N, H = q.shape
  K = k.shape[1]
  G = N // K
  n = -(-T // min(int(block), T))  # blocks per sequence
  size = -(-T // n // 8) * 8  # the shortest multiple of 8 that n blocks cover T with
  n = -(-T // size)
  pad = n * size - T
  # Blocked layouts, block index first: q [n, B, K, size * G, H] (row = token * G + group),
  # k [n, B, K, H, size], v [n, B, K, size, H], key_valid [n, B, size].
  qb = q.reshape(B, T, K, G, H).transpose(0, 2, 1, 3, 4)
  qb = jnp.pad(qb, ((0, 0), (0, 0), (0, pad), (0, 0), (0, 0)))
  qb = qb.reshape(B, K, n, size * G, H).transpose(2, 0, 1, 3, 4)
  kb = jnp.pad(k, ((0, 0), (0, 0), (0, 0), (0, pad))).reshape(B, K, H, n, size)
  kb = kb.transpose(3, 0, 1, 2, 4)
  vb = jnp.pad(v, ((0, 0), (0, 0), (0, pad), (0, 0))).reshape(B, K, n, size, H)
  vb = vb.transpose(2, 0, 1, 3, 4)
  valid = jnp.pad(key_valid.astype(jnp.bool_), ((0, 0), (0, pad)))
  # A query sees no key when no real key lies at or before it (left padding, padded rows).
  blind = (jnp.cumsum(valid.astype(jnp.int32), axis=1) == 0).reshape(B, n, size)
  validb = valid.reshape(B, n, size).transpose(1, 0, 2)
  blindb = blind.transpose(1, 0, 2)
  out = _flash(qb, kb, vb, validb, blindb, T, G)  # [n, B, K, size * G, H]
  out = out.transpose(1, 2, 0, 3, 4).reshape(B, K, n * size, G, H)[:, :, :T]
  return out.transpose(0, 2, 1, 3, 4).reshape(B, T, N, H)


def _block_visibility(i, j, size: int, valid_j: jax.Array, G: int) -> jax.Array:
  """[B, 1, size * G, size]: which keys of key block j each query row of query block i sees
  (causal and real), rows ordered token * G + group."""
  rows = i * size + jnp.arange(size)
  cols = j * size + jnp.arange(size)
  causal = jnp.repeat(cols[None, :] <= rows[:, None], G, axis=0)
  return (causal[None] & valid_j[:, None, :])[:, None]


def _flash_forward(qb, kb, vb, validb, blindb, T: int, G: int):
  """The blocked forward pass: (output [n, B, K, size * G, H] in q's dtype, float32 log-sum-exp
  [n, B, K, size * G]; 0 where a row sees no key)."""
  n, B, K, rows, H = qb.shape
  size = rows // G
  scale = H**-0.5
  # One barrier ties the loop-invariant inputs (key masks, block indices) to the queries. Under a
  # differentiated scan over layers JAX hoists loop-invariant work out of the layer loop, which
  # here would compute every block pair's mask up front and keep it: T x T again.
  qb, validb, blindb, index = lax.optimization_barrier((qb, validb, blindb, jnp.arange(n)))
  v_mean = jnp.sum(vb.astype(jnp.float32), axis=(0, 3)) / T  # [B, K, H] (block padding is 0)

  def query_block(args):
    i, q_i, blind_i = args

    def key_block(carry, xs):
      j, k_j, v_j, valid_j = xs

      def update(carry):
        m, l, acc = carry
        s = jnp.einsum("bkqh,bkhs->bkqs", q_i, k_j, preferred_element_type=jnp.float32) * scale
        seen = _block_visibility(i, j, size, valid_j, G)
        s = jnp.where(seen, s, MASKED)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.where(seen, jnp.exp(s - m_new[..., None]), 0.0)
        alpha = jnp.exp(m - m_new)
        pv = jnp.einsum(
          "bkqs,bksh->bkqh", p.astype(v_j.dtype), v_j, preferred_element_type=jnp.float32
        )
        return m_new, alpha * l + jnp.sum(p, axis=-1), alpha[..., None] * acc + pv

      return lax.cond(j <= i, update, lambda c: c, carry), None

    init = (
      jnp.full((B, K, rows), MASKED, jnp.float32),
      jnp.zeros((B, K, rows), jnp.float32),
      jnp.zeros((B, K, rows, H), jnp.float32),
    )
    (m, l, acc), _ = lax.scan(key_block, init, (index, kb, vb, validb))
    seen_any = l > 0
    out = acc / jnp.where(seen_any, l, 1.0)[..., None]
    blind_rows = jnp.repeat(blind_i, G, axis=1)[:, None, :, None]  # [B, 1, rows, 1]
    out = jnp.where(blind_rows, v_mean[:, :, None, :], out)
    lse = jnp.where(seen_any, m + jnp.log(jnp.where(seen_any, l, 1.0)), 0.0)
    return out.astype(qb.dtype), lse

  return lax.map(query_block, (index, qb, blindb))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _flash(qb, kb, vb, validb, blindb, T: int, G: int):
  return _flash_forward(qb, kb, vb, validb, blindb, T, G)[0]


def _flash_fwd(qb, kb, vb, validb, blindb, T, G):
  out, lse = _flash_forward(qb, kb, vb, validb, blindb, T, G)
  return out, (qb, kb, vb, validb, blindb, out, lse)


def _flash_bwd(T, G, residuals, d_out):
  """Gradients of the blocked attention (FlashAttention-2's backward): per key block, a scan over
  the query blocks at or after it accumulates dk and dv and emits each query block's share of dq."""
  qb, kb, vb, validb, blindb, out, lse = residuals
  n, B, K, rows, H = qb.shape
  size = rows // G
  scale = H**-0.5
  # As in the forward pass: keep the mask work inside the loops (see `_flash_forward`).
  d_out, validb, blindb, index = lax.optimization_barrier((d_out, validb, blindb, jnp.arange(n)))
  d_out32 = d_out.astype(jnp.float32)
  blind_rows = jnp.repeat(blindb, G, axis=2)[:, :, None, :, None]  # [n, B, 1, rows, 1]
  # Rows that see a key: D = rowsum(dO * O). Blind rows output the mean of the values: their
  # output does not depend on q or k, and each of the T values gets 1/T of their gradient.
  seen_d_out = jnp.where(blind_rows, 0.0, d_out32)
  delta = jnp.sum(seen_d_out * out.astype(jnp.float32), axis=-1)  # [n, B, K, rows]
  dv_blind = jnp.sum(jnp.where(blind_rows, d_out32, 0.0), axis=(0, 3)) / T  # [B, K, H]
  real_key = (jnp.arange(n * size) < T).reshape(n, 1, 1, size, 1)

  def key_block(dq, xs):
    j, k_j, v_j, valid_j = xs

    def query_block(carry, ys):
      i, q_i, d_out_i, lse_i, delta_i = ys

      def grads(carry):
        dk, dv = carry
        s = jnp.einsum("bkqh,bkhs->bkqs", q_i, k_j, preferred_element_type=jnp.float32) * scale
        seen = _block_visibility(i, j, size, valid_j, G)
        p = jnp.where(seen, jnp.exp(s - lse_i[..., None]), 0.0)
        dv = dv + jnp.einsum("bkqs,bkqh->bksh", p, d_out_i)
        dp = jnp.einsum(
          "bkqh,bksh->bkqs", d_out_i, v_j.astype(jnp.float32), preferred_element_type=jnp.float32
        )
        ds = p * (dp - delta_i[..., None]) * scale
        dq_i = jnp.einsum("bkqs,bkhs->bkqh", ds, k_j.astype(jnp.float32))
        dk = dk + jnp.einsum("bkqs,bkqh->bkhs", ds, q_i.astype(jnp.float32))
        return (dk, dv), dq_i

      def skip(carry):
        return carry, jnp.zeros((B, K, rows, H), jnp.float32)

      return lax.cond(j <= i, grads, skip, carry)

    init = (jnp.zeros((B, K, H, size), jnp.float32), jnp.zeros((B, K, size, H), jnp.float32))
    (dk, dv), dq_parts = lax.scan(query_block, init, (index, qb, seen_d_out, lse, delta))
    return dq + dq_parts, (dk, dv)

  dq, (dk, dv) = lax.scan(key_block, jnp.zeros(qb.shape, jnp.float32), (index, kb, vb, validb))
  dv = dv + jnp.where(real_key, dv_blind[None, :, :, None, :], 0.0)
  return dq.astype(qb.dtype), dk.astype(kb.dtype), dv.astype(vb.dtype), None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _rotate_left(x: jax.Array, shift: jax.Array) -> jax.Array:
  """x [B, T, ...] with each row b's sequence rotated left by `shift[b]` places."""
  T = x.shape[1]
  index = (jnp.arange(T)[None, :] + shift[:, None]) % T  # [B, T]
  return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


def fused_gpu_attention(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  key_valid: jax.Array,
  implementation: str = "cudnn",
) -> jax.Array:
  """Causal attention through `jax.nn.dot_product_attention` (cuDNN's fused flash-attention
  kernel by default), same arguments as `chunked_attention`.

  cuDNN masks padding only at the end of a row (`key_value_seq_lengths`), so each row is rotated
  left by its number of leading pads (left padding becomes right padding; RoPE was applied
  before, so positions are unchanged), attended with the causal + padding mask, and rotated
  back. Rows must hold their real tokens contiguously (left padding, then the prompt and the
  response, then right padding: every batch this project builds). `implementation="xla"` runs
  the same rotation through JAX's reference implementation (how the CPU tests check it)."""
  B, T = q.shape[:2]
  key_valid = key_valid.astype(jnp.bool_)
  lead = jnp.argmax(key_valid, axis=1).astype(jnp.int32)  # leading pads (0 for an all-pad row)
  lengths = jnp.maximum(jnp.sum(key_valid, axis=1).astype(jnp.int32), 1)
  q_r = _rotate_left(q, lead)
  k_r = _rotate_left(k.transpose(0, 3, 1, 2), lead)  # [B, T, K, H]
  v_r = _rotate_left(v.transpose(0, 2, 1, 3), lead)
  # cuDNN's backward pass with a padding mask takes only even sequence lengths: an odd T gets one
  # trailing pad (a key no real query sees, a query row dropped after the call).
  odd = T % 2
  q_r, k_r, v_r = (jnp.pad(x, _pad_axis(4, 1, odd)) for x in (q_r, k_r, v_r))
  out = jax.nn.dot_product_attention(
    q_r,
    k_r.astype(q.dtype),
    v_r.astype(q.dtype),
    is_causal=True,
    query_seq_lengths=jnp.full((B,), T, jnp.int32),
    key_value_seq_lengths=lengths,
    implementation=implementation,
  )
  return _rotate_left(out[:, :T], (T - lead) % T)


def splash_attention(
  q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, interpret: bool = False
) -> jax.Array:
  """Causal attention through the Pallas splash-attention kernel for TPU, same arguments as
  `chunked_attention`; grouped-query heads go to the kernel as they are.

  Padding is a segment id (real tokens 1, pads 0): a real query sees only real keys, whatever
  the padding pattern. The sequence is padded to a multiple of 128 (the kernel's lane width).
  Inside a multi-device `jit`, the kernel runs under `shard_map` over the mesh in context
  (`jax.set_mesh`; batch over data/fsdp, heads over tensor when the kv heads divide), since XLA
  cannot partition a Pallas call. `interpret=True` runs the kernel in the Pallas interpreter."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # TPU-only kernel: lazy
    splash_attention_kernel as splash,
  )
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

  B, T, _, H = q.shape
  K = k.shape[1]
  padded = -(-T // 128) * 128
  block = next(b for b in (512, 256, 128) if padded % b == 0)
  pad = padded - T
  qh = jnp.pad((q * jnp.asarray(H**-0.5, q.dtype)).transpose(0, 2, 1, 3), _pad_axis(4, 2, pad))
  kh = jnp.pad(k.transpose(0, 1, 3, 2).astype(q.dtype), _pad_axis(4, 2, pad))  # [B, K, T, H]
  vh = jnp.pad(v.astype(q.dtype), _pad_axis(4, 2, pad))
  segments = jnp.pad(key_valid.astype(jnp.int32), ((0, 0), (0, pad)))

  def kernel_call(qh, kh, vh, segments):
    heads = qh.shape[1]
    mask = masks.MultiHeadMask([masks.CausalMask((padded, padded))] * heads)
    sizes = splash.BlockSizes(
      block_q=block,
      block_kv=block,
      block_kv_compute=block,
      block_q_dkv=block,
      block_kv_dkv=block,
      block_kv_dkv_compute=block,
      block_q_dq=block,
      block_kv_dq=block,
    )
    kernel = splash.make_splash_mha(
      mask, head_shards=1, q_seq_shards=1, block_sizes=sizes, interpret=interpret
    )
    ids = jax.vmap(lambda s: splash.SegmentIds(q=s, kv=s))(segments)
    return jax.vmap(kernel)(qh, kh, vh, segment_ids=ids)

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    out = kernel_call(qh, kh, vh, segments)
  else:
    from jax.sharding import PartitionSpec as P

    batch_axes = tuple(a for a in ("data", "fsdp") if mesh.shape.get(a, 1) > 1)
    if B % math.prod(mesh.shape[a] for a in batch_axes):
      batch_axes = ()
    tensor = mesh.shape.get("tensor", 1)
    heads = "tensor" if tensor > 1 and K % tensor == 0 else None
    batch = batch_axes or None
    spec = P(batch, heads, None, None)
    out = jax.shard_map(
      kernel_call,
      mesh=mesh,
      in_specs=(spec, spec, spec, P(batch, None)),
      out_specs=spec,
      check_vma=False,
    )(qh, kh, vh, segments)
  return out[:, :, :T].transpose(0, 2, 1, 3).astype(q.dtype)


def _pad_axis(ndim: int, axis: int, pad: int) -> tuple[tuple[int, int], ...]:
  return tuple((0, pad) if a == axis else (0, 0) for a in range(ndim))
