"""Advantage estimators: multi-turn GRPO (docs/reference.md §2.1) and RLSD token re-weighting
(docs/reference.md §2.4); the turn-level ones (AgentOPSD, GRSD) are in `turn_credit`.

GRPO works on turn-samples: every turn of every trajectory is one sample carrying the
episode return (minus its own invalid-format penalty). Samples that share a group id (the
G trajectories started from the same task) are normalised together: mean and unbiased
(Bessel) std over ALL turn-samples of the group, so longer trajectories weigh more.
A group holding a single sample gets mean 0 and std 1, as verl does.

All functions are jittable: group ids are arbitrary integers, regrouped with
`jnp.unique(..., size=N)` and segment sums (no Python loop over samples).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from sdar_jax.algos.registry import Registry

Array = jax.Array
ArrayLike = jax.typing.ArrayLike


def apply_invalid_penalty(scores: ArrayLike, is_valid: ArrayLike, coef: float) -> Array:
  """Per-turn format penalty (docs/reference.md §4.4): scores - coef * (1 - valid)."""
  scores = jnp.asarray(scores, jnp.float32)
  valid = jnp.asarray(is_valid, jnp.float32)
  return scores - coef * (1.0 - valid)


def _segments(group_ids: ArrayLike, num_groups: int | None) -> tuple[Array, int]:
  """Maps group ids to segment indices; returns (segment index per sample, #segments)."""
  ids = jnp.asarray(group_ids)
  if ids.ndim != 1:
    raise ValueError(f"group_ids must be 1-D [N], got shape {ids.shape}")
  if not jnp.issubdtype(ids.dtype, jnp.integer):
    raise ValueError(f"group_ids must be integers, got dtype {ids.dtype}; map uids to ints first")
  if num_groups is not None:  # ids already in [0, num_groups)
    return ids.astype(jnp.int32), int(num_groups)
  n = ids.shape[0]
  _, inverse = jnp.unique(ids, size=n, return_inverse=True)
  return inverse.reshape(-1).astype(jnp.int32), n


def grpo_group_stats(
  scores: ArrayLike,
  group_ids: ArrayLike,
  *,
  sample_mask: ArrayLike | None = None,
  num_groups: int | None = None,
) -> tuple[Array, Array, Array]:
  """Per-sample (group mean, group unbiased std, group size) of `scores` [N].

  `sample_mask` [N] (1 = real sample, 0 = batch padding) leaves padding out of the
  statistics. A group of size <= 1 reports mean 0 and std 1. `num_groups` (static) skips
  the `jnp.unique` regrouping when ids are already 0..num_groups-1.
  """
  scores = jnp.asarray(scores, jnp.float32)
  seg, n_seg = _segments(group_ids, num_groups)
  if scores.shape != seg.shape:
    raise ValueError(f"scores shape {scores.shape} must equal group_ids shape {seg.shape}")
  w = jnp.ones_like(scores) if sample_mask is None else jnp.asarray(sample_mask, jnp.float32)

  count = jax.ops.segment_sum(w, seg, n_seg)
  # Shift each group by one of its own scores before summing: a group whose scores are all
  # equal (e.g. every episode failed) then has a mean equal to that score bit for bit, so its
  # advantages are exactly 0 instead of rounding noise divided by (0 + eps).
  shift = jax.ops.segment_max(jnp.where(w > 0, scores, -jnp.inf), seg, n_seg)
  shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
  total = jax.ops.segment_sum((scores - shift[seg]) * w, seg, n_seg)
  mean = shift + total / jnp.maximum(count, 1.0)
  dev = (scores - mean[seg]) * w  # two-pass variance: accurate in float32
  sq = jax.ops.segment_sum(dev * dev, seg, n_seg)
  std = jnp.sqrt(sq / jnp.maximum(count - 1.0, 1.0))

  several = count[seg] > 1
  return (
    jnp.where(several, mean[seg], 0.0),
    jnp.where(several, std[seg], 1.0),
    count[seg],
  )


def grpo_advantages(
  scores: ArrayLike,
  group_ids: ArrayLike,
  norm_by_std: bool = True,
  eps: float = 1e-6,
  *,
  sample_mask: ArrayLike | None = None,
  num_groups: int | None = None,
) -> Array:
  """GRPO advantages per turn-sample [N]: (R - mean) / (std + eps), or R - mean.

  The caller broadcasts them to tokens (`adv[:, None] * mask`). Samples with
  `sample_mask == 0` get advantage 0 and do not enter the group statistics.
  """
  scores = jnp.asarray(scores, jnp.float32)
  mean, std, _ = grpo_group_stats(scores, group_ids, sample_mask=sample_mask, num_groups=num_groups)
  adv = scores - mean
  if norm_by_std:
    adv = adv / (std + eps)
  if sample_mask is not None:
    adv = jnp.where(jnp.asarray(sample_mask) != 0, adv, 0.0)
  return adv


def rlsd_lambda(iteration: ArrayLike, lam0: float = 0.5, warmdown_iterations: int = 100) -> Array:
  """RLSD mixing weight: lam0 * (1 - k / K) at training iteration k < K, else 0 (docs/reference.md
  §2.4; the reference's global step is our iteration).

  `iteration` may be traced. It starts at 1, as the reference's steps do, so the first iteration
  uses lam0 * (1 - 1/K). `warmdown_iterations <= 0` means no warm-down (constant lam0; ours).
  """
  iteration = jnp.asarray(iteration, jnp.float32)
  if warmdown_iterations <= 0:
    return jnp.full_like(iteration, lam0)
  k = float(warmdown_iterations)
  return jnp.where(iteration < k, lam0 * (1.0 - iteration / k), 0.0)


def rlsd_token_advantages(
  seq_adv: ArrayLike,
  teacher_logp: ArrayLike,
  old_logp: ArrayLike,
  mask: ArrayLike,
  teacher_weight: ArrayLike,
  clip_eps: float = 0.2,
) -> Array:
  """RLSD token advantages [B, R] (docs/reference.md §2.4), no gradient.

  w_t = clip(exp(sign(A) * (lT_t - lold_t)), 1 - eps, 1 + eps);
  A_t = A * ((1 - λ) + λ * w_t) * m_t with λ = `teacher_weight` (`rlsd_lambda`).  A = 0 gives
  exactly 0.
  """
  seq_adv = jax.lax.stop_gradient(jnp.asarray(seq_adv, jnp.float32))
  gap = jax.lax.stop_gradient(
    jnp.asarray(teacher_logp, jnp.float32) - jnp.asarray(old_logp, jnp.float32)
  )
  m = jnp.asarray(mask, jnp.float32)
  if seq_adv.ndim != gap.ndim - 1:
    raise ValueError(f"seq_adv must be [B] for log-probs [B, R], got {seq_adv.shape}")
  a = seq_adv[..., None]
  weight = jnp.clip(jnp.exp(jnp.sign(a) * gap), 1.0 - clip_eps, 1.0 + clip_eps)
  adv = a * ((1.0 - teacher_weight) + teacher_weight * weight) * m
  return jnp.where(m != 0, adv, 0.0)  # NaN/inf log-probs in padding must not leak


def _segmented_cumsum(values: Array, starts: Array) -> Array:
  """Inclusive running sums of `values` [N] that restart wherever `starts` [N] is True (exact per
  segment: no running total of the whole array is subtracted)."""

  def combine(a, b):
    (fa, va), (fb, vb) = a, b
    return fa | fb, jnp.where(fb, vb, va + vb)

  _, out = jax.lax.associative_scan(combine, (starts, values))
  return out


# Estimators that mix the teacher in with a weight that follows the training iteration:
# name -> fn(algo, iteration) -> the weight λ (traced), passed to the estimator as teacher_weight
# and logged as "<name>/lambda".
ScheduleFn = Callable[..., Array]
ADVANTAGE_SCHEDULES: Registry[ScheduleFn] = Registry("advantage schedule")


def advantage_clip_eps(algo) -> float:
  """The clip of the estimator's teacher weight (RLSD's algo.rlsd.clip_eps; read by no other)."""
  return float(algo.rlsd.clip_eps)


def advantage_teacher_weight(algo, iteration: ArrayLike) -> tuple[Array, dict[str, Array]]:
  """(λ, metrics) of `algo.advantage`'s schedule at `iteration` (1-based); (0, {}) for an
  estimator without one."""
  if algo.advantage not in ADVANTAGE_SCHEDULES:
    return jnp.zeros((), jnp.float32), {}
  weight = ADVANTAGE_SCHEDULES.get(algo.advantage)(algo, iteration)
  return weight, {f"{algo.advantage}/lambda": weight}


TokenAdvFn = Callable[..., Array]
ADVANTAGE_ESTIMATORS: Registry[TokenAdvFn] = Registry("advantage estimator")


@ADVANTAGE_ESTIMATORS.register("grpo")
def _grpo_token_advantages(
  seq_adv, mask, *, teacher_logp=None, old_logp=None, teacher_weight=0.0, clip_eps=0.2
) -> Array:
  del teacher_logp, old_logp, teacher_weight, clip_eps
  m = jnp.asarray(mask, jnp.float32)
  return jnp.asarray(seq_adv, jnp.float32)[..., None] * m


@ADVANTAGE_SCHEDULES.register("rlsd")
def _rlsd_schedule(algo, iteration) -> Array:
  return rlsd_lambda(iteration, algo.rlsd.lam0, algo.rlsd.warmdown_iterations)


@ADVANTAGE_ESTIMATORS.register("rlsd")
def _rlsd(
  seq_adv, mask, *, teacher_logp=None, old_logp=None, teacher_weight=0.0, clip_eps=0.2
) -> Array:
  if teacher_logp is None or old_logp is None:
    raise ValueError("advantage 'rlsd' needs teacher_logp and old_logp")
  return rlsd_token_advantages(seq_adv, teacher_logp, old_logp, mask, teacher_weight, clip_eps)


def token_advantages(
  name: str,
  seq_adv: ArrayLike,
  mask: ArrayLike,
  *,
  teacher_logp: ArrayLike | None = None,
  old_logp: ArrayLike | None = None,
  teacher_weight: ArrayLike = 0.0,
  clip_eps: float = 0.2,
) -> Array:
  """Per-token advantages [B, R] from per-sample ones [B] with estimator `name`
  ("grpo": broadcast x mask; "rlsd": teacher re-weighting mixed in with `teacher_weight`)."""
  return ADVANTAGE_ESTIMATORS.get(name)(
    seq_adv,
    mask,
    teacher_logp=teacher_logp,
    old_logp=old_logp,
    teacher_weight=teacher_weight,
    clip_eps=clip_eps,
  )
