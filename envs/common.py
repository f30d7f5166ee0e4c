"""Helpers shared by several environments: action-tag projection, history records, success
rates, the JAX-free bm25s import, and the file lock that guards a shared data cache.

Each environment keeps its own module (`envs.<name>.projection`, `.prompts`, ...) with its own
constants; those modules call these functions with their parameters.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

__all__ = [
  "file_lock",
  "format_history",
  "import_bm25s",
  "project_each",
  "project_tagged_action",
  "steps_taken",
  "success_rates",
]

_CJK = re.compile(r"[\u4e00-\u9fff]")
_OPEN, _CLOSE = "<action>", "</action>"


# ---------------------------------------------------------------------------------- projection
def project_tagged_action(text: str, no_tag_tail_chars: int) -> tuple[str, bool]:
  """(action for the env, format valid) for an output that should hold ``<action>...</action>``.

  verl-agent's ALFWorld and WebShop projection: the output is lower-cased; the action is the
  stripped text between the first "<action>" and the first "</action>" after it; the format is
  valid when both tags are present, "<think>" and "</think>" occur in the original `text`, and
  there is no CJK character (U+4E00..U+9FFF). Without the tags the env receives the last
  `no_tag_tail_chars` characters of the lower-cased output (a no-op step) and the format is invalid.
  """
  lowered = text.lower()
  start = lowered.find(_OPEN)
  end = lowered.find(_CLOSE, start + len(_OPEN)) if start != -1 else -1
  if start == -1 or end == -1:
    return lowered[-no_tag_tail_chars:], False
  action = lowered[start + len(_OPEN) : end].strip()
  valid = "<think>" in text and "</think>" in text and not _CJK.search(text)
  return action, valid


def project_each(
  project: Callable[[str], tuple[str, bool]], texts: Sequence[str]
) -> tuple[list[str], list[bool]]:
  """`project` over a batch of outputs: (actions, validity flags)."""
  pairs = [project(t) for t in texts]
  return [a for a, _ in pairs], [v for _, v in pairs]


# -------------------------------------------------------------------------------------- prompts
def steps_taken(history: Sequence[Any], step: int | None) -> int:
  """Steps already taken: `step`, or len(history) when `step` is None.

  `history` may be the last records only, so `step` may exceed its length but never be smaller.
  """
  step_count = len(history) if step is None else step
  if step_count < len(history):
    raise ValueError(f"step={step} is smaller than the {len(history)} history records given")
  return step_count


def format_history(history: Sequence[tuple[str, str]], step_count: int) -> str:
  """``[Observation i: '<obs>', Action i: '<action>']`` records, one a line, for (observation,
  action) pairs numbered so that the last one is step `step_count`."""
  first = step_count - len(history) + 1
  return "\n".join(
    f"[Observation {first + j}: '{obs}', Action {first + j}: '{action}']"
    for j, (obs, action) in enumerate(history)
  )


# -------------------------------------------------------------------------------------- metrics
def success_rates(episodes: Iterable[tuple[str, bool]]) -> dict[str, float]:
  """Success rates from (group, won) per episode: one "<group>_success_rate" per group that
  occurred (sorted by key), then "success_rate" over all episodes (not a mean of the groups)."""
  totals: dict[str, list[int]] = {}
  everything = [0, 0]
  for group, won in episodes:
    counts = totals.setdefault(f"{group}_success_rate", [0, 0])
    counts[0] += int(bool(won))
    counts[1] += 1
    everything[0] += int(bool(won))
    everything[1] += 1
  rates = {key: wins / n for key, (wins, n) in sorted(totals.items())}
  if everything[1]:
    rates["success_rate"] = everything[0] / everything[1]
  return rates


# ----------------------------------------------------------------------------------------- bm25
def import_bm25s() -> Any:
  """Imports bm25s without letting it import JAX (it does when JAX is installed): envs/ stays JAX-free.

  If JAX is already loaded (the trainer process) bm25s may use it; callers always ask for numpy
  selection.
  """
  if "bm25s" in sys.modules or "jax" in sys.modules:
    import bm25s

    return bm25s
  sys.modules["jax"] = None  # type: ignore[assignment]  # makes `import jax` raise ImportError
  try:
    import bm25s
  finally:
    del sys.modules["jax"]
  return bm25s


# ---------------------------------------------------------------------------------- data cache
@contextlib.contextmanager
def file_lock(
  path: str, holder: str | None = None, waiting: Callable[[str], None] | None = None
) -> Iterator[None]:
  """Holds an exclusive `fcntl.flock` on `path` (created, with its folder, if missing): runs that
  share a data cache build each entry once, one at a time. The kernel drops the lock if its
  process dies, so a killed builder never blocks the next run. `holder`: written into the file
  while the lock is held; `waiting`: called once with the file's text (the holder's, or "") when
  another process holds the lock, before this one waits for it."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "a+") as handle:  # not "w": a waiting process must not erase the holder's text
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      if waiting is not None:
        handle.seek(0)
        waiting(handle.read().strip())
      fcntl.flock(handle, fcntl.LOCK_EX)
    try:
      if holder is not None:
        handle.seek(0)
        handle.truncate()
        handle.write(holder + "\n")
        handle.flush()
      yield
    finally:
      fcntl.flock(handle, fcntl.LOCK_UN)


def lock_held(path: str) -> bool:
  """Whether another open file of `path` holds its `file_lock` now (False when it is missing)."""
  if not os.path.exists(path):
    return False
  with open(path, "a+") as probe:
    try:
      fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      return True
    fcntl.flock(probe, fcntl.LOCK_UN)
    return False
