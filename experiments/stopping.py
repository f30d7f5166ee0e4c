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
* SIGTERM between steps: the driver exits at once (143), unless it is writing what must not stop
  half-way (`deferred`: the tables' appends), which it finishes first.

An evaluation has no safe point: SIGTERM ends it, and it plays its unfinished split again when
the driver is run again.

A driver's `run` writes its process id to <out>/run.pid (`write_pid`); its `stop` action
(`stop_driver`) sends the SIGTERM to the driver alone, which passes it to its step, and waits
until the driver has ended. Not to the driver's process group: that would reach the step's env
workers too, which end on SIGTERM (a scheduler stopping the whole job), so the step would lose
the episodes they were playing (the trainer then plays the iteration's validation when resumed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

PID_FILE = "run.pid"  # <out>/run.pid: the process id of the driver playing into <out>
STOP_FILE = "stop.requested"  # <out>/stop.requested: the process id a `stop` has signalled


class Stop:
  """The driver's stop request and the step it would stop (see the module's docstring)."""

  def __init__(self) -> None:
    self.requested = False  # a SIGTERM came while a step played: play no further step
    self._step: subprocess.Popen | None = None
    self._deferring = False

  def install(self) -> None:
    """Makes `handle` this process's SIGTERM handler (the main thread's call)."""
    signal.signal(signal.SIGTERM, self.handle)

  def handle(self, signum: int, frame: Any) -> None:
    step = self._step
    if step is None:
      if self._deferring:
        self.requested = True  # the driver stops once the write has ended
        return
      sys.exit(128 + signum)
    if self.requested:
      step.kill()  # a second SIGTERM: now
      return
    self.requested = True
    step.send_signal(signal.SIGTERM)  # nothing when it has just ended: the driver stops after it

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

  @contextlib.contextmanager
  def deferred(self) -> Iterator[None]:
    """While entered, a SIGTERM between steps only sets `requested`, so that the block (a write
    that must not stop half-way) ends before the driver does."""
    self._deferring = True
    try:
      yield
    finally:
      self._deferring = False

  def reset(self) -> None:
    """Forgets a request (tests; a driver stops after one)."""
    self.requested = False


STOP = Stop()  # the process's one handler (signals reach a process, not an object)


# ---------------------------------------------------------------------------- `stop`
def write_pid(out: str) -> str:
  """Writes this process's id to <out>/PID_FILE (a driver's `run`), forgetting an earlier
  driver's stop request; returns the path."""
  os.makedirs(out, exist_ok=True)
  with contextlib.suppress(FileNotFoundError):
    os.remove(os.path.join(out, STOP_FILE))
  path = os.path.join(out, PID_FILE)
  with open(path, "w") as f:
    f.write(f"{os.getpid()}\n")
  return path


def _running_driver(pid: int) -> bool:
  """Whether process `pid` lives (not a zombie) and runs an experiments driver (a stale pid
  file may name a process id the system has given to another program since)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      if f.read().rsplit(")", 1)[1].split()[0] == "Z":
        return False
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return b"experiments" in f.read()
  except (FileNotFoundError, ProcessLookupError, IndexError):
    return False
  except OSError:  # no /proc (another OS): whether the process exists at all
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return False
    return True


def _signalled(marker: str) -> int | None:
  """The process id an earlier `stop` signalled (<out>/STOP_FILE), if any."""
  try:
    with open(marker) as f:
      return int(f.read().split()[0])
  except (FileNotFoundError, ValueError, IndexError):
    return None


def stop_driver(
  out: str,
  wait: float = 900.0,
  echo: Callable[[str], None] = lambda line: print(line, flush=True),
  every: float = 15.0,
) -> int:
  """`stop`: SIGTERM to the driver playing into `out` (it passes it to its step), then waits up
  to `wait` seconds for it to end, saying so every `every` seconds. Exit code 0 when it has ended
  or none was running, 1 when it still runs after `wait` (a second `stop` then kills its step at
  once)."""
  path = os.path.join(out, PID_FILE)
  try:
    with open(path) as f:
      pid = int(f.read().split()[0])
  except FileNotFoundError:
    echo(f"no driver to stop: {path} does not exist (no `run` has played into {out})")
    return 0
  if not _running_driver(pid):
    echo(f"no driver to stop: {path} names process {pid}, which is no longer a running driver")
    return 0
  marker = os.path.join(out, STOP_FILE)
  again = _signalled(marker) == pid
  try:
    os.kill(pid, signal.SIGTERM)
  except ProcessLookupError:  # it ended just now
    echo(f"no driver to stop: process {pid} ended as the signal was being sent")
    return 0
  with open(marker, "w") as f:
    f.write(f"{pid}\n")
  if again:
    echo(
      f"a second SIGTERM sent to the driver (process {pid}): the step playing is killed now (a "
      "training keeps its last periodic checkpoint, an evaluation plays its split again), then "
      "the driver ends; `run` resumes it"
    )
  else:
    echo(
      f"SIGTERM sent to the driver (process {pid}): the step playing stops at its safe point (a "
      "training saves its last finished iteration), then the driver ends; `run` resumes it"
    )
  start = last = time.monotonic()
  while _running_driver(pid):
    now = time.monotonic()
    if now - start > wait:
      echo(f"process {pid} still runs after {wait:.0f} s; `stop` again kills its step at once")
      return 1
    if now - last >= every:
      echo(f"waiting for process {pid} to end ({now - start:.0f} s)")
      last = now
    time.sleep(0.2)
  echo(f"the driver has ended ({time.monotonic() - start:.0f} s after the signal)")
  return 0
