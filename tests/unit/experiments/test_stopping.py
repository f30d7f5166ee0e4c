"""A driver's SIGTERM (experiments.stopping) with real child processes and real signals sent to
the driver alone: the step playing is sent the signal and waited for, no further step starts,
and a second SIGTERM kills the step at once; the `stop` action on a real driver process. The
trainer's own stop at its safe point, through a driver, is tests/integration/test_preemption.py's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from experiments import driver, stopping
from experiments.stopping import STOP
from tests.helpers import REPO

# A step that, on SIGTERM, "saves" (writes `saved`) and exits 143 as a training does; with
# `ignore`, a step that notes each SIGTERM (touches `term`) and plays on (a training busy past
# its safe point).
CHILD = """
import pathlib, signal, sys, time
folder = pathlib.Path(sys.argv[1])
def stop(signum, frame):
  (folder / "saved").write_text("saved")
  sys.exit(143)
def note(signum, frame):
  (folder / "term").touch()
signal.signal(signal.SIGTERM, note if sys.argv[2] == "ignore" else stop)
(folder / "ready").touch()
time.sleep(120)
"""


@pytest.fixture(autouse=True)
def no_request_left():
  STOP.reset()
  yield
  STOP.reset()


def _plan(tmp_path, mode: str):
  child = tmp_path / "child.py"
  child.write_text(CHILD)
  first = tmp_path / "first"
  second = tmp_path / "second"
  first.mkdir()
  steps = [
    driver.Step("train", "a", 5e-4, 0, str(first), (sys.executable, str(child), str(first), mode)),
    driver.Step("train", "b", 5e-4, 0, str(second), ("touch", str(second / "ran"))),
  ]
  return steps, first, second


def _wait_ready(folder, name: str = "ready") -> None:
  """Until the step has set its SIGTERM handler (at most 60 s); name="term": until an ignoring
  step has got a SIGTERM (the driver's handler has run: two signals sent before it runs would
  reach it as one)."""
  for _ in range(3000):  # polls 0.02 s apart
    if (folder / name).exists():
      return
    time.sleep(0.02)


def _signal_when_ready(folder, times: int) -> threading.Thread:
  def send():
    _wait_ready(folder)
    for n in range(times):
      if n:
        _wait_ready(folder, "term")
      os.kill(os.getpid(), signal.SIGTERM)  # the driver (this process) alone, not its step

  thread = threading.Thread(target=send, daemon=True)
  thread.start()
  return thread


def test_a_sigterm_reaches_the_step_which_ends_at_its_safe_point_and_no_step_follows(tmp_path):
  steps, first, second = _plan(tmp_path, "save")
  lines: list[str] = []
  thread = _signal_when_ready(first, times=1)
  code = driver.run_command(lambda: driver.play(lambda: steps, echo=lines.append))
  thread.join()
  assert code == 143
  assert (first / "saved").read_text() == "saved"  # the step got the signal and saved
  assert not (second / "ran").exists()  # the next step never started
  assert any("train a lr5.0e-04 seed 0: stopped by SIGTERM (exit code 143)" in x for x in lines)
  assert lines[-1].startswith("stopped after 1 step(s)")


def test_a_second_sigterm_kills_the_step_at_once(tmp_path):
  steps, first, second = _plan(tmp_path, "ignore")
  lines: list[str] = []
  thread = _signal_when_ready(first, times=2)
  code = driver.run_command(lambda: driver.play(lambda: steps, echo=lines.append))
  thread.join()
  assert code == 143
  # killed (SIGKILL), not ended by its own 120 s sleep
  assert any(f"stopped by SIGTERM (exit code {-signal.SIGKILL})" in x for x in lines)
  assert not (first / "saved").exists() and not (second / "ran").exists()


def test_without_a_signal_the_steps_run_as_with_subprocess_run(tmp_path):
  _, _, second = _plan(tmp_path, "save")
  second.mkdir()
  with open(second / "log", "w") as log:  # as collect.run_and_record calls its runner
    done = STOP.run(["sh", "-c", "echo out; exit 3"], cwd=str(second), stdout=log, check=False)
  assert (done.returncode, STOP.requested) == (3, False)
  assert (second / "log").read_text() == "out\n"
  with pytest.raises(ValueError, match="check=True"):
    STOP.run(["true"], check=True)


# A driver in its own process (its own session, as `setsid` starts one) playing _plan's steps.
DRIVER = """
import sys
from experiments import driver
driver.AUTOGROUP = "/dev/null"  # the test's session keeps its priority
out, first, child, mode, second = sys.argv[1:]
steps = [
  driver.Step("train", "a", 5e-4, 0, first, (sys.executable, child, first, mode)),
  driver.Step("train", "b", 5e-4, 0, second, ("touch", second + "/ran")),
]
sys.exit(driver.run_command(lambda: driver.play(lambda: steps), out))
"""


def _start_driver(tmp_path, mode: str):
  """DRIVER in its own session playing _plan's steps into <tmp_path>/out."""
  _, first, second = _plan(tmp_path, mode)
  out = tmp_path / "out"
  command = [sys.executable, "-c", DRIVER, str(out), str(first), str(tmp_path / "child.py")]
  proc = subprocess.Popen(
    [*command, mode, str(second)],
    cwd=REPO,
    env=dict(os.environ, PYTHONPATH=REPO),
    stdout=subprocess.DEVNULL,
    start_new_session=True,
  )
  return proc, out, first, second


def test_stop_signals_the_running_driver_and_waits_until_it_has_ended(tmp_path):
  proc, out, first, second = _start_driver(tmp_path, "save")
  try:
    _wait_ready(first)
    lines: list[str] = []
    assert stopping.stop_driver(str(out), echo=lines.append) == 0
    assert lines[0].startswith("SIGTERM sent to the driver (process")
    assert lines[-1].startswith("the driver has ended")
    assert proc.wait(timeout=10) == 143
  finally:
    proc.kill()
  assert (first / "saved").read_text() == "saved" and not (second / "ran").exists()
  # the driver has ended: its pid file names no running driver now
  assert stopping.stop_driver(str(out), echo=lines.append) == 0
  assert "which is no longer a running driver" in lines[-1]
  assert stopping.stop_driver(str(tmp_path / "none"), echo=lines.append) == 0
  assert "does not exist (no `run` has played into" in lines[-1]


def test_a_second_stop_says_it_kills_the_step_and_the_driver_ends(tmp_path):
  proc, out, first, second = _start_driver(tmp_path, "ignore")
  try:
    _wait_ready(first)
    lines: list[str] = []
    # the step ignores SIGTERM: the first stop gives up waiting, the driver still runs
    assert stopping.stop_driver(str(out), wait=0, echo=lines.append) == 1
    _wait_ready(first, "term")
    assert "stops at its safe point" in lines[0] and "still runs after" in lines[-1]
    assert stopping.stop_driver(str(out), echo=lines.append) == 0
    assert any("a second SIGTERM sent to the driver" in x and "killed now" in x for x in lines)
    assert proc.wait(timeout=10) == 143
  finally:
    proc.kill()
  assert not (first / "saved").exists() and not (second / "ran").exists()


def test_a_sigterm_while_the_tables_are_written_lets_the_write_end_first(tmp_path):
  """Between steps a SIGTERM ends the driver at once, except while it appends to the tables: a
  step's rows are written table after table, and a stop between them would leave rows that a
  later `record` appends again."""
  written: list[str] = []

  def record(tables) -> int:
    written.append("outcomes")
    os.kill(os.getpid(), signal.SIGTERM)  # arrives between the two appends
    time.sleep(0.2)
    written.append("runs")
    return 1

  steps = [
    driver.Step("train", arm, 5e-4, 0, str(tmp_path / arm), ("touch", str(tmp_path / arm / "ran")))
    for arm in ("a", "b")
  ]
  code = driver.run_command(
    lambda: driver.play(
      lambda: steps, echo=lambda line: None, record=record, records_to=str(tmp_path)
    )
  )
  assert code == 143 and written == ["outcomes", "runs"]
  assert (tmp_path / "a" / "ran").exists() and not (tmp_path / "b" / "ran").exists()
