"""Advantage estimators: multi-turn GRPO (docs/reference.md §2.1), RLSD token re-weighting
(docs/reference.md §2.4), and the turn-level teacher advantages of AgentOPSD and GRSD.

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


def rlsd_lambda(step: ArrayLike, lam0: float = 0.5, warmdown_steps: int = 100) -> Array:
  """RLSD mixing weight: lam0 * (1 - step / K) for step < K, else 0 (docs/reference.md §2.4).

  `step` may be traced. Steps start at 1 in the reference, so the first update uses
  lam0 * (1 - 1/K). `warmdown_steps <= 0` means no warm-down (constant lam0; our choice).
  """
  step = jnp.asarray(step, jnp.float32)
  if warmdown_steps <= 0:
    return jnp.full_like(step, lam0)
  k = float(warmdown_steps)
  return jnp.where(step < k, lam0 * (1.0 - step / k), 0.0)


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


def agent_opsd_advantages(
  seq_adv: ArrayLike,
  turn_gap_sum: ArrayLike,
  group_ids: ArrayLike,
  episode_ids: ArrayLike,
  turn_index: ArrayLike,
  *,
  v0: float = 0.5,
  eps: float = 1e-4,
  norm_eps: float = 1e-6,
  sample_mask: ArrayLike | None = None,
  num_groups: int | None = None,
) -> Array:
  """AgentOPSD's turn advantages [N] from per-turn-sample inputs [N]; jittable, no gradient.

  Each episode carries a belief V that it will succeed, kept in logit space and moved by the
  teacher at every turn: with δ_k = `turn_gap_sum` = Σ over turn k's tokens of (lT − lθ_old),
  logit V_k = logit V_0 + Σ_{j ≤ k} δ_j over the episode's turns in `turn_index` order, and V_k
  clamped to [eps, 1 − eps] (V_{−1} is V_0, clamped alike). The turn's raw advantage is
  sign(A)·|V_k − V_{k−1}| (A = `seq_adv`, the turn-sample's GRPO advantage: a turn of a won
  episode gains by how much the teacher moved the belief there, a lost one's loses by as much).
  Normalised within each group by the root mean square of its turn-samples' raw values (+
  `norm_eps`): a scale, not a centring, so every turn keeps GRPO's sign (subtracting the group
  mean would give the turns of a lost episode positive advantages whenever another turn of the
  group lost more). A group whose episodes all ended alike has A = 0, hence 0 everywhere. Rows
  with `sample_mask` 0 get 0 and stay out of the statistics."""
  adv = jax.lax.stop_gradient(jnp.asarray(seq_adv, jnp.float32))
  delta = jax.lax.stop_gradient(jnp.asarray(turn_gap_sum, jnp.float32))
  mask = jnp.ones_like(adv) if sample_mask is None else jnp.asarray(sample_mask, jnp.float32)
  delta = jnp.where(mask > 0, delta, 0.0)
  episodes = jnp.asarray(episode_ids)
  turns = jnp.asarray(turn_index)
  order = jnp.lexsort((turns, episodes))  # by episode, then turn
  ep_sorted = episodes[order]
  starts = jnp.concatenate([jnp.ones((1,), bool), ep_sorted[1:] != ep_sorted[:-1]])
  cum = _segmented_cumsum(delta[order], starts)
  prev = jnp.where(starts, 0.0, jnp.concatenate([jnp.zeros((1,), jnp.float32), cum[:-1]]))
  logit0 = jnp.log(v0) - jnp.log1p(-v0)
  v_now = jnp.clip(jax.nn.sigmoid(logit0 + cum), eps, 1.0 - eps)
  v_before = jnp.clip(jax.nn.sigmoid(logit0 + prev), eps, 1.0 - eps)
  step = jnp.zeros_like(delta).at[order].set(jnp.abs(v_now - v_before))
  raw = jnp.where(mask > 0, jnp.sign(adv) * step, 0.0)
  seg, n_seg = _segments(group_ids, num_groups)
  count = jax.ops.segment_sum(mask, seg, n_seg)
  rms = jnp.sqrt(jax.ops.segment_sum(raw * raw, seg, n_seg) / jnp.maximum(count, 1.0))
  return raw / (rms[seg] + norm_eps)


def grsd_advantages(
  seq_adv: ArrayLike,
  turn_gap_mean: ArrayLike,
  group_ids: ArrayLike,
  won: ArrayLike,
  *,
  scale: float = 0.5,
  clip: float = 3.0,
  floor: float = 0.1,
  sample_mask: ArrayLike | None = None,
  num_groups: int | None = None,
) -> Array:
  """GRSD's turn advantages [N] from per-turn-sample inputs [N]; jittable, no gradient.

  q = sign(A)·`turn_gap_mean` (the mean over the turn's tokens of lT − lθ_old, A = `seq_adv`);
  q̃ = expm1(q) / mean over the group's turn-samples of |expm1(q)| (0 where that mean is 0);
  A' = A·max(1 + scale·clip(q̃, −clip, clip)·m, floor), with m = 1 only in a group holding both a
  won and a lost episode (`won` per turn-sample), so a group whose episodes all ended alike keeps
  A. q is clamped to [−20, 20] before expm1 so that float32 stays finite (a mean token gap of 20
  nats is far past anything a teacher of the same model gives). Rows with `sample_mask` 0 get 0
  and stay out of the group means."""
  adv = jax.lax.stop_gradient(jnp.asarray(seq_adv, jnp.float32))
  gap = jax.lax.stop_gradient(jnp.asarray(turn_gap_mean, jnp.float32))
  mask = jnp.ones_like(adv) if sample_mask is None else jnp.asarray(sample_mask, jnp.float32)
  seg, n_seg = _segments(group_ids, num_groups)
  q = jnp.clip(jnp.where(mask > 0, jnp.sign(adv) * gap, 0.0), -20.0, 20.0)
  e = jnp.expm1(q)
  count = jax.ops.segment_sum(mask, seg, n_seg)
  scale_abs = jax.ops.segment_sum(jnp.abs(e) * mask, seg, n_seg) / jnp.maximum(count, 1.0)
  denom = scale_abs[seg]
  q_tilde = jnp.where(denom > 0, e / jnp.where(denom > 0, denom, 1.0), 0.0)
  won = jnp.asarray(won, jnp.float32) * mask
  wins = jax.ops.segment_sum(won, seg, n_seg)[seg]
  mixed = ((wins > 0) & (wins < count[seg])).astype(jnp.float32)
  factor = jnp.maximum(1.0 + scale * jnp.clip(q_tilde, -clip, clip) * mixed, floor)
  return jnp.where(mask > 0, adv * factor, 0.0)


# Estimators that rewrite each turn-sample's advantage from its turn's teacher gap before the
# update (over the whole iteration: they need the GRPO groups and the episodes' turns); the
# update then broadcasts the rewritten advantage to the turn's tokens as GRPO does.
TURN_ADVANTAGES = ("agent_opsd", "grsd")


TokenAdvFn = Callable[..., Array]
ADVANTAGE_ESTIMATORS: Registry[TokenAdvFn] = Registry("advantage estimator")


@ADVANTAGE_ESTIMATORS.register("grpo")
def _grpo_token_advantages(
  seq_adv, mask, *, teacher_logp=None, old_logp=None, teacher_weight=0.0, clip_eps=0.2
) -> Array:
  del teacher_logp, old_logp, teacher_weight, clip_eps
  m = jnp.asarray(mask, jnp.float32)
  return jnp.asarray(seq_adv, jnp.float32)[..., None] * m


# AgentOPSD and GRSD (TURN_ADVANTAGES): the batch's advantages were rewritten per turn before the
# update (`agent_opsd_advantages`, `grsd_advantages`); inside it they broadcast like GRPO's.
ADVANTAGE_ESTIMATORS.register("agent_opsd")(_grpo_token_advantages)
ADVANTAGE_ESTIMATORS.register("grsd")(_grpo_token_advantages)


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
