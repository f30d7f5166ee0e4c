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
  rng: jax.Array  # a uint32 PRNG key (raw, so orbax stores it as a plain array)
  skipped_updates: jax.Array  # int32 scalar: updates skipped because the gradient was not finite


def make_lr_schedule(lr: float, warmup_steps: int = 0) -> optax.Schedule:
  """Linear warm-up from 0 to `lr` over `warmup_steps` updates, then constant."""
  if warmup_steps > 0:
    return optax.linear_schedule(0.0, lr, warmup_steps)
  return optax.constant_schedule(lr)


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
  lr 1e-6, betas (0.9, 0.999), weight decay 0.01, clip 1.0; Search-QA warms up over 15 steps).
  The warm-up matches the reference's scheduler: step k of K uses lr * k / K, so step 0 uses 0."""
  if lr < 0:
    raise ValueError(f"optim.lr={lr} must be >= 0.")
  if warmup_steps < 0:
    raise ValueError(f"optim.warmup_steps={warmup_steps} must be >= 0.")
  schedule = make_lr_schedule(lr, warmup_steps)
  parts = []
  if clip_norm and clip_norm > 0:
    parts.append(optax.clip_by_global_norm(clip_norm))
  parts.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
  return optax.chain(*parts)


def create_train_state(
  params: Params, optimizer: optax.GradientTransformation, seed: int = 0
) -> TrainState:
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    params=params,
    opt_state=optimizer.init(params),
    rng=jax.random.key_data(jax.random.key(seed)),
    skipped_updates=jnp.zeros((), jnp.int32),
  )


def init_train_state(
  config: ModelConfig, optimizer: optax.GradientTransformation, seed: int = 0
) -> TrainState:
  """Random-init parameters + optimizer state (tests, the offline demo)."""
  return create_train_state(init_params(config, jax.random.key(seed)), optimizer, seed)
