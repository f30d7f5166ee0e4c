"""Stopping a run cleanly on SIGTERM (what a cloud scheduler or a TPU VM sends before preemption)
or SIGINT (Ctrl-C): `StopRequest` remembers the signal, and the trainer acts on it at its safe
points (after an iteration's rollout, before any update; after an iteration): it saves the last
finished iteration and raises `Preempted`, which the commands turn into one message and exit
status 128 + the signal's number. A second Ctrl-C interrupts at once. With several processes
every process stops at the same iteration: the request is agreed over the processes at each safe
point (a small collective), so a signal that reaches one process stops them all.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from sdar_jax.infra import multihost

log = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
  """The run stopped on a signal after saving; `exit_code` is 128 + the signal's number."""

  def __init__(self, signum: int, message: str):
    super().__init__(message)
    self.signum = signum
    self.exit_code = 128 + signum


class StopRequest:
  """While entered (on the main thread): SIGTERM and SIGINT set `signum` instead of stopping the
  process; `requested()` says, at a safe point, whether any process got one."""

  def __init__(self) -> None:
    self.signum: int | None = None
    self._previous: dict[int, Any] = {}

  def __enter__(self) -> StopRequest:
    if threading.current_thread() is threading.main_thread():
      for sig in SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc: Any) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous.clear()

  def _handle(self, signum: int, frame: Any) -> None:
    if self.signum is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt  # a second Ctrl-C: stop now
    if self.signum is None:
      log.warning(
        "%s received: the run stops at the next safe point (after this iteration's rollout, or "
        "at its end) and saves the last finished iteration; Ctrl-C again stops at once",
        signal.Signals(signum).name,
      )
    self.signum = signum

  def requested(self) -> bool:
    """Whether this process, or with several processes any of them, got a signal (then every
    process's `signum` is set, SIGTERM for those that got none themselves)."""
    got = multihost.any_process(self.signum is not None)
    if got and self.signum is None:
      self.signum = signal.SIGTERM
    return got


def preempted(signum: int, ckpt: Any, iterations: int, total: int) -> Preempted:
  """The Preempted error of a run stopped by `signum` after `iterations` of `total`, saying what
  `ckpt` (the run's CheckpointManager) holds."""
  saved = ckpt.latest_step()
  what = (
    f"iteration {saved} is saved in {ckpt.directory}"
    if saved is not None
    else "no iteration had finished, nothing is saved"
  )
  return Preempted(
    signum,
    f"stopped by {signal.Signals(signum).name} after {iterations} of {total} iterations: {what}. "
    "Run the same command again to resume from there.",
  )
