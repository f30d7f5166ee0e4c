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
DEMO_V = 1664  # the offline demo's compact tokenizer
SMALL_V = 16
BETAS = [0.5, 2.5, 5.0, 10.0]
SOUND = ["gap", "entropy", "soft_or", "constant", "entropy_lnv", "soft_or_lnv"]
# Float32 sigmoids may wobble by an ulp between neighbouring inputs; monotonicity is asserted
# up to this much (a real violation, like the paper's soft-OR, is orders of magnitude larger).
ULP_SLACK = 1e-6


def grid(vocab_size: int, n_h: int = 121, n_gap: int = 121, h_max: float | None = None):
  """Entropies [n_h, 1] from 0 to ln V (or `h_max`, if lower) and gaps [1, n_gap] from -10 to 2."""
  top = math.log(vocab_size) if h_max is None else min(h_max, math.log(vocab_size))
  h = np.linspace(0.0, top, n_h, dtype=np.float32)[:, None]
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


@pytest.mark.parametrize("name", ["entropy", "entropy_lnv"])
@pytest.mark.parametrize("vocab_size", [QWEN_V, SMALL_V])
@pytest.mark.parametrize("beta", BETAS)
def test_entropy_gate_rises_with_entropy_and_ignores_the_gap(beta, vocab_size, name):
  h, gap = grid(vocab_size)
  g = gate(name, beta, h, gap, vocab_size)
  assert np.all(np.diff(g, axis=0) >= -ULP_SLACK)
  assert g[-1, 0] - g[0, 0] > 0.2  # it really rises, it is not flat
  np.testing.assert_array_equal(g, np.repeat(g[:, :1], g.shape[1], axis=1))


@pytest.mark.parametrize("soft, ent", [("soft_or", "entropy"), ("soft_or_lnv", "entropy_lnv")])
@pytest.mark.parametrize("vocab_size", [QWEN_V, SMALL_V])
@pytest.mark.parametrize("beta", BETAS)
def test_soft_or_rises_with_the_gap_for_every_entropy_and_with_the_entropy(
  beta, vocab_size, soft, ent
):
  h, gap = grid(vocab_size)
  g = gate(soft, beta, h, gap, vocab_size)
  assert np.all(np.diff(g, axis=1) >= -ULP_SLACK)  # along Δ, at every entropy
  assert np.all(np.diff(g, axis=0) >= -ULP_SLACK)  # along h, at every gap
  # an OR: at least as open as either of its two parts
  assert np.all(g >= gate("gap", beta, h, gap, vocab_size) - ULP_SLACK)
  assert np.all(g >= gate(ent, beta, h, gap, vocab_size) - ULP_SLACK)


@pytest.mark.parametrize("vocab_size", [QWEN_V, SMALL_V])
@pytest.mark.parametrize("soft, ent", [("soft_or", "entropy"), ("soft_or_lnv", "entropy_lnv")])
def test_sound_gates_close_and_open_on_realistic_inputs(vocab_size, soft, ent):
  # an LLM token's entropy is mostly below 4 nats; the ln V gates need the whole [0, ln V]
  h, gap = grid(vocab_size, h_max=None if soft.endswith("_lnv") else 4.0)
  ent = gate(ent, 5.0, h, gap, vocab_size)
  assert ent[0, 0] < 0.3 and ent[-1, 0] > 0.7  # a certain student closes it, an unsure opens
  soft = gate(soft, 5.0, h, gap, vocab_size)
  assert soft[0, 0] < 0.3  # teacher rejects (Δ = -10) a token the student is sure of (h = 0)
  assert soft[0, -1] > 0.7  # teacher endorses (Δ = 2), student sure
  assert soft[-1, 0] > 0.7  # teacher rejects, student maximally unsure
  assert (soft < 0.3).mean() > 0.1 and (soft > 0.7).mean() > 0.05  # not just at the corners
  g = gate("gap", 5.0, h, gap, vocab_size)
  assert g.min() < 0.3 and g.max() > 0.7


def test_lnv_gates_at_hand_worked_points():
  log_v = math.log(QWEN_V)
  h = np.asarray([0.0, log_v / 2, log_v, 0.3 * log_v], np.float32)
  ent = compute_gate("entropy_lnv", beta=5.0, gap=np.zeros(4), entropy=h, vocab_size=QWEN_V)
  # σ(-5), σ(0), σ(5), σ(-2)
  np.testing.assert_allclose(ent, [0.0066928509, 0.5, 0.9933071491, 0.1192029220], rtol=1e-5)
  soft = compute_gate(
    "soft_or_lnv",
    beta=5.0,
    gap=np.asarray([-10.0, 0.0, -10.0, -1.0], np.float32),
    entropy=h,
    vocab_size=QWEN_V,
  )
  # 1 - (1 - σ(-50))(1 - σ(-5)); 1 - 0.5·0.5; 1 - (1 - σ(-50))(1 - σ(5)); 1 - (1 - σ(-5))(1 - σ(-2))
  np.testing.assert_allclose(
    soft, [0.0066928509, 0.75, 0.9933071491, 0.1250979656], rtol=1e-5, atol=1e-12
  )


@pytest.mark.parametrize("vocab_size", [QWEN_V, DEMO_V])
@pytest.mark.parametrize("name", ["entropy", "soft_or"])
def test_entropy_gates_close_for_confident_and_open_for_hesitant_tokens_at_any_vocab(
  name, vocab_size
):
  """β = 5, the teacher rejecting the token (Δ = -5 or -1; soft_or is open whenever the teacher
  endorses it): a confident token (h <= 0.05 nat) closes the gate, and the student's entropy
  alone opens it (> 0.7) at some h <= 4 nats, whatever the vocabulary; the gate rises with h.
  The "_lnv" gates (entropy over ln V) never open below 4 nats at Qwen's size."""
  h = np.linspace(0.0, 4.0, 401, dtype=np.float32)[:, None]  # 0.01 nat steps
  gap = np.asarray([[-5.0, -1.0]], np.float32)
  g = gate(name, 5.0, h, gap, vocab_size)
  confident = h[:, 0] <= 0.05
  assert confident.sum() == 6 and g[confident].max() < 0.3
  assert g[:, 0].max() > 0.7 and g[:, 1].max() > 0.7
  assert np.all(np.diff(g, axis=0) >= -ULP_SLACK)
  # the same gate at both sizes: nothing in it depends on V
  np.testing.assert_array_equal(g, gate(name, 5.0, h, gap, QWEN_V + DEMO_V - vocab_size))
  old = gate(name + "_lnv", 5.0, h, gap, QWEN_V)
  assert old.max() < 0.7  # the ln V gate stays closed up to 4 nats at Qwen's size


def test_beta_zero_flattens_the_entropy_gates():
  h, gap = grid(QWEN_V, 11, 11)
  for suffix in ("", "_lnv"):
    np.testing.assert_array_equal(gate("entropy" + suffix, 0.0, h, gap, QWEN_V), 0.5)
    np.testing.assert_allclose(gate("soft_or" + suffix, 0.0, h, gap, QWEN_V), 0.75, rtol=1e-7)


def test_entropy_above_ln_v_from_rounding_stays_in_range():
  h = np.asarray([-1e-6, math.log(SMALL_V) * (1 + 1e-6), 50.0], np.float32)
  for name in ("entropy", "soft_or", "entropy_lnv", "soft_or_lnv"):
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
