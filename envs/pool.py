"""EnvPool: N text environments stepped in parallel by worker processes, with batched reset/step.

Each worker process hosts a share of the envs (env i lives on worker i % num_workers) and steps
them one after the other; workers run in parallel. Processes, not threads: the TextWorld/PDDL
engine keeps process-global state (the Fast Downward translator patches `sys.argv`/`sys.stdout`),
and a hung thread cannot be killed.

Failure handling, per env:
- an env that raises: its result has done=True, info["env_error"], won=False; the worker drops
  that env and builds a fresh one at its next reset. The other envs are untouched.
- an env that hangs past `timeout_s`, or a worker process that dies: the worker is killed and
  restarted; every env of that worker loses its episode (the ones in the call get an error result
  now, the others get one at their next step) and all are rebuilt before their next reset.
The pool and the training run go on.

Workers are started with the "spawn" method by default: forking a process that already runs JAX
threads is unsafe. Envs are therefore built inside the workers from a registered name and
keyword arguments (`envs.make(name, **kwargs)`), which is all a worker needs.
With `num_workers=0` the envs run in the calling process (no isolation from hangs; handy for
debugging).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import multiprocessing.connection as mp_connection
import time
import traceback
from typing import Any, Mapping, Sequence

from envs.base import StepResult, TextEnv, failed_result, make

__all__ = ["EnvPool"]

_KEEP_INFO_KEYS = (
  "task_type",
  "gamefile",
  "task",
)  # copied from an env's last info into its error results


def _describe(exc: BaseException) -> str:
  tb = traceback.extract_tb(exc.__traceback__)
  where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
  return f"{type(exc).__name__}: {exc}{where}"


class _EnvSlot:
  """One env inside a worker: built lazily, dropped after an error, rebuilt at the next reset."""

  def __init__(self, name: str, kwargs: Mapping[str, Any]):
    self.name = name
    self.kwargs = dict(kwargs)
    self.env: TextEnv | None = None
    self.lost: str | None = None  # why the current episode cannot be stepped

  def _drop(self) -> None:
    if self.env is not None:
      try:
        self.env.close()
      except Exception:  # the env is being discarded because it misbehaved; closing is best effort
        pass
    self.env = None

  def reset(self, task: int | None) -> StepResult:
    try:
      if self.env is None:
        self.env = make(self.name, **self.kwargs)
      obs, info = self.env.reset(task)
      self.lost = None
      return StepResult(obs, 0.0, False, dict(info))
    except Exception as e:
      self._drop()
      self.lost = f"env raised during reset: {_describe(e)}"
      return failed_result(self.lost)

  def step(self, action: str) -> StepResult:
    if self.env is None or self.lost is not None:
      return failed_result(self.lost or "env was stepped before reset; call reset first")
    try:
      obs, reward, done, info = self.env.step(action)
      return StepResult(obs, float(reward), bool(done), dict(info))
    except Exception as e:
      self._drop()
      self.lost = f"env raised during step: {_describe(e)}"
      return failed_result(self.lost)

  def close(self) -> None:
    self._drop()


def _worker_main(
  conn: mp_connection.Connection, name: str, kwargs_list: list[dict[str, Any]]
) -> None:
  """Worker process loop: answers ("reset"|"step", [(local_index, argument), ...]) one env at a time."""
  slots = [_EnvSlot(name, kwargs) for kwargs in kwargs_list]
  try:
    while True:
      try:
        command, payload = conn.recv()
      except (EOFError, KeyboardInterrupt):
        break
      if command == "close":
        break
      for local_index, argument in payload:
        slot = slots[local_index]
        result = slot.reset(argument) if command == "reset" else slot.step(argument)
        conn.send((local_index, result))
  finally:
    for slot in slots:
      slot.close()


class _Worker:
  """Main-process handle on one worker process."""

  def __init__(self, ctx: Any, name: str, kwargs_list: list[dict[str, Any]]):
    self.name = name
    self.kwargs_list = kwargs_list
    self._ctx = ctx
    self.start()

  def start(self) -> None:
    self.conn, child_conn = self._ctx.Pipe(duplex=True)
    self.process = self._ctx.Process(
      target=_worker_main, args=(child_conn, self.name, self.kwargs_list), daemon=True
    )
    self.process.start()
    child_conn.close()

  def kill(self) -> None:
    if self.process.is_alive():
      self.process.kill()
    self.process.join(timeout=5)
    self.conn.close()

  def close(self) -> None:
    try:
      self.conn.send(("close", None))
    except (BrokenPipeError, OSError):
      pass
    self.process.join(timeout=5)
    if self.process.is_alive():
      self.process.kill()
      self.process.join(timeout=5)
    self.conn.close()


class EnvPool:
  """`num_envs` environments built by `envs.make(env_name, **kwargs)`, reset and stepped in batches.

  Args:
    env_name: a registered environment name (see `envs.make`).
    num_envs: how many envs.
    env_kwargs: keyword arguments for every env (a dict), or one dict per env (a list).
    num_workers: worker processes (default: min(num_envs, CPU count)); 0 runs the envs in this process.
    timeout_s: the longest one env may take for one reset or step before its worker is killed.
    start_method: multiprocessing start method for the workers.
  """

  def __init__(
    self,
    env_name: str,
    num_envs: int,
    env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    num_workers: int | None = None,
    timeout_s: float = 120.0,
    start_method: str = "spawn",
  ):
    if num_envs < 1:
      raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if env_kwargs is None or isinstance(env_kwargs, Mapping):
      kwargs_list = [dict(env_kwargs or {}) for _ in range(num_envs)]
    else:
      kwargs_list = [dict(k) for k in env_kwargs]
      if len(kwargs_list) != num_envs:
        raise ValueError(
          f"env_kwargs has {len(kwargs_list)} entries for num_envs={num_envs}; "
          "pass one dict for all envs or exactly one per env"
        )
    if num_workers is None:
      num_workers = min(num_envs, os.cpu_count() or 1)
    if not 0 <= num_workers <= num_envs:
      raise ValueError(f"num_workers must be in [0, num_envs={num_envs}], got {num_workers}")
    self.env_name = env_name
    self.num_envs = num_envs
    self.num_workers = num_workers
    self.timeout_s = float(timeout_s)
    self._last_info: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    self._lost: list[str | None] = [
      None
    ] * num_envs  # episode lost because its worker was restarted
    self.restarts = 0  # worker restarts so far (hangs and crashes)
    if num_workers == 0:
      self._local = [_EnvSlot(env_name, k) for k in kwargs_list]
      self._workers: list[_Worker] = []
    else:
      ctx = mp.get_context(start_method)
      self._local = []
      self._workers = [
        _Worker(ctx, env_name, kwargs_list[w::num_workers]) for w in range(num_workers)
      ]

  def __len__(self) -> int:
    return self.num_envs

  def __enter__(self) -> "EnvPool":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  def reset(
    self, tasks: Sequence[int | None] | None = None, indices: Sequence[int] | None = None
  ) -> list[StepResult]:
    """Resets envs `indices` (default: all) on `tasks` (one per index; None: the env's own choice).

    GRPO groups: give the G envs of a group the same task id. Returns one StepResult per index.
    """
    indices = list(range(self.num_envs)) if indices is None else list(indices)
    tasks = [None] * len(indices) if tasks is None else list(tasks)
    if len(tasks) != len(indices):
      raise ValueError(
        f"got {len(tasks)} tasks for {len(indices)} envs; pass one task per env index"
      )
    for i in indices:
      self._lost[i] = None
    return self._run("reset", indices, tasks)

  def step(self, actions: Sequence[str], indices: Sequence[int] | None = None) -> list[StepResult]:
    """Steps envs `indices` (default: all) with `actions` (one per index). Returns one StepResult per index."""
    indices = list(range(self.num_envs)) if indices is None else list(indices)
    actions = list(actions)
    if len(actions) != len(indices):
      raise ValueError(
        f"got {len(actions)} actions for {len(indices)} envs; pass one action per env index"
      )
    return self._run("step", indices, actions)

  def close(self) -> None:
    for worker in self._workers:
      worker.close()
    self._workers = []
    for slot in self._local:
      slot.close()
    self._local = []

  # -- internals -----------------------------------------------------------------------------

  def _failed(self, index: int, message: str) -> StepResult:
    result = failed_result(message)
    for key in _KEEP_INFO_KEYS:
      if key in self._last_info[index]:
        result.info[key] = self._last_info[index][key]
    return result

  def _record(self, index: int, result: StepResult) -> StepResult:
    if result.failed:
      kept = self._failed(index, result.info["env_error"])
      return kept
    self._last_info[index] = {k: result.info[k] for k in _KEEP_INFO_KEYS if k in result.info}
    return result

  def _run(self, command: str, indices: list[int], arguments: list[Any]) -> list[StepResult]:
    for i in indices:
      if not 0 <= i < self.num_envs:
        raise IndexError(f"env index {i} out of range for a pool of {self.num_envs}")
    if len(set(indices)) != len(indices):
      raise ValueError(f"env indices must be distinct, got {indices}")
    results: dict[int, StepResult] = {}
    if self.num_workers == 0:
      for i, arg in zip(indices, arguments):
        slot = self._local[i]
        results[i] = self._record(i, slot.reset(arg) if command == "reset" else slot.step(arg))
      return [results[i] for i in indices]

    # Envs whose episode was lost to a worker restart answer at once, without a round trip.
    per_worker: dict[int, list[tuple[int, Any]]] = {}
    for i, arg in zip(indices, arguments):
      if command == "step" and self._lost[i] is not None:
        results[i] = self._failed(i, self._lost[i])
        continue
      per_worker.setdefault(i % self.num_workers, []).append((i // self.num_workers, arg))
    pending: dict[int, set[int]] = {}
    deadline: dict[int, float] = {}
    now = time.monotonic()
    for w, payload in per_worker.items():
      try:
        self._workers[w].conn.send((command, payload))
        pending[w] = {local for local, _ in payload}
        deadline[w] = now + self.timeout_s
      except (BrokenPipeError, OSError) as e:
        pending[w] = {local for local, _ in payload}
        self._restart(w, f"worker process was gone ({e!r})", pending[w], results)
        pending.pop(w)

    while pending:
      conn_to_worker = {self._workers[w].conn: w for w in pending}
      timeout = max(0.0, min(deadline[w] for w in pending) - time.monotonic())
      ready = mp_connection.wait(list(conn_to_worker), timeout=timeout)
      for conn in ready:
        w = conn_to_worker[conn]
        try:
          local, result = conn.recv()
        except (EOFError, OSError):
          code = self._workers[w].process.exitcode
          self._restart(w, f"worker process died (exit code {code})", pending.pop(w), results)
          continue
        index = local * self.num_workers + w
        results[index] = self._record(index, result)
        pending[w].discard(local)
        deadline[w] = time.monotonic() + self.timeout_s
        if not pending[w]:
          pending.pop(w)
      now = time.monotonic()
      for w in [w for w in pending if deadline[w] <= now]:
        self._restart(
          w, f"env timed out after {self.timeout_s:g}s during {command}", pending.pop(w), results
        )
    return [results[i] for i in indices]

  def _restart(
    self, w: int, reason: str, pending_locals: set[int], results: dict[int, StepResult]
  ) -> None:
    """Kills and restarts worker `w`; every env on it loses its episode."""
    worker = self._workers[w]
    worker.kill()
    worker.start()
    self.restarts += 1
    for local in range(len(worker.kwargs_list)):
      index = local * self.num_workers + w
      if local in pending_locals:
        results[index] = self._failed(index, reason)
        self._lost[index] = reason
      else:
        # Its episode state died with the worker: the next step reports it, a reset rebuilds it.
        self._lost[index] = f"episode lost: its worker was restarted ({reason})"
