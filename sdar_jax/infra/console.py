"""What goes to the terminal or the log while a long call runs.

tqdm redraws a bar with carriage returns; written to a log file (a cluster job's output, `make
demo > log`), every redraw becomes a frame in the file. Bars are therefore drawn only on a
terminal; a log gets the run's own one-line-per-iteration progress (sdar_jax.observe.progress)
and, from a call that runs long (`Progress`: an evaluation of hundreds of games, a rollout of a
large model), a line every so often saying how far it got."""

from __future__ import annotations

import datetime
import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

from tqdm import tqdm

log = logging.getLogger(__name__)

LOG_EVERY_S = 120.0  # seconds between two progress lines of one call in a log


def show_progress_bars(wanted: bool = True, stream: TextIO | None = None) -> bool:
  """Whether to draw a progress bar: `wanted` and `stream` (default stderr) is a terminal."""
  stream = sys.stderr if stream is None else stream
  isatty = getattr(stream, "isatty", None)
  return bool(wanted and isatty is not None and isatty())


class Progress:
  """One call's progress through `total` units: a tqdm bar on a terminal; without one (a log
  file), an INFO line at most every `every` seconds, the first once the call has run that long,
  so a short call writes nothing and a long one shows that it is alive and how far it got:
  "heldout_seen: turn 12/50 (active 600, won 31), 0:24:10 elapsed"."""

  def __init__(
    self,
    total: int,
    desc: str,
    unit: str = "turn",
    wanted: bool = True,
    every: float = LOG_EVERY_S,
    stream: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
  ):
    bars = show_progress_bars(wanted, stream)
    self._bar = tqdm(total=total, desc=desc, leave=False, disable=not bars, file=stream)
    self._lines = wanted and not bars
    self.total, self.desc, self.unit, self.every = total, desc, unit, every
    self.n = 0
    self._clock = clock
    self._start = self._last = clock()

  def update(self, n: int = 1, **state: object) -> None:
    """`n` more units done; `state` (e.g. active=..., won=...) is shown beside the count."""
    if state:
      self._bar.set_postfix(**state)
    self._bar.update(n)
    self.n += n
    now = self._clock()
    if self._lines and now - self._last >= self.every:
      self._last = now
      shown = f" ({', '.join(f'{k} {v}' for k, v in state.items())})" if state else ""
      elapsed = datetime.timedelta(seconds=round(now - self._start))
      log.info(
        "%s: %s %d/%d%s, %s elapsed", self.desc, self.unit, self.n, self.total, shown, elapsed
      )

  def to(self, n: int, **state: object) -> None:
    """`update` to an absolute count (a callback that reports how many are done)."""
    self.update(n - self.n, **state)

  def close(self) -> None:
    self._bar.close()
