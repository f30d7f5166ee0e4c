"""THE compiled update: one mini-batch = one optimizer update, compiled once per bucket shape.

    step = TrainStep(model_config, algo_config, optimizer, mesh=mesh, micro_batch_size=8)
    state = step.shard_state(state)
    state, metrics = step(state, batch)                # batch: a TurnBatch, donated state

Holds `TrainStep`: the jitted update (the loss and gradients of `sdar_jax.core.loss`, the
optimizer update with its non-finite skip, `train_state.apply_update`), its shardings, donation
and host-side batch checks, and the jitted scoring passes (`score_teacher`, `score_student`);
`train_step_from_config` builds it from a run config. Inputs: a `TrainState`, a `TurnBatch`, the
frozen reference params, the 1-based iteration; outputs: the new state and the update's metrics
(histogram counts under "diag/"). No host loop, no files. docs/design.md, "The update", explains
the branches, the teacher sources and the accumulation.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sdar_jax.algos import AlgoConfig
from sdar_jax.core import sharding
from sdar_jax.core.batch import TurnBatch
from sdar_jax.core.loss import (
  loss_and_grads,
  merge_micro,
  split_micro,
  student_branch_logp,
  teacher_branch_logp,
)
from sdar_jax.core.train_state import (
  TrainState,
  apply_update,
  make_lr_schedule,
  make_optimizer,
  train_state_shardings,
  update_ema,
)
from sdar_jax.models import ModelConfig, Params

Array = jax.Array
Metrics = dict[str, Array]


# ------------------------------------------------------------------------------- the builder
class TrainStep:
  """The jitted update (and the jitted scoring passes) for one model, objective, optimizer and
  mesh: `step(state, batch, ref_params=None, iteration=None) -> (state, metrics)`. `num_traces`
  counts traces of the update (= compilations: one per bucket shape). `histograms=True` adds the
  gap / gate histogram counts to the metrics (int32 vectors under "diag/" keys, read by
  `sdar_jax.observe.gate_histograms.record_update_histograms`; the trainer's update has them)."""

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
    self._update_fns: dict[tuple[bool, bool], Callable] = {}
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
    self,
    batch: TurnBatch,
    ref_params: Params | None = None,
    for_update: bool = True,
    teacher_params: Params | None = None,
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
    teacher_in_update = algo.scores_teacher and algo.teacher_source == "update"
    if for_update and algo.scores_teacher and algo.teacher_source == "rollout":
      if batch.teacher_logp is None:
        raise ValueError(
          "algo.teacher_source='rollout' needs batch.teacher_logp: score it once "
          "per iteration with TrainStep.score_teacher(params, batch) before the "
          "first update, or set algo.teacher_source='update'."
        )
      expect["teacher_logp"] = (B, R)
    if teacher_in_update or not for_update:
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
    if (
      teacher_in_update and for_update and algo.teacher_weights == "initial" and ref_params is None
    ):
      raise ValueError(
        "algo.teacher_weights='initial' scores the teacher with the frozen initial policy inside "
        "the update: pass ref_params= (the initial params), or set teacher_weights='current'."
      )
    if (
      teacher_in_update
      and for_update
      and algo.teacher_weights == "frozen"
      and teacher_params is None
    ):
      raise ValueError(
        "algo.teacher_weights='frozen' scores the teacher with the weights read from "
        "algo.teacher_path inside the update: pass teacher_params=, or set teacher_weights="
        "'current'."
      )
    if for_update and algo.reads_distill_weight:
      if batch.distill_weight is None:
        raise ValueError(
          f"algo.distill={algo.distill!r} reads per-token weights: the batch needs "
          "distill_weight [B, R] (pack_batch(..., distill_weights=True))."
        )
      expect["distill_weight"] = (B, R)
    if for_update and algo.measures_kl:
      if ref_params is None and batch.ref_logp is None:
        raise ValueError(
          f"algo.kl_coef={algo.kl_coef} (measure_kl={algo.measure_kl}) needs the reference "
          "policy: pass ref_params= (frozen initial params) or batch.ref_logp [B, R]; or set "
          "kl_coef=0 and measure_kl=False."
        )
      if ref_params is None:
        expect["ref_logp"] = (B, R)
    for name, shape in expect.items():
      got = getattr(batch, name).shape
      if tuple(got) != tuple(shape):
        raise ValueError(f"batch.{name} has shape {tuple(got)}, expected {tuple(shape)}.")
    self._micro(B)

  # --------------------------------------------------------------------------- update
  def _update_fn(self, with_ref: bool, with_teacher: bool = False) -> Callable:
    key = (with_ref, with_teacher)
    if key in self._update_fns:
      return self._update_fns[key]
    config, algo, optimizer = self.model_config, self.algo_config, self.optimizer

    def update(state: TrainState, batch: TurnBatch, ref_params, iteration, teacher_params):
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
        teacher_params=teacher_params,
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
      teacher_sh = self.param_shardings() if with_teacher else None
      fn = jax.jit(
        update,
        donate_argnums=(0,),
        in_shardings=(state_sh, self._batch_sharding(), ref_sh, rep, teacher_sh),
        out_shardings=(state_sh, rep),
      )
      fn = sharding.with_kernel_mesh(fn, self.mesh, config)
    self._update_fns[key] = fn
    return fn

  def call_args(self, state, batch, ref_params=None, iteration=None, teacher_params=None) -> tuple:
    """The positional arguments of the jitted update (for `lower(...).compile()` callers)."""
    it = jnp.asarray(-1 if iteration is None else iteration, jnp.int32)
    return state, batch, ref_params, it, teacher_params

  def __call__(
    self,
    state: TrainState,
    batch: TurnBatch,
    ref_params: Params | None = None,
    iteration: int | None = None,
    teacher_params: Params | None = None,
  ) -> tuple[TrainState, Metrics]:
    """One update on one mini-batch. `state` is donated (do not reuse it). `iteration` is the
    1-based training iteration for the RLSD λ schedule and the learning-rate warm-up (default:
    state.step + 1, right when each iteration has one mini-batch; the trainer passes it).
    `ref_params`: the frozen initial policy, for the KL term and a frozen teacher
    (`algo.needs_ref_params`); `teacher_params`: the teacher's weights when the trainer hands
    them over (`algo.passes_teacher_params`: a teacher read from a folder, or θ_old)."""
    self.check_batch(batch, ref_params, teacher_params=teacher_params)
    fn = self._update_fn(ref_params is not None, teacher_params is not None)
    return fn(*self.call_args(state, batch, ref_params, iteration, teacher_params))

  def lower(
    self,
    state,
    batch: TurnBatch,
    ref_params=None,
    iteration: int | None = None,
    teacher_params=None,
  ):
    """`jax.stages.Lowered` of the update (state may be abstract). `.compile()` gives an executable
    with `.memory_analysis()`, called as `compiled(*step.call_args(state, batch, ref_params))`."""
    self.check_batch(batch, ref_params, teacher_params=teacher_params)
    fn = self._update_fn(ref_params is not None, teacher_params is not None)
    return fn.lower(*self.call_args(state, batch, ref_params, iteration, teacher_params))

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
      "teacher": lambda p, mb: teacher_branch_logp(config, algo, p, mb),
      "student": lambda p, mb: student_branch_logp(config, algo, p, mb, False)[0],
    }[branch]

    def score(params: Params, batch: TurnBatch) -> Array:
      num_micro = batch.batch_size // self._micro(batch.batch_size)
      if num_micro == 1:
        return logp_fn(params, batch)
      micro = split_micro(batch, num_micro, self._constrain_micro)
      return merge_micro(jax.lax.map(functools.partial(logp_fn, params), micro))

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
  return batch.replace(ref_logp=None, teacher_logp=None, distill_weight=None)


def lr_schedule_from_optim(optim: Mapping[str, Any]) -> Callable[[Array], Array]:
  """The learning-rate schedule `train_state.make_optimizer` builds from the same settings, a
  function of the 0-based training iteration (for the train/lr metric)."""
  return make_lr_schedule(float(optim["lr"]), int(optim.get("warmup_iterations", 0)))


def train_step_from_config(
  model_config: ModelConfig, config, mesh: Mesh | None = None, histograms: bool = True
) -> TrainStep:
  """From a run config: `config.algo` (every `AlgoConfig` field), `config.optim` (lr,
  warmup_iterations, b1, b2, eps, weight_decay, clip_norm), `config.train.micro_batch_size`. The
  update the trainer runs: with the diagnostics' histogram counts (`histograms`, see `TrainStep`)."""
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
