"""Run logging: where sdar_jax's log lines go, and the per-iteration progress line (elapsed, ETA).

Every module logs through Python's `logging` under the "sdar_jax" (and "envs") loggers. Under the
command-line entry points absl installs its handler on the root logger, whose prefix carries the
time (`I1130 19:30:01.123456 4242 trainer.py:512] ...`); `configure_logging` then shows sdar_jax's
INFO lines (progress, "compiling ...", warnings) while the other libraries are kept to WARNING
(orbax logs every checkpoint step at INFO). An explicit `--verbosity` is honoured for everything:
`--verbosity=-1` hides the INFO lines, `--verbosity=0` shows every library's INFO lines,
`--verbosity=1` their debug output. The Trainer calls `ensure_log_handler`, which does the same in
an absl program whose entry point did not, and, used as a library with no logging set up, gives
the sdar_jax loggers a stderr handler with timestamps.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

OUR_LOGGERS = ("sdar_jax", "envs")
LOG_FORMAT = "%(asctime)s %(levelname).1s %(name)s] %(message)s"


def _verbosity_given() -> bool:
  try:
    from absl import flags

    return bool(flags.FLAGS["verbosity"].present)
  except (ImportError, KeyError):
    return False


def configure_logging(verbosity_given: bool | None = None) -> None:
  """Logging levels of an entry point run under `absl.app.run` (call after flag parsing). Without
  `--verbosity`: sdar_jax's loggers at INFO, the root logger (every other library) at WARNING.
  With it: absl has set the root level from it, and ours inherit that."""
  given = _verbosity_given() if verbosity_given is None else verbosity_given
  for name in OUR_LOGGERS:
    logging.getLogger(name).setLevel(logging.NOTSET if given else logging.INFO)
  if not given:
    logging.getLogger().setLevel(logging.WARNING)


def _under_absl() -> bool:
  """Whether absl's handler is on the root logger (an `absl.app.run` program)."""
  try:
    from absl import logging as absl_logging
  except ImportError:
    return False
  return absl_logging.get_absl_handler() in logging.getLogger().handlers


def ensure_log_handler() -> None:
  """Makes sdar_jax's INFO lines visible where nobody configured them: in an absl program whose
  entry point did not call `configure_logging`, as that would (unless `--verbosity` was given);
  used as a library with no handler anywhere, through a stderr handler with timestamps. Logging set
  up by the application (handlers on the root logger, levels on ours) is left alone."""
  if _under_absl():
    if logging.getLogger("sdar_jax").level == logging.NOTSET and not _verbosity_given():
      configure_logging(verbosity_given=False)
    return
  if logging.getLogger().handlers:
    return
  fmt = logging.Formatter(LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S")
  for name in OUR_LOGGERS:
    logger = logging.getLogger(name)
    if logger.handlers:
      continue
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(fmt)
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
      logger.setLevel(logging.INFO)


def format_duration(seconds: float) -> str:
  """12.3 -> "12.3s", 3723 -> "1:02:03"."""
  if seconds < 60:
    return f"{seconds:.1f}s"
  s = round(seconds)
  return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
  """Elapsed time and ETA of a loop of `total` iterations (a resumed one counts from where it
  restarted: `eta(done)` and `line(done, ...)` take the completed count).

  The ETA is the remaining iteration count times the mean duration of this process's iterations,
  leaving out the first one once there are others (it also pays the compilations).
  """

  def __init__(self, total: int, clock: Callable[[], float] = time.monotonic):
    self.total = int(total)
    self._clock = clock
    self._t0 = clock()
    self._last = self._t0
    self.durations: list[float] = []

  def tick(self) -> float:
    """Marks one iteration done; returns its duration in seconds."""
    now = self._clock()
    duration, self._last = now - self._last, now
    self.durations.append(duration)
    return duration

  @property
  def elapsed(self) -> float:
    return self._last - self._t0

  def eta(self, done: int) -> float | None:
    """Seconds left after `done` completed iterations (None before the first tick)."""
    if not self.durations:
      return None
    timed = self.durations[1:] if len(self.durations) > 1 else self.durations
    return max(0, self.total - done) * sum(timed) / len(timed)

  def line(self, done: int, duration: float) -> str:
    """ "iteration 3/150 (2%) in 12.3s, elapsed 37.0s, ETA 0:30:02" after iteration `done`."""
    pct = 100.0 * done / self.total if self.total else 100.0
    eta = self.eta(done)
    eta_text = "?" if eta is None else format_duration(eta)
    return (
      f"iteration {done}/{self.total} ({pct:.0f}%) in {format_duration(duration)}, "
      f"elapsed {format_duration(self.elapsed)}, ETA {eta_text}"
    )
