"""A tiny deterministic text game for pool tests and benchmarks, with switchable faults.

Task t asks the agent to say the word ``words[t % len(words)]`` (``words`` defaults to `WORDS`);
saying it wins (reward 1). Admissible commands are all the words. With ``max_steps=1`` it is a
one-turn contextual bandit: the observation names the winning action. Faults for tests: raise,
sleep, or kill the whole process at a given step, or raise at reset; `slow_s` adds a fixed delay to
every step (to look like a real engine); `paced_s` adds about as much in 10 ms sleeps, a delay
that a stop of the process pauses (one long sleep's deadline passes while the process is stopped).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from typing import Any

from envs.base import register

__all__ = ["DummyEnv", "WORDS"]

WORDS = ("apple", "banana", "cherry", "damson", "elder", "fig", "grape", "hazel")


@register("dummy")
class DummyEnv:
  """Say-the-word game over `words`. `fail_on_step`/`hang_on_step` count steps from 1 within an
  episode."""

  def __init__(
    self,
    seed: int = 0,
    max_steps: int = 10,
    fail_on_step: int | None = None,
    hang_on_step: int | None = None,
    exit_on_step: int | None = None,
    fail_on_reset: bool = False,
    hang_s: float = 3600.0,
    slow_s: float = 0.0,
    paced_s: float = 0.0,
    words: Sequence[str] = WORDS,
  ):
    if not words or any(not isinstance(w, str) or not w.strip() or w != w.strip() for w in words):
      raise ValueError(
        f"words={words!r}: need at least one word, each a non-empty string without surrounding "
        "spaces. Fix: pass e.g. words=('mug', 'lamp')"
      )
    self.words = tuple(words)
    self._rng = random.Random(seed)
    self.max_steps = max_steps
    self.fail_on_step = fail_on_step
    self.hang_on_step = hang_on_step
    self.exit_on_step = exit_on_step
    self.fail_on_reset = fail_on_reset
    self.hang_s = hang_s
    self.slow_s = slow_s
    self.paced_s = paced_s
    self._task = 0
    self._steps = 0

  @property
  def num_tasks(self) -> int:
    return len(self.words)

  def _info(self, won: bool) -> dict[str, Any]:
    return {
      "won": won,
      "admissible_commands": list(self.words),
      "task_type": "say_word",
      "task": f"say {self.words[self._task]}",
      "steps": self._steps,
    }

  def reset(self, task: int | None = None) -> tuple[str, dict[str, Any]]:
    if self.fail_on_reset:
      raise RuntimeError("dummy env configured to fail on reset")
    n = len(self.words)
    self._task = self._rng.randrange(n) if task is None else task % n
    self._steps = 0
    return f"Your task is to: say {self.words[self._task]}.", self._info(False)

  def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
    self._steps += 1
    if self.fail_on_step is not None and self._steps == self.fail_on_step:
      raise RuntimeError(f"dummy env configured to fail on step {self._steps}")
    if self.hang_on_step is not None and self._steps == self.hang_on_step:
      time.sleep(self.hang_s)
    if self.exit_on_step is not None and self._steps == self.exit_on_step:
      os._exit(3)  # simulates an engine crash that takes its process down
    if self.slow_s:
      time.sleep(self.slow_s)
    for _ in range(round(self.paced_s / 0.01)):
      time.sleep(0.01)
    won = action.strip() == self.words[self._task]
    done = won or self._steps >= self.max_steps
    obs = "You said the right word." if won else f"Nothing happens. Step {self._steps}."
    return obs, 1.0 if won else 0.0, done, self._info(won)

  def close(self) -> None:
    pass
