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
  A worker's own start (a spawned interpreter importing this package) does not count toward
  `timeout_s`: the clock of its first request starts when it reports ready, and the start has its
  own limit, `startup_timeout_s`.
The pool and the training run go on. Neither limit counts time this process spent stopped
(SIGSTOP, Ctrl-Z, a paused container or VM): the deadlines run on an `AwakeClock`, so a run
suspended in the middle of a step and continued later finds its envs where it left them instead
of every busy worker declared hung.

Non-blocking steps: `step_async(actions, indices)` sends the actions and returns an `EnvRequest`
at once; `wait(request)` returns its results. Several requests on disjoint envs may be out at
the same time (the agent loop steps one half of its episodes while it decodes the other); a
worker answers them in the order they were sent, each result tagged with its env, and while the
pool waits for one request it also collects the others' results and watches their workers for
hangs and deaths, with the rules above (a restart fails every env of the worker that has a
request out). `step` is `wait(step_async(...))`. A request for an env that is still in an earlier
request waits for the earlier one first. With `num_workers=0` a request runs at once, in
`step_async` (nothing overlaps).

Workers are started with the "spawn" method by default: forking a process that already runs JAX
threads is unsafe. Envs are therefore built inside the workers from a registered name and
keyword arguments (`envs.make(name, **kwargs)`), which is all a worker needs.
With `num_workers=0` the envs run in the calling process (no isolation from hangs; handy for
debugging).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from envs.base import StepResult, TextEnv, failed_result, import_user_modules, make

__all__ = ["AwakeClock", "EnvPool", "EnvRequest"]

_KEEP_INFO_KEYS = (
  "task_type",
  "gamefile",
  "task",
)  # copied from an env's last info into its error results
_READY = "ready"  # a worker's first message: started, imports done, waiting for requests


def _describe(exc: BaseException) -> str:
  tb = traceback.extract_tb(exc.__traceback__)
  where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
  return f"{type(exc).__name__}: {exc}{where}"


class AwakeClock:
  """Monotonic seconds that leave out the time this process was stopped.

  `time.monotonic()` keeps running while a process is stopped (SIGSTOP, Ctrl-Z, a frozen
  container), so a deadline set before the stop has passed when the process continues, though
  nothing it waited for had a chance to run. Here a daemon thread wakes every `tick` seconds; a
  wake-up later than `tick + grace` means the process did not run meanwhile, and the excess is
  left out of `now()`. Between wake-ups `now()` never runs more than `tick + grace` past the
  last one, so a caller that continues before the thread does already reads the stopped clock.
  Time the whole process lost for another reason (a GIL held for longer than `grace`, a machine
  so loaded that the thread waits that long for a core) is left out the same way: it only makes
  a deadline later. `now()` never goes backwards.
  """

  def __init__(self, tick: float = 0.5, grace: float = 2.0):
    if not (tick > 0 and grace >= 0):
      raise ValueError(f"AwakeClock needs tick > 0 and grace >= 0, got tick={tick}, grace={grace}")
    self.tick = float(tick)
    self.grace = float(grace)
    self._lock = threading.Lock()
    self._last = time.monotonic()  # the thread's last wake-up
    self._skipped = 0.0  # seconds left out so far
    self.pid = os.getpid()  # the process whose thread keeps it
    threading.Thread(target=self._run, name="sdar-awake-clock", daemon=True).start()

  @property
  def skipped(self) -> float:
    """Seconds left out so far: `time.monotonic()` minus `now()`."""
    with self._lock:
      t = time.monotonic()
      return t - (min(t, self._last + self.tick + self.grace) - self._skipped)

  def _run(self) -> None:
    while True:
      time.sleep(self.tick)
      now = time.monotonic()
      with self._lock:
        late = now - self._last - self.tick
        if late > self.grace:
          self._skipped += late - self.grace
        self._last = now

  def now(self) -> float:
    with self._lock:
      return min(time.monotonic(), self._last + self.tick + self.grace) - self._skipped


_DEFAULT_CLOCK: AwakeClock | None = None
_DEFAULT_CLOCK_LOCK = threading.Lock()


def default_clock() -> Callable[[], float]:
  """The process's shared `AwakeClock().now` (one thread for all pools), started on first use,
  and again in a forked child (which inherits the clock but not its thread)."""
  global _DEFAULT_CLOCK
  with _DEFAULT_CLOCK_LOCK:
    if _DEFAULT_CLOCK is None or _DEFAULT_CLOCK.pid != os.getpid():
      _DEFAULT_CLOCK = AwakeClock()
    return _DEFAULT_CLOCK.now


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
  """Worker process loop: answers ("reset"|"step", [(local_index, argument), ...]) one env at a time.

  Ctrl-C reaches every process of the terminal's group: a worker ignores it and plays on, so the
  trainer can finish its iteration and save (it closes the workers itself). SIGTERM (a scheduler
  stopping the whole job) ends the worker quietly; the trainer then abandons the iteration."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, _quiet_exit)
  import_user_modules()  # the command's --imports: an env registered in the user's package
  slots = [_EnvSlot(name, kwargs) for kwargs in kwargs_list]
  try:
    conn.send(_READY)
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
  except (BrokenPipeError, ConnectionResetError, SystemExit):
    pass  # the trainer is gone or stopping: nothing to answer, nothing to report
  finally:
    for slot in slots:
      slot.close()


def _quiet_exit(signum: int, frame: Any) -> None:
  raise SystemExit(0)


class _Worker:
  """Main-process handle on one worker process."""

  def __init__(self, ctx: Any, name: str, kwargs_list: list[dict[str, Any]]):
    self.name = name
    self.kwargs_list = kwargs_list
    self._ctx = ctx
    self.start()

  def start(self) -> None:
    self.ready = False  # until its _READY message is read
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


class EnvRequest:
  """A reset or step sent to some envs of an `EnvPool`; `EnvPool.wait(request)` returns its
  results, one StepResult per index, in the order of `indices`."""

  def __init__(self, command: str, indices: list[int]):
    self.command = command
    self.indices = indices
    self.results: dict[int, StepResult] = {}

  @property
  def done(self) -> bool:
    return len(self.results) == len(self.indices)


class EnvPool:
  """`num_envs` environments built by `envs.make(env_name, **kwargs)`, reset and stepped in batches.

  Args:
    env_name: a registered environment name (see `envs.make`).
    num_envs: how many envs.
    env_kwargs: keyword arguments for every env (a dict), or one dict per env (a list).
    num_workers: worker processes (default: min(num_envs, CPU count)); 0 runs the envs in this process.
    timeout_s: the longest one env may take for one reset or step before its worker is killed.
    start_method: multiprocessing start method for the workers.
    startup_timeout_s: the longest a worker process may take to start (interpreter, imports)
      before it is killed and started again; its first request's `timeout_s` starts after that.
    clock: the seconds both limits are measured in (default: the shared `AwakeClock`, which
      leaves out time this process was stopped); `time.monotonic` counts every second.
  """

  def __init__(
    self,
    env_name: str,
    num_envs: int,
    env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    num_workers: int | None = None,
    timeout_s: float = 120.0,
    start_method: str = "spawn",
    startup_timeout_s: float = 300.0,
    clock: Callable[[], float] | None = None,
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
    for name, value in (("timeout_s", timeout_s), ("startup_timeout_s", startup_timeout_s)):
      if not value > 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
    if num_workers is None:
      num_workers = min(num_envs, os.cpu_count() or 1)
    if not 0 <= num_workers <= num_envs:
      raise ValueError(f"num_workers must be in [0, num_envs={num_envs}], got {num_workers}")
    self.env_name = env_name
    self.num_envs = num_envs
    self.num_workers = num_workers
    self.timeout_s = float(timeout_s)
    self.startup_timeout_s = float(startup_timeout_s)
    self._last_info: list[dict[str, Any]] = [{} for _ in range(num_envs)]
    self._lost: list[str | None] = [
      None
    ] * num_envs  # episode lost because its worker was restarted
    self.restarts = 0  # worker restarts so far (hangs and crashes)
    # Per worker: the request each env with a result still to come belongs to (by local index),
    # and when the worker is declared hung if no result arrives.
    self._out: list[dict[int, EnvRequest]] = [{} for _ in range(num_workers)]
    self._deadline: list[float] = [0.0] * num_workers
    self._clock = clock or (default_clock() if num_workers else time.monotonic)
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

  def __enter__(self) -> EnvPool:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()

  def reset(
    self,
    tasks: Sequence[int | None] | None = None,
    indices: Sequence[int] | None = None,
    progress: Callable[[int], None] | None = None,
  ) -> list[StepResult]:
    """Resets envs `indices` (default: all) on `tasks` (one per index; None: the env's own choice).

    GRPO groups: give the G envs of a group the same task id. Returns one StepResult per index.
    `progress`, when given, is called with the number of envs reset so far as results arrive (a
    reset of hundreds of generated games can take minutes).
    """
    indices = list(range(self.num_envs)) if indices is None else list(indices)
    tasks = [None] * len(indices) if tasks is None else list(tasks)
    if len(tasks) != len(indices):
      raise ValueError(
        f"got {len(tasks)} tasks for {len(indices)} envs; pass one task per env index"
      )
    return self.wait(self._submit("reset", indices, tasks), progress)

  def step(self, actions: Sequence[str], indices: Sequence[int] | None = None) -> list[StepResult]:
    """Steps envs `indices` (default: all) with `actions` (one per index). Returns one StepResult per index."""
    return self.wait(self.step_async(actions, indices))

  def step_async(self, actions: Sequence[str], indices: Sequence[int] | None = None) -> EnvRequest:
    """`step` without waiting: sends `actions` to envs `indices` (default: all) and returns the
    request; `wait(request)` gives its results. Other requests may be sent meanwhile."""
    indices = list(range(self.num_envs)) if indices is None else list(indices)
    actions = list(actions)
    if len(actions) != len(indices):
      raise ValueError(
        f"got {len(actions)} actions for {len(indices)} envs; pass one action per env index"
      )
    return self._submit("step", indices, actions)

  def wait(
    self, request: EnvRequest, progress: Callable[[int], None] | None = None
  ) -> list[StepResult]:
    """The results of `request` (a `step_async`), one per index, once all have arrived (or
    failed: hung or dead workers are restarted as in `step`). `progress`: called with the number
    of results in so far after each arrival."""
    while not request.done:
      self._collect()
      if progress is not None and not request.done:
        progress(len(request.results))
    if progress is not None:
      progress(len(request.results))
    return [request.results[i] for i in request.indices]

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

  def _submit(self, command: str, indices: list[int], arguments: list[Any]) -> EnvRequest:
    """Sends `command` to envs `indices` and returns the request without waiting for results."""
    for i in indices:
      if not 0 <= i < self.num_envs:
        raise IndexError(f"env index {i} out of range for a pool of {self.num_envs}")
    if len(set(indices)) != len(indices):
      raise ValueError(f"env indices must be distinct, got {indices}")
    request = EnvRequest(command, indices)
    if self.num_workers == 0:
      for i, arg in zip(indices, arguments):
        slot = self._local[i]
        result = slot.reset(arg) if command == "reset" else slot.step(arg)
        request.results[i] = self._record(i, result)
      return request

    for i in indices:  # an env answers one request at a time
      earlier = self._out[i % self.num_workers].get(i // self.num_workers)
      if earlier is not None:
        self.wait(earlier)
    if command == "reset":  # a reset starts a new episode, on a rebuilt env if it was lost
      for i in indices:
        self._lost[i] = None
    # Envs whose episode was lost to a worker restart answer at once, without a round trip.
    per_worker: dict[int, list[tuple[int, Any]]] = {}
    for i, arg in zip(indices, arguments):
      if command == "step" and self._lost[i] is not None:
        request.results[i] = self._failed(i, self._lost[i])
        continue
      per_worker.setdefault(i % self.num_workers, []).append((i // self.num_workers, arg))
    now = self._clock()
    for w, payload in per_worker.items():
      if not self._out[w]:  # an idle worker starts on it now; a busy one after its earlier work
        self._deadline[w] = now + self._time_allowed(w)
      for local, _ in payload:
        self._out[w][local] = request
      try:
        self._workers[w].conn.send((command, payload))
      except (BrokenPipeError, OSError) as e:
        code = self._workers[w].process.exitcode
        gone = f"died (exit code {code})" if code is not None else f"was gone ({e!r})"
        self._restart(w, f"worker process {gone}")
    return request

  def _collect(self) -> None:
    """Waits for the next results of any worker with requests out (until the earliest deadline),
    files them under their requests, and restarts the workers that died or passed their
    deadline."""
    busy = [w for w in range(self.num_workers) if self._out[w]]
    if not busy:
      raise RuntimeError("EnvPool.wait on a request with no results to come; this is a bug.")
    conn_to_worker = {self._workers[w].conn: w for w in busy}
    # (in clock seconds: a stop during the wait ends it before the deadline by the clock, and
    # the next round waits for the rest)
    timeout = max(0.0, min(self._deadline[w] for w in busy) - self._clock())
    for conn in mp_connection.wait(list(conn_to_worker), timeout=timeout):
      w = conn_to_worker[conn]
      try:
        self._receive(w, conn.recv())
      except (EOFError, OSError):
        self._restart(w, f"worker process died (exit code {self._workers[w].process.exitcode})")
        continue
      # The worker started, or moved on to its next env: that one gets the whole timeout.
      self._deadline[w] = self._clock() + self.timeout_s
    now = self._clock()
    for w in busy:
      # (a worker whose pipe became readable meanwhile answered: the next round reads it)
      if self._out[w] and self._deadline[w] <= now and not self._workers[w].conn.poll():
        if not self._workers[w].ready:
          self._restart(w, f"worker process did not start within {self.startup_timeout_s:g}s")
          continue
        command = next(iter(self._out[w].values())).command  # the oldest request still out
        self._restart(w, f"env timed out after {self.timeout_s:g}s during {command}")

  def _time_allowed(self, w: int) -> float:
    """Seconds worker `w` has from now for its next answer: `timeout_s` once it has started,
    `startup_timeout_s` before (then `timeout_s` from its ready message on)."""
    return self.timeout_s if self._workers[w].ready else self.startup_timeout_s

  def _receive(self, w: int, message: Any) -> None:
    """One message of worker `w`: its ready signal, or a result (filed under its request)."""
    if message == _READY:
      self._workers[w].ready = True
    else:
      self._file(w, *message)

  def _file(self, w: int, local: int, result: StepResult) -> None:
    """Files worker `w`'s result for its env `local` under the request it belongs to."""
    index = local * self.num_workers + w
    self._out[w].pop(local).results[index] = self._record(index, result)

  def _restart(self, w: int, reason: str) -> None:
    """Kills and restarts worker `w`; every env on it loses its episode, and those with a
    request out get a failed result now (after the results it sent before are filed: with
    several requests out, earlier ones may still sit unread in its pipe)."""
    worker = self._workers[w]
    try:
      while self._out[w] and worker.conn.poll():
        self._receive(w, worker.conn.recv())
    except (EOFError, OSError):  # all it sent has been read
      pass
    worker.kill()
    worker.start()
    self.restarts += 1
    out, self._out[w] = self._out[w], {}
    for local in range(len(worker.kwargs_list)):
      index = local * self.num_workers + w
      if local in out:
        out[local].results[index] = self._failed(index, reason)
        self._lost[index] = reason
      else:
        # Its episode state died with the worker: the next step reports it, a reset rebuilds it.
        self._lost[index] = f"episode lost: its worker was restarted ({reason})"
