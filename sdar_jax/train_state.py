"""The training state pytree and the optimizer, shared by the train step and the checkpointer."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from sdar_jax.models import ModelConfig, Params, init_params


@flax.struct.dataclass
class TrainState:
  """Everything an update changes. One copy of the policy parameters: the SDAR teacher is the same
  weights under a longer prompt, so it needs no state of its own. The frozen reference policy for
  the KL term (when on) is passed to the step separately, never stored here."""

  step: jax.Array  # int32 scalar: optimizer updates applied so far
  params: Params
  opt_state: Any
  skipped_updates: jax.Array  # int32 scalar: updates skipped because the gradient was not finite


def make_lr_schedule(lr: float, warmup_steps: int = 0) -> optax.Schedule:
  """The learning rate of 0-based training iteration k (one rollout + its updates): linear warm-up
  lr·k/K over K = `warmup_steps` iterations (iteration 0 uses 0), then constant. It counts
  iterations, not optimizer updates: every mini-batch update of one iteration uses the same rate,
  as the reference steps its scheduler once per iteration (docs/reference.md §4.8)."""
  if warmup_steps > 0:
    return optax.linear_schedule(0.0, lr, warmup_steps)
  return optax.constant_schedule(lr)


def scale_by_iteration_lr(
  lr: float, warmup_steps: int = 0
) -> optax.GradientTransformationExtraArgs:
  """Scales updates by −lr_k with lr_k = make_lr_schedule(lr, warmup_steps)(iteration − 1), where
  the 1-based training `iteration` is passed as `optimizer.update(..., iteration=...)` (the train
  step does). Without a warm-up the rate is constant and `iteration` may be left out."""
  schedule = make_lr_schedule(lr, warmup_steps)

  def init(params):
    del params
    return optax.EmptyState()

  def update(updates, state, params=None, *, iteration=None, **extra_args):
    del params, extra_args
    if iteration is None:
      if warmup_steps > 0:
        raise ValueError(
          f"optim.warmup_steps={warmup_steps} counts training iterations: pass the 1-based "
          "iteration to optimizer.update(..., iteration=k) (TrainStep does), or set "
          "warmup_steps=0."
        )
      rate = jnp.asarray(lr, jnp.float32)
    else:
      rate = schedule(jnp.asarray(iteration, jnp.int32) - 1)
    return jax.tree.map(lambda u: -jnp.asarray(rate, u.dtype) * u, updates), state

  return optax.GradientTransformationExtraArgs(init, update)


def make_optimizer(
  lr: float = 1e-6,
  warmup_steps: int = 0,
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
  if lr < 0:
    raise ValueError(f"optim.lr={lr} must be >= 0.")
  if warmup_steps < 0:
    raise ValueError(f"optim.warmup_steps={warmup_steps} must be >= 0.")
  parts = []
  if clip_norm and clip_norm > 0:
    parts.append(optax.clip_by_global_norm(clip_norm))
  # optax.adamw's own chain (so the state has adamw's structure), with the learning rate taken
  # per training iteration
  adamw = optax.chain(
    optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
    optax.add_decayed_weights(weight_decay),
    scale_by_iteration_lr(lr, warmup_steps),
  )
  return optax.chain(*parts, adamw)


def create_train_state(params: Params, optimizer: optax.GradientTransformation) -> TrainState:
  """Step 0 of training `params` with `optimizer` (the update needs no randomness: rollout keys are
  derived by the trainer from (seed, iteration))."""
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=optimizer.init(params),
    skipped_updates=jnp.zeros((), jnp.int32),
  )


def init_train_state(
  config: ModelConfig, optimizer: optax.GradientTransformation, seed: int = 0
) -> TrainState:
  """Random-init parameters + optimizer state (tests, the offline demo)."""
  return create_train_state(init_params(config, jax.random.key(seed)), optimizer)
