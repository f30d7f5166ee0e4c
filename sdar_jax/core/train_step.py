"""THE compiled update: student + teacher branches of one set of weights, loss composition, AdamW.

One call = one mini-batch = one optimizer update, compiled once per bucket shape:

    step = TrainStep(model_config, algo_config, optimizer, mesh=mesh, micro_batch_size=8)
    state = step.shard_state(state)
    state, metrics = step(state, batch)                # batch: a TurnBatch, donated state

The batch layout is `sdar_jax.core.batch.TurnBatch`'s (B turn-samples, R response slots; RLSD makes
its sequence-level advantages token-level here). The index map between the two branches is a
static offset: response token r sits at position
P+r and is predicted by the logits at P+r-1, with P = Ps for the student and Pt for the teacher.
So only the R hidden states [P-1, P-1+R) go through the lm_head: the [B, T, V] logits of the
prompt positions are never materialised, and student and teacher log-probs line up slot by slot.

Log-probs are log_softmax(logits / temperature)[token] in float32, exactly what the sampler
returns, so the importance ratio is 1 at staleness 0; the entropy is that distribution's.

Loss (every term from `sdar_jax.algos`, by config name; a term whose coefficient is 0 is left out):

    loss = pg_coef·PPO(advantage) + lam·distill − entropy_coef·H + kl_coef·KL(kl_kind)

with every setting from one `sdar_jax.algos.AlgoConfig` (a jit static).

Teacher branch. teacher_source="step": teacher log-probs from the current parameters inside the
same jit, computed OUTSIDE the differentiated function, so XLA keeps none of its activations for
the backward pass (and no second copy of the weights exists: the teacher is the same params,
unless teacher_weights="initial", below).
teacher_source="rollout": `TrainStep.score_teacher(params, batch)` scores them once per iteration
at θ_old before the first update and they ride in the batch, as the authors' code does. With one
mini-batch per iteration the two agree exactly; with several, "step" re-scores at the current θ.
`algo.teacher_weights="initial"` runs the teacher on the frozen initial policy (`ref_params`, the
KL term's) instead of the current parameters, in either source; "ema" (teacher_source "step")
on `TrainState.ema_params`, an EMA of the params moved once per iteration (`move_teacher_ema`,
SDPO's cadence) or after every applied update (algo.ema.every="update").
SDAR's forms "vocab" and "topk" compute their heads in chunks of `algo.vocab_chunk` response
positions (scanned and rematerialised), so no [mb, R, V] array of either branch is live at once.
SDAR's form "vocab" (ours, `algos.vocab_distill_term`) reads the teacher's whole distribution: the
teacher's [mb, R, D] hidden states go into the student's lm_head pass, which forms both
branches' [mb, R, V] log-softmax, the gated per-position sum over the vocabulary and the sampled
tokens' log-probs (under `remat` only the hidden states are kept for the backward pass).

Mini-batch accumulation. The batch is split into B / micro_batch_size micro-batches (strided, so
each stays spread over the data-parallel devices) and scanned; every term is aggregated with the
GLOBAL token count (and sequence count) of the whole mini-batch, so the summed gradients and the
summed metrics are exactly those of one big batch (docs/reference.md §4.8 uses a mean of
per-micro-batch token-means instead; ours is the natural global token-mean, a documented deviation).

A non-finite loss or gradient norm skips the update: params and optimizer state stay bit-identical,
`state.step` does not advance, `state.skipped_updates` and metric train/skipped_update count it.

Length: the update is one program (branches, loss composition, micro-batch accumulation, the
non-finite skip, shardings and donation) and reads best in one file.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sdar_jax import algos
from sdar_jax.algos import AlgoConfig
from sdar_jax.core import sharding
from sdar_jax.core.batch import TurnBatch
from sdar_jax.core.histograms import update_histograms
from sdar_jax.core.train_state import (
  TrainState,
  make_lr_schedule,
  make_optimizer,
  train_state_shardings,
  update_ema,
)
from sdar_jax.models import ModelConfig, Params, apply, logits_from_hidden, positions_from_mask

Array = jax.Array
Metrics = dict[str, Array]


# --------------------------------------------------------------------------------- log-probs
def _scaled_logits(config: ModelConfig, temperature: float, params: Params, hidden: Array) -> Array:
  """Float32 logits [..., V] of hidden states [..., D], divided by `temperature` unless it is 1."""
  logits = logits_from_hidden(config, params, hidden)
  return logits if temperature == 1.0 else logits / temperature


def _token_logprob_and_entropy(
  config: ModelConfig,
  temperature: float,
  with_entropy: bool,
  params: Params,
  hidden: Array,
  targets: Array,
) -> tuple[Array, Array | None]:
  """log p(target) of each hidden state's next-token distribution at `temperature` (and its
  entropy): the lm_head applied to response positions only."""
  logits = _scaled_logits(config, temperature, params, hidden)
  picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  logp = picked - jax.nn.logsumexp(logits, axis=-1)
  return logp, (algos.entropy_from_logits(logits) if with_entropy else None)


def response_hidden(
  config: ModelConfig, params: Params, tokens: Array, mask: Array, response_len: int
) -> tuple[Array, Array]:
  """The hidden states [B, R, D] that predict the last `response_len` tokens of `tokens`
  [B, P+R], and those tokens [B, R]. The decoder keeps only the last R + 1 positions (the last
  prompt position and the response's), so its last layer skips the rest of the prompt."""
  prompt_len = tokens.shape[1] - response_len
  if prompt_len < 1:
    raise ValueError(
      f"tokens of length {tokens.shape[1]} leave no prompt before a response of "
      f"{response_len} slots; the first response token needs a preceding position."
    )
  hidden, _ = apply(
    config, params, tokens, positions_from_mask(mask), mask, keep_last=response_len + 1
  )
  return hidden[:, :response_len], tokens[:, prompt_len:]


def response_logprobs(
  config: ModelConfig,
  params: Params,
  tokens: Array,
  mask: Array,
  response_len: int,
  temperature: float = 1.0,
  with_entropy: bool = False,
) -> tuple[Array, Array | None]:
  """Log-probs [B, R] (and entropies [B, R]) of the last `response_len` tokens of `tokens`
  [B, P+R] (left-padded prompt, then the response), float32; lm_head on R positions only."""
  hidden, targets = response_hidden(config, params, tokens, mask, response_len)
  head = functools.partial(_token_logprob_and_entropy, config, temperature, with_entropy)
  if config.remat:  # keep only the [B, R, D] hidden states, recompute the [B, R, V] logits
    head = jax.checkpoint(head)
  return head(params, hidden, targets)


def _log_softmax(config: ModelConfig, temperature: float, params: Params, hidden: Array) -> Array:
  return jax.nn.log_softmax(_scaled_logits(config, temperature, params, hidden), axis=-1)


def _student_logp(config, algo: AlgoConfig, params, batch: TurnBatch, with_entropy: bool):
  return response_logprobs(
    config,
    params,
    batch.student_tokens,
    batch.student_mask,
    batch.response_len,
    algo.temperature,
    with_entropy,
  )


def _vocab_head(config, algo: AlgoConfig, params, hidden, targets, teacher_params, teacher_hidden):
  """Student log-probs, entropies, the SDAR vocab term and the teacher's log-probs [B, R], from
  both branches' [B, R, V] log-softmax formed here from their [B, R, D] hidden states (so under
  `remat` only the hidden states are kept for the backward pass)."""
  lsm = _log_softmax(config, algo.temperature, params, hidden)
  teacher_lsm = jax.lax.stop_gradient(
    _log_softmax(config, algo.temperature, teacher_params, teacher_hidden)
  )
  logp = jnp.take_along_axis(lsm, targets[..., None], axis=-1)[..., 0]
  teacher_logp = jnp.take_along_axis(teacher_lsm, targets[..., None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)
  gated = dict(
    beta=algo.beta,
    gate=algo.gate,
    entropy=jax.lax.stop_gradient(entropy),
    vocab_size=config.vocab_size,
  )
  if algo.form == "topk":
    term = algos.topk_distill_term(lsm, teacher_lsm, top_k=algo.top_k, **gated)
  else:
    term = algos.vocab_distill_term(lsm, teacher_lsm, **gated)
  return logp, entropy, term, teacher_logp


def _chunked_head(
  head: Callable, chunk: int, params, hidden, targets, teacher_params, teacher_hidden
):
  """`head` over response positions in chunks of `chunk` (the last one zero-padded, its padding
  sliced off): a scan whose body is rematerialised, so the forward keeps one chunk's [B, chunk, V]
  arrays live and the backward recomputes them chunk by chunk from the [B, R, D] hidden states.
  Every output is per position [B, R], so the chunks only concatenate."""
  R = hidden.shape[1]
  num = -(-R // chunk)

  def split(x):  # [B, R, ...] -> [num, B, chunk, ...]
    x = jnp.pad(x, [(0, 0), (0, num * chunk - R)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape(x.shape[0], num, chunk, *x.shape[2:]).swapaxes(0, 1)

  body = jax.checkpoint(lambda xs: head(params, xs[0], xs[1], teacher_params, xs[2]))
  outs = jax.lax.map(body, (split(hidden), split(targets), split(teacher_hidden)))
  return tuple(x.swapaxes(0, 1).reshape(x.shape[1], num * chunk)[:, :R] for x in outs)


def _student_scores(config, algo: AlgoConfig, params, batch: TurnBatch, teacher):
  """(log-probs, entropies, vocab term or None, teacher log-probs or None) of the student
  branch. `teacher` = (teacher params, teacher hidden states [B, R, D]) for form "vocab": the
  vocab term and the teacher's log-probs come from the same lm_head pass as the log-probs."""
  if teacher is None:
    logp, entropy = _student_logp(config, algo, params, batch, with_entropy=True)
    return logp, entropy, None, None
  hidden, targets = response_hidden(
    config, params, batch.student_tokens, batch.student_mask, batch.response_len
  )
  head = functools.partial(_vocab_head, config, algo)
  if algo.vocab_chunk and batch.response_len > algo.vocab_chunk:
    return _chunked_head(head, algo.vocab_chunk, params, hidden, targets, *teacher)
  if config.remat:
    head = jax.checkpoint(head)
  return head(params, hidden, targets, *teacher)


def _teacher_logp(config, algo: AlgoConfig, params, batch: TurnBatch) -> Array:
  logp, _ = response_logprobs(
    config, params, batch.teacher_tokens, batch.teacher_mask, batch.response_len, algo.temperature
  )
  return logp


def _teacher_hidden(config, params, batch: TurnBatch) -> Array:
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
) -> tuple[Array, Metrics]:
  """The loss of one micro-batch as its additive share of the mini-batch loss (`denom` and
  `num_seqs` are the mini-batch's), with additive metric shares. Differentiated w.r.t. params.
  `teacher_weight` is the advantage estimator's teacher weight λ_k of this iteration
  (`algos.advantage_teacher_weight`; RLSD's).
  `teacher`: (teacher params, teacher hidden states [B, R, D]) for SDAR form "vocab", whose
  teacher log-probs are formed in the student's lm_head pass (`teacher_logp` is then None).
  `histograms`: also the fixed-bin counts of the gap and the gate over the response tokens
  (int32 vectors under "diag/" keys, `sdar_jax.core.histograms`; additive like the other shares)."""
  mask = micro_batch.response_mask.astype(jnp.float32)
  logp, entropy, vocab_term, head_teacher_logp = _student_scores(
    config, algo, params, micro_batch, teacher
  )
  if head_teacher_logp is not None:
    teacher_logp = head_teacher_logp
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
      mask=mask,
      beta=algo.beta,
      gate=algo.gate,
      entropy=entropy,
      vocab_size=config.vocab_size,  # the entropy gates normalise h by ln V
      form=algo.form,
      vocab_term=vocab_term,
      **agg,
    )
    metrics.update(dist_metrics)
    if algo.lam:
      loss = loss + algo.lam * dist
  if algo.kl_coef:
    kl, kl_metrics = algos.kl_loss(logp, ref_logp, mask, algo.kl_kind, **agg)
    metrics.update(kl_metrics)
    loss = loss + algo.kl_coef * kl
  if teacher_logp is not None:  # teacher vs behaviour policy (reference's trainer-side metric)
    metrics["teacher/gap_vs_old_mean"] = algos.masked_mean(
      teacher_logp - micro_batch.old_logp, mask, denom
    )
    # Δ = lT − lθ of the current student, the gap the SDAR gate reads: the share of tokens the
    # teacher endorses (gives a higher log-prob than the student does).
    gap = jax.lax.stop_gradient(teacher_logp - logp)
    metrics["sdar/positive_gap_share"] = algos.masked_mean(
      (gap > 0).astype(jnp.float32), mask, denom
    )
    if histograms:
      gate = algos.term_gate(algo, gap=gap, entropy=entropy, vocab_size=config.vocab_size)
      metrics.update(update_histograms(gap, gate, mask))
  metrics["train/loss"] = loss
  return loss, jax.lax.stop_gradient(metrics)


def _split_micro(tree, num_micro: int, constrain: Callable[[Array], Array]):
  """[B, ...] -> [num_micro, B/num_micro, ...], micro-batch i = rows i, i+num_micro, ... (strided,
  so a batch sharded in contiguous blocks keeps every micro-batch on every device)."""

  def one(x):
    x = x.reshape(x.shape[0] // num_micro, num_micro, *x.shape[1:]).swapaxes(0, 1)
    return constrain(x)

  return jax.tree.map(one, tree)


def _merge_micro(x: Array) -> Array:
  """Inverse of `_split_micro` for one array."""
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
) -> tuple[Params, Metrics]:
  """Gradients (float32, summed over micro-batches) and metrics of one mini-batch; traceable.

  `iteration` is the 1-based training iteration (the reference's global step) for the RLSD
  λ schedule; `constrain` places a [num_micro, mb, ...] array (sharding constraint);
  `histograms` adds the gap / gate histogram counts (`micro_loss`); `ema_params`: the EMA
  teacher's weights (teacher_weights="ema", `TrainState.ema_params`)."""
  if algo.scores_teacher and algo.teacher_source == "rollout" and batch.teacher_logp is None:
    raise ValueError(
      "algo.teacher_source='rollout' reads batch.teacher_logp, which is None: score it with "
      "TrainStep.score_teacher(params, batch) first, or use teacher_source='step'."
    )
  B = batch.batch_size
  micro = B if micro_batch_size is None else micro_batch_size
  num_micro = B // micro
  denom = algos.token_count(batch.response_mask)
  num_seqs = algos.seq_count(batch.response_mask)
  teacher_weight, schedule_metrics = algos.advantage_teacher_weight(algo, iteration)
  teacher_params = jax.lax.stop_gradient(params)
  if algo.scores_teacher and algo.teacher_source == "step":  # whose weights: algo.teacher_weights
    teacher_params = jax.lax.stop_gradient(
      algos.TEACHER_WEIGHTS.get(algo.teacher_weights)(params, ref_params, ema_params)
    )
  grad_fn = jax.value_and_grad(
    functools.partial(micro_loss, config, algo, histograms=histograms), has_aux=True
  )

  def one(micro: TurnBatch):  # one micro-batch
    teacher_logp = teacher = None
    if algo.vocab_distill:  # teacher_source "step" (AlgoConfig checks it)
      teacher = (teacher_params, _teacher_hidden(config, teacher_params, micro))
    elif algo.scores_teacher:
      teacher_logp = (
        micro.teacher_logp
        if algo.teacher_source == "rollout"
        else _teacher_logp(config, algo, teacher_params, micro)
      )
    ref_logp = None
    if algo.kl_coef:
      ref_logp = (
        micro.ref_logp
        if ref_params is None
        else _student_logp(config, algo, jax.lax.stop_gradient(ref_params), micro, False)[0]
      )
    (_, metrics), grads = grad_fn(
      params, micro, teacher_logp, ref_logp, denom, num_seqs, teacher_weight, teacher
    )
    return jax.tree.map(lambda g: g.astype(jnp.float32), grads), metrics

  if num_micro == 1:
    grads, metrics = one(batch)
  else:
    micro_batches = _split_micro(batch, num_micro, constrain)
    first = jax.tree.map(lambda x: x[0], micro_batches)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(one, first))

    def body(carry, micro):
      return jax.tree.map(jnp.add, carry, one(micro)), None

    (grads, metrics), _ = jax.lax.scan(body, zeros, micro_batches)
  metrics.update(schedule_metrics)
  metrics.update(algos.term_metrics(algo))
  metrics["train/tokens"] = denom
  return grads, metrics


def apply_update(
  optimizer: optax.GradientTransformation,
  state: TrainState,
  grads: Params,
  loss: Array,
  iteration: Array | int | None = None,
  ema_decay: float | None = None,
) -> tuple[TrainState, Array, Array]:
  """One optimizer update, skipped (state bit-identical, counter +1) when the loss or the global
  gradient norm is not finite. `iteration` (1-based training iteration) reaches the optimizer as
  an extra argument: `make_optimizer`'s learning-rate warm-up counts iterations, not updates.
  `ema_decay` d: the state's EMA of the params (when it has one) becomes d·ema + (1 − d)·params
  of the updated params (left as it was by a skipped update).
  Returns (state, grad_norm, skipped as float32)."""
  grad_norm = optax.global_norm(grads)
  finite = jnp.isfinite(grad_norm) & jnp.isfinite(loss)
  grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
  extra = {} if iteration is None else {"iteration": iteration}
  updates, new_opt_state = optax.with_extra_args_support(optimizer).update(
    grads, state.opt_state, state.params, **extra
  )
  new_params = optax.apply_updates(state.params, updates)
  keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
  skipped = (~finite).astype(jnp.int32)
  ema = state.ema_params
  if ema is not None and ema_decay is not None:
    ema = jax.tree.map(keep, update_ema(ema, new_params, ema_decay), ema)
  state = state.replace(
    step=state.step + 1 - skipped,
    params=jax.tree.map(keep, new_params, state.params),
    opt_state=jax.tree.map(keep, new_opt_state, state.opt_state),
    skipped_updates=state.skipped_updates + skipped,
    ema_params=ema,
  )
  return state, grad_norm, skipped.astype(jnp.float32)


# ------------------------------------------------------------------------------- the builder
class TrainStep:
  """The jitted update (and the jitted scoring passes) for one model, objective, optimizer and
  mesh: `step(state, batch, ref_params=None, iteration=None) -> (state, metrics)`. `num_traces`
  counts traces of the update (= compilations: one per bucket shape). `histograms=True` adds the
  gap / gate histogram counts to the metrics (int32 vectors under "diag/" keys, read by
  `sdar_jax.observe.diagnostics.record_update_histograms`; the trainer's update has them)."""

  def __init__(
    self,
    model_config: ModelConfig,
    algo_config: AlgoConfig | Mapping[str, Any],
    optimizer: optax.GradientTransformation,
    *,
    mesh: Mesh | None = None,
    micro_batch_size: int | None = None,
    lr_schedule: Callable[[Array], Array] | None = None,
    rules: sharding.Rules | None = None,
    histograms: bool = False,
  ):
    self.model_config = model_config
    self.algo_config = AlgoConfig.from_config(algo_config)
    self.optimizer = optimizer
    self.mesh = mesh
    self.micro_batch_size = micro_batch_size
    self.lr_schedule = lr_schedule
    self.rules = rules
    self.histograms = histograms
    self.num_traces = 0
    self._update_fns: dict[bool, Callable] = {}
    self._score_fns: dict[str, Callable] = {}
    self._ema_fn: Callable | None = None
    if micro_batch_size is not None and micro_batch_size <= 0:
      raise ValueError(f"micro_batch_size={micro_batch_size} must be a positive integer or None.")

  # ------------------------------------------------------------------------- shardings
  def param_shardings(self):
    return (
      None
      if self.mesh is None
      else sharding.param_shardings(self.model_config, self.mesh, self.rules)
    )

  def state_shardings(self) -> TrainState | None:
    """`train_state_shardings` of this step's model, optimizer and mesh (None: no mesh)."""
    if self.mesh is None:
      return None
    return train_state_shardings(
      self.model_config, self.optimizer, self.mesh, self.rules, ema=self.algo_config.keeps_ema
    )

  def _batch_sharding(self) -> NamedSharding | None:
    return None if self.mesh is None else sharding.batch_sharding(self.mesh, 1, self.rules)

  def shard_state(self, state: TrainState) -> TrainState:
    """The state placed on the mesh; with an EMA teacher (algo.teacher_weights="ema") a state
    without its EMA (a fresh one, or one from a checkpoint written before the field existed) gets
    one started from its params."""
    if self.algo_config.keeps_ema and state.ema_params is None:
      state = state.replace(ema_params=jax.tree.map(jnp.copy, state.params))
    return state if self.mesh is None else jax.device_put(state, self.state_shardings())

  def shard_params(self, params: Params) -> Params:
    return params if self.mesh is None else jax.device_put(params, self.param_shardings())

  def shard_batch(self, batch: TurnBatch) -> TurnBatch:
    return batch if self.mesh is None else jax.device_put(batch, self._batch_sharding())

  def _constrain_micro(self, x: Array) -> Array:
    if self.mesh is None:
      return x
    lead = self._batch_sharding().spec[0]
    return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, P(None, lead)))

  # --------------------------------------------------------------------------- checks
  def _micro(self, batch_size: int) -> int:
    micro = batch_size if self.micro_batch_size is None else self.micro_batch_size
    if batch_size % micro:
      raise ValueError(
        f"Batch of {batch_size} turn-samples does not split into micro-batches of "
        f"train.micro_batch_size={micro}; pad the batch to a multiple of it."
      )
    if self.mesh is not None:
      div = sharding.batch_divisor(self.mesh, self.rules)
      if micro % div:
        raise ValueError(
          f"Micro-batch of {micro} samples cannot be sharded over the mesh's batch "
          f"axes (size {div}); make train.micro_batch_size a multiple of {div}."
        )
    return micro

  def check_batch(
    self, batch: TurnBatch, ref_params: Params | None = None, for_update: bool = True
  ) -> None:
    """Shape / presence checks on the host, with errors that say what to pass."""
    algo = self.algo_config
    B, R = batch.response_mask.shape
    expect = {"student_mask": batch.student_tokens.shape, "old_logp": (B, R), "advantages": (B,)}
    if batch.student_tokens.shape[0] != B or batch.student_tokens.shape[1] <= R:
      raise ValueError(
        f"student_tokens shape {batch.student_tokens.shape} must be [B={B}, Ps+R] "
        f"with a prompt of at least one token before R={R} response slots."
      )
    teacher_in_step = algo.scores_teacher and algo.teacher_source == "step"
    if for_update and algo.scores_teacher and algo.teacher_source == "rollout":
      if batch.teacher_logp is None:
        raise ValueError(
          "algo.teacher_source='rollout' needs batch.teacher_logp: score it once "
          "per iteration with TrainStep.score_teacher(params, batch) before the "
          "first update, or set algo.teacher_source='step'."
        )
      expect["teacher_logp"] = (B, R)
    if teacher_in_step or not for_update:
      if batch.teacher_tokens is None or batch.teacher_mask is None:
        raise ValueError(
          f"algo (distill={algo.distill!r}, advantage={algo.advantage!r}) scores the "
          "teacher: the batch needs teacher_tokens and teacher_mask [B, Pt+R]."
        )
      if batch.teacher_tokens.shape[0] != B or batch.teacher_tokens.shape[1] <= R:
        raise ValueError(
          f"teacher_tokens shape {batch.teacher_tokens.shape} must be "
          f"[B={B}, Pt+R] with Pt >= 1 before R={R} response slots."
        )
      expect["teacher_mask"] = batch.teacher_tokens.shape
    if teacher_in_step and for_update and algo.teacher_weights == "initial" and ref_params is None:
      raise ValueError(
        "algo.teacher_weights='initial' scores the teacher with the frozen initial policy inside "
        "the update: pass ref_params= (the initial params), or set teacher_weights='current'."
      )
    if for_update and algo.kl_coef:
      if ref_params is None and batch.ref_logp is None:
        raise ValueError(
          f"algo.kl_coef={algo.kl_coef} needs the reference policy: pass ref_params= "
          "(frozen initial params) or batch.ref_logp [B, R]; or set kl_coef=0."
        )
      if ref_params is None:
        expect["ref_logp"] = (B, R)
    for name, shape in expect.items():
      got = getattr(batch, name).shape
      if tuple(got) != tuple(shape):
        raise ValueError(f"batch.{name} has shape {tuple(got)}, expected {tuple(shape)}.")
    self._micro(B)

  # --------------------------------------------------------------------------- update
  def _update_fn(self, with_ref: bool) -> Callable:
    if with_ref in self._update_fns:
      return self._update_fns[with_ref]
    config, algo, optimizer = self.model_config, self.algo_config, self.optimizer

    def update(state: TrainState, batch: TurnBatch, ref_params, iteration):
      self.num_traces += 1  # runs at trace time only
      logging.getLogger(__name__).info(
        "compiling the update for %d turn-samples x %d response tokens (student %d, teacher "
        "%d tokens a row; compilation %d) ...",
        batch.response_mask.shape[0],
        batch.response_mask.shape[1],
        batch.student_tokens.shape[1],
        0 if batch.teacher_tokens is None else batch.teacher_tokens.shape[1],
        self.num_traces,
      )
      iteration = jnp.where(iteration < 0, state.step + 1, iteration)
      grads, metrics = loss_and_grads(
        config,
        algo,
        state.params,
        batch,
        micro_batch_size=self._micro(batch.batch_size),
        ref_params=ref_params,
        iteration=iteration,
        constrain=self._constrain_micro,
        histograms=self.histograms,
        ema_params=state.ema_params,
      )
      # the warm-up counts training iterations (several mini-batch updates share one rate)
      lr = None if self.lr_schedule is None else self.lr_schedule(iteration - 1)
      ema_decay = algo.ema.decay if algo.keeps_ema and algo.ema.every == "update" else None
      state, grad_norm, skipped = apply_update(
        optimizer, state, grads, metrics["train/loss"], iteration, ema_decay
      )
      metrics["train/grad_norm"] = grad_norm
      metrics["train/skipped_update"] = skipped
      if lr is not None:
        metrics["train/lr"] = jnp.asarray(lr, jnp.float32)
      return state, metrics

    if self.mesh is None:
      fn = jax.jit(update, donate_argnums=(0,))
    else:
      rep = sharding.replicated(self.mesh)
      state_sh = self.state_shardings()
      ref_sh = self.param_shardings() if with_ref else None
      fn = jax.jit(
        update,
        donate_argnums=(0,),
        in_shardings=(state_sh, self._batch_sharding(), ref_sh, rep),
        out_shardings=(state_sh, rep),
      )
      fn = sharding.with_kernel_mesh(fn, self.mesh, config)
    self._update_fns[with_ref] = fn
    return fn

  def call_args(self, state, batch, ref_params=None, iteration=None) -> tuple:
    """The positional arguments of the jitted update (for `lower(...).compile()` callers)."""
    return state, batch, ref_params, jnp.asarray(-1 if iteration is None else iteration, jnp.int32)

  def __call__(
    self,
    state: TrainState,
    batch: TurnBatch,
    ref_params: Params | None = None,
    iteration: int | None = None,
  ) -> tuple[TrainState, Metrics]:
    """One update on one mini-batch. `state` is donated (do not reuse it). `iteration` is the
    1-based training iteration for the RLSD λ schedule and the learning-rate warm-up (default:
    state.step + 1, right when each iteration has one mini-batch; the trainer passes it).
    `ref_params`: the frozen initial policy, for the KL term and a frozen teacher
    (`algo.needs_ref_params`)."""
    self.check_batch(batch, ref_params)
    return self._update_fn(ref_params is not None)(
      *self.call_args(state, batch, ref_params, iteration)
    )

  def lower(self, state, batch: TurnBatch, ref_params=None, iteration: int | None = None):
    """`jax.stages.Lowered` of the update (state may be abstract). `.compile()` gives an executable
    with `.memory_analysis()`, called as `compiled(*step.call_args(state, batch, ref_params))`."""
    self.check_batch(batch, ref_params)
    return self._update_fn(ref_params is not None).lower(
      *self.call_args(state, batch, ref_params, iteration)
    )

  def move_teacher_ema(self, state: TrainState) -> TrainState:
    """The state with its EMA teacher moved once, ema ← d·ema + (1 − d)·params (d =
    algo.ema.decay): SDPO's cadence (algo.ema.every="iteration") calls it after an
    iteration's updates when at least one was applied. `state` is donated."""
    if state.ema_params is None:
      raise ValueError(
        "move_teacher_ema needs a state with ema_params (algo.teacher_weights='ema'; "
        "TrainStep.shard_state starts it from the params)."
      )
    if self._ema_fn is None:
      decay = self.algo_config.ema.decay

      def move(state: TrainState) -> TrainState:
        return state.replace(ema_params=update_ema(state.ema_params, state.params, decay))

      if self.mesh is None:
        self._ema_fn = jax.jit(move, donate_argnums=(0,))
      else:
        shardings = self.state_shardings()
        self._ema_fn = jax.jit(
          move, donate_argnums=(0,), in_shardings=(shardings,), out_shardings=shardings
        )
    return self._ema_fn(state)

  # -------------------------------------------------------------------------- scoring
  def _score_fn(self, branch: str) -> Callable:
    if branch in self._score_fns:
      return self._score_fns[branch]
    config, algo = self.model_config, self.algo_config
    logp_fn = {
      "teacher": lambda p, mb: _teacher_logp(config, algo, p, mb),
      "student": lambda p, mb: _student_logp(config, algo, p, mb, False)[0],
    }[branch]

    def score(params: Params, batch: TurnBatch) -> Array:
      num_micro = batch.batch_size // self._micro(batch.batch_size)
      if num_micro == 1:
        return logp_fn(params, batch)
      micro = _split_micro(batch, num_micro, self._constrain_micro)
      return _merge_micro(jax.lax.map(functools.partial(logp_fn, params), micro))

    if self.mesh is None:
      fn = jax.jit(score)
    else:
      fn = jax.jit(
        score,
        in_shardings=(self.param_shardings(), self._batch_sharding()),
        out_shardings=self._batch_sharding(),
      )
      fn = sharding.with_kernel_mesh(fn, self.mesh, config)
    self._score_fns[branch] = fn
    return fn

  def score_teacher(self, params: Params, batch: TurnBatch) -> Array:
    """Teacher log-probs [B, R] of the batch's responses under the teacher prompts (no grad),
    micro-batched like the update. Run at θ_old for teacher_source='rollout' (at the frozen
    initial params with teacher_weights='initial')."""
    self.check_batch(batch, for_update=False)
    return self._score_fn("teacher")(params, _without_logps(batch))

  def score_student(self, params: Params, batch: TurnBatch) -> Array:
    """Student-prompt log-probs [B, R] under `params` (no grad): behaviour log-probs recomputed
    after the rollout, or reference log-probs from frozen reference params."""
    self._micro(batch.batch_size)
    return self._score_fn("student")(params, _without_logps(batch))

  def lower_score(self, branch: str, params, batch: TurnBatch):
    """`jax.stages.Lowered` of `score_teacher` (branch "teacher") or `score_student` ("student");
    params and batch may be abstract (`sdar_jax.aot` compiles them for a TPU slice)."""
    if branch not in ("teacher", "student"):
      raise ValueError(f"branch={branch!r}; choose 'teacher' or 'student'.")
    if branch == "teacher":
      self.check_batch(batch, for_update=False)
    self._micro(batch.batch_size)
    return self._score_fn(branch).lower(params, _without_logps(batch))

  def recompute_old_logp(self, params: Params, batch: TurnBatch) -> tuple[TurnBatch, float]:
    """The batch with `old_logp` replaced by a no-grad forward at `params` (θ_old, right after
    the rollout, as the reference computes its old log-probs), and the largest
    |sampler − recomputed| log-prob over the response tokens (0 for a batch without any)."""
    recomputed = self.score_student(params, batch)
    diff = jnp.where(batch.response_mask > 0, jnp.abs(recomputed - batch.old_logp), 0.0)
    return batch.replace(old_logp=recomputed), float(jnp.max(diff))


def _without_logps(batch: TurnBatch) -> TurnBatch:
  """Scoring needs only tokens and masks; dropping the optional arrays keeps one compilation."""
  return batch.replace(ref_logp=None, teacher_logp=None)


def lr_schedule_from_optim(optim: Mapping[str, Any]) -> Callable[[Array], Array]:
  """The learning-rate schedule `train_state.make_optimizer` builds from the same settings, a
  function of the 0-based training iteration (for the train/lr metric)."""
  return make_lr_schedule(float(optim["lr"]), int(optim.get("warmup_steps", 0)))


def train_step_from_config(
  model_config: ModelConfig, config, mesh: Mesh | None = None, histograms: bool = True
) -> TrainStep:
  """From a run config: `config.algo` (every `AlgoConfig` field), `config.optim` (lr,
  warmup_steps, b1, b2, eps, weight_decay, clip_norm), `config.train.micro_batch_size`. The update
  the trainer runs: with the diagnostics' histogram counts (`histograms`, see `TrainStep`)."""
  optim = dict(config.optim)
  optimizer = make_optimizer(**optim)
  micro = config.train.get("micro_batch_size") if hasattr(config.train, "get") else None
  return TrainStep(
    model_config,
    config.algo,
    optimizer,
    mesh=mesh,
    micro_batch_size=micro,
    lr_schedule=lr_schedule_from_optim(optim),
    histograms=histograms,
  )
