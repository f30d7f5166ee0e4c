"""A bounded queue of turn-samples tagged with the policy version that generated them.

Synchronous on-policy training (the paper, `max_staleness=0`) puts one iteration's samples and
takes them all before the next rollout. With `max_staleness=k > 0` the trainer may update on
samples up to k versions old (their behaviour log-probs still give the exact importance ratio);
older samples are dropped and counted, never trained on.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from sdar_jax.core.batch import TurnSample


class ReplayQueue:
  """Turn-samples waiting for an update, oldest first: at most `capacity` (the oldest fall out
  when it is full), none more than `max_staleness` policy versions old when taken."""

  def __init__(self, capacity: int = 65536, max_staleness: int = 0):
    if capacity < 1:
      raise ValueError(f"replay capacity={capacity} must be >= 1.")
    if max_staleness < 0:
      raise ValueError(f"max_staleness={max_staleness} must be >= 0 (0 = synchronous on-policy).")
    self.capacity = capacity
    self.max_staleness = max_staleness
    self._items: collections.deque[TurnSample] = collections.deque()
    self.dropped_stale = 0
    self.dropped_overflow = 0

  def __len__(self) -> int:
    return len(self._items)

  def put(self, samples: Sequence[TurnSample]) -> None:
    for sample in samples:
      if len(self._items) >= self.capacity:
        self._items.popleft()
        self.dropped_overflow += 1
      self._items.append(sample)

  def _evict_stale(self, current_version: int) -> None:
    """Drops every sample staler than `max_staleness`, wherever it sits in the queue (samples
    need not arrive in version order), keeping the others' order."""
    oldest = current_version - self.max_staleness
    fresh = [s for s in self._items if s.policy_version >= oldest]
    self.dropped_stale += len(self._items) - len(fresh)
    self._items = collections.deque(fresh)

  def take(self, n: int | None, current_version: int) -> list[TurnSample]:
    """Up to `n` samples (all when None), oldest first, none staler than `max_staleness`."""
    self._evict_stale(current_version)
    n = len(self._items) if n is None else min(n, len(self._items))
    return [self._items.popleft() for _ in range(n)]

  def state_dict(self) -> dict[str, int]:
    """What a checkpoint keeps: the counters (a synchronous run checkpoints with an empty queue)."""
    return {"dropped_stale": self.dropped_stale, "dropped_overflow": self.dropped_overflow}

  def load_state_dict(self, state: dict[str, int]) -> None:
    self.dropped_stale = int(state.get("dropped_stale", 0))
    self.dropped_overflow = int(state.get("dropped_overflow", 0))
