"""Where an iteration's wall time goes: the `perf/*` metrics of each training iteration.

    clock = IterationClock()                      # at the top of the iteration
    episodes = loop.run(..., timings=clock.rollout)
    ...                                           # samples, update
    metrics.update(clock.metrics(samples, current_version, rollout_s, update_s))

Outputs `perf/iteration_seconds`, `perf/rollout_tokens_per_s`, `perf/update_tokens_per_s`,
`perf/env_wait_share`, `perf/compile_share`, `perf/staleness_mean` and `perf/staleness_max`
(`perf_metrics` does the arithmetic), from host wall times and JAX's compile events: no extra
device syncs. What each one counts: docs/design.md, "Iteration metrics".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import jax

from sdar_jax.rollout.trajectory import RolloutTimings

# JAX's monitoring events for the phases of compiling a top-level computation (jax._src.dispatch).
COMPILE_EVENTS = (
  "/jax/core/compile/jaxpr_trace_duration",
  "/jax/core/compile/jaxpr_to_mlir_module_duration",
  "/jax/core/compile/backend_compile_duration",
)

_compile_lock = threading.Lock()
_compile_total = 0.0
_compile_events = 0
_listening = False


def _on_duration_event(event: str, duration_secs: float, **kwargs) -> None:
  global _compile_total, _compile_events
  del kwargs
  if event in COMPILE_EVENTS:
    with _compile_lock:
      _compile_total += float(duration_secs)
      _compile_events += 1


def _listen() -> None:
  global _listening
  if not _listening:
    jax.monitoring.register_event_duration_secs_listener(_on_duration_event)
    _listening = True


def compile_seconds() -> float:
  """Seconds JAX has spent tracing, lowering and compiling in this process since the first call
  of this function or of `compile_events` (which start listening to its monitoring events); take
  differences."""
  with _compile_lock:
    _listen()
    return _compile_total


def compile_events() -> int:
  """How many of JAX's compile-phase events (trace, lower, backend compile) `compile_seconds`
  has added up so far: the same listener, counted instead of timed."""
  with _compile_lock:
    _listen()
    return _compile_events


def _per_second(amount: float, seconds: float) -> float:
  return amount / seconds if seconds > 0 else 0.0


def perf_metrics(
  *,
  iteration_seconds: float,
  rollout_seconds: float,
  generated_tokens: int,
  env_seconds: float,
  compile_seconds: float,
  update_seconds: float | None = None,
  update_tokens: int = 0,
  staleness: Sequence[int] = (),
) -> dict[str, float]:
  """The `perf/*` metrics of one iteration from its timings (docs/design.md, "Iteration
  metrics"). Without an update (`update_seconds` None) there is no update throughput; without
  trained samples no staleness."""
  named = {
    "iteration_seconds": iteration_seconds,
    "rollout_seconds": rollout_seconds,
    "env_seconds": env_seconds,
    "compile_seconds": compile_seconds,
    "update_seconds": update_seconds or 0.0,
    "generated_tokens": generated_tokens,
    "update_tokens": update_tokens,
  }
  for name, value in named.items():
    if value < 0:
      raise ValueError(f"{name}={value} is negative; timings and token counts are >= 0.")
  if any(s < 0 for s in staleness):
    raise ValueError(
      f"staleness {min(staleness)} < 0: a sample's policy_version is newer than the update's "
      "parameters. Tag samples with the version of the parameters that sampled them."
    )
  m = {
    "perf/iteration_seconds": float(iteration_seconds),
    "perf/rollout_tokens_per_s": _per_second(generated_tokens, rollout_seconds),
    "perf/env_wait_share": _per_second(env_seconds, iteration_seconds),
    "perf/compile_share": _per_second(compile_seconds, iteration_seconds),
  }
  if update_seconds is not None:
    m["perf/update_tokens_per_s"] = _per_second(update_tokens, update_seconds)
  if staleness:
    m["perf/staleness_mean"] = float(sum(staleness)) / len(staleness)
    m["perf/staleness_max"] = float(max(staleness))
  return m


class IterationClock:
  """Started at the top of a training iteration: its wall clock, JAX's compile clock and the
  rollout's `RolloutTimings` (pass `clock.rollout` to `AgentLoop.run`)."""

  def __init__(self):
    self.start = time.perf_counter()
    self.compile_start = compile_seconds()
    self.rollout = RolloutTimings()

  def metrics(
    self,
    samples: Sequence,
    current_version: int,
    rollout_seconds: float,
    update_seconds: float | None = None,
  ) -> dict[str, float]:
    """`perf_metrics` now: `samples` are the iteration's trained `TurnSample`s (their prompt
    and response tokens are the update's tokens), `current_version` the policy version of the
    parameters the update starts from."""
    return perf_metrics(
      iteration_seconds=time.perf_counter() - self.start,
      rollout_seconds=rollout_seconds,
      generated_tokens=self.rollout.generated_tokens,
      env_seconds=self.rollout.env_seconds,
      compile_seconds=compile_seconds() - self.compile_start,
      update_seconds=update_seconds,
      update_tokens=sum(len(s.prompt_ids) + len(s.response_ids) for s in samples),
      staleness=[current_version - s.policy_version for s in samples],
    )
