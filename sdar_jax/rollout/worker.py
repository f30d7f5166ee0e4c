"""The rollout thread of asynchronous training (`train.max_staleness > 0`).

`RolloutWorker` runs submitted rollouts one at a time, in submission order, on a daemon thread;
`submit` returns a `concurrent.futures.Future` whose `result()` gives the rollout's value or
re-raises its exception in the caller's thread, so a failing rollout stops the run instead of
hanging it. `close` cancels the rollouts not started yet and asks the running one to stop: the
env pool it plays on is wrapped in a `StoppablePool`, whose next reset or step raises
`RolloutCancelled`, so the thread ends within one env call or one generation, before the pool
itself is closed.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class RolloutCancelled(RuntimeError):
  """A rollout was stopped because its worker was closed (the run is ending)."""


class StoppablePool:
  """An env pool whose calls raise `RolloutCancelled` once `stop` is set; everything else
  (attributes, `len`) is the wrapped pool's."""

  def __init__(self, pool: Any, stop: threading.Event):
    self._pool = pool
    self._stop = stop

  def __len__(self) -> int:
    return len(self._pool)

  def __getattr__(self, name: str) -> Any:
    value = getattr(self._pool, name)
    if not callable(value):
      return value

    def checked(*args: Any, **kwargs: Any) -> Any:
      if self._stop.is_set():
        raise RolloutCancelled(f"rollout stopped before env pool call {name!r}: worker closed")
      return value(*args, **kwargs)

    return checked


class RolloutWorker:
  """One daemon thread running submitted callables in order (see the module docstring)."""

  def __init__(self, name: str = "sdar-rollout", setup: Callable[[], Any] | None = None):
    """`setup`, when given, runs first on the new thread (e.g. thread-local JAX context)."""
    self.stop = threading.Event()
    self._jobs: queue.SimpleQueue = queue.SimpleQueue()
    self._setup = setup
    self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
    self._thread.start()

  def _serve(self) -> None:
    setup_error: BaseException | None = None
    if self._setup is not None:
      try:
        self._setup()
      except BaseException as e:  # every job reports it
        setup_error = e
    while True:
      job = self._jobs.get()
      if job is None:
        return
      future, fn, args = job
      if not future.set_running_or_notify_cancel():
        continue
      if self.stop.is_set():
        future.set_exception(RolloutCancelled("rollout not started: worker closed"))
        continue
      try:
        if setup_error is not None:
          raise setup_error
        future.set_result(fn(*args))
      except BaseException as e:  # handed to the thread that waits on the future
        future.set_exception(e)

  def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
    if self.stop.is_set():
      raise RuntimeError("RolloutWorker.submit after close.")
    future: concurrent.futures.Future = concurrent.futures.Future()
    self._jobs.put((future, fn, args))
    return future

  @property
  def alive(self) -> bool:
    return self._thread.is_alive()

  def close(self, timeout: float = 300.0) -> bool:
    """Stops the thread: rollouts not started are cancelled, the running one stops at its next
    env call. Waits up to `timeout` seconds; returns whether the thread ended."""
    self.stop.set()
    self._jobs.put(None)
    if threading.current_thread() is not self._thread:
      self._thread.join(timeout)
    if self._thread.is_alive():
      log.warning(
        "the rollout thread did not stop within %gs; closing the env pools under it", timeout
      )
      return False
    return True
