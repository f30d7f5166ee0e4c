"""SDAR token gates g_t in [0, 1], all detached (docs/reference.md §1.1, §1.5).

Inputs per response token: the gap Δ_t = lT_t − sg(lθ_t) (teacher minus current student log-prob
of the sampled token; in practice about [−10, 2]), the student's entropy h_t in nats over the
model's V logits (0 ≤ h ≤ ln V), and the sharpness β ≥ 0 (the reference uses 5). σ is the logistic
sigmoid and u_t = h_t / ln V ∈ [0, 1] the normalised entropy.

- "gap":            σ(β·Δ)                              the teacher endorses the token (the
                                                        paper's gate, the authors' only one)
- "entropy":        σ(β·(2u − 1))                       the student is uncertain
- "soft_or":        1 − (1 − σ(β·Δ))·(1 − σ(β·(2u − 1)))  teacher endorses OR student uncertain
- "constant":       0.5                                 (= "gap" with β = 0: GRPO+OPSD)
- "entropy_paper":  σ(β·h)                              the paper's formula, taken literally
- "soft_or_paper":  σ(β·[1 − (1 − h)(1 − Δ)])           the paper's formula, taken literally

The entropy and soft-OR gates exist only in the paper; the authors' code has the gap gate alone.
Taken literally, their formulas do not gate (kept as "entropy_paper" and "soft_or_paper" for
comparison):
- σ(β·h) ≥ 0.5 for every token because h ≥ 0: it never closes (at β = 5 it is above 0.92 once
  h > 0.5 nats), so it is an almost constant weight, not a selection.
- In σ(β·[1 − (1 − h)(1 − Δ)]) the argument's slope in Δ is (1 − h), negative once h > 1 nat:
  for uncertain tokens the gate grows as the teacher rejects the token more strongly (β = 5, h = 2:
  Δ = −5 gives g ≈ 1.0, Δ = +1 gives 0.993), the opposite of a gate. h and Δ are not
  probabilities, so 1 − (1 − h)(1 − Δ) is not an OR of anything.

Our designs keep the paper's intent with inputs of the right scale:
- "entropy": the normalised entropy u is centred and stretched to 2u − 1 ∈ [−1, 1], then passed
  through the same σ(β·) as the gap gate. It rises with h, is 0.5 at half the maximal entropy, and
  spans [σ(−β), σ(β)] = [0.007, 0.993] at β = 5: a confident token (u < 0.41) gets g < 0.3, a
  very uncertain one (u > 0.59) g > 0.7. β = 0 gives 0.5 everywhere, like the gap gate. With
  a 152k vocabulary u = 0.59 is 7 nats; an LLM's tokens mostly sit below 3 nats (u < 0.25), so
  on real rollouts this gate is mostly closed and opens on near-uniform positions only.
- "soft_or": the probabilistic OR 1 − (1 − a)(1 − b) of two probabilities, a = σ(β·Δ) (the gap
  gate) and b = σ(β·(2u − 1)) (the entropy gate). It lies in [max(a, b), 1], rises with Δ for every
  entropy and with h for every Δ, opens when either the teacher endorses the token or the student
  is uncertain, and closes only when the teacher rejects a token the student is sure of (β = 5,
  Δ = −1, u = 0.3: g = 0.125). At β = 0 it is 0.75.
Both need V (the number of logits the entropy is taken over, `vocab_size`); u is clipped to
[0, 1] against float rounding.
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


@GATES.register("entropy")
def entropy_gate(
  beta: ArrayLike, gap: Array, entropy: Array | None = None, vocab_size: int | None = None
) -> Array:
  del gap
  u = normalised_entropy("entropy", entropy, vocab_size)
  return jax.nn.sigmoid(beta * (2.0 * u - 1.0))


@GATES.register("soft_or")
def soft_or_gate(
  beta: ArrayLike, gap: Array, entropy: Array | None = None, vocab_size: int | None = None
) -> Array:
  u = normalised_entropy("soft_or", entropy, vocab_size)
  # 1 − (1 − a)(1 − b) = a + b·(1 − a) = a + b·σ(−βΔ): a sum of non-negative terms, so no
  # cancellation near 0 in float32 (the minimum guards the last ulp near 1).
  a = jax.nn.sigmoid(beta * gap)
  b = jax.nn.sigmoid(beta * (2.0 * u - 1.0))
  return jnp.minimum(a + b * jax.nn.sigmoid(-beta * gap), 1.0)


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
  """Gate `name` evaluated on `gap` (and `entropy` in nats over `vocab_size` logits, for the
  entropy gates); inputs and output are stop-gradient."""
  fn = GATES.get(name)
  gap = jax.lax.stop_gradient(jnp.asarray(gap, jnp.float32))
  if entropy is not None:
    entropy = jax.lax.stop_gradient(jnp.asarray(entropy, jnp.float32))
  beta = jax.lax.stop_gradient(jnp.asarray(beta, jnp.float32))
  return jax.lax.stop_gradient(fn(beta, gap, entropy, vocab_size))
