"""The drivers' tests leave the process that runs them as they found it. A driver's `run`
(experiments.driver.run_command) puts its whole session at the lowest CPU priority and sets a
SIGTERM handler; in a test that session is the suite's own (its workers, and what the same shell
runs after it), which a test once left at nice 19 beside the background experiments: the rest of
the suite and the demo after it ran at their priority (2026-12-07)."""

import signal

import pytest

from experiments import driver


@pytest.fixture(autouse=True)
def the_suite_keeps_its_priority_and_signals(tmp_path_factory, monkeypatch):
  monkeypatch.setattr(driver, "AUTOGROUP", str(tmp_path_factory.mktemp("session") / "autogroup"))
  handler = signal.getsignal(signal.SIGTERM)
  yield
  signal.signal(signal.SIGTERM, handler)
