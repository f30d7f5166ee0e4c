"""The training state pytree, its shardings and the optimizer, shared by the train step and the
checkpointer."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from sdar_jax.core.sharding import Rules, param_shardings, replicated
from sdar_jax.models import ModelConfig, Params, init_params, param_shapes

Array = jax.Array


@flax.struct.dataclass
class TrainState:
  """Everything an update changes. One copy of the policy parameters: the SDAR teacher is the same
  weights under a longer prompt, so it needs no state of its own, unless it runs on an EMA of
  them (algo.teacher_weights="ema"): then `ema_params`, a params-shaped pytree sharded like the
  params and checkpointed with them; None otherwise (and in checkpoints written before the field
  existed, where `TrainStep.shard_state` starts it from the params). The frozen reference policy
  for the KL term (when on) is passed to the step separately, never stored here."""

  step: jax.Array  # int32 scalar: optimizer updates applied so far
  params: Params
  opt_state: Any
  skipped_updates: jax.Array  # int32 scalar: updates skipped because the gradient was not finite
  ema_params: Params | None = None  # the EMA teacher's weights (teacher_weights="ema"), or None


def make_lr_schedule(lr: float, warmup_iterations: int = 0) -> optax.Schedule:
  """The learning rate of 0-based training iteration k (one rollout + its updates): linear warm-up
  lr·k/K over K = `warmup_iterations` iterations (iteration 0 uses 0), then constant. It counts
  iterations, not optimizer updates: every mini-batch update of one iteration uses the same rate,
  as the reference steps its scheduler once per iteration (docs/reference.md §4.8)."""
  if warmup_iterations > 0:
    return optax.linear_schedule(0.0, lr, warmup_iterations)
  return optax.constant_schedule(lr)


def scale_by_iteration_lr(
  lr: float, warmup_iterations: int = 0
) -> optax.GradientTransformationExtraArgs:
  """Scales updates by −lr_k with lr_k = make_lr_schedule(lr, warmup_iterations)(iteration − 1),
  where the 1-based training `iteration` is passed as `optimizer.update(..., iteration=...)` (the
  train step does). Without a warm-up the rate is constant and `iteration` may be left out."""
  schedule = make_lr_schedule(lr, warmup_iterations)

  def init(params):
    del params
    return optax.EmptyState()

  def update(updates, state, params=None, *, iteration=None, **extra_args):
    del params, extra_args
    if iteration is None:
      if warmup_iterations > 0:
        raise ValueError(
          f"optim.warmup_iterations={warmup_iterations} counts training iterations: pass the "
          "1-based iteration to optimizer.update(..., iteration=k) (TrainStep does), or set "
          "warmup_iterations=0."
        )
      rate = jnp.asarray(lr, jnp.float32)
    else:
      rate = schedule(jnp.asarray(iteration, jnp.int32) - 1)
    return jax.tree.map(lambda u: -jnp.asarray(rate, u.dtype) * u, updates), state

  return optax.GradientTransformationExtraArgs(init, update)


def _optimizer_problems(lr, warmup_iterations, b1, b2, weight_decay, clip_norm, eps) -> list[str]:
  """One "optim.<key>=<value>: <problem>. Fix: <fix>" line per invalid `make_optimizer` argument."""
  problems = []

  def require(ok: bool, key: str, value, problem: str, fix: str) -> None:
    if not ok:
      problems.append(f"optim.{key}={value!r}: {problem}. Fix: {fix}")

  def number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

  require(number(lr) and lr >= 0, "lr", lr, "must be a number >= 0", "the reference uses 1e-6")
  require(
    number(warmup_iterations) and warmup_iterations >= 0,
    "warmup_iterations",
    warmup_iterations,
    "must be a number >= 0 (training iterations)",
    "use 0 for no warm-up",
  )
  for key, value in (("b1", b1), ("b2", b2)):
    decay = "Adam decay rates must be in [0, 1)"
    require(number(value) and 0 <= value < 1, key, value, decay, "use 0.9 / 0.999")
  require(number(eps) and eps > 0, "eps", eps, "must be > 0", "use 1e-8")
  require(
    number(weight_decay) and weight_decay >= 0,
    "weight_decay",
    weight_decay,
    "must be a number >= 0",
    "the reference uses 0.01",
  )
  require(
    number(clip_norm) and clip_norm >= 0,
    "clip_norm",
    clip_norm,
    "must be a number >= 0",
    "use 0 to disable clipping",
  )
  return problems


def make_optimizer(
  lr: float = 1e-6,
  warmup_iterations: int = 0,
  b1: float = 0.9,
  b2: float = 0.999,
  weight_decay: float = 0.01,
  clip_norm: float = 1.0,
  eps: float = 1e-8,
) -> optax.GradientTransformation:
  """AdamW with global-norm clipping and linear learning-rate warm-up (the reference's optimizer:
  lr 1e-6, betas (0.9, 0.999), weight decay 0.01, clip 1.0; Search-QA warms up over 15 training
  iterations). The warm-up matches the reference's scheduler: iteration k (0-based) of K uses
  lr·k/K, so the first uses 0; `update` takes the 1-based `iteration=` keyword for it (see
  `scale_by_iteration_lr`). Without warm-up it is exactly `optax.adamw` after the clipping."""
  problems = _optimizer_problems(lr, warmup_iterations, b1, b2, weight_decay, clip_norm, eps)
  if problems:
    raise ValueError("\n".join(problems))
  parts = []
  if clip_norm and clip_norm > 0:
    parts.append(optax.clip_by_global_norm(clip_norm))
  # optax.adamw's own chain (so the state has adamw's structure), with the learning rate taken
  # per training iteration
  adamw = optax.chain(
    optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
    optax.add_decayed_weights(weight_decay),
    scale_by_iteration_lr(lr, warmup_iterations),
  )
  return optax.chain(*parts, adamw)


def create_train_state(
  params: Params, optimizer: optax.GradientTransformation, ema: bool = False
) -> TrainState:
  """Step 0 of training `params` with `optimizer` (the update needs no randomness: rollout keys are
  derived by the trainer from (seed, iteration)); `ema`: with an EMA of the params (a copy)."""
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=optimizer.init(params),
    skipped_updates=jnp.zeros((), jnp.int32),
    ema_params=jax.tree.map(jnp.copy, params) if ema else None,
  )


def init_train_state(
  config: ModelConfig, optimizer: optax.GradientTransformation, seed: int = 0, ema: bool = False
) -> TrainState:
  """Random-init parameters + optimizer state (tests, the offline demo)."""
  return create_train_state(init_params(config, jax.random.key(seed)), optimizer, ema)


def update_ema(ema: Params, params: Params, decay: float) -> Params:
  """ema ← d·ema + (1 − d)·params, leaf by leaf in float32, cast back to each leaf's dtype."""

  def one(e, p):
    mixed = decay * e.astype(jnp.float32) + (1.0 - decay) * p.astype(jnp.float32)
    return mixed.astype(e.dtype)

  return jax.tree.map(one, ema, params)


def train_state_shardings(
  model_config: ModelConfig,
  optimizer: optax.GradientTransformation,
  mesh: Mesh,
  rules: Rules | None = None,
  ema: bool = False,
) -> TrainState:
  """A TrainState of NamedShardings: params (and their EMA when `ema`) by the logical-axis rules,
  optimizer moments like the params they track (`optax.tree_map_params`), scalars (step,
  counts) replicated."""
  params = param_shardings(model_config, mesh, rules)
  scalar = replicated(mesh)
  abstract_opt_state = jax.eval_shape(optimizer.init, param_shapes(model_config))
  opt_state = optax.tree_map_params(
    optimizer, lambda _, s: s, abstract_opt_state, params, transform_non_params=lambda _: scalar
  )
  return TrainState(
    step=scalar,
    params=params,
    opt_state=opt_state,
    skipped_updates=scalar,
    ema_params=params if ema else None,
  )


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
