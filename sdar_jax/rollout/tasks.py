"""Which games the validation episodes play.

The reference validates on episodes drawn from the whole validation split: each validation worker
is seeded and takes games from its own shuffle of the split (docs/reference.md §5.1). Taking the
first N of the sorted game paths instead would keep only the first task types of the split (paths
start with the task type), so `validation_tasks` draws N distinct games with a seeded shuffle.
"""

from __future__ import annotations

import numpy as np

__all__ = ["validation_tasks"]


def validation_tasks(num_games: int, num_tasks: int, seed: int) -> list[int]:
  """Indices of `min(num_tasks, num_games)` distinct games of a split of `num_games`, drawn by a
  shuffle seeded with `seed`: the same games for the same seed, every game equally likely.
  `num_tasks=-1`: every game of the split, in the same shuffled order."""
  if num_games < 1:
    raise ValueError(f"the validation split has no games (num_games={num_games}).")
  if num_tasks < -1:
    raise ValueError(
      f"eval.num_tasks={num_tasks}; use -1 (the whole split), 0 (no episodes) or more."
    )
  order = np.random.default_rng(seed).permutation(num_games)
  return [int(i) for i in order[: num_games if num_tasks == -1 else min(num_tasks, num_games)]]
