"""Self-distillation terms: SDAR's gated term (docs/reference.md §1) and Skill-SD's ρ·k3 (docs/reference.md §2.5).

Neither loss is multiplied by its coefficient λ: the train step does `+ λ · loss`.
Teacher log-probs always get stop_gradient inside; metrics follow the micro-batch rule of
`aggregation` (masked means over the batch passed in, or additive shares when the caller
passes the whole batch's token count as `denom`; sum them over micro-batches).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from sdar_jax.algos.aggregation import agg_loss, masked_mean
from sdar_jax.algos.gates import compute_gate
from sdar_jax.algos.registry import Registry

Array = jax.Array
ArrayLike = jax.typing.ArrayLike
Metrics = dict[str, Array]

FormFn = Callable[[Array, Array, Array, Array], Array]
SDAR_FORMS: Registry[FormFn] = Registry("sdar form")


@SDAR_FORMS.register("reference")
def _reference_form(student_logp: Array, teacher_logp: Array, gap: Array, gate: Array) -> Array:
  """ℓ = g·(sg(lT) − lθ): pushes every sampled token up with weight g (authors' code)."""
  del gap
  return gate * (teacher_logp - student_logp)


@SDAR_FORMS.register("reverse_kl")
def _reverse_kl_form(student_logp: Array, teacher_logp: Array, gap: Array, gate: Array) -> Array:
  """ℓ = −g·sg(Δ)·lθ: Δ as a token advantage, so teacher-rejected tokens go down."""
  del teacher_logp
  return -gate * gap * student_logp


def sdar_loss(
  student_logp: ArrayLike,
  teacher_logp: ArrayLike,
  mask: ArrayLike,
  *,
  beta: ArrayLike,
  gate: str = "gap",
  entropy: ArrayLike | None = None,
  form: str = "reference",
  agg: str = "token-mean",
  denom: ArrayLike | None = None,
  num_seqs: ArrayLike | None = None,
  vocab_size: int | None = None,
) -> tuple[Array, Metrics]:
  """The SDAR distillation loss (not multiplied by λ) and its metrics.

  Δ = sg(lT) − sg(lθ); g = gate(β, Δ, h) (detached; the entropy gates also need `vocab_size`,
  the number of logits h is taken over, see `gates`); per token ℓ from `form`
  ("reference": g·(sg(lT) − lθ); "reverse_kl": −g·sg(Δ)·lθ); loss = agg(ℓ, mask).
  Its gradient w.r.t. lθ in the reference form with token-mean is −g·m/Σm.

  Metrics (over the whole batch passed in): sdar/gate_mean, sdar/gate_active_ratio
  (share of tokens with g > 0.5), sdar/teacher_gap_mean (mean Δ), sdar/loss.
  """
  lsg = jnp.asarray(student_logp, jnp.float32)
  lt = jax.lax.stop_gradient(jnp.asarray(teacher_logp, jnp.float32))
  gap = lt - jax.lax.stop_gradient(lsg)
  g = compute_gate(gate, beta=beta, gap=gap, entropy=entropy, vocab_size=vocab_size)
  per_token = SDAR_FORMS.get(form)(lsg, lt, gap, g)
  loss = agg_loss(per_token, mask, agg, denom, num_seqs)
  metrics = {
    "sdar/gate_mean": masked_mean(g, mask, denom),
    "sdar/gate_active_ratio": masked_mean((g > 0.5).astype(jnp.float32), mask, denom),
    "sdar/teacher_gap_mean": masked_mean(gap, mask, denom),
    "sdar/loss": loss,
  }
  return loss, jax.lax.stop_gradient(metrics)


def skill_sd_loss(
  student_logp: ArrayLike,
  teacher_logp: ArrayLike,
  old_logp: ArrayLike,
  mask: ArrayLike,
  agg: str = "token-mean",
  denom: ArrayLike | None = None,
  num_seqs: ArrayLike | None = None,
) -> tuple[Array, Metrics]:
  """Skill-SD's term (not multiplied by its coefficient c), `skillsd_utils.compute_sdl_loss`.

  e = lθ − sg(lT); k3 = exp(min(−e, 20)) − 1 + e; ρ = exp(min(lθ − lold, 10)) with
  gradient (NOT detached, as the reference); loss = agg(ρ·k3, mask).
  Metrics: skillsd/loss, skillsd/k3_mean, skillsd/ratio_mean.
  """
  lsg = jnp.asarray(student_logp, jnp.float32)
  lt = jax.lax.stop_gradient(jnp.asarray(teacher_logp, jnp.float32))
  lold = jax.lax.stop_gradient(jnp.asarray(old_logp, jnp.float32))
  e = lsg - lt
  k3 = jnp.exp(jnp.minimum(-e, 20.0)) - 1.0 + e
  rho = jnp.exp(jnp.minimum(lsg - lold, 10.0))
  loss = agg_loss(rho * k3, mask, agg, denom, num_seqs)
  metrics = {
    "skillsd/loss": loss,
    "skillsd/k3_mean": masked_mean(k3, mask, denom),
    "skillsd/ratio_mean": masked_mean(rho, mask, denom),
  }
  return loss, jax.lax.stop_gradient(metrics)


DistillFn = Callable[..., tuple[Array, Metrics]]
DISTILL_LOSSES: Registry[DistillFn] = Registry("distill loss")


@DISTILL_LOSSES.register("none")
def _no_distill(*, student_logp, mask, **unused) -> tuple[Array, Metrics]:
  del student_logp, mask, unused
  return jnp.zeros((), jnp.float32), {}


@DISTILL_LOSSES.register("sdar")
def _sdar(
  *,
  student_logp,
  teacher_logp,
  mask,
  beta,
  gate="gap",
  entropy=None,
  form="reference",
  agg="token-mean",
  denom=None,
  num_seqs=None,
  vocab_size=None,
  **unused,
):
  del unused
  return sdar_loss(
    student_logp,
    teacher_logp,
    mask,
    beta=beta,
    gate=gate,
    entropy=entropy,
    form=form,
    agg=agg,
    denom=denom,
    num_seqs=num_seqs,
    vocab_size=vocab_size,
  )


@DISTILL_LOSSES.register("skill_sd")
def _skill_sd(
  *,
  student_logp,
  teacher_logp,
  old_logp,
  mask,
  agg="token-mean",
  denom=None,
  num_seqs=None,
  **unused,
):
  del unused
  return skill_sd_loss(
    student_logp, teacher_logp, old_logp, mask, agg=agg, denom=denom, num_seqs=num_seqs
  )


def distill_loss(name: str, **kwargs) -> tuple[Array, Metrics]:
  """Dispatches to distillation term `name` ("none", "sdar", "skill_sd") with keyword
  arguments student_logp, teacher_logp, old_logp, mask, beta, gate, entropy, vocab_size, form,
  agg, denom, num_seqs; each term takes the ones it needs. Not multiplied by λ."""
  return DISTILL_LOSSES.get(name)(**kwargs)
