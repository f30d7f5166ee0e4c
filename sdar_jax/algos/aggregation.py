"""Masked aggregation of per-token values, as verl's `agg_loss`, plus masked-mean metrics.

Per-token arrays are [..., R] (the last axis tokens, the others sequences) with a bool or float
`mask` of the same shape. Modes (`AGG_MODES`): "token-mean" sum(v·m) / denom (default sum(m)),
"seq-mean-token-sum" Σ_rows Σ_t v·m / num_seqs, "seq-mean-token-mean" Σ_rows (Σ_t v·m / Σ_t m) /
num_seqs (num_seqs defaults to the rows with a masked token). Given the whole mini-batch's `denom`
and `num_seqs`, each micro-batch's value and metric (`masked_mean`) is its additive share, so the
caller sums them over micro-batches and gets the whole batch's exactly. An all-masked batch gives
0, a fully masked row counts as no sequence, and padding never leaks NaN or inf into a value or
its gradient (docs/design.md, "The update").
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
