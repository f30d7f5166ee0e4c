"""The workdir lock: one holder at a time, the holder named in a refusal, stale locks recovered."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from sdar_jax.run.workdir_lock import LOCK_NAME, WorkdirLock, WorkdirLockedError, read_holder


def test_lock_file_records_host_pid_and_start(tmp_path):
  with WorkdirLock(tmp_path, purpose="training") as lock:
    assert lock.held
    record = json.loads((tmp_path / LOCK_NAME).read_text())
    assert record["host"] == socket.gethostname()
    assert record["pid"] == os.getpid()
    assert record["purpose"] == "training"
    assert record["started"] and record["started_unix"] > 0
  assert not (tmp_path / LOCK_NAME).exists()  # released: the file is gone


def test_second_holder_is_refused_with_host_and_pid(tmp_path):
  first = WorkdirLock(tmp_path).acquire()
  try:
    with pytest.raises(WorkdirLockedError) as e:
      WorkdirLock(tmp_path).acquire()
    msg = str(e.value)
    assert f"pid {os.getpid()}" in msg and f"host {socket.gethostname()}" in msg
    assert str(tmp_path) in msg and "--workdir" in msg
  finally:
    first.release()
  WorkdirLock(tmp_path).acquire().release()  # free again once released


def test_lock_held_by_another_process_is_refused(tmp_path):
  """A live holder in another process; the refusal names that process."""
  script = textwrap.dedent(
    f"""
    import sys, time
    from sdar_jax.run.workdir_lock import WorkdirLock
    lock = WorkdirLock({str(tmp_path)!r}).acquire()
    print("locked", flush=True)
    sys.stdin.readline()
    lock.release()
    """
  )
  holder = subprocess.Popen(
    [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
  )
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(WorkdirLockedError, match=f"pid {holder.pid} on host"):
      WorkdirLock(tmp_path).acquire()
  finally:
    holder.communicate("\n", timeout=60)
  assert holder.returncode == 0
  WorkdirLock(tmp_path).acquire().release()


def test_stale_lock_of_a_dead_process_is_recovered(tmp_path):
  """A lock file left by a killed run (its pid is dead on this host) does not block the next run."""
  dead = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True
  )
  dead_pid = int(dead.stdout)
  stale = {"host": socket.gethostname(), "pid": dead_pid, "started": "earlier", "purpose": "x"}
  (tmp_path / LOCK_NAME).write_text(json.dumps(stale))
  with WorkdirLock(tmp_path) as lock:
    assert lock.held
    assert read_holder(tmp_path)["pid"] == os.getpid()


def test_killed_holder_releases_the_lock(tmp_path):
  """kill -9 of the holder: the kernel drops its lock; the record it left is taken over."""
  script = textwrap.dedent(
    f"""
    import os, signal
    from sdar_jax.run.workdir_lock import WorkdirLock
    WorkdirLock({str(tmp_path)!r}).acquire()
    os.kill(os.getpid(), signal.SIGKILL)
    """
  )
  proc = subprocess.Popen([sys.executable, "-c", script])
  assert proc.wait(timeout=120) == -9
  assert read_holder(tmp_path)["pid"] == proc.pid  # the dead holder's record is left behind
  with WorkdirLock(tmp_path) as lock:
    assert lock.held
