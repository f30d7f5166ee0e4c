"""The loss of one mini-batch and its gradients: the update's objective, traceable.

Holds the branches of a `TurnBatch` (student log-probs with gradient; the teacher's without, from
its hidden states or log-probs), `micro_loss` (pg_coef·PPO(advantage) + lam·distill −
entropy_coef·H + kl_coef·KL, every term from `sdar_jax.algos` by config name, a term whose
coefficient is 0 left out) and `loss_and_grads` (float32 gradients and additive metrics summed over
strided micro-batches, every term aggregated with the whole mini-batch's token and sequence
counts, so the sums equal one big batch's). Inputs: a `ModelConfig`, an `AlgoConfig`, params, a
`TurnBatch`; outputs: gradients and metric arrays. Scores come from `sdar_jax.core.scoring`; no
jit, no optimizer, no shardings (`core.train_step`). docs/design.md, "The update", explains the
branches and the teacher sources.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from sdar_jax import algos
from sdar_jax.algos import AlgoConfig
from sdar_jax.core.batch import TurnBatch
from sdar_jax.core.histograms import update_histograms
from sdar_jax.core.scoring import (
  response_hidden,
  response_logprobs,
  sdar_vocab_extras,
  two_branch_scores,
)
from sdar_jax.models import ModelConfig, Params

Array = jax.Array
Metrics = dict[str, Array]


# ------------------------------------------------------------------------------- branches
def student_branch_logp(config, algo: AlgoConfig, params, batch: TurnBatch, with_entropy: bool):
  return response_logprobs(
    config,
    params,
    batch.student_tokens,
    batch.student_mask,
    batch.response_len,
    algo.temperature,
    with_entropy,
  )


def student_scores(config, algo: AlgoConfig, params, batch: TurnBatch, teacher):
  """(log-probs, entropies, vocab term or None, teacher log-probs or None) of the student
  branch. `teacher` = (teacher params, teacher hidden states [B, R, D]) for form "vocab": the
  vocab term and the teacher's log-probs come from the same lm_head pass as the log-probs
  (`scoring.two_branch_scores`, in chunks of algo.vocab_chunk positions)."""
  if teacher is None:
    logp, entropy = student_branch_logp(config, algo, params, batch, with_entropy=True)
    return logp, entropy, None, None
  hidden, targets = response_hidden(
    config, params, batch.student_tokens, batch.student_mask, batch.response_len
  )
  chunked = bool(algo.vocab_chunk) and batch.response_len > algo.vocab_chunk
  got = two_branch_scores(
    config,
    algo.temperature,
    params,
    hidden,
    targets,
    *teacher,
    extras=sdar_vocab_extras(algo, config.vocab_size),
    chunk=algo.vocab_chunk if chunked else None,
    remat=chunked or config.remat,
  )
  return got["student"], got["entropy"], got["term"], got["teacher"]


def teacher_branch_logp(config, algo: AlgoConfig, params, batch: TurnBatch) -> Array:
  logp, _ = response_logprobs(
    config, params, batch.teacher_tokens, batch.teacher_mask, batch.response_len, algo.temperature
  )
  return logp


def teacher_branch_hidden(config, params, batch: TurnBatch) -> Array:
  """The teacher branch's hidden states [B, R, D] at the response positions (form "vocab")."""
  hidden, _ = response_hidden(
    config, params, batch.teacher_tokens, batch.teacher_mask, batch.response_len
  )
  return hidden


# ------------------------------------------------------------------------------------- loss
def micro_loss(
  config: ModelConfig,
  algo: AlgoConfig,
  params: Params,
  micro_batch: TurnBatch,
  teacher_logp: Array | None,
  ref_logp: Array | None,
  denom: Array,
  num_seqs: Array,
  teacher_weight: Array,
  teacher: tuple[Params, Array] | None = None,
  histograms: bool = False,
  distill_counts: tuple[Array, Array] | None = None,
) -> tuple[Array, Metrics]:
  """The loss of one micro-batch as its additive share of the mini-batch loss (`denom` and
  `num_seqs` are the mini-batch's), with additive metric shares. Differentiated w.r.t. params.
  A term that reads per-token weights (`algo.reads_distill_weight`, UCOB) splits the rows: those
  whose `distill_weight` holds any weight are distillation rows, aggregated over their own
  tokens (`distill_counts` = the mini-batch's (token, row) counts of them), and left out of the
  PPO, entropy and KL terms, whose `denom` / `num_seqs` then count the other rows only.
  `teacher_weight` is the advantage estimator's teacher weight λ_k of this iteration
  (`algos.advantage_teacher_weight`; RLSD's).
  `teacher`: (teacher params, teacher hidden states [B, R, D]) for SDAR form "vocab", whose
  teacher log-probs are formed in the student's lm_head pass (`teacher_logp` is then None).
  `histograms`: also the fixed-bin counts of the gap and the gate over the response tokens
  (int32 vectors under "diag/" keys, `sdar_jax.core.histograms`; additive like the other shares)."""
  mask = micro_batch.response_mask.astype(jnp.float32)
  distill_mask, distill_agg = mask, None
  if algo.reads_distill_weight:  # distillation rows apart (see above)
    rows = (jnp.sum(micro_batch.distill_weight, axis=-1, keepdims=True) > 0).astype(jnp.float32)
    mask, distill_mask = mask * (1.0 - rows), mask * rows
    distill_agg = {"agg": algo.agg, "denom": distill_counts[0], "num_seqs": distill_counts[1]}
  logp, entropy, vocab_term, head_teacher_logp = student_scores(
    config, algo, params, micro_batch, teacher
  )
  if head_teacher_logp is not None:
    teacher_logp = head_teacher_logp
  if teacher_logp is not None and micro_batch.teacher_mask is not None:
    # a row whose teacher has no privileged context (response part of teacher_mask 0,
    # rollout.batching.pack_batch) reads as teacher = behaviour policy and leaves the distillation
    # term: its teacher log-probs were scored without the response in view
    response = micro_batch.teacher_mask[:, -micro_batch.response_len :]
    with_context = jnp.max(response, axis=-1, keepdims=True).astype(jnp.float32)  # [B, 1]
    distill_mask = distill_mask * with_context
    teacher_logp = jnp.where(with_context > 0, teacher_logp, micro_batch.old_logp)
  if algo.entropy_coef == 0:
    entropy = jax.lax.stop_gradient(entropy)  # a metric (and gate input) only
  agg = dict(agg=algo.agg, denom=denom, num_seqs=num_seqs)
  adv = algos.token_advantages(
    algo.advantage,
    micro_batch.advantages,
    mask,
    teacher_logp=teacher_logp,
    old_logp=micro_batch.old_logp,
    teacher_weight=teacher_weight,
    clip_eps=algos.advantage_clip_eps(algo),
  )
  pg, metrics = algos.policy_loss(
    logp,
    micro_batch.old_logp,
    adv,
    mask,
    algo.ppo.clip_low,
    algo.ppo.clip_high,
    algo.ppo.clip_c,
    **agg,
  )
  ent, ent_metrics = algos.entropy_loss(entropy, mask, **agg)
  metrics.update(ent_metrics)
  loss = jnp.zeros((), jnp.float32)
  if algo.pg_coef:
    loss = loss + algo.pg_coef * pg
  if algo.entropy_coef:
    loss = loss - algo.entropy_coef * ent
  if algo.distill != "none":
    dist, dist_metrics = algos.distill_loss(
      algo.distill,
      student_logp=logp,
      teacher_logp=teacher_logp,
      old_logp=micro_batch.old_logp,
      mask=distill_mask,
      beta=algo.beta,
      gate=algo.gate,
      entropy=entropy,
      vocab_size=config.vocab_size,  # the entropy gates normalise h by ln V
      form=algo.form,
      vocab_term=vocab_term,
      distill_weight=micro_batch.distill_weight,
      sdpo=algo.sdpo,
      **(agg if distill_agg is None else distill_agg),
    )
    metrics.update(dist_metrics)
    if algo.lam:
      loss = loss + algo.lam * dist
  if ref_logp is not None:  # kl_coef > 0, or measured only (algo.measure_kl)
    kl, kl_metrics = algos.kl_loss(logp, ref_logp, mask, algo.kl_kind, **agg)
    metrics.update(kl_metrics)
    if algo.kl_coef:
      loss = loss + algo.kl_coef * kl
  if teacher_logp is not None:  # teacher vs behaviour policy (reference's trainer-side metric)
    metrics["teacher/gap_vs_old_mean"] = algos.masked_mean(
      teacher_logp - micro_batch.old_logp, mask, denom
    )
    # Δ = lT − lθ of the current student, the gap the SDAR gate reads: the share of tokens the
    # teacher endorses (gives a higher log-prob than the student does), over the tokens the
    # distillation term reads (a weighted term's distillation rows)
    gap = jax.lax.stop_gradient(teacher_logp - logp)
    gap_denom = denom if distill_agg is None else distill_agg["denom"]
    metrics["sdar/positive_gap_share"] = algos.masked_mean(
      (gap > 0).astype(jnp.float32), distill_mask, gap_denom
    )
    if histograms:
      gate = algos.term_gate(algo, gap=gap, entropy=entropy, vocab_size=config.vocab_size)
      metrics.update(update_histograms(gap, gate, distill_mask))
  metrics["train/loss"] = loss
  return loss, jax.lax.stop_gradient(metrics)


def split_micro(tree, num_micro: int, constrain: Callable[[Array], Array]):
  """[B, ...] -> [num_micro, B/num_micro, ...], micro-batch i = rows i, i+num_micro, ... (strided,
  so a batch sharded in contiguous blocks keeps every micro-batch on every device)."""

  def one(x):
    x = x.reshape(x.shape[0] // num_micro, num_micro, *x.shape[1:]).swapaxes(0, 1)
    return constrain(x)

  return jax.tree.map(one, tree)


def merge_micro(x: Array) -> Array:
  """Inverse of `split_micro` for one array."""
  return x.swapaxes(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def loss_and_grads(
  config: ModelConfig,
  algo: AlgoConfig,
  params: Params,
  batch: TurnBatch,
  *,
  micro_batch_size: int | None = None,
  ref_params: Params | None = None,
  iteration: Array | int = 1,
  constrain: Callable[[Array], Array] = lambda x: x,
  histograms: bool = False,
  ema_params: Params | None = None,
  teacher_params: Params | None = None,
) -> tuple[Params, Metrics]:
  """Gradients (float32, summed over micro-batches) and metrics of one mini-batch; traceable.

  `iteration` is the 1-based training iteration (the reference's global step) for the RLSD
  λ schedule; `constrain` places a [num_micro, mb, ...] array (sharding constraint);
  `histograms` adds the gap / gate histogram counts (`micro_loss`); `ema_params`: the EMA
  teacher's weights (teacher_weights="ema", `TrainState.ema_params`); `teacher_params`: the
  weights the trainer hands over (teacher_weights "frozen" or "old")."""
  if algo.scores_teacher and algo.teacher_source == "rollout" and batch.teacher_logp is None:
    raise ValueError(
      "algo.teacher_source='rollout' reads batch.teacher_logp, which is None: score it with "
      "TrainStep.score_teacher(params, batch) first, or use teacher_source='update'."
    )
  B = batch.batch_size
  micro = B if micro_batch_size is None else micro_batch_size
  num_micro = B // micro
  rl_mask, distill_counts = batch.response_mask, None
  if algo.reads_distill_weight:
    if batch.distill_weight is None:
      raise ValueError(
        f"algo.distill={algo.distill!r} reads per-token weights: the batch needs distill_weight "
        "[B, R] (pack_batch(..., distill_weights=True) of the turn-samples its hooks pair)"
      )
    rows = jnp.sum(batch.distill_weight, axis=-1, keepdims=True) > 0
    distill_mask = jnp.where(rows, batch.response_mask, 0.0)
    rl_mask = jnp.where(rows, 0.0, batch.response_mask)
    distill_counts = (algos.token_count(distill_mask), algos.seq_count(distill_mask))
  denom = algos.token_count(rl_mask)
  num_seqs = algos.seq_count(rl_mask)
  teacher_weight, schedule_metrics = algos.advantage_teacher_weight(algo, iteration)
  teacher_given = teacher_params
  teacher_params = jax.lax.stop_gradient(params)
  if algo.scores_teacher and algo.teacher_source == "update":  # whose weights: algo.teacher_weights
    teacher_params = jax.lax.stop_gradient(
      algos.TEACHER_WEIGHTS.get(algo.teacher_weights)(
        params, ref_params, ema_params, teacher_params=teacher_given
      )
    )
  grad_fn = jax.value_and_grad(
    functools.partial(
      micro_loss, config, algo, histograms=histograms, distill_counts=distill_counts
    ),
    has_aux=True,
  )

  def one(micro: TurnBatch):  # one micro-batch
    teacher_logp = teacher = None
    if algo.vocab_distill:  # teacher_source "update" (AlgoConfig checks it)
      teacher = (teacher_params, teacher_branch_hidden(config, teacher_params, micro))
    elif algo.scores_teacher:
      teacher_logp = (
        micro.teacher_logp
        if algo.teacher_source == "rollout"
        else teacher_branch_logp(config, algo, teacher_params, micro)
      )
    ref_logp = None
    if algo.measures_kl:
      ref_logp = (
        micro.ref_logp
        if ref_params is None
        else student_branch_logp(config, algo, jax.lax.stop_gradient(ref_params), micro, False)[0]
      )
    (_, metrics), grads = grad_fn(
      params, micro, teacher_logp, ref_logp, denom, num_seqs, teacher_weight, teacher
    )
    return jax.tree.map(lambda g: g.astype(jnp.float32), grads), metrics

  if num_micro == 1:
    grads, metrics = one(batch)
  else:
    micro_batches = split_micro(batch, num_micro, constrain)
    first = jax.tree.map(lambda x: x[0], micro_batches)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(one, first))

    def body(carry, micro):
      return jax.tree.map(jnp.add, carry, one(micro)), None

    (grads, metrics), _ = jax.lax.scan(body, zeros, micro_batches)
  metrics.update(schedule_metrics)
  metrics.update(algos.term_metrics(algo))
  metrics["train/tokens"] = denom
  if distill_counts is not None:
    metrics["train/distill_tokens"] = distill_counts[0]
  return grads, metrics
