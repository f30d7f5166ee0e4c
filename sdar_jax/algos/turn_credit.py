"""Turn-level credit from the teacher: estimators that rewrite each turn-sample's GRPO advantage
once per iteration, before the first update, from its turn's teacher gap (AgentOPSD, GRSD).

They need what one mini-batch does not hold (every turn-sample of a GRPO group, every turn of an
episode in order), so they are registered in `TURN_ADVANTAGES` (name -> rewrite) and applied by
their hooks after the teacher is scored (`algos.hooks`), on a `TurnTable` of the whole iteration;
inside the update their advantage is broadcast to the turn's tokens as GRPO's (the same name is
registered in `ADVANTAGE_ESTIMATORS`).
A rewrite is `fn(algo, table) -> [N]` advantages; no gradient, float32 (the built-in ones are
jitted: one compilation per number of turn-samples).
Sources and every difference from them: docs/reference.md §11.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sdar_jax.algos.advantages import (
  ADVANTAGE_ESTIMATORS,
  _grpo_token_advantages,
  _segmented_cumsum,
  _segments,
)
from sdar_jax.algos.hooks import MethodHooks, register_hooks
from sdar_jax.algos.registry import Registry

Array = jax.Array
ArrayLike = jax.typing.ArrayLike


class TurnTable(NamedTuple):
  """One row per turn-sample of the iteration, every array [N]."""

  advantage: ArrayLike  # GRPO's advantage A
  gap_sum: ArrayLike  # Σ over the turn's response tokens of lT − lθ_old
  gap_mean: ArrayLike  # the same, divided by the turn's response tokens
  group: ArrayLike  # GRPO group, integers in [0, num_groups)
  episode: ArrayLike  # episode, unique across groups
  turn: ArrayLike  # the turn's index in its episode (need not be contiguous)
  won: ArrayLike  # 1.0 where the turn's episode succeeded
  mask: ArrayLike | None = None  # 0 on padding rows (they get 0, and stay out of every statistic)


RewriteFn = Callable[..., Array]
TURN_ADVANTAGES: Registry[RewriteFn] = Registry("turn-level advantage")


def register_turn_advantage(name: str) -> Callable[[RewriteFn], RewriteFn]:
  """Registers a rewrite under `name` in `TURN_ADVANTAGES`, and `name` in `ADVANTAGE_ESTIMATORS`
  as GRPO's broadcast (inside the update the rewritten advantage is broadcast to the tokens)."""

  def decorator(fn: RewriteFn) -> RewriteFn:
    TURN_ADVANTAGES.register(name)(fn)
    ADVANTAGE_ESTIMATORS.register(name)(_grpo_token_advantages)
    return fn

  return decorator


def _episode_order(episodes: Array, turns: Array) -> tuple[Array, Array, Array]:
  """(order, starts, segment): the permutation sorting rows by (episode, turn), whether each sorted
  row opens its episode, and each sorted row's episode index 0..E−1."""
  order = jnp.lexsort((turns, episodes))
  ep = episodes[order]
  starts = jnp.concatenate([jnp.ones((1,), bool), ep[1:] != ep[:-1]])
  return order, starts, jnp.cumsum(starts.astype(jnp.int32)) - 1


def _beliefs(delta: Array, starts: Array, logit0: Array, eps: float) -> tuple[Array, Array]:
  """(V_k, V_{k−1}) of sorted rows: logit V_k = logit0 + Σ_{j ≤ k} δ_j within each episode, V
  clamped to [eps, 1 − eps]; V_{−1} is sigmoid(logit0), unclamped."""
  cum = _segmented_cumsum(delta, starts)
  now = jnp.clip(jax.nn.sigmoid(logit0 + cum), eps, 1.0 - eps)
  before = jnp.concatenate([jnp.zeros((1,), jnp.float32), now[:-1]])
  return now, jnp.where(starts, jax.nn.sigmoid(logit0), before)


@functools.partial(jax.jit, static_argnames=("lam", "band", "eps", "v0_clamp", "num_groups"))
def agent_opsd_advantages(
  table: TurnTable,
  *,
  lam: float = 0.5,
  band: float = 0.2,
  eps: float = 1e-6,
  v0_clamp: float = 1e-4,
  num_groups: int | None = None,
) -> Array:
  """AgentOPSD as published (ZethWang/AgentOPSD@0c478b2, `compute_opsd_turn_advantage` with
  belief_mult, signed, mult_lambda 0.5, V_0 from `compute_group_mean_v0`).

  V_0: the group's success rate over its episodes, clamped to [v0_clamp, 1 − v0_clamp]. Per
  episode, turns in order: logit V_k = logit V_0 + Σ_{j ≤ k} δ_j (δ: `gap_sum`), V_k clamped to
  [eps, 1 − eps]; q_k = V_k − V_{k−1} (V_{−1} = V_0); z_k = (q_k − mean q) / (std q + eps) with
  the episode's population std (0 in a one-turn episode); m_k = clip(1 + band·sign(A)·z_k,
  1 − band, 1 + band); A'_k = A·((1 − lam) + lam·m_k). A' keeps A's sign, |A'| within lam·band of
  |A|."""
  adv = jax.lax.stop_gradient(jnp.asarray(table.advantage, jnp.float32))
  mask = jnp.ones_like(adv) if table.mask is None else jnp.asarray(table.mask, jnp.float32)
  delta = jnp.where(mask > 0, jnp.asarray(table.gap_sum, jnp.float32), 0.0)
  won = jnp.asarray(table.won, jnp.float32) * mask
  order, starts, seg = _episode_order(jnp.asarray(table.episode), jnp.asarray(table.turn))
  n = adv.shape[0]
  # V_0: each episode counted once (its first row), in its group
  groups, n_groups = _segments(table.group, num_groups)
  first = jnp.zeros((n,), jnp.float32).at[order].set(starts.astype(jnp.float32)) * mask
  episodes_in = jax.ops.segment_sum(first, groups, n_groups)
  wins_in = jax.ops.segment_sum(first * won, groups, n_groups)
  v0 = jnp.clip(wins_in / jnp.maximum(episodes_in, 1.0), v0_clamp, 1.0 - v0_clamp)[groups]
  v0_sorted = v0[order]
  logit0 = jnp.log(v0_sorted) - jnp.log1p(-v0_sorted)
  now, before = _beliefs(delta[order], starts, logit0, eps)
  q = now - before
  live = mask[order]
  count = jax.ops.segment_sum(live, seg, n)
  mean = jax.ops.segment_sum(q * live, seg, n) / jnp.maximum(count, 1.0)
  dev = (q - mean[seg]) * live
  std = jnp.sqrt(jax.ops.segment_sum(dev * dev, seg, n) / jnp.maximum(count, 1.0))
  z_sorted = jnp.where(count[seg] > 1, dev / (std[seg] + eps), 0.0)
  z = jnp.zeros((n,), jnp.float32).at[order].set(z_sorted)
  m = jnp.clip(1.0 + band * jnp.sign(adv) * z, 1.0 - band, 1.0 + band)
  return jnp.where(mask > 0, adv * ((1.0 - lam) + lam * m), 0.0)


@functools.partial(jax.jit, static_argnames=("v0", "eps", "norm_eps", "num_groups"))
def agent_opsd_rms_advantages(
  table: TurnTable,
  *,
  v0: float = 0.5,
  eps: float = 1e-4,
  norm_eps: float = 1e-6,
  num_groups: int | None = None,
) -> Array:
  """Ours, after AgentOPSD's anchoring ablation: the belief walk of `agent_opsd_advantages` from a
  fixed V_0 = `v0` (V clamped to [eps, 1 − eps], V_{−1} clamped alike); a turn's raw advantage is
  sign(A)·|V_k − V_{k−1}| (GRPO's magnitude replaced, its sign kept), divided by the root mean
  square of its group's raw values (+ norm_eps): a scale, not a centring, so no turn changes sign.
  A group whose episodes all ended alike has A = 0, hence 0 everywhere."""
  adv = jax.lax.stop_gradient(jnp.asarray(table.advantage, jnp.float32))
  mask = jnp.ones_like(adv) if table.mask is None else jnp.asarray(table.mask, jnp.float32)
  delta = jnp.where(mask > 0, jnp.asarray(table.gap_sum, jnp.float32), 0.0)
  order, starts, _ = _episode_order(jnp.asarray(table.episode), jnp.asarray(table.turn))
  logit0 = jnp.full((adv.shape[0],), jnp.log(v0) - jnp.log1p(-v0), jnp.float32)
  now, before = _beliefs(delta[order], starts, logit0, eps)
  before = jnp.clip(before, eps, 1.0 - eps)
  step = jnp.zeros_like(delta).at[order].set(jnp.abs(now - before))
  raw = jnp.where(mask > 0, jnp.sign(adv) * step, 0.0)
  seg, n_seg = _segments(table.group, num_groups)
  count = jax.ops.segment_sum(mask, seg, n_seg)
  rms = jnp.sqrt(jax.ops.segment_sum(raw * raw, seg, n_seg) / jnp.maximum(count, 1.0))
  return raw / (rms[seg] + norm_eps)


@functools.partial(jax.jit, static_argnames=("scale", "clip", "floor", "eps", "num_groups"))
def grsd_advantages(
  table: TurnTable,
  *,
  scale: float = 0.5,
  clip: float = 0.2,
  floor: float = 0.1,
  eps: float = 1e-6,
  num_groups: int | None = None,
) -> Array:
  """GRSD as published (BinbZheng1/GRSD@393213a, `compute_grsd_turn_advantage`; every launcher's
  G_HAT_MAX 0.2, λ 0.5, eta 0).

  q = sign(A)·`gap_mean`, clamped to [−20, 20]; e = expm1(q); q̃ = e / (mean over the group's rows
  of |e| + eps), the group counted only when it holds both a won and a lost episode (m = 1);
  A' = A·max(1 + scale·clip(q̃·m, −clip, clip)·m, floor). With clip 0.2 the factor stays in
  [0.9, 1.1]; a group whose episodes all ended alike keeps A."""
  adv = jax.lax.stop_gradient(jnp.asarray(table.advantage, jnp.float32))
  gap = jax.lax.stop_gradient(jnp.asarray(table.gap_mean, jnp.float32))
  mask = jnp.ones_like(adv) if table.mask is None else jnp.asarray(table.mask, jnp.float32)
  seg, n_seg = _segments(table.group, num_groups)
  q = jnp.clip(jnp.where(mask > 0, jnp.sign(adv) * gap, 0.0), -20.0, 20.0)
  e = jnp.expm1(q)
  count = jax.ops.segment_sum(mask, seg, n_seg)
  won = jnp.asarray(table.won, jnp.float32) * mask
  wins = jax.ops.segment_sum(won, seg, n_seg)
  mixed = ((wins > 0) & (wins < count)).astype(jnp.float32)
  mean_abs = jax.ops.segment_sum(jnp.abs(e) * mask, seg, n_seg) / jnp.maximum(count, 1.0)
  m = mixed[seg]
  q_tilde = e / ((mean_abs * mixed)[seg] + eps)  # non-mixed groups: any value, m = 0 below
  factor = jnp.maximum(1.0 + scale * jnp.clip(q_tilde * m, -clip, clip) * m, floor)
  return jnp.where(mask > 0, adv * factor, 0.0)


@register_turn_advantage("agent_opsd")
def _agent_opsd(algo, table: TurnTable, num_groups: int | None = None) -> Array:
  return agent_opsd_advantages(
    table,
    lam=algo.agent_opsd.lam,
    band=algo.agent_opsd.band,
    eps=algo.agent_opsd.eps,
    num_groups=num_groups,
  )


@register_turn_advantage("agent_opsd_rms")
def _agent_opsd_rms(algo, table: TurnTable, num_groups: int | None = None) -> Array:
  return agent_opsd_rms_advantages(
    table, v0=algo.agent_opsd.v0, eps=algo.agent_opsd.eps, num_groups=num_groups
  )


@register_turn_advantage("grsd")
def _grsd(algo, table: TurnTable, num_groups: int | None = None) -> Array:
  return grsd_advantages(
    table,
    scale=algo.grsd.scale,
    clip=algo.grsd.clip,
    floor=algo.grsd.floor,
    num_groups=num_groups,
  )


def turn_rewrite(algo) -> Callable[..., Array]:
  """`fn(table, num_groups=None)`: the rewrite `algo.advantage` names, with `algo`'s settings."""
  fn = TURN_ADVANTAGES.get(algo.advantage)
  return lambda table, num_groups=None: fn(algo, table, num_groups=num_groups)


class _TurnAdvantageHooks(MethodHooks):
  """After the teacher is scored at θ_old: every turn-sample's advantage rewritten (while the
  run's algorithm still names a rewrite: a retired one does not)."""

  def after_teacher_scoring(self, view):
    if view.algo.advantage not in TURN_ADVANTAGES:
      return None
    return view.rewrite_advantages(turn_rewrite(view.algo))


@register_hooks("turn_advantages")
def _turn_advantage_hooks(algo) -> MethodHooks | None:
  return _TurnAdvantageHooks() if algo.advantage in TURN_ADVANTAGES else None
