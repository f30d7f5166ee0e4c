"""Paired statistics (sdar_jax.observe.stats): the two-way bootstrap against exhaustive
enumeration on a 2 x 2 grid, against explicit index resampling and against scipy's one-way
bootstrap; the seed-level sign-flip test by hand and by exact enumeration; Holm's marks on
hand-made families; five bootstrap seeds giving the same marks at RESAMPLES.

Floats: sums of small integers (0/1 outcomes, resample counts) are exact in float64; other
comparisons are bounded by the size of what is summed or by the Monte Carlo error.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
import scipy.stats

from sdar_jax.observe import stats


def _exact_two_way(d: np.ndarray) -> dict[float, float]:
  """The exact distribution of the two-way bootstrap mean: every ordered draw of S seed rows
  and G game columns, each equally likely."""
  S, G = d.shape
  dist: dict[float, float] = {}
  rows = list(itertools.product(range(S), repeat=S))
  cols = list(itertools.product(range(G), repeat=G))
  for r, c in itertools.product(rows, cols):
    mean = float(d[np.ix_(r, c)].mean())
    dist[mean] = dist.get(mean, 0.0) + 1.0 / (len(rows) * len(cols))
  return dist


def _anova_variance(d: np.ndarray) -> float:
  """The two-way bootstrap variance of the grid mean: var(a)/S + var(b)/G + var(e)/(S G) with
  a, b, e the seed, game and residual effects (population variances, divided by their count)."""
  S, G = d.shape
  mu = d.mean()
  a, b = d.mean(axis=1) - mu, d.mean(axis=0) - mu
  e = d - mu - a[:, None] - b[None, :]
  return float(np.mean(a**2) / S + np.mean(b**2) / G + np.mean(e**2) / (S * G))


def test_two_way_bootstrap_on_a_2x2_grid_has_its_exact_distribution():
  """d = [[1, 0], [0, 0]]: the resampled mean is w_s0 w_g0 / 4 with w_s0, w_g0 each 2, 1, 0 with
  probabilities 1/4, 1/2, 1/4; so 1 w.p. 1/16, 1/2 w.p. 1/4, 1/4 w.p. 1/4, 0 w.p. 7/16, and the
  variance is (E[w^2]^2 - 1) / 16 = (1.5^2 - 1) / 16 = 0.078125."""
  d = np.array([[1.0, 0.0], [0.0, 0.0]])
  exact = _exact_two_way(d)
  assert exact == pytest.approx({1.0: 1 / 16, 0.5: 1 / 4, 0.25: 1 / 4, 0.0: 7 / 16}, abs=1e-12)
  assert _anova_variance(d) == pytest.approx(0.078125, abs=1e-15)
  B = 40_000
  means = stats.bootstrap_means(d, resamples=B, rng_seed=1)
  assert set(np.unique(means)) <= set(exact)  # sums of small integers over 4: exact
  for value, prob in exact.items():
    share = np.mean(means == value)
    assert abs(share - prob) < 5 * np.sqrt(prob * (1 - prob) / B), (value, share, prob)
  # A generic 2 x 2 grid: the exhaustive variance is the ANOVA formula's.
  g = np.array([[0.3, -0.7], [1.1, 0.2]])
  dist = _exact_two_way(g)
  mean = sum(v * p for v, p in dist.items())
  var = sum((v - mean) ** 2 * p for v, p in dist.items())
  assert mean == pytest.approx(g.mean(), abs=1e-14)
  assert var == pytest.approx(_anova_variance(g), abs=1e-14)


def test_resample_counts_agree_with_explicit_index_resampling():
  """Means of 4 x 16 resamples from the counts' matmul against rows and columns drawn as
  indices (another generator): means within 5 Monte Carlo sd, variances within 10% of each
  other and of the formula, and a two-sample KS test that does not tell them apart."""
  rng = np.random.default_rng(11)
  d = rng.normal(0.0, 1.0, size=(4, 16)) + rng.normal(0.0, 0.5, size=(4, 1))
  B = 20_000
  fast = stats.bootstrap_means(d, resamples=B, rng_seed=2)
  rows = rng.integers(0, 4, size=(B, 4))
  cols = rng.integers(0, 16, size=(B, 16))
  slow = d[rows[:, :, None], cols[:, None, :]].mean(axis=(1, 2))
  want = _anova_variance(d)
  assert abs(fast.mean() - slow.mean()) < 5 * np.sqrt(2 * want / B)
  assert fast.var() == pytest.approx(want, rel=0.1)
  assert slow.var() == pytest.approx(want, rel=0.1)
  assert scipy.stats.ks_2samp(fast, slow).pvalue > 1e-3


def test_draws_do_not_depend_on_chunking(monkeypatch):
  """Seeds and games come from their own streams: a shorter run is a prefix of a longer one and
  the chunk size changes nothing (0/1 outcomes: the sums are exact)."""
  rng = np.random.default_rng(6)
  d = rng.integers(-1, 2, size=(3, 9)).astype(float)
  full = stats.bootstrap_means(d, resamples=5000, rng_seed=4)
  np.testing.assert_array_equal(stats.bootstrap_means(d, resamples=700, rng_seed=4), full[:700])
  monkeypatch.setattr(stats, "_CHUNK", 7)
  np.testing.assert_array_equal(stats.bootstrap_means(d, resamples=5000, rng_seed=4), full)


def test_one_seed_bootstrap_matches_scipy_percentile_interval():
  """One seed: only games are resampled, the ordinary bootstrap of a mean. Both intervals are
  Monte Carlo estimates of the same percentiles; with 20,000 resamples each, on 64 paired
  outcomes in {-1, 0, 1} (sd of the mean ~0.08), their endpoints agree within 0.01."""
  rng = np.random.default_rng(3)
  a = (rng.random(64) < 0.45).astype(float)
  b = (rng.random(64) < 0.35).astype(float)
  r = stats.bootstrap(a - b, resamples=20_000, rng_seed=1)
  ref = scipy.stats.bootstrap(
    ((a - b),), np.mean, n_resamples=20_000, method="percentile", random_state=2
  ).confidence_interval
  assert abs(r.ci_low - ref.low) < 0.01 and abs(r.ci_high - ref.high) < 0.01
  assert r.ci_low < np.mean(a - b) < r.ci_high
  assert (r.seeds, r.games, r.sign_flip_p) == (1, 64, 1.0)


def test_two_way_bootstrap_widens_with_disagreeing_seeds():
  """The same games' differences in three seeds, shifted per seed: resampling seeds adds their
  spread to the interval (a one-way bootstrap over the pooled games would not see it)."""
  rng = np.random.default_rng(4)
  base = rng.normal(0.0, 0.3, size=64)
  agree = stats.bootstrap(np.stack([base, base, base]), resamples=4000)
  disagree = stats.bootstrap(np.stack([base - 0.2, base, base + 0.2]), resamples=4000)
  assert disagree.ci_high - disagree.ci_low > 1.5 * (agree.ci_high - agree.ci_low)


def test_constant_difference_has_a_point_interval_and_a_fixed_seed_reproduces():
  c = stats.paired_comparison(np.ones((3, 10)), np.zeros((3, 10)), resamples=500, rng_seed=7)
  assert (c.difference, c.ci_low, c.ci_high, c.sim_low, c.sim_high) == (1.0,) * 5
  assert (c.p, c.p_se, c.sign_flip_p, c.sign_flip_floor) == (1 / 500, 0.0, 0.25, 0.25)
  zero = stats.bootstrap(np.zeros((2, 5)), resamples=300)
  assert (zero.p, zero.p_se, zero.sign_flip_p) == (1.0, 0.0, 1.0)  # every mean is 0: both sides
  rng = np.random.default_rng(5)
  a, b = rng.integers(0, 2, (3, 20)), rng.integers(0, 2, (3, 20))
  first = stats.paired_comparison(a, b, resamples=300, rng_seed=9)
  assert first == stats.paired_comparison(a, b, resamples=300, rng_seed=9)
  line = first.describe()
  assert "95% CI [" in line and "RNG seed 9" in line and "simultaneous" not in line
  assert "seed-level sign-flip p = " in line and "floor 0.25 at 3 seeds" in line


def test_bootstrap_p_and_its_monte_carlo_error_agree_with_the_percentile_interval():
  """p < 0.05 exactly when the 95% interval of the same resamples excludes 0; p_se is
  2 sqrt(q (1 - q) / B) at q = p / 2; a difference centred on 0 gets a p near 1."""
  rng = np.random.default_rng(3)
  for shift in (0.0, 0.05, 0.1, 0.15, 0.2, -0.1):
    d = rng.choice([-1.0, 0.0, 1.0], size=(4, 32), p=[0.3, 0.4, 0.3]) + shift
    r = stats.bootstrap(d, resamples=2000)
    assert (r.p < 0.05) == (r.ci_low > 0 or r.ci_high < 0), (shift, r)
    q = r.p / 2
    assert r.p_se == pytest.approx(2 * np.sqrt(q * (1 - q) / 2000), rel=1e-12)
  assert stats.bootstrap(np.tile([-1.0, 1.0], (2, 16)), resamples=2000).p > 0.5


def test_simultaneous_intervals_contain_the_per_comparison_ones():
  rng = np.random.default_rng(8)
  d = rng.normal(0.05, 0.5, size=(5, 40))
  one = stats.bootstrap(d, resamples=3000)
  assert (one.sim_low, one.sim_high) == (one.ci_low, one.ci_high)
  for k in (2, 5, 20):
    r = stats.bootstrap(d, resamples=3000, family_size=k)
    assert (r.ci_low, r.ci_high, r.p) == (one.ci_low, one.ci_high, one.p)  # the same resamples
    assert r.sim_low < r.ci_low and r.ci_high < r.sim_high
    assert f"(Bonferroni, family of {k})" in r.describe()
  means = stats.bootstrap_means(d, resamples=3000)
  np.testing.assert_allclose(
    [r.sim_low, r.sim_high], np.quantile(means, [0.025 / 20, 1 - 0.025 / 20]), rtol=0, atol=0
  )


def test_sign_flip_p_by_hand_and_its_floor():
  """Seed means 0.3, 0.1, -0.05: observed |sum| 0.35; the 8 sign assignments give |sums| 0.45,
  0.35, 0.25, 0.15 twice each, so p = 4/8. Equal seed means: only the observed assignment and
  its negation reach it, the floor 2/8."""
  grid = np.array([[0.2, 0.4], [0.0, 0.2], [-0.1, 0.0]])  # seed means 0.3, 0.1, -0.05
  assert stats.sign_flip_p(grid) == 0.5
  assert stats.sign_flip_p(np.full((3, 4), 0.2)) == 0.25 == stats.sign_flip_floor(3)
  assert stats.sign_flip_p(np.ones((5, 2))) == 0.0625 == stats.sign_flip_floor(5)
  assert stats.sign_flip_floor(8) == 0.0078125
  assert stats.sign_flip_p(-np.ones((8, 3))) == 0.0078125


def test_sign_flip_p_equals_exact_enumeration_with_ties():
  """Seed means in tenths (not exact in binary, many exact ties): the test against every sign
  assignment enumerated in rational arithmetic."""
  rng = np.random.default_rng(9)
  for S in (2, 4, 6, 7):
    for _ in range(5):
      tenths = rng.integers(-4, 5, size=S)
      want = 0
      for signs in itertools.product((1, -1), repeat=S):
        value = abs(sum(Fraction(int(k), 10) * e for k, e in zip(tenths, signs)))
        want += value >= abs(sum(Fraction(int(k), 10) for k in tenths))
      got = stats.sign_flip_p((tenths / 10.0)[:, None])
      assert got == want / 2**S, (tenths, got, want)


def test_sign_flip_refuses_too_many_seeds_naming_the_fix():
  with pytest.raises(ValueError, match="21 seeds.*at most 20"):
    stats.sign_flip_p(np.ones((21, 3)))
  assert stats.bootstrap(np.ones((21, 3)), resamples=50).sign_flip_p is None


def test_holm_stops_at_the_first_kept_row():
  """m = 4, thresholds 0.0125, 0.0167, 0.025, 0.05 by rank. Sorted: 0.001 rejected; 0.03 at
  rank 2 is above 0.0167: kept, and Holm stops, so 0.04 and 0.045 are kept though each is
  below 0.05 alone (and 0.045 would meet the rank-4 threshold)."""
  ps = [0.001, 0.04, 0.03, 0.045]
  assert stats.holm_marks(ps, [0.0] * 4) == ["rejected", "kept", "kept", "kept"]
  assert stats.holm_adjusted(ps) == pytest.approx([0.004, 0.09, 0.09, 0.09], abs=1e-15)
  # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1, raised to 0.06)
  assert stats.holm_adjusted([0.01, 0.04, 0.03, 0.005]) == pytest.approx(
    [0.03, 0.06, 0.06, 0.02], abs=1e-15
  )
  assert stats.holm_adjusted([0.5, 0.9]) == [1.0, 1.0]  # 2 x 0.5 caps at 1
  # 0.005 and 0.01 meet 0.0125 and 0.0167; 0.03 misses 0.025 and stops the walk.
  marks = stats.holm_marks([0.01, 0.04, 0.03, 0.005], [0.0] * 4)
  assert marks == ["rejected", "kept", "kept", "rejected"]


def test_holm_marks_undecided_within_the_margin_and_after_it():
  # m = 3: 0.001 (rank 1, 0.0167) rejected; 0.024 +- 3 x 0.001 holds 0.025 (rank 2): undecided;
  # 0.03 + 3 x 0.0005 < 0.05 (rank 3) would be rejected, but only after the undecided one.
  assert stats.holm_marks([0.024, 0.001, 0.03], [0.001, 0.0001, 0.0005]) == [
    "undecided",
    "rejected",
    "undecided",
  ]
  # m = 4: 0.016 +- 0.003 holds 0.0167 (rank 2): undecided; 0.03 - 0.0003 > 0.025 (rank 3):
  # kept, Holm stops, and 0.04 (below its rank-4 threshold 0.05) is kept.
  assert stats.holm_marks([0.016, 0.001, 0.03, 0.04], [0.001, 0.0, 0.0001, 0.0001]) == [
    "undecided",
    "rejected",
    "kept",
    "kept",
  ]
  assert stats.holm_marks([0.04], [0.004]) == ["undecided"]  # 0.04 + 0.012 > 0.05 > 0.028
  assert stats.holm_marks([0.04], [0.004], margin=2.0) == ["rejected"]  # 0.048 < 0.05
  # Ties in p are walked in the order given: the first 0.02 takes rank 1 (threshold 0.025).
  assert stats.holm_marks([0.02, 0.02], [0.0, 0.01]) == ["rejected", "undecided"]
  assert stats.holm_marks([0.02, 0.02], [0.01, 0.0]) == ["undecided", "undecided"]
  assert stats.holm_marks([], []) == [] and stats.holm_adjusted([]) == []


def test_holm_refuses_bad_inputs_naming_the_fix():
  with pytest.raises(ValueError, match="alpha=1.5"):
    stats.holm_marks([0.1], [0.0], alpha=1.5)
  with pytest.raises(ValueError, match="2 p-values but 1 standard errors"):
    stats.holm_marks([0.1, 0.2], [0.0])
  with pytest.raises(ValueError, match=r"\[1.2\] are not p-values"):
    stats.holm_adjusted([0.1, 1.2])
  with pytest.raises(ValueError, match="p_ses"):
    stats.holm_marks([0.1], [-0.01])


def _arm_differences(effect: float, rng: np.random.Generator, S: int = 8, G: int = 128):
  """0/1 outcomes of two arms on the same games: a game difficulty shared by both, a per-seed
  training wobble, arm A's success rate raised by `effect`."""
  p_game = rng.beta(0.6, 1.2, size=G)
  base = np.clip(p_game + rng.normal(0.0, 0.03, size=(S, 1)), 0.0, 1.0)
  p_a = np.clip(base + effect + rng.normal(0.0, 0.03, size=(S, 1)), 0.0, 1.0)
  return (rng.random((S, G)) < p_a).astype(float) - (rng.random((S, G)) < base).astype(float)


def test_five_bootstrap_seeds_give_the_same_marks():
  """A family on 8 seeds x 128 games at RESAMPLES: effects 0, 0.05 (drawn: +0.072, p ~ 0.0067
  against its rank-2 threshold 0.0167) and 0.12, and a fourth row whose p sits at its rank-3
  threshold 0.025. Five bootstrap seeds give the same marks, the fourth row undecided under
  every one, where a bare p < 0.025 flips with the seed. About 1.2 s (the family's rows share
  one pass of draws: ~0.2 s a seed)."""
  rng = np.random.default_rng(0)
  rows = [_arm_differences(effect, rng) for effect in (0.0, 0.05, 0.12)]
  # Continuous values (a 0/1 grid's resampled means have atoms wider than the Monte Carlo
  # error), shifted so that seed 0's 1.25% quantile is at 0: p ~ 0.025.
  d = rows[1] + rng.normal(0.0, 0.02, size=rows[1].shape)
  rows.append(d - np.quantile(stats.bootstrap_means(d, rng_seed=0), 0.0125))
  marks, ps = set(), []
  for seed in range(5):
    fam = stats.family(rows, rng_seed=seed)
    assert all(r.bootstrap.resamples == stats.RESAMPLES for r in fam)
    marks.add(tuple(r.mark for r in fam))
    ps.append([r.bootstrap.p for r in fam])
  assert marks == {("kept", "rejected", "rejected", "undecided")}
  assert len({p[1] for p in ps}) > 1  # the p moved with the seed; the marks did not
  assert {p[3] < 0.025 for p in ps} == {True, False}


def test_family_rows_are_their_own_bootstraps_with_holm():
  rng = np.random.default_rng(12)
  rows = [rng.integers(-1, 2, size=(4, 24)), rng.integers(0, 2, size=(4, 24)), np.ones(10)]
  fam = stats.family(rows, resamples=2000, rng_seed=5)
  for row, d in zip(fam, rows):
    assert row.bootstrap == stats.bootstrap(d, resamples=2000, rng_seed=5, family_size=3)
  ps = [r.bootstrap.p for r in fam]
  assert [r.holm_p for r in fam] == stats.holm_adjusted(ps)
  assert [r.mark for r in fam] == stats.holm_marks(ps, [r.bootstrap.p_se for r in fam])
  assert stats.family([]) == []


def test_bad_inputs_are_refused_naming_the_fix():
  with pytest.raises(ValueError, match="same seeds and games"):
    stats.paired_comparison(np.ones((3, 10)), np.ones((2, 10)))
  with pytest.raises(ValueError, match=r"\[seeds, games\]"):
    stats.paired_comparison(np.ones((2, 2, 2)), np.ones((2, 2, 2)))
  with pytest.raises(ValueError, match="resamples=0"):
    stats.bootstrap(np.ones((2, 2)), resamples=0)
  with pytest.raises(ValueError, match="family_size=0"):
    stats.bootstrap(np.ones((2, 2)), family_size=0)
  with pytest.raises(ValueError, match="finite"):
    stats.bootstrap_means([[0.0, np.nan]])


def test_per_game_auc_by_hand():
  # Steps 0, 8, 16; a game failed, then won twice: (0 + 1) / 2 * 8 + (1 + 1) / 2 * 8 = 12 of 16.
  auc = stats.per_game_auc([0, 8, 16], [[0, 1], [1, 1], [1, 0]])
  np.testing.assert_allclose(auc, [12 / 16, 12 / 16])


def test_format_difference():
  c = stats.paired_comparison([[1.0, 0.0, 1.0]], [[0.0, 0.0, 1.0]], resamples=100)
  assert stats.format_difference(c) == (f"+0.333, 95% CI [{c.ci_low:+.3f}, {c.ci_high:+.3f}]")
  assert stats.format_difference(c, digits=1).startswith("+0.3, 95% CI [")
