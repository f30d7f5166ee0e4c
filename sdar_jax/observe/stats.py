"""Paired statistics of two arms run on the same seeds and validated on the same games.

Evaluation already uses common random numbers (every evaluation of a run draws the same sampling
keys per game and turn), so the natural unit of comparison is a (seed, game) pair: arm A's outcome
on game g of seed s against arm B's on the same game of the same seed. Two sources of spread
matter: which seeds were run (the training noise) and which games were drawn (the evaluation
noise). `paired_comparison` accounts for both:

* the paired difference of the mean outcome (final success, or a per-game area under the
  success curve): mean over the seed x game grid of a[s, g] - b[s, g];
* its 95% interval from a two-way bootstrap: seeds and games are resampled independently, with
  replacement, and the grid mean is recomputed on each resample (percentile interval). The number
  of resamples and the RNG seed are fixed and reported with the result, so a figure can be
  recomputed to the digit;
* an exact two-sided sign test on the outcome pairs: among the pairs that differ, how often A
  beats B, against a fair coin (ties are dropped).

`format_difference` writes the result as the docs state it: "+0.042, 95% CI [-0.01, +0.09]".
Nothing here reads files; `sdar_jax.observe.collect` and the `compare` command pass the arrays.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

RESAMPLES = 10_000  # bootstrap resamples, unless asked otherwise
RNG_SEED = 0  # the bootstrap's generator seed, unless asked otherwise


@dataclasses.dataclass(frozen=True)
class PairedComparison:
  """Arm A minus arm B over a seed x game grid (see the module docstring)."""

  difference: float  # mean of a - b over the grid
  ci_low: float  # 95% percentile interval of the two-way bootstrap
  ci_high: float
  seeds: int
  games: int
  wins: int  # pairs where A > B
  losses: int  # pairs where A < B
  ties: int
  sign_p: float  # exact two-sided sign test on wins vs losses
  resamples: int
  rng_seed: int

  def describe(self, digits: int = 3) -> str:
    """One line: the difference with its interval, the sign test, and how it was computed."""
    return (
      f"{format_difference(self, digits)}; sign test {self.wins} wins, {self.losses} losses, "
      f"{self.ties} ties, p = {self.sign_p:.3g} ({self.seeds} seeds x {self.games} games, "
      f"{self.resamples} bootstrap resamples, RNG seed {self.rng_seed})"
    )


def format_difference(result: PairedComparison, digits: int = 3) -> str:
  """'+0.042, 95% CI [-0.011, +0.094]'."""
  return (
    f"{result.difference:+.{digits}f}, 95% CI "
    f"[{result.ci_low:+.{digits}f}, {result.ci_high:+.{digits}f}]"
  )


def sign_test(wins: int, losses: int) -> float:
  """Exact two-sided p-value of `wins` successes in `wins + losses` fair coin flips (the
  binomial test at p = 1/2: twice the smaller tail, capped at 1; 1.0 with no flips)."""
  n = wins + losses
  if n == 0:
    return 1.0
  k = min(wins, losses)
  tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
  return min(1.0, 2.0 * tail)


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


def bootstrap_interval(
  differences, resamples: int = RESAMPLES, rng_seed: int = RNG_SEED, level: float = 0.95
) -> tuple[float, float]:
  """Percentile interval of the grid mean of `differences` [seeds, games] under a two-way
  bootstrap: seed rows and game columns resampled independently, with replacement. With one seed
  only the games are resampled (the ordinary one-way bootstrap of a mean)."""
  d = _grid(differences, "differences")
  if resamples < 1:
    raise ValueError(f"resamples={resamples}: use at least 1 (e.g. {RESAMPLES}).")
  if not 0.0 < level < 1.0:
    raise ValueError(f"level={level}: a confidence level in (0, 1), e.g. 0.95.")
  S, G = d.shape
  rng = np.random.default_rng(rng_seed)
  means = np.empty(resamples)
  for start in range(0, resamples, 1000):  # chunks bound the [chunk, S, G] index arrays
    n = min(1000, resamples - start)
    rows = rng.integers(0, S, size=(n, S)) if S > 1 else np.zeros((n, 1), np.int64)
    cols = rng.integers(0, G, size=(n, G))
    picked = d[rows[:, :, None], cols[:, None, :]]  # [n, S, G]
    means[start : start + n] = picked.mean(axis=(1, 2))
  alpha = (1.0 - level) / 2.0
  low, high = np.quantile(means, [alpha, 1.0 - alpha])
  return float(low), float(high)


def paired_comparison(
  a, b, resamples: int = RESAMPLES, rng_seed: int = RNG_SEED
) -> PairedComparison:
  """Arm A against arm B on outcomes [seeds, games] (row s: seed s, column g: game g, the same
  seeds and games in both, e.g. final success 0/1 or a per-game AUC)."""
  a, b = _grid(a, "arm A"), _grid(b, "arm B")
  if a.shape != b.shape:
    raise ValueError(
      f"arm A has outcomes of shape {a.shape} and arm B {b.shape}: a paired comparison needs the "
      "same seeds and games in both. Fix: compare runs of the same seeds, evaluated on the same "
      "games (the same eval.seed and eval.num_tasks)."
    )
  d = a - b
  low, high = bootstrap_interval(d, resamples, rng_seed)
  wins, losses = int(np.sum(d > 0)), int(np.sum(d < 0))
  return PairedComparison(
    difference=float(d.mean()),
    ci_low=low,
    ci_high=high,
    seeds=a.shape[0],
    games=a.shape[1],
    wins=wins,
    losses=losses,
    ties=int(d.size - wins - losses),
    sign_p=sign_test(wins, losses),
    resamples=resamples,
    rng_seed=rng_seed,
  )


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


def bootstrap_p(differences, resamples: int = RESAMPLES, rng_seed: int = RNG_SEED) -> float:
  """Two-sided bootstrap p-value of "the mean difference is 0" for `differences` [seeds, games]:
  twice the smaller share of two-way bootstrap means (the resampling of `bootstrap_interval`)
  on either side of 0, capped at 1; the smallest reported value is 1/resamples. It is the p that
  matches the percentile interval: the (1 - p) interval just reaches 0."""
  d = _grid(differences, "differences")
  S, G = d.shape
  rng = np.random.default_rng(rng_seed)
  below = above = 0
  for start in range(0, resamples, 1000):
    n = min(1000, resamples - start)
    rows = rng.integers(0, S, size=(n, S)) if S > 1 else np.zeros((n, 1), np.int64)
    cols = rng.integers(0, G, size=(n, G))
    means = d[rows[:, :, None], cols[:, None, :]].mean(axis=(1, 2))
    below += int(np.sum(means <= 0.0))
    above += int(np.sum(means >= 0.0))
  return float(min(1.0, max(2.0 * min(below, above) / resamples, 1.0 / resamples)))


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> tuple[list[float], list[float]]:
  """Holm's step-down correction of m p-values: (adjusted p-values, confidence levels). Sorted
  ascending, the p of rank r (1-based) is compared with alpha / (m - r + 1); its adjusted value is
  the running maximum of (m - r + 1) p, capped at 1, and its interval is drawn at level
  1 - alpha / (m - r + 1), so an interval excludes 0 exactly when Holm rejects (the step-down's
  early stop aside: a comparison after the first one kept is not rejected whatever its interval).
  Both lists are in the order of `pvalues`."""
  m = len(pvalues)
  if not 0.0 < alpha < 1.0:
    raise ValueError(f"alpha={alpha}: a level in (0, 1), e.g. 0.05.")
  order = sorted(range(m), key=lambda i: pvalues[i])
  adjusted, levels = [0.0] * m, [0.0] * m
  running = 0.0
  for rank, i in enumerate(order):
    k = m - rank
    running = max(running, min(1.0, k * float(pvalues[i])))
    adjusted[i] = running
    levels[i] = 1.0 - alpha / k
  return adjusted, levels
