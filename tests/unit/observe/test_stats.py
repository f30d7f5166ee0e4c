"""Paired statistics (sdar_jax.observe.stats) against scipy: the sign test against
`scipy.stats.binomtest`, the one-way bootstrap against `scipy.stats.bootstrap`, and the two-way
bootstrap's properties (it is wider than the one-way one when seeds disagree, and exact on a
constant difference).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from sdar_jax.observe import stats


@pytest.mark.parametrize("wins,losses", [(0, 0), (3, 0), (5, 5), (7, 2), (13, 40), (1, 60)])
def test_sign_test_equals_scipy_binomtest(wins, losses):
  want = 1.0 if wins + losses == 0 else scipy.stats.binomtest(wins, wins + losses).pvalue
  assert stats.sign_test(wins, losses) == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_one_seed_bootstrap_matches_scipy_percentile_interval():
  """One seed: only games are resampled, the ordinary bootstrap of a mean. Both intervals are
  Monte Carlo estimates of the same percentiles; with 20,000 resamples each, on 64 paired
  outcomes in {-1, 0, 1} (sd of the mean ~0.08), their endpoints agree within 0.01."""
  rng = np.random.default_rng(3)
  a = (rng.random(64) < 0.45).astype(float)
  b = (rng.random(64) < 0.35).astype(float)
  low, high = stats.bootstrap_interval(a - b, resamples=20_000, rng_seed=1)
  ref = scipy.stats.bootstrap(
    ((a - b),), np.mean, n_resamples=20_000, method="percentile", random_state=2
  ).confidence_interval
  assert abs(low - ref.low) < 0.01 and abs(high - ref.high) < 0.01
  assert low < np.mean(a - b) < high


def test_two_way_bootstrap_widens_with_disagreeing_seeds():
  """The same games' differences in three seeds, shifted per seed: resampling seeds adds their
  spread to the interval (a one-way bootstrap over the pooled games would not see it)."""
  rng = np.random.default_rng(4)
  base = rng.normal(0.0, 0.3, size=64)
  agree = np.stack([base, base, base])
  disagree = np.stack([base - 0.2, base, base + 0.2])
  lo1, hi1 = stats.bootstrap_interval(agree, resamples=4000)
  lo2, hi2 = stats.bootstrap_interval(disagree, resamples=4000)
  assert hi2 - lo2 > 1.5 * (hi1 - lo1)


def test_constant_difference_has_a_point_interval_and_a_fixed_seed_reproduces():
  c = stats.paired_comparison(np.ones((3, 10)), np.zeros((3, 10)), resamples=500, rng_seed=7)
  assert (c.difference, c.ci_low, c.ci_high) == (1.0, 1.0, 1.0)
  assert (c.wins, c.losses, c.ties) == (30, 0, 0)
  assert c.sign_p == pytest.approx(2 * 0.5**30)
  rng = np.random.default_rng(5)
  a, b = rng.integers(0, 2, (3, 20)), rng.integers(0, 2, (3, 20))
  first = stats.paired_comparison(a, b, resamples=300, rng_seed=9)
  assert first == stats.paired_comparison(a, b, resamples=300, rng_seed=9)
  assert "95% CI [" in first.describe() and "RNG seed 9" in first.describe()


def test_mismatched_arms_are_refused_naming_the_fix():
  with pytest.raises(ValueError, match="same seeds and games"):
    stats.paired_comparison(np.ones((3, 10)), np.ones((2, 10)))
  with pytest.raises(ValueError, match=r"\[seeds, games\]"):
    stats.paired_comparison(np.ones((2, 2, 2)), np.ones((2, 2, 2)))


def test_per_game_auc_by_hand():
  # Steps 0, 8, 16; a game failed, then won twice: (0 + 1) / 2 * 8 + (1 + 1) / 2 * 8 = 12 of 16.
  auc = stats.per_game_auc([0, 8, 16], [[0, 1], [1, 1], [1, 0]])
  np.testing.assert_allclose(auc, [12 / 16, 12 / 16])


def test_holm_by_hand():
  # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1, raised to 0.06)
  adjusted, levels = stats.holm([0.01, 0.04, 0.03, 0.005])
  assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-12)
  assert levels == pytest.approx([1 - 0.05 / 3, 0.95, 0.975, 1 - 0.05 / 4], abs=1e-12)
  assert stats.holm([0.5, 0.9]) == ([1.0, 1.0], [0.975, 0.95])  # 2 x 0.5 caps at 1
  with pytest.raises(ValueError, match="alpha=1.5"):
    stats.holm([0.1], alpha=1.5)


def test_bootstrap_p_agrees_with_the_percentile_interval():
  """p < 0.05 exactly when the 95% interval of the same resamples excludes 0; a difference far
  from 0 gets the smallest p the resamples can show, one centred on 0 a p near 1."""
  rng = np.random.default_rng(3)
  for shift in (0.0, 0.05, 0.1, 0.15, 0.2, -0.1):
    d = rng.choice([-1.0, 0.0, 1.0], size=(4, 32), p=[0.3, 0.4, 0.3]) + shift
    p = stats.bootstrap_p(d, resamples=2000)
    low, high = stats.bootstrap_interval(d, resamples=2000)
    assert (p < 0.05) == (low > 0 or high < 0), (shift, p, low, high)
  assert stats.bootstrap_p(np.ones((3, 8)), resamples=500) == pytest.approx(1 / 500)
  symmetric = np.tile([-1.0, 1.0], (2, 16))
  assert stats.bootstrap_p(symmetric, resamples=2000) > 0.5
