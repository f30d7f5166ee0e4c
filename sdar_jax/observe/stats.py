"""Paired statistics of two arms on a crossed seed x game grid d[s, g] = a[s, g] - b[s, g].

* `bootstrap`: the grid mean with a two-way bootstrap (seeds and games resampled independently;
  a resample's mean is w_s^T D w_g / (S G) with multinomial resample counts w_s, w_g): its p of
  "mean 0" with the Monte Carlo standard error, the per-comparison 1 - alpha percentile interval
  and the simultaneous (Bonferroni) 1 - alpha / family_size one, both from the same resamples.
* `sign_flip_p`: the exact seed-level sign-flip test on the per-seed means (floor 2 / 2^S). Seeds
  are the independent units: every seed plays the same games, so (seed, game) pairs are not.
* `holm_marks`: Holm's step-down decisions, "undecided" where the Monte Carlo error of a p could
  move the decision; `holm_adjusted`: Holm-adjusted p-values. An interval is not a Holm decision:
  a rejected row's Bonferroni interval may hold 0, and no interval "at a Holm level" is drawn.
* `family` bootstraps the rows of a family and marks them; `paired_comparison` is a family of 1.
Resamples and the RNG seed are fixed and reported: figures recompute to the digit (to rounding
in the last bits across CPUs: a resampled mean within the summation's rounding bound of 0
counts as 0). Nothing here reads files: `sdar_jax.observe.pairing` and the experiments pass arrays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

RESAMPLES = 200_000  # bootstrap resamples, unless asked otherwise
RNG_SEED = 0  # the bootstrap's generator seed, unless asked otherwise
ALPHA = 0.05  # the family-wise error rate of Holm's decisions and the intervals' 1 - level
MARGIN = 3.0  # Monte Carlo standard errors between a p and its Holm threshold for a decision
MAX_SIGN_FLIP_SEEDS = 20  # the exact sign-flip test enumerates 2^(S - 1) sign assignments
MARKS = ("rejected", "kept", "undecided")
_CHUNK = 2048  # resamples drawn and reduced together (the draws do not depend on it)
_CHUNK_CELLS = 1 << 20  # at most this many resample counts of one kind in memory at a time


@dataclasses.dataclass(frozen=True)
class Bootstrap:
  """One comparison of a family over a seed x game grid (see the module docstring).

  p is the two-sided bootstrap p: with below / above the shares of resampled means <= 0 / >= 0
  (0 to within the rounding bound of the sum) and q = min(below, above),
  p = min(1, max(2 q, 1 / resamples)). p_se is its Monte Carlo standard error,
  se = 2 sqrt(q (1 - q) / resamples) (0 when no resample falls on the far side of 0; p is then
  the floor 1 / resamples)."""

  difference: float  # mean of the grid
  seeds: int
  games: int
  resamples: int
  rng_seed: int
  alpha: float
  family_size: int
  p: float
  p_se: float
  ci_low: float  # per-comparison 1 - alpha percentile interval
  ci_high: float
  sim_low: float  # simultaneous 1 - alpha / family_size percentile interval (Bonferroni)
  sim_high: float
  sign_flip_p: float | None  # exact seed-level sign-flip p; None above MAX_SIGN_FLIP_SEEDS seeds

  @property
  def sign_flip_floor(self) -> float:
    """The smallest p the sign-flip test can give at this many seeds."""
    return 2.0 ** (1 - self.seeds)

  def describe(self, digits: int = 3) -> str:
    """One line: the difference with its interval(s), the bootstrap p with its Monte Carlo
    error, the seed-level sign-flip test with its floor, and how it was computed."""
    parts = [format_difference(self, digits)]
    if self.family_size > 1:
      level = 100.0 * (1.0 - self.alpha / self.family_size)
      parts.append(
        f"simultaneous {level:.4g}% CI [{self.sim_low:+.{digits}f}, {self.sim_high:+.{digits}f}]"
        f" (Bonferroni, family of {self.family_size})"
      )
    parts.append(f"bootstrap p = {self.p:.3g} (Monte Carlo se {self.p_se:.2g})")
    if self.sign_flip_p is None:
      parts.append(f"seed-level sign-flip test not run (over {MAX_SIGN_FLIP_SEEDS} seeds)")
    else:
      parts.append(
        f"seed-level sign-flip p = {self.sign_flip_p:.3g} (exact; floor "
        f"{self.sign_flip_floor:.3g} at {self.seeds} seeds)"
      )
    return "; ".join(parts) + (
      f" ({self.seeds} seeds x {self.games} games, {self.resamples} two-way bootstrap resamples, "
      f"RNG seed {self.rng_seed})"
    )


PairedComparison = Bootstrap  # `paired_comparison`'s result: a family of one


@dataclasses.dataclass(frozen=True)
class FamilyRow:
  """A row of `family`: its bootstrap, its Holm-adjusted p, and Holm's mark (one of MARKS)."""

  bootstrap: Bootstrap
  holm_p: float
  mark: str


def format_difference(result: Bootstrap, digits: int = 3) -> str:
  """'+0.042, 95% CI [-0.011, +0.094]' (the per-comparison interval)."""
  level = 100.0 * (1.0 - getattr(result, "alpha", ALPHA))
  return (
    f"{result.difference:+.{digits}f}, {level:.4g}% CI "
    f"[{result.ci_low:+.{digits}f}, {result.ci_high:+.{digits}f}]"
  )


def _grid(values, name: str) -> np.ndarray:
  grid = np.asarray(values, np.float64)
  if grid.ndim == 1:
    grid = grid[None, :]  # one seed
  if grid.ndim != 2 or grid.size == 0:
    raise ValueError(
      f"{name}: expected outcomes as [seeds, games] (or [games] for one seed), got shape "
      f"{grid.shape}. Fix: pass one row per seed, one column per validation game."
    )
  if not np.all(np.isfinite(grid)):
    raise ValueError(f"{name}: outcomes must be finite numbers (success 0/1, or a per-game AUC).")
  return grid


def _check_resampling(resamples: int, rng_seed: int) -> None:
  if int(resamples) != resamples or resamples < 1:
    raise ValueError(f"resamples={resamples}: use a whole number >= 1 (e.g. {RESAMPLES}).")
  if int(rng_seed) != rng_seed or rng_seed < 0:
    raise ValueError(f"rng_seed={rng_seed}: use a whole number >= 0 (e.g. {RNG_SEED}).")


def _check_alpha(alpha: float) -> None:
  if not 0.0 < alpha < 1.0:
    raise ValueError(f"alpha={alpha}: a level in (0, 1), e.g. {ALPHA}.")


def _counts(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
  """[n, k] resample counts: each row k uniform draws from range(k), counted (so each row is
  Multinomial(k, 1/k)). 32-bit draws keep the stream independent of how resamples are chunked."""
  if k == 1:
    return np.ones((n, 1))
  draws = rng.integers(0, k, size=(n, k), dtype=np.int32)
  draws += (np.arange(n, dtype=np.int32) * k)[:, None]
  return np.bincount(draws.ravel(), minlength=n * k).reshape(n, k).astype(np.float64)


def _resampled_means(grids: Sequence[np.ndarray], resamples: int, rng_seed: int) -> np.ndarray:
  """[len(grids), resamples] two-way bootstrap means of grids of one shape [S, G], all under the
  same resample counts: seeds from one stream and games from another, both spawned from
  `rng_seed`, so the draws depend only on (S, G, resamples, rng_seed)."""
  S, G = grids[0].shape
  stacked = np.concatenate(grids, axis=0)  # [R * S, G]
  seed_rng, game_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(rng_seed).spawn(2))
  means = np.empty((len(grids), resamples))
  chunk = max(1, min(_CHUNK, _CHUNK_CELLS // max(S, G)))  # bounds memory and int32 offsets
  for start in range(0, resamples, chunk):
    n = min(chunk, resamples - start)
    w_s = _counts(seed_rng, n, S)  # [n, S]
    w_g = _counts(game_rng, n, G)  # [n, G]
    per_seed = (w_g @ stacked.T).reshape(n, len(grids), S)  # D w_g for each grid
    means[:, start : start + n] = np.einsum("nrs,ns->rn", per_seed, w_s)
  return means / (S * G)


def bootstrap_means(
  differences, resamples: int = RESAMPLES, rng_seed: int = RNG_SEED
) -> np.ndarray:
  """[resamples] grid means of `differences` [seeds, games] under the two-way bootstrap: seed
  rows and game columns resampled independently with replacement, a resample's mean computed as
  w_s^T D w_g / (S G) from the resample counts. One seed: only games are resampled."""
  d = _grid(differences, "differences")
  _check_resampling(resamples, rng_seed)
  return _resampled_means([d], resamples, rng_seed)[0]


def _zero_tolerance(d: np.ndarray) -> float:
  """A bound on the rounding error of a resampled mean: (S + G) additions of terms whose
  absolute sum is at most S G max|d|, then a division by S G (twice the bound, for safety)."""
  S, G = d.shape
  return 2.0 * (S + G + 2) * np.finfo(np.float64).eps * float(np.max(np.abs(d)))


def _summarise(
  d: np.ndarray,
  means: np.ndarray,
  resamples: int,
  rng_seed: int,
  family_size: int,
  alpha: float,
) -> Bootstrap:
  tol = _zero_tolerance(d)
  below = int(np.count_nonzero(means <= tol))
  above = int(np.count_nonzero(means >= -tol))
  q = min(below, above) / resamples
  p = min(1.0, max(2.0 * q, 1.0 / resamples))
  p_se = 2.0 * float(np.sqrt(q * (1.0 - q) / resamples))
  tail, sim_tail = alpha / 2.0, alpha / (2.0 * family_size)
  ci_low, ci_high, sim_low, sim_high = np.quantile(
    means, [tail, 1.0 - tail, sim_tail, 1.0 - sim_tail]
  )
  S, G = d.shape
  return Bootstrap(
    difference=float(d.mean()),
    seeds=S,
    games=G,
    resamples=int(resamples),
    rng_seed=int(rng_seed),
    alpha=float(alpha),
    family_size=int(family_size),
    p=float(p),
    p_se=p_se,
    ci_low=float(ci_low),
    ci_high=float(ci_high),
    sim_low=float(min(sim_low, ci_low)),  # equal quantiles may differ in the last bit
    sim_high=float(max(sim_high, ci_high)),
    sign_flip_p=sign_flip_p(d) if S <= MAX_SIGN_FLIP_SEEDS else None,
  )


def _check_family(family_size: int, alpha: float) -> None:
  _check_alpha(alpha)
  if int(family_size) != family_size or family_size < 1:
    raise ValueError(
      f"family_size={family_size}: the number of comparisons in the family, a whole number >= 1."
    )


def bootstrap(
  differences,
  resamples: int = RESAMPLES,
  rng_seed: int = RNG_SEED,
  family_size: int = 1,
  alpha: float = ALPHA,
) -> Bootstrap:
  """`differences` [seeds, games] (or [games]) summarised by the two-way bootstrap
  (`bootstrap_means`), as one comparison of a family of `family_size`."""
  d = _grid(differences, "differences")
  _check_resampling(resamples, rng_seed)
  _check_family(family_size, alpha)
  means = _resampled_means([d], resamples, rng_seed)[0]
  return _summarise(d, means, resamples, rng_seed, family_size, alpha)


def sign_flip_floor(seeds: int) -> float:
  """The smallest p of the exact sign-flip test at `seeds` seeds: 2 / 2^seeds (an assignment and
  its negation give the same statistic). 5 seeds: 0.0625; 8 seeds: 0.0078125."""
  if int(seeds) != seeds or seeds < 1:
    raise ValueError(f"seeds={seeds}: a whole number >= 1.")
  return 2.0 ** (1 - int(seeds))


def sign_flip_p(differences) -> float:
  """Exact two-sided sign-flip (randomisation) p of "mean difference 0" at the seed level: the
  per-seed means m_s (over games), statistic |sum_s m_s|; p is the share of the 2^S assignments
  of signs e_s = +-1 with |sum_s e_s m_s| >= the observed value, less 1e-12 S max|d| (ties under
  rounding count as ties). Floor `sign_flip_floor(S)`; one seed gives 1."""
  d = _grid(differences, "differences")
  S = d.shape[0]
  if S > MAX_SIGN_FLIP_SEEDS:
    raise ValueError(
      f"sign_flip_p: {S} seeds; the exact test enumerates 2^{S - 1} sign assignments and takes at "
      f"most {MAX_SIGN_FLIP_SEEDS} seeds. Fix: pass at most {MAX_SIGN_FLIP_SEEDS} seeds' rows, or "
      "read the bootstrap p (`bootstrap`), which has no such limit."
    )
  m = d.mean(axis=1)
  sums = np.array([m[0]])  # the first sign fixed at +1: an assignment and its negation tie
  for value in m[1:]:
    sums = np.concatenate([sums + value, sums - value])  # sums[0]: every sign +1, the observed
  tol = 1e-12 * S * float(np.max(np.abs(d)))
  hits = int(np.count_nonzero(np.abs(sums) >= abs(sums[0]) - tol))
  return hits / len(sums)


def _check_pvalues(pvalues: Sequence[float], name: str = "pvalues") -> list[float]:
  ps = [float(p) for p in pvalues]
  bad = [p for p in ps if not 0.0 <= p <= 1.0]
  if bad:
    raise ValueError(f"{name}: {bad} are not p-values. Fix: pass numbers in [0, 1].")
  return ps


def _holm_order(ps: list[float]) -> list[int]:
  return sorted(range(len(ps)), key=lambda i: ps[i])  # stable: ties in the order given


def holm_adjusted(pvalues: Sequence[float]) -> list[float]:
  """Holm-adjusted p-values, in the order of `pvalues`: sorted ascending (ties in the order
  given), rank r (1-based) of m gets the running maximum of (m - r + 1) p, capped at 1. A row
  with adjusted p <= alpha is one Holm rejects at alpha (Monte Carlo error aside: `holm_marks`)."""
  ps = _check_pvalues(pvalues)
  m = len(ps)
  adjusted = [0.0] * m
  running = 0.0
  for rank, i in enumerate(_holm_order(ps)):
    running = max(running, min(1.0, (m - rank) * ps[i]))
    adjusted[i] = running
  return adjusted


def holm_marks(
  pvalues: Sequence[float],
  p_ses: Sequence[float],
  alpha: float = ALPHA,
  margin: float = MARGIN,
) -> list[str]:
  """Holm's decisions at family-wise level `alpha` for p-values known to a Monte Carlo standard
  error each, one of MARKS per row in the order given. Rows are walked by p ascending, ties in
  the order given; rank r (1-based) of m has threshold alpha / (m - r + 1):
  * p + margin se < threshold: "rejected", and the walk goes on;
  * p - margin se > threshold: "kept", and every later row is "kept" (Holm stops);
  * otherwise "undecided", and the walk goes on; a later row that would be rejected or undecided
    is then "undecided" (its rejection needs the earlier one's), and the first "kept" stops.
  A p exactly at its threshold with se 0 is "undecided"."""
  _check_alpha(alpha)
  ps = _check_pvalues(pvalues)
  ses = [float(se) for se in p_ses]
  if len(ses) != len(ps):
    raise ValueError(
      f"{len(ps)} p-values but {len(ses)} standard errors. Fix: one standard error per p-value."
    )
  if any(not (np.isfinite(se) and se >= 0.0) for se in ses):
    raise ValueError(f"p_ses={ses}: standard errors are finite numbers >= 0.")
  if not (np.isfinite(margin) and margin >= 0.0):
    raise ValueError(f"margin={margin}: a number of standard errors >= 0, e.g. {MARGIN}.")
  m = len(ps)
  marks = ["kept"] * m
  undecided = False
  for rank, i in enumerate(_holm_order(ps)):
    threshold = alpha / (m - rank)
    if ps[i] - margin * ses[i] > threshold:
      break  # Holm stops: this row and every later one stay "kept"
    if ps[i] + margin * ses[i] < threshold and not undecided:
      marks[i] = "rejected"
    else:
      marks[i] = "undecided"
      undecided = True
  return marks


def family(
  rows_differences: Sequence,
  resamples: int = RESAMPLES,
  rng_seed: int = RNG_SEED,
  alpha: float = ALPHA,
  margin: float = MARGIN,
) -> list[FamilyRow]:
  """Every row of a family of comparisons (each [seeds, games]) bootstrapped with
  family_size = len(rows) and `rng_seed`, then Holm-adjusted and marked (`holm_marks`). Each
  row's figures are those `bootstrap` gives it alone (to rounding in the last bits): rows of one
  shape share the resample counts (the draws depend only on the shape and the seed), computed
  in one pass."""
  grids = [_grid(d, f"row {i}") for i, d in enumerate(rows_differences)]
  _check_resampling(resamples, rng_seed)
  _check_family(max(1, len(grids)), alpha)
  by_shape: dict[tuple[int, int], list[int]] = {}
  for i, d in enumerate(grids):
    by_shape.setdefault(d.shape, []).append(i)
  results: list[Bootstrap | None] = [None] * len(grids)
  for rows in by_shape.values():
    means = _resampled_means([grids[i] for i in rows], resamples, rng_seed)
    for i, row_means in zip(rows, means):
      results[i] = _summarise(grids[i], row_means, resamples, rng_seed, len(grids), alpha)
  ps = [r.p for r in results]
  marks = holm_marks(ps, [r.p_se for r in results], alpha, margin)
  return [FamilyRow(r, h, k) for r, h, k in zip(results, holm_adjusted(ps), marks)]


def paired_comparison(
  a, b, resamples: int = RESAMPLES, rng_seed: int = RNG_SEED
) -> PairedComparison:
  """Arm A against arm B on outcomes [seeds, games] (row s: seed s, column g: game g, the same
  seeds and games in both, e.g. final success 0/1 or a per-game AUC): `bootstrap` of a - b as a
  family of one."""
  a, b = _grid(a, "arm A"), _grid(b, "arm B")
  if a.shape != b.shape:
    raise ValueError(
      f"arm A has outcomes of shape {a.shape} and arm B {b.shape}: a paired comparison needs the "
      "same seeds and games in both. Fix: compare runs of the same seeds, evaluated on the same "
      "games (the same eval.seed and eval.num_tasks)."
    )
  return bootstrap(a - b, resamples, rng_seed)


def per_game_auc(steps: Sequence[float], outcomes) -> np.ndarray:
  """Each game's area under its success curve over the evaluation `steps` (trapezoid rule,
  divided by the step span: the game's mean success over training, in [0, 1]); `outcomes` is
  [steps, games] (or [seeds, steps, games], giving [seeds, games])."""
  steps = np.asarray(steps, np.float64)
  y = np.asarray(outcomes, np.float64)
  if steps.ndim != 1 or len(steps) < 2 or np.any(np.diff(steps) <= 0):
    raise ValueError(f"steps={steps.tolist()}: at least two increasing evaluation steps.")
  if y.shape[-2] != len(steps):
    raise ValueError(f"outcomes of shape {y.shape} for {len(steps)} steps: [.., steps, games].")
  widths = np.diff(steps)[:, None]
  area = np.sum(widths * (y[..., 1:, :] + y[..., :-1, :]) / 2.0, axis=-2)
  return area / (steps[-1] - steps[0])
