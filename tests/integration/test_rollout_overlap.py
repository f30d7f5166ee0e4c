"""Env steps overlapping generation inside a rollout (`rollout.overlap="halves"`): the pool's
non-blocking steps, identical episodes to the serial loop for the same key, a bounded number of
compiled sampler shapes, env failures handled as in the serial loop, and the config check.

The rollouts are the agent-loop tests' one-layer model on the full Qwen vocabulary (the bundled
tokenizer drives it), random weights, on the dummy say-the-word env in real worker processes, with
a one-line user message so the prompts stay short.
"""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

import envs
from envs.base import EpisodeView
from envs.dummy import WORDS
from sdar_jax.core.batch import batch_bucket, prompt_bucket
from sdar_jax.core.sampling import Sampler, SamplingParams
from sdar_jax.models import init_params
from sdar_jax.rollout import AgentLoop
from sdar_jax.rollout.agent_loop import split_halves
from sdar_jax.rollout.worker import RolloutCancelled, StoppablePool
from sdar_jax.text.chat_templates import ChatTemplate
from sdar_jax.text.tokenizer import Tokenizer
from tests.helpers import QWEN_VOCAB_DECODER, tiny_run_config

MAX_TURNS = 3
# 8 episodes in 4 GRPO groups of 2 (halves: episodes 0-3 and 4-7); the dummy env ends an episode
# after its max_steps, so episodes end after 1, 2 or 3 turns.
TASKS = [0, 0, 1, 1, 2, 2, 3, 3]
GROUPS = [10, 10, 11, 11, 12, 12, 13, 13]
MAX_STEPS = [1, 3, 2, 3, 3, 1, 2, 3]
SAMPLING = SamplingParams(max_new_tokens=4, temperature=1.0)


class _WordAdapter:
  """One short user line per turn: the observation (prompts of about 20 tokens)."""

  def user_text(self, view: EpisodeView, history_length: int) -> str:
    return f"{view.observation} Answer with one word."

  def project(self, text: str) -> tuple[str, bool]:
    return text.strip(), bool(text.strip())

  def skill_query(self, view: EpisodeView) -> str:
    return view.task


class _ShapeRecorder:
  """The sampler, recording each call's bucketed shapes (`GenerationResult.shapes`) and row ids."""

  def __init__(self, sampler: Sampler, events: list | None = None):
    self.sampler = sampler
    self.collective = False
    self.shapes: list[tuple] = []
    self.events = events

  def generate(self, params, prompts, sampling, rng=None, share_prefix=True, row_ids=None):
    out = self.sampler.generate(params, prompts, sampling, rng, share_prefix, row_ids=row_ids)
    self.shapes.append(tuple(sorted(out.shapes.items())))
    if self.events is not None:
      self.events.append(("generate", tuple(row_ids)))
    return out


class _EventPool:
  """An EnvPool that logs its step_async / wait calls (which envs) in `events`."""

  def __init__(self, pool, events: list):
    self._pool, self.events = pool, events

  def __len__(self) -> int:
    return len(self._pool)

  def reset(self, tasks, indices, progress=None):
    return self._pool.reset(tasks, indices, progress)

  def step(self, actions, indices):
    self.events.append(("step", tuple(indices)))
    return self._pool.step(actions, indices)

  def step_async(self, actions, indices):
    self.events.append(("step_async", tuple(indices)))
    return self._pool.step_async(actions, indices)

  def wait(self, request):
    self.events.append(("wait", tuple(request.indices)))
    return self._pool.wait(request)


def _loop(pool, sampler, overlap: str) -> AgentLoop:
  return AgentLoop(
    pool,
    _WordAdapter(),
    sampler,
    Tokenizer.bundled_qwen(),
    ChatTemplate.builtin("qwen3"),
    SAMPLING,
    max_turns=MAX_TURNS,
    progress=False,
    overlap=overlap,
  )


def _assert_same_episodes(serial, halves) -> None:
  """Same turns, prompts, tokens, actions, rewards and outcomes; log-probs equal up to float
  rounding (the same computation in batches of other sizes)."""
  assert len(serial) == len(halves)
  for a, b in zip(serial, halves):
    assert (a.env_index, a.task_id, a.group_id) == (b.env_index, b.task_id, b.group_id)
    assert (a.reward, a.won, a.done, a.env_error is None) == (
      b.reward,
      b.won,
      b.done,
      b.env_error is None,
    )
    assert len(a.turns) == len(b.turns)
    for s, h in zip(a.turns, b.turns):
      assert s.prompt_ids == h.prompt_ids and s.response_ids == h.response_ids
      assert (s.action, s.valid, s.finish_reason) == (h.action, h.valid, h.finish_reason)
      # |log p| <= ln(151936) ~ 12 in float32: 1e-4 is far above rounding, far below any change
      np.testing.assert_allclose(s.logprobs, h.logprobs, rtol=0, atol=1e-4)


# ------------------------------------------------------------------------------ the env pool
@pytest.mark.parametrize("num_workers", [0, 2])
def test_step_async_requests_out_together_get_their_own_results(num_workers):
  with envs.EnvPool("dummy", 4, num_workers=num_workers, timeout_s=30) as pool:
    pool.reset(tasks=[0, 1, 2, 3])
    first = pool.step_async([WORDS[0], "nope"], [0, 1])
    second = pool.step_async(["nope", WORDS[3]], [2, 3])
    # Waited for in the other order: each request gets its own envs' results.
    assert [r.info["won"] for r in pool.wait(second)] == [False, True]
    assert [r.info["won"] for r in pool.wait(first)] == [True, False]
    assert pool.wait(first)[0].info["steps"] == 1  # waiting again returns the same results
    # A request for an env whose earlier request is still out runs after it.
    earlier = pool.step_async(["nope"], [1])
    later = pool.step_async([WORDS[1]], [1])
    assert pool.wait(later)[0].info["steps"] == 3 and pool.wait(later)[0].info["won"]
    assert pool.wait(earlier)[0].info["steps"] == 2 and not pool.wait(earlier)[0].info["won"]


def test_a_worker_death_fails_every_request_out_on_it():
  # Worker 0 holds envs 0 and 2, worker 1 envs 1 and 3; env 2 takes its process down on step 1,
  # after env 0 (an earlier request) has stepped on the same worker.
  kwargs = [{}, {}, {"exit_on_step": 1}, {}]
  with envs.EnvPool("dummy", 4, env_kwargs=kwargs, num_workers=2, timeout_s=30) as pool:
    pool.reset(tasks=[0, 1, 2, 3])
    first = pool.step_async([WORDS[0], "x"], [0, 1])
    second = pool.step_async(["x", "x"], [2, 3])
    late = pool.wait(second)
    assert late[0].failed and "died" in late[0].info["env_error"] and not late[1].failed
    early = pool.wait(first)
    assert early[0].info["won"] and not early[1].failed
    assert pool.restarts == 1
    lost = pool.step(["x"], indices=[0])[0]  # its episode died with the worker
    assert lost.failed and "worker was restarted" in lost.info["env_error"]
    assert not any(r.failed for r in pool.reset(tasks=[0, 2], indices=[0, 2]))


def test_a_hang_behind_another_request_times_out_and_the_pool_goes_on():
  kwargs = [{}, {"hang_on_step": 1}]
  with envs.EnvPool("dummy", 2, env_kwargs=kwargs, num_workers=1, timeout_s=1.0) as pool:
    pool.reset(tasks=[0, 1])
    first = pool.step_async([WORDS[0]], [0])
    second = pool.step_async(["x"], [1])
    assert pool.wait(first)[0].info["won"]
    hung = pool.wait(second)[0]
    assert hung.failed and "timed out" in hung.info["env_error"] and pool.restarts == 1
    assert not pool.reset(tasks=[1], indices=[1])[0].failed


def test_stoppable_pool_forwards_the_non_blocking_steps_until_stopped():
  stop = threading.Event()
  with envs.EnvPool("dummy", 2, num_workers=0) as raw:
    pool = StoppablePool(raw, stop)
    pool.reset([0, 1], [0, 1])
    request = pool.step_async([WORDS[0], "x"], [0, 1])
    assert [r.info["won"] for r in pool.wait(request)] == [True, False]
    stop.set()
    for call in (lambda: pool.step_async(["x"], [1]), lambda: pool.wait(request)):
      with pytest.raises(RolloutCancelled):
        call()


# ------------------------------------------------------------------------------ the halves
def test_halves_cut_at_the_group_boundary_nearest_the_middle():
  assert split_halves(GROUPS) == [[0, 1, 2, 3], [4, 5, 6, 7]]
  assert split_halves([0, 0, 0, 1, 1, 2]) == [[0, 1, 2], [3, 4, 5]]
  assert split_halves([0, 0, 0, 0, 0, 1]) == [[0, 1, 2, 3, 4], [5]]
  assert split_halves([4, 4, 4, 4]) == [[0, 1], [2, 3]]  # one group: the middle
  assert split_halves([7]) == [[0]] and split_halves([]) == [[]]


@pytest.fixture(scope="module")
def model():
  config = QWEN_VOCAB_DECODER
  return config, init_params(config, jax.random.key(0))


@pytest.fixture(scope="module")
def rollouts(model):
  """One fresh sampler: two overlapped rollouts (keys 1 and 2; compilations counted after
  each), then the serial rollout of key 1; and, on envs that raise or die, serial and
  overlapped rollouts of key 3."""
  config, params = model
  sampler = Sampler(config)
  recorder = _ShapeRecorder(sampler)
  got = {}
  kwargs = [{"max_steps": m} for m in MAX_STEPS]
  with envs.EnvPool("dummy", 8, env_kwargs=kwargs, num_workers=2, timeout_s=60) as pool:
    events: list = []
    recorder.events = events
    overlapped = _loop(_EventPool(pool, events), recorder, "halves")
    got["halves"] = overlapped.run(params, TASKS, GROUPS, jax.random.key(1))
    recorder.events = None
    got["events"] = events
    got["compilations"] = [sampler.num_compilations]
    got["halves_2"] = _loop(pool, recorder, "halves").run(params, TASKS, GROUPS, jax.random.key(2))
    got["compilations"].append(sampler.num_compilations)
    got["halves_shapes"] = set(recorder.shapes)  # of both overlapped rollouts
    got["serial"] = _loop(pool, sampler, "off").run(params, TASKS, GROUPS, jax.random.key(1))
  # Env 1 (first half) raises on its 2nd step; env 6 (second half) kills its worker on its 2nd
  # step, and with it the episodes of envs 0, 2 and 4 (worker 0 of 2 holds the even envs).
  failing = [{"max_steps": 3} for _ in TASKS]
  failing[1]["fail_on_step"] = 2
  failing[6]["exit_on_step"] = 2
  with envs.EnvPool("dummy", 8, env_kwargs=failing, num_workers=2, timeout_s=60) as pool:
    for mode in ("off", "halves"):
      got[f"failing_{mode}"] = _loop(pool, sampler, mode).run(
        params, TASKS, GROUPS, jax.random.key(3)
      )
    got["restarts"] = pool.restarts
  return got


@pytest.mark.slow
def test_overlapped_episodes_equal_the_serial_ones(rollouts):
  serial, halves = rollouts["serial"], rollouts["halves"]
  _assert_same_episodes(serial, halves)
  assert [len(ep.turns) for ep in serial] == MAX_STEPS  # ended at different turns
  assert all(ep.env_error is None for ep in serial)
  # Each episode has its own random stream: the two episodes of a group share every prompt
  # (same task, same observations) yet sample different responses.
  assert serial[1].turns[0].prompt_ids == serial[0].turns[0].prompt_ids
  assert serial[1].turns[0].response_ids != serial[0].turns[0].response_ids
  # Another key, other episodes.
  assert [t.response_ids for t in rollouts["halves_2"][1].turns] != [
    t.response_ids for t in halves[1].turns
  ]


@pytest.mark.slow
def test_one_half_steps_its_envs_while_the_other_half_decodes(rollouts):
  first, second = (0, 1, 2, 3), (4, 5, 6, 7)
  events = rollouts["events"]
  out = {first: False, second: False}  # whether the half has an env request out
  overlapped = []
  decodes = 0
  for kind, rows in events:
    assert kind != "step"  # the overlapped loop never blocks on a step
    if kind == "generate":  # rows: the sampler's row_ids; both halves play all 3 turns here,
      half = (first, second)[decodes % 2]  # so the halves decode in alternation
      decodes += 1
      assert not out[half]  # a half decodes only once its envs have answered
      overlapped.append(out[second if half == first else first])
    else:  # rows: env indices
      half = first if set(rows) <= set(first) else second
      out[half] = kind == "step_async"
  # Every decode but the very first runs while the other half's envs step.
  assert overlapped == [False] + [True] * (len(overlapped) - 1)
  # Finished episodes leave their half's batch (envs 0 and 5 end after 1 turn, 2 and 6 after 2).
  sent = [rows for kind, rows in events if kind == "step_async"]
  assert sent == [first, second, (1, 2, 3), (4, 6, 7), (1, 3), (4, 7)]
  # Each half's rows draw the streams of their rows in the serial loop's one batch: the ranks
  # among the episodes playing that turn (turn 1: envs 1-4, 6, 7 -> rows 0-5).
  decoded = [rows for kind, rows in events if kind == "generate"]
  assert decoded == [(0, 1, 2, 3), (4, 5, 6, 7), (0, 1, 2), (3, 4, 5), (0, 1), (2, 3)]


@pytest.mark.slow
def test_overlapped_rollouts_compile_a_bounded_number_of_shapes(rollouts):
  """Shapes (batch B, prefilled prompts U, prompt bucket P, new-token bucket N) of a half: B is a
  power of two up to batch_bucket(4) = 4 for halves of 4 episodes, U a power of two <= B, P the
  prompt buckets that the prompt lengths span, N = 16 fixed: at most (1 + 2 + 3) pairs (B, U)
  times the P buckets, however many turns and iterations run."""
  halves = rollouts["halves"] + rollouts["halves_2"]
  lengths = [len(t.prompt_ids) for ep in halves for t in ep.turns]
  p_buckets = {prompt_bucket(n) for n in range(min(lengths), max(lengths) + 1)}
  b_max = batch_bucket(4)
  pairs = sum(k + 1 for k in range(b_max.bit_length()))  # U in {1, 2, .., B} for B in {1, 2, 4}
  bound = pairs * len(p_buckets)
  shapes = rollouts["halves_shapes"]
  assert all(dict(s)["batch"] <= b_max for s in shapes)
  # One compilation per distinct shape (the compile-time flags are the same in every call).
  first, second = rollouts["compilations"]
  assert first <= second == len(shapes) <= bound
  assert bound <= 12  # (prompts of one or two buckets)


@pytest.mark.slow
def test_env_failures_in_one_half_end_the_same_episodes_as_serially(rollouts):
  serial, halves = rollouts["failing_off"], rollouts["failing_halves"]
  _assert_same_episodes(serial, halves)
  assert rollouts["restarts"] == 2  # one worker death per rollout
  errors = {i: ep.env_error for i, ep in enumerate(serial) if ep.env_error}
  assert set(errors) == {0, 1, 2, 4, 6}
  for ep in (serial, halves):
    assert "fail on step 2" in ep[1].env_error and "worker process" in ep[6].env_error
  # Env 6 died at its 2nd step; envs 0, 2 and 4 (its worker's) at their 3rd, in both loops.
  assert [len(serial[i].turns) for i in (0, 1, 2, 4, 6)] == [3, 2, 3, 3, 2]
  assert [len(ep.turns) for ep in serial if ep.env_error is None] == [3, 3, 3]


# ------------------------------------------------------------------------------ the config
def test_an_unknown_overlap_mode_is_refused_naming_the_value_and_the_fix():
  from sdar_jax.run.config_validation import ConfigError, validate

  validate(tiny_run_config(1, **{"rollout.overlap": "halves"}), num_devices=8)
  with pytest.raises(ConfigError, match=r"rollout.overlap='thirds': unknown mode. Fix: use 'off'"):
    validate(tiny_run_config(1, **{"rollout.overlap": "thirds"}), num_devices=8)
  with pytest.raises(ValueError, match=r"rollout.overlap='on'.*'halves'"):
    AgentLoop(
      None,
      _WordAdapter(),
      None,
      Tokenizer.bundled_qwen(),
      ChatTemplate.builtin("qwen3"),
      SAMPLING,
      max_turns=1,
      overlap="on",
    )
  assert tiny_run_config(1).rollout.overlap == "off"  # the default: serial turns


def test_overlap_with_several_processes_is_refused(monkeypatch):
  from sdar_jax.run.setup import setting_problems

  config = tiny_run_config(1, **{"rollout.overlap": "halves"})
  assert setting_problems(config) == []
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  (problem,) = setting_problems(config)
  assert problem.startswith("rollout.overlap='halves' with 2 processes")
  assert "Fix: set rollout.overlap='off', or run one process" in problem


# ------------------------------------------------------------------------------ the sampler
@pytest.mark.slow
def test_row_ids_name_each_prompt_s_random_stream_wherever_it_sits(model):
  config, params = model
  sampler = Sampler(config)
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(1, 1000, n)) for n in (5, 11, 7)]
  key = jax.random.key(4)
  both = sampler.generate(params, prompts, SAMPLING, key, row_ids=[5, 9, 2])
  alone = sampler.generate(params, prompts[1:2], SAMPLING, key, row_ids=[9])
  assert alone.tokens[0] == both.tokens[1]  # row 1 of 3 or row 0 of 1: the same stream
  np.testing.assert_allclose(alone.logprobs[0], both.logprobs[1], rtol=0, atol=1e-4)
  # Without row_ids a prompt draws as its row index, as before.
  default = sampler.generate(params, prompts, SAMPLING, key)
  assert (
    default.tokens == sampler.generate(params, prompts, SAMPLING, key, row_ids=[0, 1, 2]).tokens
  )
  assert default.tokens[1] != both.tokens[1]
  for bad, message in (([1, 2], "2 entries for 3 prompts"), ([0, -1, 2], "-1, outside")):
    with pytest.raises(ValueError, match=message):
      sampler.generate(params, prompts, SAMPLING, key, row_ids=bad)


# ------------------------------------------------------------------------------ a training run
@pytest.mark.slow
def test_an_overlapped_asynchronous_run_logs_the_serial_run_s_rows(
  tmp_path, tmp_path_factory, monkeypatch
):
  """Two iterations of the tiny run with the rollout thread one version ahead (its pool behind
  a StoppablePool), validation at 2: with rollout.overlap=halves every rollout steps its envs
  through step_async, and the run logs the serial run's rows apart from timings."""
  import json

  from envs.pool import EnvPool
  from sdar_jax.run import trainer

  calls = {"step": [], "step_async": []}  # (EnvPool.step calls step_async itself)
  for name in ("step", "step_async"):
    real = getattr(EnvPool, name)

    def record(self, actions, indices=None, real=real, name=name):
      calls[name].append(list(indices))
      return real(self, actions, indices)

    monkeypatch.setattr(EnvPool, name, record)
  rows = {}
  for overlap in ("off", "halves"):
    settings = {"train.max_staleness": 1, "train.eval_every": 2, "rollout.overlap": overlap}
    settings.update({"train.eval_before_train": False, "checkpoint.every": 0})
    trainer.run(tiny_run_config(2, **settings), str(tmp_path / overlap))
    with open(tmp_path / overlap / "metrics.jsonl") as f:
      rows[overlap] = [json.loads(line) for line in f]
    if overlap == "off":  # the serial loop steps with EnvPool.step only
      assert calls["step"] and calls["step_async"] == calls["step"]
      calls = {"step": [], "step_async": []}
  # The overlapped loop never blocks in EnvPool.step. One GRPO group of 2 episodes: halves of one
  # episode each; the 2 validation episodes likewise.
  assert calls["step"] == [] and calls["step_async"]
  assert all(len(r) == 1 for r in calls["step_async"])
  # Timings, and the compile counters: totals read when a row is logged, while the rollout
  # thread may still be compiling the next rollout's shapes (more so on a loaded machine).
  timing = ("seconds", "tokens_per_s", "_share", "compilations")
  untimed = [
    {k: v for k, v in row.items() if not any(t in k for t in timing)} for row in rows["halves"]
  ]
  assert untimed == [
    {k: v for k, v in row.items() if not any(t in k for t in timing)} for row in rows["off"]
  ]
  assert [r["step"] for r in rows["halves"]] == [1, 2] and "val/success_rate" in rows["halves"][-1]


@pytest.mark.slow
def test_task_streams_keep_an_episodes_draws_whoever_else_plays(model):
  """eval.streams='task': an episode's draws are keyed by its task and turn, so task 2 plays the
  same tokens beside tasks 0, 1 and 3 (ending at other turns) as alone, where rank streams
  would give it rank 0's draws; a task played twice in one call is refused."""
  config, params = model
  sampler = Sampler(config)

  def play(tasks, steps, streams):
    kwargs = [{"max_steps": m} for m in steps]
    with envs.EnvPool("dummy", len(tasks), env_kwargs=kwargs, num_workers=0) as pool:
      loop = _loop(pool, sampler, "off")
      loop.row_streams = streams
      return loop.run(params, tasks, list(range(len(tasks))), jax.random.key(7))

  together = play([0, 1, 2, 3], [1, 3, 3, 2], "task")
  alone = play([2], [3], "task")
  ranked = play([2], [3], "rank")
  assert [t.response_ids for t in alone[0].turns] == [t.response_ids for t in together[2].turns]
  assert [t.response_ids for t in ranked[0].turns] != [t.response_ids for t in alone[0].turns]
  with pytest.raises(ValueError, match="a task is played twice"):
    play([2, 2], [1, 1], "task")
  with pytest.raises(ValueError, match="eval.streams='games'"):
    AgentLoop(None, _WordAdapter(), sampler, Tokenizer.bundled_qwen(),
              ChatTemplate.builtin("qwen3"), SAMPLING, max_turns=1, row_streams="games")  # fmt: skip
