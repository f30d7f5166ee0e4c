"""How large a paired difference a seeds x games experiment can see: the variance components of a
difference grid and the effect detectable at a given power.

The paired difference d[s, g] of two arms (seed s, game g; every seed plays the same games) is
read as d = mu + u_s + v_g + e_sg with independent seed, game and residual terms (the crossed
random-effects model the two-way bootstrap resamples). `components` estimates their variances by
the ANOVA method of moments (negative estimates clipped to 0); the mean difference over S seeds
and G games then has variance su/S + sv/G + se/(S G), and `detectable` is the true difference a
two-sided test at `alpha` rejects with probability `power` (the normal approximation:
(z_{1-alpha/2} + z_power) x its standard error). A multiple-comparison correction lowers alpha
and raises the figure; the caller says which alpha it used.
"""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import numpy as np


@dataclasses.dataclass(frozen=True)
class Components:
  seed: float  # variance of u_s: seed-to-seed spread of the arms' difference (training noise)
  game: float  # variance of v_g: game-to-game spread of the difference (game x arm)
  residual: float  # variance of e_sg: seed x game x arm, and the sampling of each episode

  def standard_error(self, seeds: int, games: int) -> float:
    """Standard error of the mean difference over `seeds` x `games`."""
    return math.sqrt(self.seed / seeds + self.game / games + self.residual / (seeds * games))


def components(differences) -> Components:
  """The variance components of a [seeds, games] difference grid (at least 2 x 2)."""
  d = np.asarray(differences, np.float64)
  if d.ndim != 2 or min(d.shape) < 2:
    raise ValueError(f"differences of shape {d.shape}: a [seeds, games] grid of at least 2 x 2.")
  S, G = d.shape
  rows, cols, grand = d.mean(axis=1), d.mean(axis=0), d.mean()
  ms_seed = G * np.sum((rows - grand) ** 2) / (S - 1)
  ms_game = S * np.sum((cols - grand) ** 2) / (G - 1)
  resid = d - rows[:, None] - cols[None, :] + grand
  ms_resid = np.sum(resid**2) / ((S - 1) * (G - 1))
  return Components(
    seed=max(0.0, float(ms_seed - ms_resid) / G),
    game=max(0.0, float(ms_game - ms_resid) / S),
    residual=float(ms_resid),
  )


def detectable(
  parts: Components, seeds: int, games: int, alpha: float = 0.05, power: float = 0.8
) -> float:
  """The true mean difference a two-sided test at `alpha` detects with probability `power`."""
  z = NormalDist().inv_cdf(1.0 - alpha / 2.0) + NormalDist().inv_cdf(power)
  return z * parts.standard_error(seeds, games)


def games_needed(
  parts: Components, seeds: int, effect: float, alpha: float = 0.05, power: float = 0.8
) -> int | None:
  """The fewest games a panel that make `effect` detectable with `seeds` seeds (None: no number
  of games does, the seed term alone being too large)."""
  z = NormalDist().inv_cdf(1.0 - alpha / 2.0) + NormalDist().inv_cdf(power)
  room = (effect / z) ** 2 - parts.seed / seeds
  if room <= 0:
    return None
  return math.ceil((parts.game + parts.residual / seeds) / room)


def power_at(
  parts: Components, seeds: int, games: int, effect: float, alpha: float = 0.05
) -> float:
  """The probability that a two-sided test at `alpha` detects a true difference `effect` (the
  normal approximation, the far tail ignored): Phi(|effect| / se - z_{1-alpha/2})."""
  z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
  return NormalDist().cdf(abs(effect) / parts.standard_error(seeds, games) - z)
