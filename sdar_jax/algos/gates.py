"""SDAR token gates g_t in [0, 1], all detached (docs/reference.md §1.1, §1.5), by name (`GATES`).

Inputs per response token: the gap Δ = lT − sg(lθ) (teacher minus current student log-prob of the
sampled token), the student's entropy h in nats, the sharpness β ≥ 0 (the reference: 5); σ is the
logistic sigmoid, H0 = ENTROPY_SCALE_NATS = 1 nat, u = h / ln V (clipped to [0, 1]).

- "gap":            σ(β·Δ)                              the paper's gate, the authors' only one
- "entropy":        σ(β·(h/H0 − 1))                     the student is uncertain
- "soft_or":        1 − (1 − σ(β·Δ))·(1 − σ(β·(h/H0 − 1)))  teacher endorses OR student uncertain
- "constant":       0.5                                 (= "gap" with β = 0: GRPO+OPSD)
- "entropy_lnv", "soft_or_lnv":  the same with 2u − 1 for h/H0 − 1 ("entropy", "soft_or" until
                                 2026-12-04; they need `vocab_size`, the others ignore it)
- "entropy_paper":  σ(β·h),  "soft_or_paper": σ(β·[1 − (1 − h)(1 − Δ)])   the paper's, literally

Pure functions of arrays, traceable. Why each design, and why the paper's formulas taken
literally do not gate: docs/design.md, "Gates".
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from sdar_jax.algos.registry import Registry

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

# gate(beta, gap, entropy or None, vocab_size or None) -> g
GateFn = Callable[[ArrayLike, Array, "Array | None", "int | None"], Array]
GATES: Registry[GateFn] = Registry("gate")
# Gates whose value does not depend on β (a sweep over β runs them once: launch/sweep.py).
BETA_FREE_GATES = ("constant",)


def _need_entropy(name: str, entropy: Array | None) -> Array:
  if entropy is None:
    raise ValueError(
      f"gate {name!r} needs the student's per-token entropy: pass entropy=[B, R] "
      "(e.g. entropy_from_logits(logits)), or use gate 'gap' or 'constant'"
    )
  return entropy


def normalised_entropy(name: str, entropy: Array | None, vocab_size: int | None) -> Array:
  """u = h / ln V clipped to [0, 1]; errors name the missing or bad input of gate `name`."""
  h = _need_entropy(name, entropy)
  if vocab_size is None or isinstance(vocab_size, bool) or int(vocab_size) != vocab_size:
    raise ValueError(
      f"gate {name!r} normalises the entropy by ln V: pass vocab_size=V (the number of logits "
      f"the entropy is taken over, ModelConfig.vocab_size), got {vocab_size!r}"
    )
  if vocab_size < 2:
    raise ValueError(
      f"gate {name!r}: vocab_size={vocab_size} leaves no entropy to normalise (ln V = 0); "
      "pass the model's number of logits (>= 2)"
    )
  return jnp.clip(h / math.log(int(vocab_size)), 0.0, 1.0)


@GATES.register("gap")
def gap_gate(
  beta: ArrayLike, gap: Array, entropy: Array | None = None, vocab_size: int | None = None
) -> Array:
  del entropy, vocab_size
  return jax.nn.sigmoid(beta * gap)


ENTROPY_SCALE_NATS = 1.0  # H0: the entropy at which "entropy" is half open


def _entropy_on_scale(name: str, entropy: Array | None) -> Array:
  """h / H0 − 1 (h clipped at 0 against rounding): −1 for a certain token, 0 at h = H0 nats."""
  h = jnp.maximum(_need_entropy(name, entropy), 0.0)
  return h / ENTROPY_SCALE_NATS - 1.0


def _soft_or(beta: ArrayLike, gap: Array, b: Array) -> Array:
  """1 − (1 − σ(βΔ))(1 − b) written as a + b·σ(−βΔ): a sum of non-negative terms, so no
  cancellation near 0 in float32 (the minimum guards the last ulp near 1)."""
  a = jax.nn.sigmoid(beta * gap)
  return jnp.minimum(a + b * jax.nn.sigmoid(-beta * gap), 1.0)


@GATES.register("entropy")
def entropy_gate(
  beta: ArrayLike, gap: Array, entropy: Array | None = None, vocab_size: int | None = None
) -> Array:
  del gap, vocab_size
  return jax.nn.sigmoid(beta * _entropy_on_scale("entropy", entropy))


@GATES.register("soft_or")
def soft_or_gate(
  beta: ArrayLike, gap: Array, entropy: Array | None = None, vocab_size: int | None = None
) -> Array:
  del vocab_size
  return _soft_or(beta, gap, jax.nn.sigmoid(beta * _entropy_on_scale("soft_or", entropy)))


@GATES.register("entropy_lnv")
def entropy_lnv_gate(
  beta: ArrayLike, gap: Array, entropy: Array | None = None, vocab_size: int | None = None
) -> Array:
  del gap
  u = normalised_entropy("entropy_lnv", entropy, vocab_size)
  return jax.nn.sigmoid(beta * (2.0 * u - 1.0))


@GATES.register("soft_or_lnv")
def soft_or_lnv_gate(
  beta: ArrayLike, gap: Array, entropy: Array | None = None, vocab_size: int | None = None
) -> Array:
  u = normalised_entropy("soft_or_lnv", entropy, vocab_size)
  return _soft_or(beta, gap, jax.nn.sigmoid(beta * (2.0 * u - 1.0)))


@GATES.register("constant")
def constant_gate(
  beta: ArrayLike, gap: Array, entropy: Array | None = None, vocab_size: int | None = None
) -> Array:
  del beta, entropy, vocab_size
  return jnp.full_like(gap, 0.5)


@GATES.register("entropy_paper")
def entropy_paper_gate(
  beta: ArrayLike, gap: Array, entropy: Array | None = None, vocab_size: int | None = None
) -> Array:
  del gap, vocab_size
  return jax.nn.sigmoid(beta * _need_entropy("entropy_paper", entropy))


@GATES.register("soft_or_paper")
def soft_or_paper_gate(
  beta: ArrayLike, gap: Array, entropy: Array | None = None, vocab_size: int | None = None
) -> Array:
  del vocab_size
  h = _need_entropy("soft_or_paper", entropy)
  return jax.nn.sigmoid(beta * (1.0 - (1.0 - h) * (1.0 - gap)))


def compute_gate(
  name: str,
  *,
  beta: ArrayLike,
  gap: ArrayLike,
  entropy: ArrayLike | None = None,
  vocab_size: int | None = None,
) -> Array:
  """Gate `name` evaluated on `gap` (and `entropy` in nats, for the entropy gates; the "_lnv"
  ones also need `vocab_size`, the number of logits it is taken over); inputs and output are
  stop-gradient."""
  fn = GATES.get(name)
  gap = jax.lax.stop_gradient(jnp.asarray(gap, jnp.float32))
  if entropy is not None:
    entropy = jax.lax.stop_gradient(jnp.asarray(entropy, jnp.float32))
  beta = jax.lax.stop_gradient(jnp.asarray(beta, jnp.float32))
  return jax.lax.stop_gradient(fn(beta, gap, entropy, vocab_size))
