"""One process per run directory: an exclusive lock file on the workdir.

`WorkdirLock(workdir).acquire()` takes `<workdir>/.sdar_jax.lock` (host, pid, start time, command
line, under an `fcntl.flock`) before a trainer writes anything and `release()` drops it; a second
trainer on the same directory stops at once with `WorkdirLockedError` naming the holder. A lock
left by a killed run is recovered (the kernel drops a flock with its process; a recorded pid dead
on this host is taken over). Not taken, and said so in the log, on a gs:// workdir (an object
store has no lock a killed holder releases: give every run its own workdir) and on the processes
other than the primary one of a multi-process run.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from typing import Any, Self

from sdar_jax.infra import paths
from sdar_jax.infra.errors import UserError

log = logging.getLogger(__name__)

LOCK_NAME = ".sdar_jax.lock"


class WorkdirLockedError(UserError, RuntimeError):
  """Another live process holds the workdir's lock."""

  heading = "Workdir in use"


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by someone else
    return True
  return True


def read_holder(workdir: str | os.PathLike) -> dict[str, Any] | None:
  """The holder record of `workdir`'s lock file (None when there is no readable record)."""
  try:
    with open(os.path.join(os.fspath(workdir), LOCK_NAME)) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  return record if isinstance(record, dict) else None


class WorkdirLock:
  """Exclusive lock of one run directory, held from `acquire()` to `release()`.

  lock = WorkdirLock(workdir, purpose="training")
  lock.acquire()  # WorkdirLockedError naming the holder's host and pid when another run has it
  ...
  lock.release()
  """

  def __init__(self, workdir: str | os.PathLike, purpose: str = "training"):
    self.workdir = paths.resolve(workdir)
    self.path = paths.join(self.workdir, LOCK_NAME)
    self.purpose = purpose
    self._fd: int | None = None
    self.skipped = False  # acquire() took no lock (a remote workdir, or not the primary process)

  @property
  def held(self) -> bool:
    return self._fd is not None

  def _refuse(self, holder: dict[str, Any] | None) -> WorkdirLockedError:
    if holder:
      who = (
        f"{holder.get('purpose', 'a run')} started {holder.get('started', '?')} by pid "
        f"{holder.get('pid', '?')} on host {holder.get('host', '?')}"
      )
    else:
      who = "another process (its lock record is unreadable)"
    return WorkdirLockedError(
      f"workdir {self.workdir} is in use by {who}. Two runs on one workdir would both write its "
      f"checkpoints and metrics. Wait for that run to finish (or stop it), or pass another "
      f"--workdir. Lock file: {self.path}"
    )

  def acquire(self) -> Self:
    if self._fd is not None or self.skipped:
      return self
    if paths.is_remote(self.workdir):
      self.skipped = True
      log.warning(
        "workdir %s is remote: no workdir lock is taken (object stores have none that a killed "
        "run releases), so a second run on this workdir would not be refused. Give every run its "
        "own workdir.",
        self.workdir,
      )
      return self
    if not paths.is_primary_process():
      self.skipped = True
      log.info("workdir lock: held by the primary process of this run, not by this one")
      return self
    os.makedirs(self.workdir, exist_ok=True)
    fd = self._lock_file()
    try:
      self._take_over(fd)
    except BaseException:  # never keep a locked fd that release() cannot reach
      os.close(fd)  # closing drops the flock
      raise
    self._fd = fd
    return self

  def _take_over(self, fd: int) -> None:
    """Refuses a live holder's record, else writes ours into the locked file `fd`."""
    # We hold the flock. A record left by another process is either stale (its process died and the
    # kernel dropped its flock) or, where flock is not enforced, possibly live: refuse then if the
    # recorded pid still runs on this host.
    holder = read_holder(self.workdir)
    host = socket.gethostname()
    if (
      holder
      and holder.get("pid") != os.getpid()
      and holder.get("host") == host
      and isinstance(holder.get("pid"), int)
      and _pid_alive(holder["pid"])
      and not _flock_enforced(self.path, fd)
    ):
      raise self._refuse(holder)
    record = {
      "host": host,
      "pid": os.getpid(),
      "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
      "started_unix": time.time(),
      "purpose": self.purpose,
      "argv": list(sys.argv),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    os.fsync(fd)

  def _lock_file(self) -> int:
    """An fd of the lock file under our flock. The file a releasing holder unlinks may be the one we
    opened: then the flock guards nothing, so open the path again."""
    for _ in range(100):
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        os.close(fd)
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
          raise self._refuse(read_holder(self.workdir)) from None
        raise
      try:
        same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
      except FileNotFoundError:
        same = False
      if same:
        return fd
      fcntl.flock(fd, fcntl.LOCK_UN)
      os.close(fd)
    raise self._refuse(read_holder(self.workdir))

  def release(self) -> None:
    """Drops the lock and removes the lock file (a no-op when not held)."""
    if self._fd is None:
      return
    fd, self._fd = self._fd, None
    try:
      os.unlink(self.path)  # while still locked, so no other process's fresh record is removed
    except FileNotFoundError:
      pass
    finally:
      fcntl.flock(fd, fcntl.LOCK_UN)
      os.close(fd)

  def __enter__(self) -> Self:
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def _flock_enforced(path: str, held_fd: int) -> bool:
  """Whether a second open file of `path` is refused the flock `held_fd` holds (False on file
  systems that accept every flock, where only the pid check protects the workdir)."""
  probe = os.open(path, os.O_RDONLY)
  try:
    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    return True
  else:
    fcntl.flock(probe, fcntl.LOCK_UN)
    return False
  finally:
    os.close(probe)
