"""SDAR gates as gates: range, monotonicity and the ability to close and open, checked on a grid
of realistic inputs (β = 5, entropy h in [0, ln V] nats, gap Δ in [-10, 2]), plus hand-worked
values. The paper's literal formulas are checked to fail these properties the way the gates
module documents."""

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest

from sdar_jax.algos import GATES, compute_gate, get_preset

QWEN_V = 151936  # the Qwen embedding rows: the number of logits the entropy is taken over
SMALL_V = 16
BETAS = [0.5, 2.5, 5.0, 10.0]
SOUND = ["gap", "entropy", "soft_or", "constant"]
# Float32 sigmoids may wobble by an ulp between neighbouring inputs; monotonicity is asserted
# up to this much (a real violation, like the paper's soft-OR, is orders of magnitude larger).
ULP_SLACK = 1e-6


def grid(vocab_size: int, n_h: int = 121, n_gap: int = 121):
  """Entropies [n_h, 1] from 0 to ln V and gaps [1, n_gap] from -10 to 2."""
  h = np.linspace(0.0, math.log(vocab_size), n_h, dtype=np.float32)[:, None]
  gap = np.linspace(-10.0, 2.0, n_gap, dtype=np.float32)[None, :]
  return h, gap


def gate(name, beta, h, gap, vocab_size):
  h, gap = np.broadcast_arrays(h, gap)
  return np.asarray(compute_gate(name, beta=beta, gap=gap, entropy=h, vocab_size=vocab_size))


# ------------------------------------------------------------------------- sound gates
@pytest.mark.parametrize("vocab_size", [QWEN_V, SMALL_V])
@pytest.mark.parametrize("beta", [0.0, *BETAS])
@pytest.mark.parametrize("name", SOUND + ["entropy_paper", "soft_or_paper"])
def test_every_gate_lies_in_the_unit_interval(name, beta, vocab_size):
  h, gap = grid(vocab_size)
  g = gate(name, beta, h, gap, vocab_size)
  assert np.all(np.isfinite(g)) and g.min() >= 0.0 and g.max() <= 1.0


@pytest.mark.parametrize("vocab_size", [QWEN_V, SMALL_V])
@pytest.mark.parametrize("beta", BETAS)
def test_entropy_gate_rises_with_entropy_and_ignores_the_gap(beta, vocab_size):
  h, gap = grid(vocab_size)
  g = gate("entropy", beta, h, gap, vocab_size)
  assert np.all(np.diff(g, axis=0) >= -ULP_SLACK)
  assert g[-1, 0] - g[0, 0] > 0.2  # it really rises, it is not flat
  np.testing.assert_array_equal(g, np.repeat(g[:, :1], g.shape[1], axis=1))


@pytest.mark.parametrize("vocab_size", [QWEN_V, SMALL_V])
@pytest.mark.parametrize("beta", BETAS)
def test_soft_or_rises_with_the_gap_for_every_entropy_and_with_the_entropy(beta, vocab_size):
  h, gap = grid(vocab_size)
  g = gate("soft_or", beta, h, gap, vocab_size)
  assert np.all(np.diff(g, axis=1) >= -ULP_SLACK)  # along Δ, at every entropy
  assert np.all(np.diff(g, axis=0) >= -ULP_SLACK)  # along h, at every gap
  # an OR: at least as open as either of its two parts
  assert np.all(g >= gate("gap", beta, h, gap, vocab_size) - ULP_SLACK)
  assert np.all(g >= gate("entropy", beta, h, gap, vocab_size) - ULP_SLACK)


@pytest.mark.parametrize("vocab_size", [QWEN_V, SMALL_V])
def test_sound_gates_close_and_open_on_realistic_inputs(vocab_size):
  h, gap = grid(vocab_size)
  ent = gate("entropy", 5.0, h, gap, vocab_size)
  assert ent[0, 0] < 0.3 and ent[-1, 0] > 0.7  # a certain student closes it, an unsure opens
  soft = gate("soft_or", 5.0, h, gap, vocab_size)
  assert soft[0, 0] < 0.3  # teacher rejects (Δ = -10) a token the student is sure of (h = 0)
  assert soft[0, -1] > 0.7  # teacher endorses (Δ = 2), student sure
  assert soft[-1, 0] > 0.7  # teacher rejects, student maximally unsure
  assert (soft < 0.3).mean() > 0.2 and (soft > 0.7).mean() > 0.05  # not just at the corners
  g = gate("gap", 5.0, h, gap, vocab_size)
  assert g.min() < 0.3 and g.max() > 0.7


def test_new_gates_at_hand_worked_points():
  log_v = math.log(QWEN_V)
  h = np.asarray([0.0, log_v / 2, log_v, 0.3 * log_v], np.float32)
  ent = compute_gate("entropy", beta=5.0, gap=np.zeros(4), entropy=h, vocab_size=QWEN_V)
  # σ(-5), σ(0), σ(5), σ(-2)
  np.testing.assert_allclose(ent, [0.0066928509, 0.5, 0.9933071491, 0.1192029220], rtol=1e-5)
  soft = compute_gate(
    "soft_or",
    beta=5.0,
    gap=np.asarray([-10.0, 0.0, -10.0, -1.0], np.float32),
    entropy=h,
    vocab_size=QWEN_V,
  )
  # 1 - (1 - σ(-50))(1 - σ(-5)); 1 - 0.5·0.5; 1 - (1 - σ(-50))(1 - σ(5)); 1 - (1 - σ(-5))(1 - σ(-2))
  np.testing.assert_allclose(
    soft, [0.0066928509, 0.75, 0.9933071491, 0.1250979656], rtol=1e-5, atol=1e-12
  )


def test_beta_zero_flattens_the_entropy_gates():
  h, gap = grid(QWEN_V, 11, 11)
  np.testing.assert_array_equal(gate("entropy", 0.0, h, gap, QWEN_V), 0.5)
  np.testing.assert_allclose(gate("soft_or", 0.0, h, gap, QWEN_V), 0.75, rtol=1e-7)


def test_entropy_above_ln_v_from_rounding_stays_in_range():
  h = np.asarray([-1e-6, math.log(SMALL_V) * (1 + 1e-6), 50.0], np.float32)
  for name in ("entropy", "soft_or"):
    g = np.asarray(compute_gate(name, beta=5.0, gap=np.zeros(3), entropy=h, vocab_size=SMALL_V))
    assert np.all((g >= 0) & (g <= 1))


# ------------------------------------------------------------------------ paper formulas
def test_paper_entropy_gate_never_closes():
  h, gap = grid(QWEN_V)
  for beta in [0.0, *BETAS]:
    assert gate("entropy_paper", beta, h, gap, QWEN_V).min() >= 0.5
  # σ(5·0.5) = 0.924: a token of half a nat already gets nearly the full weight
  g = compute_gate("entropy_paper", beta=5.0, gap=jnp.zeros(1), entropy=jnp.asarray([0.5]))
  np.testing.assert_allclose(g, [0.9241418200], rtol=1e-6)


def test_paper_soft_or_trusts_teacher_rejected_tokens_most():
  # β = 5, h = 2: Δ = -5 gives σ(5·(1 + 1·6)) = σ(35) ≈ 1.0; Δ = +1 gives σ(5·1) = 0.99331
  g = compute_gate(
    "soft_or_paper",
    beta=5.0,
    gap=jnp.asarray([-5.0, 1.0]),
    entropy=jnp.asarray([2.0, 2.0]),
  )
  np.testing.assert_allclose(g, [1.0, 0.9933071491], rtol=1e-6)
  assert g[0] > g[1]  # decreasing in Δ: not a gate
  h, gap = grid(QWEN_V)
  decreasing = np.diff(gate("soft_or_paper", 5.0, h, gap, QWEN_V), axis=1) < -1e-3
  assert decreasing.any()


def test_paper_gates_need_no_vocab_size():
  h = jnp.asarray([0.0, 1.0])
  for name in ("entropy_paper", "soft_or_paper"):
    assert compute_gate(name, beta=5.0, gap=jnp.zeros(2), entropy=h).shape == (2,)


# ------------------------------------------------------------------------------ presets
def test_gate_presets_select_the_sound_designs_and_the_paper_variants():
  assert {"entropy_paper", "soft_or_paper"} <= set(GATES.names())
  want = {
    "sdar_entropy": "entropy",
    "sdar_soft_or": "soft_or",
    "sdar_entropy_paper": "entropy_paper",
    "sdar_soft_or_paper": "soft_or_paper",
  }
  for preset, name in want.items():
    p = get_preset(preset)
    assert p.gate == name and p.distill == "sdar" and p.scores_teacher
    assert dataclasses.replace(p, name="sdar", gate="gap") == get_preset("sdar")
