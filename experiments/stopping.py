"""A driver's SIGTERM, which lets the step it is playing stop at the step's own safe point.

A driver plays its steps as child processes. A training killed outright loses every iteration
since its last periodic checkpoint; a training sent SIGTERM saves its last finished iteration and
exits 143 (sdar_jax.run.preemption). `Stop` is both the driver's SIGTERM handler and the runner
its steps go through (subprocess.run's call):

* SIGTERM while a step plays: the step is sent SIGTERM too (it may have it already, when the
  signal went to the whole process group, as `kill -TERM -- -PGID` does; a second one changes
  nothing for a training) and the driver waits for it to end, then plays no other step
  (`requested`), and its `run` exits 143.
* A second SIGTERM while the step still plays: the step is killed at once (SIGKILL).
* SIGTERM between steps: the driver exits at once (143).

An evaluation has no safe point: SIGTERM ends it, and it plays its unfinished split again when
the driver is run again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any


class Stop:
  """The driver's stop request and the step it would stop (see the module's docstring)."""

  def __init__(self) -> None:
    self.requested = False  # a SIGTERM came while a step played: play no further step
    self._step: subprocess.Popen | None = None

  def install(self) -> None:
    """Makes `handle` this process's SIGTERM handler (the main thread's call)."""
    signal.signal(signal.SIGTERM, self.handle)

  def handle(self, signum: int, frame: Any) -> None:
    step = self._step
    if step is None or step.poll() is not None:
      sys.exit(128 + signum)
    if self.requested:
      step.kill()  # a second SIGTERM: now
      return
    self.requested = True
    step.send_signal(signal.SIGTERM)

  def run(
    self, cmd: Sequence[str], check: bool = False, **popen: Any
  ) -> subprocess.CompletedProcess:
    """Runs `cmd` to its end as subprocess.run does (`popen`: Popen's keywords; `check` is not
    supported and must be False), the process kept where `handle` finds it."""
    if check:
      raise ValueError("Stop.run(check=True) is not supported: read the returncode instead")
    step = subprocess.Popen(list(cmd), **popen)
    self._step = step
    try:
      code = step.wait()
    except BaseException:  # the driver itself ends (an error, Ctrl-C): its step ends with it
      step.kill()
      step.wait()
      raise
    finally:
      self._step = None
    return subprocess.CompletedProcess(list(cmd), code)

  def reset(self) -> None:
    """Forgets a request (tests; a driver stops after one)."""
    self.requested = False


STOP = Stop()  # the process's one handler (signals reach a process, not an object)
