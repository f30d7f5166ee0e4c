"""Ours, after SDPO (arXiv 2601.20802; lasgroup/SDPO at 0e6d510): its self-distillation loss, the
`algo.distill="sdpo"` term, in place of the policy gradient in preset `sdpo`.

Per response position: the student's top-k tokens (k = `algo.sdpo.top_k`, SDPO's
distillation_topk), both branches' log-probs of them plus a tail bucket log(1 − Σ_k p), and the
generalised Jensen–Shannon divergence (1 − α)·KL(pθ ‖ m) + α·KL(pT ‖ m), m = (1 − α)·pθ + α·pT
(α = 0: KL(pT ‖ pθ), α = 1: KL(pθ ‖ pT)); the per-token value is multiplied by the importance
ratio exp(lθ − lold) (detached, clamped to [e^−20, `is_clip`]) and averaged over the tokens.
`sdpo_divergence` is computed in the update from both branches' log-softmax (teacher_source
"update", as the vocab forms); `sdpo_loss` aggregates it. Ported from
`verl/trainer/ppo/core_algos.py::compute_self_distillation_loss` (tests/unit/algos/test_sdpo.py
checks it against a NumPy transcription of that function). docs/reference.md, "SDPO".
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from sdar_jax.algos.aggregation import agg_loss, masked_mean
from sdar_jax.algos.distill import DISTILL_LOSSES

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SDPO:
  """SDPO's loss settings (algo.distill="sdpo"; defaults: SDPO's experiments)."""

  top_k: int = 100
  """The student's most likely tokens the divergence is taken over (SDPO's distillation_topk)."""
  alpha: float = 0.5
  """In [0, 1]: 0 forward KL(pT ‖ pθ), 1 reverse KL(pθ ‖ pT), between them the generalised
  Jensen–Shannon divergence with mixture weight α on the teacher."""
  is_clip: float = 2.0
  """The importance ratio exp(lθ − lold) is clamped to at most this (> 0); 0 disables it."""
  add_tail: bool = True
  """A tail bucket log(1 − Σ_k p) beside the k (else the k are renormalised)."""


def _with_tail(logp: Array) -> Array:
  log_s = jnp.minimum(jax.nn.logsumexp(logp, axis=-1, keepdims=True), -1e-7)
  return jnp.concatenate([logp, jnp.log(-jnp.expm1(log_s))], axis=-1)


def sdpo_divergence(
  student_log_softmax: Any, teacher_log_softmax: Any, *, top_k: int, alpha: float, add_tail=True
) -> Array:
  """[B, R, V] x 2 -> [B, R]: SDPO's divergence over the student's top-k tokens (module
  docstring); the gradient flows through the student's log-probs only."""
  ls = jnp.asarray(student_log_softmax, jnp.float32)
  lt = jax.lax.stop_gradient(jnp.asarray(teacher_log_softmax, jnp.float32))
  k = min(int(top_k), ls.shape[-1])
  _, idx = jax.lax.top_k(jax.lax.stop_gradient(ls), k)
  ls, lt = jnp.take_along_axis(ls, idx, axis=-1), jnp.take_along_axis(lt, idx, axis=-1)
  if add_tail:
    ls, lt = _with_tail(ls), _with_tail(lt)
  else:
    ls = ls - jax.nn.logsumexp(ls, axis=-1, keepdims=True)
    lt = lt - jax.nn.logsumexp(lt, axis=-1, keepdims=True)
  if alpha == 0.0:
    kl = jnp.exp(lt) * (lt - ls)
  elif alpha == 1.0:
    kl = jnp.exp(ls) * (ls - lt)
  else:
    mix = jnp.logaddexp(ls + jnp.log1p(-alpha), lt + jnp.log(alpha))
    kl_teacher = jnp.exp(lt) * (lt - mix)
    kl_student = jnp.exp(ls) * (ls - mix)
    kl = kl_student + alpha * (kl_teacher - kl_student)
  return kl.sum(-1)


def sdpo_loss(
  student_logp: Any,
  old_logp: Any,
  divergence: Any,
  mask: Any,
  *,
  is_clip: float = 2.0,
  agg: str = "token-mean",
  denom: Any = None,
  num_seqs: Any = None,
) -> tuple[Array, dict[str, Array]]:
  """SDPO's loss from the per-token `divergence` ([B, R], `sdpo_divergence`): agg(divergence ·
  ratio, mask), ratio = min(exp(clip(sg(lθ − lold), −20, 20)), is_clip) (no ratio when is_clip
  is 0). Metrics: sdpo/loss, sdpo/divergence_mean, sdpo/ratio_mean."""
  div = jnp.asarray(divergence, jnp.float32)
  ratio = jnp.ones_like(div)
  if is_clip:
    log_ratio = jax.lax.stop_gradient(jnp.asarray(student_logp) - jnp.asarray(old_logp))
    ratio = jnp.minimum(jnp.exp(jnp.clip(log_ratio, -20.0, 20.0)), is_clip)
  loss = agg_loss(div * ratio, mask, agg, denom, num_seqs)
  metrics = {
    "sdpo/loss": loss,
    "sdpo/divergence_mean": masked_mean(div, mask, denom),
    "sdpo/ratio_mean": masked_mean(ratio, mask, denom),
  }
  return loss, jax.lax.stop_gradient(metrics)


@DISTILL_LOSSES.register("sdpo")
def _sdpo(
  *,
  student_logp,
  old_logp,
  mask,
  vocab_term=None,
  sdpo: SDPO = SDPO(),
  agg="token-mean",
  denom=None,
  num_seqs=None,
  **unused,
):
  del unused
  if vocab_term is None:
    raise ValueError(
      "algo.distill='sdpo' reads both branches' distributions: pass vocab_term=[B, R] "
      "(sdpo_divergence of the student's and the teacher's log-softmax)"
    )
  return sdpo_loss(
    student_logp,
    old_logp,
    vocab_term,
    mask,
    is_clip=sdpo.is_clip,
    agg=agg,
    denom=denom,
    num_seqs=num_seqs,
  )


def sdpo_problems(algo: Any) -> list[str]:
  """Every invalid algo.sdpo setting, one "algo.<key>=<value>: <problem>. Fix: <fix>" line each."""
  s, out = algo.sdpo, []
  if not isinstance(s.top_k, int) or isinstance(s.top_k, bool) or s.top_k < 1:
    out.append(f"algo.sdpo.top_k={s.top_k!r}: must be an integer >= 1. Fix: use SDPO's 100")
  if not isinstance(s.alpha, (int, float)) or isinstance(s.alpha, bool) or not 0 <= s.alpha <= 1:
    out.append(
      f"algo.sdpo.alpha={s.alpha!r}: must be in [0, 1]. Fix: use 0.5 (the Jensen–Shannon "
      "mixture), 0 (forward KL) or 1 (reverse KL)"
    )
  if not isinstance(s.is_clip, (int, float)) or isinstance(s.is_clip, bool) or s.is_clip < 0:
    out.append(
      f"algo.sdpo.is_clip={s.is_clip!r}: must be a number >= 0. Fix: use SDPO's 2.0, or 0 for "
      "no importance ratio"
    )
  if not isinstance(s.add_tail, bool):
    out.append(f"algo.sdpo.add_tail={s.add_tail!r}: must be True or False. Fix: use True")
  return out
