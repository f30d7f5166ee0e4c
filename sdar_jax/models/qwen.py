"""One decoder for Qwen2 / Qwen2.5 and Qwen3, as pure functions of a parameter pytree.

The parameters are a nested dict of arrays; the decoder layers are stacked on a leading `layers`
axis and run with `lax.scan` on TPU / GPU, so compile time does not grow with depth, and unrolled
on CPU, where that is faster (`config.layer_loop`, `layer_loop_implementation`). Nothing here
holds state: `jax.jit` sees plain functions of (params, tokens), which is what the sampler and the
train step compile (no module graph traversal in any per-step hot path).

One layer function serves the three uses: `apply` / `forward` (a whole sequence), `prefill`
(prompts, returning a `KVCache`) and `decode_step` (one token per row against that cache). The
model owns the cache layout; the sampler only threads the cache through its loop.

Parameter layout (D hidden, N q heads, K kv heads, H head_dim, F mlp, V vocab, L layers):

    embed [V, D]                       final_norm [D]              lm_head [D, V] (untied only)
    layers/attn_norm [L, D]            layers/mlp_norm [L, D]
    layers/q_proj [L, D, N, H]         layers/q_bias [L, N, H]     (qkv_bias)
    layers/k_proj [L, D, K, H]         layers/k_bias [L, K, H]     (qkv_bias)
    layers/v_proj [L, D, K, H]         layers/v_bias [L, K, H]     (qkv_bias)
    layers/o_proj [L, N, H, D]         layers/o_bias [L, D]        (o_bias)
    layers/q_norm [L, H]               layers/k_norm [L, H]        (qk_norm, Qwen3)
    layers/gate_proj [L, D, F]         layers/up_proj [L, D, F]    layers/down_proj [L, F, D]

Numerics follow transformers' Qwen2/Qwen3 modules: RMSNorm in float32 then cast back, rotate-half
RoPE with float32 tables, softmax in float32, logits in float32.

Attention over a whole sequence (`apply`, hence the update and the sampler's prefill) is one of
`config.attention` (`attention_implementation` resolves "auto"): "xla" materialises the float32
[B, N, T, T] scores; "chunked" runs an online softmax over key blocks with a hand-written
backward pass (`chunked_attention`), so no more than [B, N, block, block] scores exist at once;
"cudnn" calls cuDNN's fused kernel through `jax.nn.dot_product_attention`; "splash" calls the
Pallas splash-attention kernel for TPU. A decode step (one query token against the cache) always
uses the "xla" product: its scores are [B, N, 1, S], small for any cache.

Why one file of ~750 lines: the decoder, its KV cache and its attention implementations (xla,
chunked with its own backward, cuDNN, splash) are one model; the attention paths share the masks,
the GQA layout and the cache, and each is tested against the others.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from sdar_jax.models.config import ModelConfig

Params = dict[str, Any]

# Large finite negative for masked attention scores: a query whose keys are all masked (a left-pad
# position) gets a uniform, finite distribution instead of NaN.
_MASKED = -1e30


@dataclasses.dataclass(frozen=True)
class ParamSpec:
  shape: tuple[int, ...]
  axes: tuple[str | None, ...]  # logical axis names, mapped to mesh axes by sharding.py
  init: str  # "normal" | "ones" | "zeros"


def param_specs(config: ModelConfig) -> dict[str, Any]:
  """Shape, logical axes and initialiser of every parameter, as a pytree shaped like the params."""
  c = config
  L, D, N, K, H, F, V = (
    c.num_layers,
    c.hidden_size,
    c.num_heads,
    c.num_kv_heads,
    c.head_dim,
    c.intermediate_size,
    c.vocab_size,
  )
  layers = {
    "attn_norm": ParamSpec((L, D), ("layers", "norm"), "ones"),
    "q_proj": ParamSpec((L, D, N, H), ("layers", "embed", "q_heads", "head_dim"), "normal"),
    "k_proj": ParamSpec((L, D, K, H), ("layers", "embed", "kv_heads", "head_dim"), "normal"),
    "v_proj": ParamSpec((L, D, K, H), ("layers", "embed", "kv_heads", "head_dim"), "normal"),
    "o_proj": ParamSpec((L, N, H, D), ("layers", "q_heads", "head_dim", "embed"), "normal"),
    "mlp_norm": ParamSpec((L, D), ("layers", "norm"), "ones"),
    "gate_proj": ParamSpec((L, D, F), ("layers", "embed", "mlp"), "normal"),
    "up_proj": ParamSpec((L, D, F), ("layers", "embed", "mlp"), "normal"),
    "down_proj": ParamSpec((L, F, D), ("layers", "mlp", "embed"), "normal"),
  }
  if c.qkv_bias:
    layers["q_bias"] = ParamSpec((L, N, H), ("layers", "q_heads", "head_dim"), "zeros")
    layers["k_bias"] = ParamSpec((L, K, H), ("layers", "kv_heads", "head_dim"), "zeros")
    layers["v_bias"] = ParamSpec((L, K, H), ("layers", "kv_heads", "head_dim"), "zeros")
  if c.o_bias:
    layers["o_bias"] = ParamSpec((L, D), ("layers", "norm"), "zeros")
  if c.qk_norm:
    layers["q_norm"] = ParamSpec((L, H), ("layers", "head_dim"), "ones")
    layers["k_norm"] = ParamSpec((L, H), ("layers", "head_dim"), "ones")
  specs = {
    "embed": ParamSpec((V, D), ("vocab", "embed"), "normal"),
    "layers": layers,
    "final_norm": ParamSpec((D,), ("norm",), "ones"),
  }
  if not c.tie_word_embeddings:
    specs["lm_head"] = ParamSpec((D, V), ("embed", "vocab"), "normal")
  return specs


def _is_spec(x) -> bool:
  return isinstance(x, ParamSpec)


def param_logical_axes(config: ModelConfig) -> dict[str, Any]:
  """Logical axis names per parameter (same tree as the params)."""
  return jax.tree.map(lambda s: s.axes, param_specs(config), is_leaf=_is_spec)


def param_shapes(config: ModelConfig) -> dict[str, Any]:
  """`jax.ShapeDtypeStruct` per parameter (same tree as the params)."""
  dtype = config.jnp_param_dtype
  return jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s.shape, dtype), param_specs(config), is_leaf=_is_spec
  )


def init_params(config: ModelConfig, rng: jax.Array, std: float = 0.02) -> Params:
  """Random parameters: N(0, std) matrices (transformers' initializer_range), unit norms, zero biases."""
  specs = param_specs(config)
  leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
  keys = jax.random.split(rng, len(leaves))
  dtype = config.jnp_param_dtype

  def make(spec: ParamSpec, key):
    if spec.init == "ones":
      return jnp.ones(spec.shape, dtype)
    if spec.init == "zeros":
      return jnp.zeros(spec.shape, dtype)
    return (std * jax.random.normal(key, spec.shape, jnp.float32)).astype(dtype)

  return jax.tree.unflatten(treedef, [make(s, k) for s, k in zip(leaves, keys)])


# --------------------------------------------------------------------------------------- pieces
def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  dtype = x.dtype
  x32 = x.astype(jnp.float32)
  y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return weight.astype(dtype) * y.astype(dtype)


def rope_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
  """cos/sin [B, T, head_dim] (float32) for integer positions [B, T]."""
  exponents = np.arange(0, head_dim, 2, dtype=np.float32) / head_dim
  inv_freq = jnp.asarray(1.0 / (theta**exponents), jnp.float32)
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq
  angles = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotate-half RoPE on [B, T, heads, H]."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos = cos[:, :, None, :].astype(x.dtype)
  sin = sin[:, :, None, :].astype(x.dtype)
  return x * cos + rotated * sin


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
  """Left padding: real tokens get positions 0, 1, ...; pads get 0."""
  mask = attention_mask.astype(jnp.int32)
  return jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)


# ------------------------------------------------------------------------------------ KV cache
class KVCache(NamedTuple):
  """Keys and values of every layer, the one cache layout of the model: `prefill` writes it,
  `decode_step` reads it and appends one slot.

  Per layer, keys are [B, K, H, S] and values [B, K, S, H] (S slots), so both attention products
  of a decode step, q @ K and p @ V, are plain batched matmuls over (batch, kv head): no layer's
  cache is transposed at any step. `valid` [B, S] marks the written, real slots (left padding is
  not); `index` is the next slot to write, the same for every row (prompts are left-padded to one
  length).
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  valid: jax.Array
  index: jax.Array

  # Logical axes (mapped to the mesh by sharding.py's rules) of one layer's keys and values.
  KEY_AXES = ("batch", "kv_heads", "head_dim", "length")
  VALUE_AXES = ("batch", "kv_heads", "length", "head_dim")

  @property
  def size(self) -> int:
    """Slots per row (S)."""
    return self.valid.shape[1]

  def take_rows(self, rows: jax.Array) -> KVCache:
    """The cache of rows `rows` [B'] (indices into this batch), e.g. several samples of one
    prefilled prompt."""

    def take(a):
      return jnp.take(a, rows, axis=0)

    return KVCache(tuple(map(take, self.k)), tuple(map(take, self.v)), take(self.valid), self.index)


# ---------------------------------------------------------------------------------------- layer
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
  [B, K, T * G]) of `_attention`. The softmax is normalised after the product with the values,
  on [.., H] instead of [.., S]: one pass over the T x S scores fewer."""
  B, T, N, H = q.shape
  K, S = k.shape[1], k.shape[3]
  qg = _group_queries(q, K)
  scores = jnp.einsum("bkqh,bkhs->bkqs", qg, k, preferred_element_type=jnp.float32) * H**-0.5
  scores = jnp.where(mask[:, None, :, None], scores.reshape(B, K, T, N // K, S), _MASKED)
  weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True)).reshape(B, K, -1, S)
  total = jnp.sum(weights, axis=-1)  # >= 1: the maximum's own term is exp(0)
  out = jnp.einsum(
    "bkqs,bksh->bkqh", weights.astype(v.dtype), v, preferred_element_type=jnp.float32
  )
  return out / total[..., None], weights, total


@jax.custom_vjp
def _attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
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


_attention.defvjp(_attention_fwd, _attention_bwd)


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
  query; a query that sees no key (a left-pad position) gets the mean of all values under "xla"
  and "chunked" and another finite vector under "cudnn" and "splash" (nothing reads it)."""
  T = attention_mask.shape[1]
  implementation = attention_implementation(config, T)
  if implementation == "xla":
    causal = jnp.tril(jnp.ones((T, T), jnp.bool_))
    mask = causal[None] & attention_mask[:, None, :]
    return functools.partial(_attention, mask=mask)
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
  `_attention` with the causal mask, computed block by block.

  Queries and keys are cut into ceil(T / `block`) blocks of equal length (a multiple of 8, at
  most `block` rounded up to one); for each query block an online softmax
  (running max, running sum, float32 accumulator) runs over the key blocks at or before it, so no
  more than [B, N, block, block] scores exist at once, and blocks above the diagonal are skipped.
  The backward pass is written by hand (FlashAttention-2: recompute each block's probabilities
  from the saved log-sum-exp), so the gradient keeps no T x T residual either. A query that sees
  no key gets the mean of the T values, as the masked softmax of `_attention` gives it."""
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
        s = jnp.where(seen, s, _MASKED)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.where(seen, jnp.exp(s - m_new[..., None]), 0.0)
        alpha = jnp.exp(m - m_new)
        pv = jnp.einsum(
          "bkqs,bksh->bkqh", p.astype(v_j.dtype), v_j, preferred_element_type=jnp.float32
        )
        return m_new, alpha * l + jnp.sum(p, axis=-1), alpha[..., None] * acc + pv

      return lax.cond(j <= i, update, lambda c: c, carry), None

    init = (
      jnp.full((B, K, rows), _MASKED, jnp.float32),
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


def _matmul(x: jax.Array, w: jax.Array, contract: int = 1) -> jax.Array:
  """x [..., *w.shape[:contract]] times w, contracting w's first `contract` axes, as one 2-D
  matmul [tokens, in] x [in, out]: the same sums as the einsum, but XLA:CPU lays out the gradient
  matmuls of the 2-D form without the transposing copies it gives the batched [B, T, ...] form."""
  lead = x.shape[: x.ndim - contract]
  inner = math.prod(w.shape[:contract])
  y = x.reshape(-1, inner) @ w.reshape(inner, -1)
  return y.reshape(*lead, *w.shape[contract:])


def qkv_projection(
  config: ModelConfig, p: Params, x: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One layer's pre-attention norm and q/k/v projections of x [..., D] -> q [..., N, H] and
  k, v [..., K, H], with the q/k/v bias (Qwen2) or the per-head q/k RMSNorm (Qwen3); no RoPE."""
  eps, dt = config.rms_norm_eps, x.dtype
  h = rms_norm(x, p["attn_norm"], eps)
  q = _matmul(h, p["q_proj"].astype(dt))
  k = _matmul(h, p["k_proj"].astype(dt))
  v = _matmul(h, p["v_proj"].astype(dt))
  if config.qkv_bias:
    q = q + p["q_bias"].astype(dt)
    k = k + p["k_bias"].astype(dt)
    v = v + p["v_bias"].astype(dt)
  if config.qk_norm:
    q = rms_norm(q, p["q_norm"], eps)
    k = rms_norm(k, p["k_norm"], eps)
  return q, k, v


def attention_out_and_mlp(
  config: ModelConfig, p: Params, x: jax.Array, attn: jax.Array
) -> jax.Array:
  """The rest of a layer after attention: o_proj of attn [..., N, H] into the residual x [..., D],
  then the gated SiLU MLP block."""
  dt = x.dtype
  out = _matmul(attn, p["o_proj"].astype(dt), contract=2)
  if config.o_bias:
    out = out + p["o_bias"].astype(dt)
  x = x + out
  h = rms_norm(x, p["mlp_norm"], config.rms_norm_eps)
  gate = _matmul(h, p["gate_proj"].astype(dt))
  up = _matmul(h, p["up_proj"].astype(dt))
  return x + _matmul(jax.nn.silu(gate) * up, p["down_proj"].astype(dt))


def _layer(
  config: ModelConfig,
  p: Params,
  x: jax.Array,
  cos: jax.Array,
  sin: jax.Array,
  attend: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
  cache_kv: tuple[jax.Array, jax.Array] | None = None,
  slot: jax.Array | None = None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """One decoder layer on x [B, T, D], serving the full forward, prefill and decode alike;
  `attend(q, k, v)` is the attention of queries [B, T, N, H] over keys / values in the cache
  layout.

  Without `cache_kv`, the T tokens attend to each other and their keys/values come back in the
  cache layout (k [B, K, H, T], v [B, K, T, H]). With one layer's cache (keys, values), the new
  keys/values are first written at `slot`, then the tokens attend over the whole cache, and the
  updated cache comes back."""
  q, k, v = qkv_projection(config, p, x)
  q = apply_rope(q, cos, sin)
  k = apply_rope(k, cos, sin).transpose(0, 2, 3, 1)
  v = v.transpose(0, 2, 1, 3)
  if cache_kv is not None:
    k_cache, v_cache = cache_kv
    k = lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype), (0, 0, 0, slot))
    v = lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype), (0, 0, slot, 0))
  return attention_out_and_mlp(config, p, x, attend(q, k, v)), (k, v)


# ------------------------------------------------------------------------------ forward / decode
def layer_loop_implementation(config: ModelConfig, backend: str | None = None) -> str:
  """How `apply` runs the layers: `config.layer_loop`, with "auto" resolved by `backend` (default:
  JAX's default backend) to "unroll" on CPU and "scan" elsewhere.

  On XLA:CPU a scan over the layers costs time a Python loop does not: the differentiated scan
  stacks every layer's residuals (the [L, B, heads, T, T] attention scores among them) into
  buffers that are zero-filled and then written and read by dynamic slices at every step, and
  XLA:CPU fuses and schedules across an unrolled body better. On TPU / GPU the scan keeps the
  compile time independent of depth (at 28-36 layers an unrolled update compiles for minutes)."""
  if config.layer_loop != "auto":
    return config.layer_loop
  return "unroll" if (backend or jax.default_backend()) == "cpu" else "scan"


def apply(
  config: ModelConfig,
  params: Params,
  tokens: jax.Array,
  positions: jax.Array,
  attention_mask: jax.Array,
  last_only: bool = False,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """Runs the decoder on tokens [B, T] and returns (final-normed hidden [B, T, D], (k, v)).

  `attention_mask` [B, T] marks real tokens (0 = padding); each token attends causally to the
  real tokens up to itself. k [L, B, K, H, T] and v [L, B, K, T, H] are every layer's keys and
  values in the cache layout (`prefill` keeps them; unused, jit drops them). The layers run as a
  `lax.scan` over the stacked weights or unrolled (`layer_loop_implementation`), rematerialised in
  the backward pass when `config.remat`.

  `last_only`: only the last position's hidden state is returned ([B, 1, D]; the keys and values
  still cover every position). Unrolled, the last layer then runs its attention and MLP for that
  position alone (`_last_position_layer`): about a fifth of a 4-layer prefill's matmul work.
  """
  dt = config.jnp_dtype
  x = jnp.take(params["embed"], tokens, axis=0).astype(dt)
  cos, sin = rope_tables(positions, config.head_dim, config.rope_theta)
  attend = sequence_attention(config, attention_mask.astype(jnp.bool_))

  def body(x, layer_params):
    return _layer(config, layer_params, x, cos, sin, attend)

  if config.remat:
    body = jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)
  if layer_loop_implementation(config) == "scan":
    x, kv = lax.scan(body, x, params["layers"])
    if last_only:
      x = x[:, -1:]
  else:
    per_layer = []
    layers = unstack_layers(config, params)
    for i, layer_params in enumerate(layers):
      if last_only and i == len(layers) - 1:
        x, layer_kv = _last_position_layer(config, layer_params, x, cos, sin, attention_mask)
      else:
        x, layer_kv = body(x, layer_params)
      per_layer.append(layer_kv)
    kv = tuple(jnp.stack(a) for a in zip(*per_layer))
  return rms_norm(x, params["final_norm"], config.rms_norm_eps), kv


def _last_position_layer(
  config: ModelConfig,
  p: Params,
  x: jax.Array,
  cos: jax.Array,
  sin: jax.Array,
  attention_mask: jax.Array,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """`_layer` on x [B, T, D] when only the last position's output is needed (the last layer of a
  prefill): keys and values for all T positions, the query, attention and MLP for position T - 1
  only, which sees every real token. Returns ([B, 1, D], (k, v) in the cache layout)."""
  _, k, v = qkv_projection(config, p, x)  # the query of all T positions is dropped by jit
  q, _, _ = qkv_projection(config, p, x[:, -1:])
  q = apply_rope(q, cos[:, -1:], sin[:, -1:])
  k = apply_rope(k, cos, sin).transpose(0, 2, 3, 1)
  v = v.transpose(0, 2, 1, 3)
  attn = _attention(q, k, v, attention_mask.astype(jnp.bool_)[:, None, :])
  return attention_out_and_mlp(config, p, x[:, -1:], attn), (k, v)


def prefill(
  config: ModelConfig,
  params: Params,
  tokens: jax.Array,
  attention_mask: jax.Array,
  cache_size: int,
  last_only: bool = False,
) -> tuple[jax.Array, KVCache]:
  """Runs left-padded prompts tokens [B, T] (`attention_mask` [B, T], 1 = real token) and returns
  their final-normed hidden states [B, T, D] and a KVCache of `cache_size` slots per row: the
  prompts' keys/values in slots 0..T-1, the rest free for `decode_step` (next slot: T).
  `last_only`: the hidden state of the last position only, [B, 1, D] (see `apply`; what a sampler
  needs, and cheaper)."""
  T = tokens.shape[1]
  if cache_size < T:
    raise ValueError(
      f"cache_size={cache_size} is below the prompt length {T}; give the cache at least the "
      "prompt length plus the tokens to decode."
    )
  hidden, (k, v) = apply(
    config, params, tokens, positions_from_mask(attention_mask), attention_mask, last_only
  )
  room = cache_size - T
  keys = tuple(jnp.pad(k[i], ((0, 0), (0, 0), (0, 0), (0, room))) for i in range(k.shape[0]))
  values = tuple(jnp.pad(v[i], ((0, 0), (0, 0), (0, room), (0, 0))) for i in range(v.shape[0]))
  valid = jnp.pad(attention_mask.astype(jnp.bool_), ((0, 0), (0, room)))
  return hidden, KVCache(keys, values, valid, jnp.asarray(T, jnp.int32))


def unstack_layers(config: ModelConfig, params: Params) -> list[Params]:
  """The stacked decoder layers as one weight dict per layer, for `decode_step`. In a decode loop,
  slice them once before it: slicing the stack inside the loop copies every layer's weights at
  every step on CPU (as a `lax.scan` over the stack would)."""
  return [jax.tree.map(lambda a, i=i: a[i], params["layers"]) for i in range(config.num_layers)]


def decode_step(
  config: ModelConfig,
  params: Params,
  tokens: jax.Array,
  positions: jax.Array,
  cache: KVCache,
  layers: list[Params] | None = None,
) -> tuple[jax.Array, KVCache]:
  """One new token per row: tokens [B] at positions [B] are written into `cache` at slot
  `cache.index` and attend to every valid slot, their own included. Returns the final-normed
  hidden states [B, D] (`logits_from_hidden` gives the next-token logits) and the cache one slot
  further on. The cache must have a free slot (`cache.index < cache.size`).

  The layers run unrolled over `layers` = `unstack_layers(config, params)` (sliced here when not
  given); pass them when calling this in a loop."""
  if layers is None:
    layers = unstack_layers(config, params)
  slot = cache.index
  valid = lax.dynamic_update_slice(
    cache.valid, jnp.ones((tokens.shape[0], 1), jnp.bool_), (0, slot)
  )
  x = jnp.take(params["embed"], tokens[:, None], axis=0).astype(config.jnp_dtype)
  cos, sin = rope_tables(positions[:, None], config.head_dim, config.rope_theta)
  mask = valid[:, None, :]
  attend = functools.partial(_attention, mask=mask)  # one query: xla whatever config.attention
  keys, values = [], []
  for layer_params, k, v in zip(layers, cache.k, cache.v):
    x, (k, v) = _layer(config, layer_params, x, cos, sin, attend, (k, v), slot)
    keys.append(k)
    values.append(v)
  hidden = rms_norm(x[:, 0], params["final_norm"], config.rms_norm_eps)
  return hidden, KVCache(tuple(keys), tuple(values), valid, slot + 1)


def lm_head_weight(config: ModelConfig, params: Params) -> jax.Array:
  """[D, V] output projection (the transposed embedding when tied)."""
  return params["embed"].T if config.tie_word_embeddings else params["lm_head"]


def logits_from_hidden(config: ModelConfig, params: Params, hidden: jax.Array) -> jax.Array:
  """Float32 logits [..., V] from final-normed hidden states [..., D]."""
  w = lm_head_weight(config, params).astype(hidden.dtype)
  return jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)


def hidden_states(
  config: ModelConfig, params: Params, tokens: jax.Array, attention_mask: jax.Array | None = None
) -> jax.Array:
  """Final-normed hidden states [B, T, D] of a (left-padded) batch."""
  if attention_mask is None:
    attention_mask = jnp.ones(tokens.shape, jnp.int32)
  h, _ = apply(config, params, tokens, positions_from_mask(attention_mask), attention_mask)
  return h


def _forward(
  config: ModelConfig, params: Params, tokens: jax.Array, attention_mask: jax.Array | None = None
) -> jax.Array:
  return logits_from_hidden(config, params, hidden_states(config, params, tokens, attention_mask))


_forward_jit = jax.jit(_forward, static_argnums=0)


def forward(config: ModelConfig, params: Params, tokens, attention_mask=None) -> jax.Array:
  """Logits [B, T, V] (float32) of int tokens [B, T]; `attention_mask` [B, T] allows left padding
  (positions follow the mask). Jitted; the config is a static argument."""
  tokens = jnp.asarray(tokens, jnp.int32)
  if tokens.ndim != 2:
    raise ValueError(f"tokens must be [batch, time], got shape {tokens.shape}.")
  if attention_mask is not None:
    attention_mask = jnp.asarray(attention_mask, jnp.int32)
    if attention_mask.shape != tokens.shape:
      raise ValueError(
        f"attention_mask shape {attention_mask.shape} != tokens shape {tokens.shape}."
      )
  return _forward_jit(config, params, tokens, attention_mask)
