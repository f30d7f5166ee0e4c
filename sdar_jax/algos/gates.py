"""SDAR token gates g_t in (0, 1), all detached (reference §1.1, §1.5; DESIGN "Gates").

Inputs: the gap Δ_t = lT_t - sg(lθ_t) (teacher minus current student log-prob of the
sampled token) and h_t, the student's per-token entropy in nats.
- "gap":      σ(β·Δ)                      the paper's gate and the only one in the authors' code
- "entropy":  σ(β·h)
- "soft_or":  σ(β·[1 - (1 - h)(1 - Δ)])   a soft OR of "uncertain" and "teacher prefers"
- "constant": 0.5                          (= "gap" with β = 0: the GRPO+OPSD baseline)
The entropy and soft-OR gates are described in the paper but absent from the released code;
these are their formulas taken literally (h and Δ are not rescaled to [0, 1]).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from sdar_jax.algos.registry import Registry

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

GateFn = Callable[[ArrayLike, Array, "Array | None"], Array]
GATES: Registry[GateFn] = Registry("gate")


def _need_entropy(name: str, entropy: Array | None) -> Array:
  if entropy is None:
    raise ValueError(
      f"gate {name!r} needs the student's per-token entropy: pass entropy=[B, R] "
      "(e.g. entropy_from_logits(logits)), or use gate 'gap' or 'constant'"
    )
  return entropy


@GATES.register("gap")
def gap_gate(beta: ArrayLike, gap: Array, entropy: Array | None = None) -> Array:
  del entropy
  return jax.nn.sigmoid(beta * gap)


@GATES.register("entropy")
def entropy_gate(beta: ArrayLike, gap: Array, entropy: Array | None = None) -> Array:
  del gap
  return jax.nn.sigmoid(beta * _need_entropy("entropy", entropy))


@GATES.register("soft_or")
def soft_or_gate(beta: ArrayLike, gap: Array, entropy: Array | None = None) -> Array:
  h = _need_entropy("soft_or", entropy)
  return jax.nn.sigmoid(beta * (1.0 - (1.0 - h) * (1.0 - gap)))


@GATES.register("constant")
def constant_gate(beta: ArrayLike, gap: Array, entropy: Array | None = None) -> Array:
  del beta, entropy
  return jnp.full_like(gap, 0.5)


def compute_gate(
  name: str,
  *,
  beta: ArrayLike,
  gap: ArrayLike,
  entropy: ArrayLike | None = None,
) -> Array:
  """Gate `name` evaluated on `gap` (and `entropy`); inputs and output are stop-gradient."""
  fn = GATES.get(name)
  gap = jax.lax.stop_gradient(jnp.asarray(gap, jnp.float32))
  if entropy is not None:
    entropy = jax.lax.stop_gradient(jnp.asarray(entropy, jnp.float32))
  beta = jax.lax.stop_gradient(jnp.asarray(beta, jnp.float32))
  return jax.lax.stop_gradient(fn(beta, gap, entropy))
