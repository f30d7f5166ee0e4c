"""Masked aggregation of per-token values, as verl's `agg_loss`, plus masked-mean metrics.

Every per-token array is [B, R] (turn-samples x response slots, any leading shape works:
the last axis is tokens, all others are sequences); `mask` is bool or float of the same shape.

Modes (`AGG_MODES`):
- "token-mean":          sum(v*m) / denom,                 denom defaults to sum(m)
- "seq-mean-token-sum":  sum_rows(sum_t v*m) / num_seqs
- "seq-mean-token-mean": sum_rows(sum_t v*m / sum_t m) / num_seqs
  num_seqs defaults to the number of rows holding at least one masked token.

Combining micro-batches exactly. The train step splits a batch into micro-batches and sums
their gradients. Pass `denom` = the token count of the WHOLE batch (and, for the seq modes,
`num_seqs` = its non-empty row count) to every micro-batch: each micro-batch loss is then
its share of the whole-batch loss, and the shares SUM to the whole-batch value. Metrics follow
the same rule: `masked_mean(x, mask, denom)` is sum(x*m)/denom, a plain masked mean when
`denom` is None and an additive share when `denom` is the global count. So every metric
returned by the losses in this package (all token-weighted) is summed over micro-batches by
the caller, never averaged, and the result is exactly the metric over the whole batch.

Guards: an all-masked batch gives 0 (not NaN); a fully masked row contributes 0 and is not
counted as a sequence. Positions where mask == 0 are zeroed with `where`, so NaN/inf in
padding cannot leak into the value or its gradient. The last guard differs from verl only
when a row has no response token at all (impossible in verl, common for our bucket padding).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from sdar_jax.algos.registry import Registry

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

AggFn = Callable[[Array, Array, "ArrayLike | None", "ArrayLike | None"], Array]
AGG_MODES: Registry[AggFn] = Registry("aggregation mode")


def _safe(d: ArrayLike) -> Array:
  """A denominator that is never zero (0 -> 1; the numerator is then 0 as well)."""
  d = jnp.asarray(d, jnp.float32)
  return jnp.where(d > 0, d, 1.0)


def masked_values(values: ArrayLike, mask: ArrayLike) -> tuple[Array, Array]:
  """Returns (values*mask with masked-out positions exactly 0, mask as float32)."""
  values = jnp.asarray(values, jnp.float32)
  m = jnp.asarray(mask, jnp.float32)
  if m.shape != values.shape:
    raise ValueError(f"mask shape {m.shape} must equal values shape {values.shape}")
  return jnp.where(m != 0, values * m, 0.0), m


def token_count(mask: ArrayLike) -> Array:
  """Sum of the mask (the token-mean denominator of this batch)."""
  return jnp.sum(jnp.asarray(mask, jnp.float32))


def seq_count(mask: ArrayLike) -> Array:
  """Number of rows with at least one masked token (the seq-mean denominator)."""
  m = jnp.asarray(mask, jnp.float32)
  return jnp.sum((jnp.sum(m, axis=-1) > 0).astype(jnp.float32))


def masked_mean(values: ArrayLike, mask: ArrayLike, denom: ArrayLike | None = None) -> Array:
  """sum(values*mask) / denom, denom = sum(mask) by default (see module doc)."""
  vm, m = masked_values(values, mask)
  d = jnp.sum(m) if denom is None else denom
  return jnp.sum(vm) / _safe(d)


@AGG_MODES.register("token-mean")
def _token_mean(values: Array, mask: Array, denom=None, num_seqs=None) -> Array:
  del num_seqs  # token-mean normalises by tokens only
  return masked_mean(values, mask, denom)


@AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(values: Array, mask: Array, denom=None, num_seqs=None) -> Array:
  del denom
  vm, m = masked_values(values, mask)
  row_sums = jnp.sum(vm, axis=-1)
  n = seq_count(m) if num_seqs is None else num_seqs
  return jnp.sum(row_sums) / _safe(n)


@AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(values: Array, mask: Array, denom=None, num_seqs=None) -> Array:
  del denom
  vm, m = masked_values(values, mask)
  row_means = jnp.sum(vm, axis=-1) / _safe(jnp.sum(m, axis=-1))
  n = seq_count(m) if num_seqs is None else num_seqs
  return jnp.sum(row_means) / _safe(n)


def agg_loss(
  values: ArrayLike,
  mask: ArrayLike,
  agg: str = "token-mean",
  denom: ArrayLike | None = None,
  num_seqs: ArrayLike | None = None,
) -> Array:
  """Aggregates per-token `values` under `mask` with mode `agg` (see module doc).

  `denom` is used by "token-mean" only and `num_seqs` by the seq modes only, so a caller may
  always pass both.
  """
  return AGG_MODES.get(agg)(values, mask, denom, num_seqs)
