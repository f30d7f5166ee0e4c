"""The per-iteration throughput metrics (sdar_jax.observe.perf): their arithmetic on hand-made
timings, JAX's compile clock, and what the agent loop adds up over a rollout. The metrics of a real
run are checked in test_trainer_run.py. No test asserts how long anything took."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest

from sdar_jax.core.batch import TurnSample
from sdar_jax.observe.perf import (
  COMPILE_EVENTS,
  IterationClock,
  RolloutTimings,
  compile_events,
  perf_metrics,
)
from tests.helpers import QWEN_VOCAB_DECODER


def _sample(prompt_len: int, response_len: int, version: int) -> TurnSample:
  return TurnSample(
    prompt_ids=list(range(1, prompt_len + 1)),
    response_ids=list(range(1, response_len + 1)),
    logprobs=[-1.0] * response_len,
    score=0.0,
    advantage=0.0,
    group_id=0,
    policy_version=version,
    valid=True,
  )


def test_shares_and_throughputs_by_hand():
  """A 10 s iteration: 6 s rollout generating 300 tokens, 1.5 s of it blocked on envs, 2.5 s of
  compiling, a 4 s update over 2,000 tokens; samples of versions 5, 5 and 3 trained at 5."""
  m = perf_metrics(
    iteration_seconds=10.0,
    rollout_seconds=6.0,
    generated_tokens=300,
    env_seconds=1.5,
    compile_seconds=2.5,
    update_seconds=4.0,
    update_tokens=2000,
    staleness=[0, 0, 2],
  )
  assert m == {
    "perf/iteration_seconds": 10.0,
    "perf/rollout_tokens_per_s": 50.0,  # 300 / 6
    "perf/env_wait_share": 0.15,  # 1.5 / 10
    "perf/compile_share": 0.25,  # 2.5 / 10
    "perf/update_tokens_per_s": 500.0,  # 2000 / 4
    "perf/staleness_mean": pytest.approx(2 / 3, rel=1e-12),
    "perf/staleness_max": 2.0,
  }


def test_no_update_and_no_samples_leave_their_metrics_out():
  m = perf_metrics(
    iteration_seconds=2.0,
    rollout_seconds=2.0,
    generated_tokens=0,
    env_seconds=2.0,
    compile_seconds=0.0,
  )
  assert m == {
    "perf/iteration_seconds": 2.0,
    "perf/rollout_tokens_per_s": 0.0,
    "perf/env_wait_share": 1.0,
    "perf/compile_share": 0.0,
  }
  zero = perf_metrics(
    iteration_seconds=0.0,
    rollout_seconds=0.0,
    generated_tokens=5,
    env_seconds=0.0,
    compile_seconds=0.0,
    update_seconds=0.0,
    update_tokens=7,
  )
  assert all(math.isfinite(v) for v in zero.values())  # no division by a zero duration


def test_bad_inputs_are_named():
  base = {"iteration_seconds": 1.0, "rollout_seconds": 1.0, "generated_tokens": 1}
  base["env_seconds"] = 0.0
  with pytest.raises(ValueError, match="compile_seconds=-0.5"):
    perf_metrics(**base, compile_seconds=-0.5)
  with pytest.raises(ValueError, match="staleness -1 < 0"):
    perf_metrics(**base, compile_seconds=0.0, staleness=[0, -1])


def test_iteration_clock_counts_tokens_and_staleness_from_the_samples():
  """Update tokens are prompt + response of the trained samples; staleness is the current version
  minus each sample's version; the rollout's token count comes from its RolloutTimings."""
  clock = IterationClock()
  clock.rollout.generated_tokens = 12
  clock.rollout.env_seconds = 0.0
  samples = [_sample(10, 4, version=7), _sample(6, 2, version=6), _sample(3, 1, version=7)]
  m = clock.metrics(samples, current_version=7, rollout_seconds=1.0, update_seconds=2.0)
  assert m["perf/rollout_tokens_per_s"] == 12.0
  assert m["perf/update_tokens_per_s"] == (14 + 8 + 4) / 2.0
  assert m["perf/staleness_mean"] == pytest.approx(1 / 3, rel=1e-12)
  assert m["perf/staleness_max"] == 1.0
  assert 0.0 <= m["perf/env_wait_share"] <= 1.0 and 0.0 <= m["perf/compile_share"] <= 1.0


def test_compile_listener_counts_compiles_not_cached_calls():
  """The listener behind perf/compile_share sees a first call's trace, lowering and compile, and
  nothing of calls served from the cache (counted, not timed: no test reads a clock)."""
  x = jnp.arange(7.0)
  start = compile_events()

  @jax.jit
  def f(x):
    return jnp.tanh(x) * 3.0 + 1.0

  f(x).block_until_ready()  # traces, lowers and compiles
  after_compile = compile_events()
  assert after_compile - start >= len(COMPILE_EVENTS)  # each phase at least once
  f(x).block_until_ready()  # cached executable: nothing compiled
  f(x).block_until_ready()
  assert compile_events() == after_compile


@pytest.mark.slow
def test_agent_loop_adds_up_env_time_and_generated_tokens():
  """The rollout's RolloutTimings: one sampler call per turn, every returned response token
  counted (its seconds are timings: bench/rollout.py prints them)."""
  from envs import EnvPool
  from envs.alfworld import AlfworldAdapter
  from sdar_jax.core.sampling import Sampler, SamplingParams
  from sdar_jax.models import init_params
  from sdar_jax.rollout import AgentLoop
  from sdar_jax.text.chat_templates import ChatTemplate
  from sdar_jax.text.tokenizer import Tokenizer

  config = QWEN_VOCAB_DECODER
  params = init_params(config, jax.random.key(0))
  with EnvPool("dummy", 3, env_kwargs={"max_steps": 2}, num_workers=0) as pool:
    loop = AgentLoop(
      pool,
      AlfworldAdapter(),
      Sampler(config),
      Tokenizer.bundled_qwen(),
      ChatTemplate.builtin("qwen3"),
      SamplingParams(max_new_tokens=5, temperature=1.0),
      max_turns=2,
      progress=False,
    )
    timings = RolloutTimings()
    episodes = loop.run(params, [0, 1, 2], [0, 0, 1], jax.random.key(1), timings=timings)
  turns = [t for ep in episodes for t in ep.turns]
  assert len(turns) == 6  # no word said: every episode plays both turns
  assert timings.sampler_calls == 2
  assert timings.generated_tokens == sum(len(t.response_ids) for t in turns) > 0
