"""SDAR token gates g_t in [0, 1], all detached (docs/reference.md §1.1, §1.5).

Inputs per response token: the gap Δ_t = lT_t − sg(lθ_t) (teacher minus current student log-prob
of the sampled token; in practice about [−10, 2]), the student's entropy h_t in nats over the
model's V logits (0 ≤ h ≤ ln V), and the sharpness β ≥ 0 (the reference uses 5). σ is the logistic
sigmoid, H0 = ENTROPY_SCALE_NATS = 1 nat and u_t = h_t / ln V ∈ [0, 1] the normalised entropy.

- "gap":            σ(β·Δ)                              the teacher endorses the token (the
                                                        paper's gate, the authors' only one)
- "entropy":        σ(β·(h/H0 − 1))                     the student is uncertain
- "soft_or":        1 − (1 − σ(β·Δ))·(1 − σ(β·(h/H0 − 1)))  teacher endorses OR student uncertain
- "constant":       0.5                                 (= "gap" with β = 0: GRPO+OPSD)
- "entropy_lnv":    σ(β·(2u − 1))                       "entropy" until 2026-12-04
- "soft_or_lnv":    1 − (1 − σ(β·Δ))·(1 − σ(β·(2u − 1)))  "soft_or" until 2026-12-04
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

Our designs keep the paper's intent with inputs of the right scale.

"entropy" measures the entropy on a fixed scale in nats, H0 = 1 nat, independent of the
vocabulary: the gate is half open at h = H0 (the spread of e ≈ 2.7 equally likely tokens) and β is
its sharpness, as in the gap gate. Why a fixed scale: a language model's token entropy is set by how
many continuations are plausible, not by how many logits the head has; confident tokens sit below
0.1 nat and the positions where the model hesitates ("forking" tokens) at about 1-3 nats, whatever
V is. At β = 5 (the values are the same at every V, since V does not enter):
    h (nats)   0      0.05    0.5     0.8     1.0    1.2     1.5     2.0    4.0
    g          0.007  0.009   0.076   0.269   0.5    0.731   0.924   0.993  1.000
so a confident token (h ≤ 0.05) gets g < 0.01 and the gate is above 0.7 from h = 1.2 nats on, at
Qwen's V = 151,936 (ln V = 11.93) as at the demo's V = 1,664 (ln V = 7.42). A statistic of the
batch (e.g. the entropy's quantile) would also be V-free, but it has to be taken over the whole
mini-batch so that gradient accumulation over micro-batches still equals one batch, and it makes a
token's weight depend on its neighbours in the batch; a fixed scale has neither cost.

The gates until 2026-12-04 ("entropy_lnv", "soft_or_lnv", kept so earlier sweeps reproduce)
normalised by ln V: u = h / ln V, g = σ(β·(2u − 1)). At β = 5 they are half open at h = ln V / 2,
i.e. 5.97 nats at V = 151,936 and 3.71 nats at V = 1,664: for h = 1-3 nats, g = 0.015-0.077 at
V = 151,936 (0.025-0.28 at V = 1,664), and g ≤ 0.16 for every h ≤ 4 nats at V = 151,936. On real
rollouts they are therefore almost always closed, and closed at a point that moves with V.

"soft_or" is the probabilistic OR 1 − (1 − a)(1 − b) of two probabilities, a = σ(β·Δ) (the gap
gate) and b the entropy gate ("soft_or": b = σ(β·(h/H0 − 1)); "soft_or_lnv": b = σ(β·(2u − 1))).
It lies in [max(a, b), 1], rises with Δ for every entropy and with h for every Δ, opens when either
the teacher endorses the token or the student is uncertain, and closes only when the teacher
rejects a token the student is sure of (β = 5, Δ = −1, h = 0.5 nat: g = 0.082). At β = 0 it is 0.75.

"entropy" and "soft_or" do not read V (`vocab_size` is accepted and ignored); the "_lnv" variants
need it (the number of logits the entropy is taken over); u is clipped to [0, 1] and h to h ≥ 0
against float rounding.
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


ENTROPY_SCALE_NATS = 1.0  # H0: the entropy at which "entropy" is half open (module doc)


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
