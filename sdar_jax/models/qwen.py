"""One decoder for Qwen2 / Qwen2.5 and Qwen3, as pure functions of a parameter pytree.

`apply` / `forward` (a whole sequence), `prefill` (prompts, returning a `KVCache`) and
`decode_step` (one token per row against that cache) share one layer function; `init_params`,
`param_shapes` and `param_logical_axes` describe the pytree (a nested dict of arrays, the layers
stacked on a leading `layers` axis, scanned on TPU / GPU and unrolled on CPU: `config.layer_loop`).
Numerics follow transformers' Qwen2 / Qwen3 modules (RMSNorm, RoPE tables, softmax and logits in
float32). Attention over a sequence is `config.attention` (`sdar_jax.models.attention`); a decode
step always uses `attention.decode_attention` (from `DECODE_BLOCKED_FROM` buffer slots on, the
written cache slots only, block by block; below it the masked product over the buffer).
Nothing here holds state or reads files (`models.hf_io` does).
The parameter layout and why functions, not modules: docs/design.md, "The model".
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

from sdar_jax.models import attention
from sdar_jax.models.config import ModelConfig

Params = dict[str, Any]


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
  keep_last: int | None = None,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """Runs the decoder on tokens [B, T] and returns (final-normed hidden [B, T, D], or [B, n, D]
  with `keep_last` = n, and (k, v)).

  `attention_mask` [B, T] marks real tokens (0 = padding); each token attends causally to the
  real tokens up to itself. k [L, B, K, H, T] and v [L, B, K, T, H] are every layer's keys and
  values in the cache layout (`prefill` keeps them; unused, jit drops them). The layers run as a
  `lax.scan` over the stacked weights or unrolled (`layer_loop_implementation`), rematerialised in
  the backward pass when `config.remat`.

  `keep_last` = n: only the last n positions' hidden states are returned ([B, n, D]; the keys and
  values still cover every position): a sampler's prefill needs 1, the update the response
  positions. Unrolled, with the "xla" attention (or n = 1 with any), the last layer then runs
  its queries, attention and MLP for those n positions alone (`_tail_layer`): for a 4-layer model
  a quarter of the layer work at every other position, in the backward pass as well.
  """
  T = tokens.shape[1]
  if keep_last is not None and not 1 <= keep_last <= T:
    raise ValueError(f"keep_last={keep_last} must be in [1, {T}] (the sequence length), or None.")
  dt = config.jnp_dtype
  x = jnp.take(params["embed"], tokens, axis=0).astype(dt)
  cos, sin = rope_tables(positions, config.head_dim, config.rope_theta)
  attend = attention.sequence_attention(config, attention_mask.astype(jnp.bool_))

  def body(x, layer_params):
    return _layer(config, layer_params, x, cos, sin, attend)

  if config.remat:
    body = jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)
  tail = keep_last is not None and keep_last < T
  if layer_loop_implementation(config) == "scan":
    x, kv = lax.scan(body, x, params["layers"])
  else:
    per_layer = []
    layers = unstack_layers(config, params)
    # The tail layer attends with "xla" (its [B, N, n, T] scores materialised), so it is taken
    # where the whole sequence would use "xla" too, or for one position (a prefill's), whose
    # scores are small at any length.
    tail_layer = tail and (keep_last == 1 or attention.attention_implementation(config, T) == "xla")
    for i, layer_params in enumerate(layers):
      if tail_layer and i == len(layers) - 1:
        last = functools.partial(_tail_layer, config, n=keep_last)
        if config.remat:
          last = jax.checkpoint(last, policy=jax.checkpoint_policies.nothing_saveable)
        x, layer_kv = last(layer_params, x, cos, sin, attention_mask)
      else:
        x, layer_kv = body(x, layer_params)
      per_layer.append(layer_kv)
    kv = tuple(jnp.stack(a) for a in zip(*per_layer))
  if tail and x.shape[1] != keep_last:
    x = x[:, -keep_last:]
  return rms_norm(x, params["final_norm"], config.rms_norm_eps), kv


def _tail_layer(
  config: ModelConfig,
  p: Params,
  x: jax.Array,
  cos: jax.Array,
  sin: jax.Array,
  attention_mask: jax.Array,
  n: int,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
  """`_layer` on x [B, T, D] when only the last n positions' outputs are needed (the last layer
  of a prefill, or of the update's forward over prompt + response): keys and values for all T
  positions; queries, attention and MLP for positions T - n .. T - 1 only, each seeing the real
  keys up to itself (`attention.causal_xla_attention`). Returns ([B, n, D], (k, v) in the cache
  layout)."""
  _, k, v = qkv_projection(config, p, x)  # the queries of all T positions are dropped by jit
  q, _, _ = qkv_projection(config, p, x[:, -n:])
  q = apply_rope(q, cos[:, -n:], sin[:, -n:])
  k = apply_rope(k, cos, sin).transpose(0, 2, 3, 1)
  v = v.transpose(0, 2, 1, 3)
  attn = attention.causal_xla_attention(q, k, v, attention_mask)
  return attention_out_and_mlp(config, p, x[:, -n:], attn), (k, v)


def prefill(
  config: ModelConfig,
  params: Params,
  tokens: jax.Array,
  attention_mask: jax.Array,
  cache_size: int,
  last_only: bool = False,
) -> tuple[jax.Array, KVCache]:
  """Runs left-padded prompts tokens [B, T] (`attention_mask` [B, T], 1 = real token) and returns
  their final-normed hidden states [B, T, D] ([B, 1, D] with `last_only`) and a KVCache of `cache_size` slots per row: the
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
    config,
    params,
    tokens,
    positions_from_mask(attention_mask),
    attention_mask,
    1 if last_only else None,
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
  # One query per row, whatever config.attention: the written slots only, block by block.
  attend = functools.partial(attention.decode_attention, valid=valid, filled=slot + 1)
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


@jax.custom_vjp
def _lm_head(hidden: jax.Array, w: jax.Array) -> jax.Array:
  """Float32 logits hidden [..., D] x w [D, V], with the backward pass written out: the same two
  matmuls autodiff makes, but the weight gradient formed as [D, V] (hidden^T x d_logits) where
  autodiff forms d_logits^T x hidden, [V, D], and transposes it, for which XLA:CPU copies the
  float32 [tokens, V] logit gradient into its transpose first (7% of the update's time on the
  benchmark workload of docs/throughput.md, 2026-12-06)."""
  return jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)


def _lm_head_fwd(hidden, w):
  return _lm_head(hidden, w), (hidden, w)


def _lm_head_bwd(residuals, d_logits):
  hidden, w = residuals
  lead = tuple(range(hidden.ndim - 1))
  d_hidden = lax.dot_general(
    d_logits, w, (((hidden.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.float32
  )
  d_w = lax.dot_general(
    hidden, d_logits, ((lead, lead), ((), ())), preferred_element_type=jnp.float32
  )
  return d_hidden.astype(hidden.dtype), d_w.astype(w.dtype)


_lm_head.defvjp(_lm_head_fwd, _lm_head_bwd)


def logits_from_hidden(config: ModelConfig, params: Params, hidden: jax.Array) -> jax.Array:
  """Float32 logits [..., V] from final-normed hidden states [..., D] (`_lm_head`)."""
  return _lm_head(hidden, lm_head_weight(config, params).astype(hidden.dtype))


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
