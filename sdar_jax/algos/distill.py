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

# form(student_logp, teacher_logp, gap, gate, vocab_term) -> per-token loss [B, R]
FormFn = Callable[[Array, Array, Array, Array, "Array | None"], Array]
SDAR_FORMS: Registry[FormFn] = Registry("sdar form")

# Forms whose per-token loss is a sum over vocabulary entries at each response position: the
# update computes it from both branches' full distributions (`vocab_distill_term`, or
# `topk_distill_term` for "topk") and passes it to `sdar_loss` as `vocab_term`.
VOCAB_FORMS = ("vocab", "topk")
# Distillation terms formed, like those forms, from both branches' distributions in the update's
# lm_head pass (`scoring.sdar_vocab_extras` passes theirs as `vocab_term`): UCOB's top-k KL.
HEAD_TERMS = ("ucob",)
# Terms that read per-token weights from the batch (`TurnBatch.distill_weight`): the rows holding
# weights are distillation rows, left out of the PPO, entropy and KL terms (`sdar_jax.core.loss`).
WEIGHTED_TERMS = ("ucob",)


@SDAR_FORMS.register("reference")
def _reference_form(student_logp, teacher_logp, gap, gate, vocab_term=None) -> Array:
  """ℓ = g·(sg(lT) − lθ): pushes every sampled token up with weight g (authors' code)."""
  del gap, vocab_term
  return gate * (teacher_logp - student_logp)


@SDAR_FORMS.register("reverse_kl")
def _reverse_kl_form(student_logp, teacher_logp, gap, gate, vocab_term=None) -> Array:
  """ℓ = −g·sg(Δ)·lθ: Δ as a token advantage, so teacher-rejected tokens go down."""
  del teacher_logp, vocab_term
  return -gate * gap * student_logp


@SDAR_FORMS.register("vocab")
def _vocab_form(student_logp, teacher_logp, gap, gate, vocab_term=None) -> Array:
  """ℓ_t = Σ_v sg(pT(v)·g_v)·(sg(lT(v)) − lθ(v)), the gate applied to every vocabulary entry
  (`vocab_distill_term`); the sampled token's gate only feeds the metrics."""
  del student_logp, teacher_logp, gap, gate
  if vocab_term is None:
    raise ValueError(
      "algo.form='vocab' sums over the whole vocabulary: pass vocab_term=[B, R] "
      "(vocab_distill_term of the student's and the teacher's log-softmax), or use "
      "form 'reference'"
    )
  return vocab_term


@SDAR_FORMS.register("topk")
def _topk_form(student_logp, teacher_logp, gap, gate, vocab_term=None) -> Array:
  """ℓ_t = Σ_{v ∈ top-k of pT} sg(pT(v)·g_v)·(sg(lT(v)) − lθ(v)): the vocab form over the
  teacher's k most likely tokens (`topk_distill_term`, k = algo.top_k)."""
  del student_logp, teacher_logp, gap, gate
  if vocab_term is None:
    raise ValueError(
      "algo.form='topk' sums over the teacher's top-k tokens: pass vocab_term=[B, R] "
      "(topk_distill_term of the student's and the teacher's log-softmax), or use "
      "form 'reference'"
    )
  return vocab_term


def _gated_sum(ls: Array, lt: Array, beta, gate, entropy, vocab_size) -> Array:
  """Σ over the last axis of sg(pT·g)·(lT − lθ), g = gate(β, lT − sg(lθ), h) per entry."""
  if entropy is not None:
    entropy = jnp.asarray(entropy, jnp.float32)[..., None]  # one value per position
  gap = lt - jax.lax.stop_gradient(ls)
  g = compute_gate(gate, beta=beta, gap=gap, entropy=entropy, vocab_size=vocab_size)
  w = jax.lax.stop_gradient(jnp.exp(lt) * g)
  return jnp.sum(w * (lt - ls), axis=-1)


def vocab_distill_term(
  student_log_softmax: ArrayLike,
  teacher_log_softmax: ArrayLike,
  *,
  beta: ArrayLike,
  gate: str = "gap",
  entropy: ArrayLike | None = None,
  vocab_size: int | None = None,
) -> Array:
  """SDAR's gate over the whole distribution, per position: [B, R, V] x 2 -> [B, R].

  Every vocabulary entry v is a candidate token with its own gap Δ_v = lT(v) − sg(lθ(v)) and
  gate g_v = gate(β, Δ_v, h) (h: the student's entropy at the position, [B, R]); the term is
  Σ_v w_v·(lT(v) − lθ(v)) with w_v = sg(pT(v)·g_v). With every g_v = 1 it is the forward KL
  KL(pT ‖ pθ); the gate keeps the entries the teacher endorses (lT(v) > lθ(v)) and drops the ones
  it rejects, which then fall only through the normalisation. Its gradient w.r.t. the student's
  logits z is −w + pθ·Σ_v w_v: unlike the sampled-token forms it raises tokens the student did
  not sample, so a near-deterministic student still learns the teacher's preferred actions.
  Not in the authors' code (they gate sampled tokens only); an extension of ours.
  """
  ls = jnp.asarray(student_log_softmax, jnp.float32)
  lt = jax.lax.stop_gradient(jnp.asarray(teacher_log_softmax, jnp.float32))
  return _gated_sum(ls, lt, beta, gate, entropy, vocab_size)


def topk_distill_term(
  student_log_softmax: ArrayLike,
  teacher_log_softmax: ArrayLike,
  *,
  top_k: int,
  beta: ArrayLike,
  gate: str = "gap",
  entropy: ArrayLike | None = None,
  vocab_size: int | None = None,
) -> Array:
  """`vocab_distill_term` restricted to the teacher's `top_k` most likely tokens per position:
  [B, R, V] x 2 -> [B, R] (k is capped at V, where the two terms are equal).

  Σ_{v ∈ K} w_v·(lT(v) − lθ(v)), K the teacher's k most likely entries at the position, w_v =
  sg(pT(v)·g_v), each entry gated by its own gap Δ_v = lT(v) − sg(lθ(v)) as in the vocab form.
  Neither renormalised nor with a tail bucket: the k keep the teacher's own probabilities, so the
  term is the vocab form's sum with its least likely entries dropped (each of which weighs at
  most pT(v) there), and its gradient w.r.t. the student's logits is −w + pθ·Σ_{v ∈ K} w_v (the
  tail still falls through the student's normalisation). Renormalising would scale a flat
  teacher's weights up by 1/Σ_K pT; a tail bucket needs log(1 − Σ_K p) of both branches, which
  float32 cancels to noise when the k hold nearly all the mass, and one gate for the whole tail
  would mix endorsed and rejected tokens.
  """
  ls = jnp.asarray(student_log_softmax, jnp.float32)
  lt = jax.lax.stop_gradient(jnp.asarray(teacher_log_softmax, jnp.float32))
  k = min(int(top_k), lt.shape[-1])
  lt_k, idx = jax.lax.top_k(lt, k)
  ls_k = jnp.take_along_axis(ls, idx, axis=-1)
  return _gated_sum(ls_k, lt_k, beta, gate, entropy, vocab_size)


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
  vocab_term: ArrayLike | None = None,
) -> tuple[Array, Metrics]:
  """The SDAR distillation loss (not multiplied by λ) and its metrics.

  Δ = sg(lT) − sg(lθ); g = gate(β, Δ, h) (detached; the entropy gates also need `vocab_size`,
  the number of logits h is taken over, see `gates`); per token ℓ from `form`
  ("reference": g·(sg(lT) − lθ); "reverse_kl": −g·sg(Δ)·lθ; "vocab" / "topk": `vocab_term`, the
  gated sum over the vocabulary from `vocab_distill_term` / over the teacher's top k from
  `topk_distill_term`); loss = agg(ℓ, mask).
  Its gradient w.r.t. lθ in the reference form with token-mean is −g·m/Σm.

  Metrics (over the whole batch passed in): sdar/gate_mean, sdar/gate_active_ratio
  (share of tokens with g > 0.5), sdar/teacher_gap_mean (mean Δ), sdar/loss.
  """
  lsg = jnp.asarray(student_logp, jnp.float32)
  lt = jax.lax.stop_gradient(jnp.asarray(teacher_logp, jnp.float32))
  gap = lt - jax.lax.stop_gradient(lsg)
  g = compute_gate(gate, beta=beta, gap=gap, entropy=entropy, vocab_size=vocab_size)
  per_token = SDAR_FORMS.get(form)(lsg, lt, gap, g, vocab_term)
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
  vocab_term=None,
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
    vocab_term=vocab_term,
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
  """Dispatches to distillation term `name` ("none", "sdar", "skill_sd", "ucob") with keyword
  arguments student_logp, teacher_logp, old_logp, mask, beta, gate, entropy, vocab_size, form,
  vocab_term, distill_weight, agg, denom, num_seqs; each term takes the ones it needs. Not
  multiplied by λ."""
  return DISTILL_LOSSES.get(name)(**kwargs)


# Terms gated token by token by algo.gate (σ(β·…)): their gate is drawn in the diagnostics'
# histograms and their coefficient logged as "<name>/coef".
GATED_TERMS = ("sdar", "ucob")


def term_gate(algo, *, gap, entropy, vocab_size: int) -> Array | None:
  """The gate algo's distillation term applies at each token (for the histograms), or None for
  a term without one."""
  if algo.distill not in GATED_TERMS:
    return None
  return compute_gate(algo.gate, beta=algo.beta, gap=gap, entropy=entropy, vocab_size=vocab_size)


def term_metrics(algo) -> Metrics:
  """Constant metrics of algo's distillation term (a gated term's coefficient λ)."""
  if algo.distill not in GATED_TERMS:
    return {}
  return {f"{algo.distill}/coef": jnp.asarray(algo.lam, jnp.float32)}
