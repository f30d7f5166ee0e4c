"""Policy-gradient objective (verl dual-clip PPO), KL to a reference policy, entropy bonus.

Per-token arrays are [B, R]; aggregation and the micro-batch rule for `denom` / `num_seqs`
and for metrics are described in `aggregation`. Metrics carry verl's names.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from sdar_jax.algos.aggregation import agg_loss, masked_mean
from sdar_jax.algos.registry import Registry

Array = jax.Array
ArrayLike = jax.typing.ArrayLike
Metrics = dict[str, Array]


def policy_loss(
  logp: ArrayLike,
  old_logp: ArrayLike,
  advantages: ArrayLike,
  mask: ArrayLike,
  clip_low: float = 0.2,
  clip_high: float = 0.2,
  clip_c: float = 3.0,
  agg: str = "token-mean",
  denom: ArrayLike | None = None,
  num_seqs: ArrayLike | None = None,
) -> tuple[Array, Metrics]:
  """Dual-clip PPO, exactly `verl.trainer.ppo.core_algos.compute_policy_loss`.

  ratio = exp(clamp(logp - old_logp, -20, 20))
  clip1 = max(-A*ratio, -A*clip(ratio, 1-clip_low, 1+clip_high))
  loss_t = min(-A*clip_c, clip1) where A < 0, else clip1.

  `advantages` are per token [B, R] (RLSD makes them token-level) or per sample [B]
  (broadcast over tokens); they and `old_logp` carry no gradient.
  Metrics: actor/pg_loss, actor/pg_clipfrac (share of tokens where the clipped term is
  larger), actor/pg_clipfrac_lower (share with A < 0 where the dual clip bites),
  actor/ppo_kl (masked mean of old_logp - logp, on the clamped difference as verl).
  """
  logp = jnp.asarray(logp, jnp.float32)
  old_logp = jax.lax.stop_gradient(jnp.asarray(old_logp, jnp.float32))
  adv = jax.lax.stop_gradient(jnp.asarray(advantages, jnp.float32))
  if adv.ndim == logp.ndim - 1:
    adv = adv[..., None]
  adv = jnp.broadcast_to(adv, logp.shape)
  if isinstance(clip_c, (int, float)) and clip_c <= 1.0:
    raise ValueError(f"clip_c must be > 1.0 for dual-clip PPO, got {clip_c}")

  log_ratio = jnp.clip(logp - old_logp, -20.0, 20.0)
  ratio = jnp.exp(log_ratio)
  pg1 = -adv * ratio
  pg2 = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  clip1 = jnp.maximum(pg1, pg2)
  pg3 = -adv * clip_c
  clip2 = jnp.minimum(pg3, clip1)
  per_token = jnp.where(adv < 0, clip2, clip1)

  loss = agg_loss(per_token, mask, agg, denom, num_seqs)
  metrics = {
    "actor/pg_loss": loss,
    "actor/pg_clipfrac": masked_mean((pg2 > pg1).astype(jnp.float32), mask, denom),
    "actor/pg_clipfrac_lower": masked_mean(
      ((clip1 > pg3) & (adv < 0)).astype(jnp.float32), mask, denom
    ),
    "actor/ppo_kl": masked_mean(-log_ratio, mask, denom),
  }
  return loss, jax.lax.stop_gradient(metrics)


KlFn = Callable[[Array, Array], Array]
KL_PENALTIES: Registry[KlFn] = Registry("kl penalty")


@KL_PENALTIES.register("kl")
def _k1(logp: Array, ref_logp: Array) -> Array:
  return logp - ref_logp


@KL_PENALTIES.register("abs")
def _abs(logp: Array, ref_logp: Array) -> Array:
  return jnp.abs(logp - ref_logp)


@KL_PENALTIES.register("mse")
def _k2(logp: Array, ref_logp: Array) -> Array:
  return 0.5 * jnp.square(logp - ref_logp)


@KL_PENALTIES.register("low_var_kl")
def _k3(logp: Array, ref_logp: Array) -> Array:
  # Clamping the log-ratio before exp keeps exp finite (and its gradient NaN-free); values
  # with |kl| > 20 are clamped to 10 by the outer clamp anyway, so results equal verl's.
  kl = jnp.clip(ref_logp - logp, -20.0, 20.0)
  return jnp.clip(jnp.exp(kl) - kl - 1.0, -10.0, 10.0)


# verl's aliases
KL_PENALTIES.register("k1")(_k1)
KL_PENALTIES.register("k2")(_k2)
KL_PENALTIES.register("k3")(_k3)


def kl_penalty(logp: ArrayLike, ref_logp: ArrayLike, kind: str = "low_var_kl") -> Array:
  """Per-token KL estimate of pi_theta || pi_ref on the sampled tokens.

  "low_var_kl"/"k3": clamp(exp(k) - k - 1, -10, 10) with k = ref - logp;
  "kl"/"k1": logp - ref; "mse"/"k2": 0.5 (logp - ref)^2; "abs": |logp - ref|.
  The reference log-probs carry no gradient.
  """
  logp = jnp.asarray(logp, jnp.float32)
  ref_logp = jax.lax.stop_gradient(jnp.asarray(ref_logp, jnp.float32))
  return KL_PENALTIES.get(kind)(logp, ref_logp)


def kl_loss(
  logp: ArrayLike,
  ref_logp: ArrayLike,
  mask: ArrayLike,
  kind: str = "low_var_kl",
  agg: str = "token-mean",
  denom: ArrayLike | None = None,
  num_seqs: ArrayLike | None = None,
) -> tuple[Array, Metrics]:
  """Aggregated KL-to-reference loss; metrics {"actor/kl_loss"}. The caller scales by c_kl."""
  loss = agg_loss(kl_penalty(logp, ref_logp, kind), mask, agg, denom, num_seqs)
  return loss, {"actor/kl_loss": jax.lax.stop_gradient(loss)}


def entropy_from_logits(logits: ArrayLike) -> Array:
  """Entropy of softmax(logits) over the last axis: [B, R, V] -> [B, R].

  logsumexp(z) - sum softmax(z) * z as verl, on z = logits - max(logits): the same value,
  without float32 cancellation when logits are large.
  """
  logits = jnp.asarray(logits, jnp.float32)
  z = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  probs = jax.nn.softmax(z, axis=-1)
  return jax.nn.logsumexp(z, axis=-1) - jnp.sum(probs * z, axis=-1)


def entropy_loss(
  entropy: ArrayLike,
  mask: ArrayLike,
  agg: str = "token-mean",
  denom: ArrayLike | None = None,
  num_seqs: ArrayLike | None = None,
) -> tuple[Array, Metrics]:
  """Aggregated entropy (a bonus: the caller SUBTRACTS c_ent times it); metrics {"actor/entropy"}."""
  value = agg_loss(entropy, mask, agg, denom, num_seqs)
  return value, {"actor/entropy": jax.lax.stop_gradient(value)}
