"""Asynchronous training (`train.max_staleness` > 0): the rollout thread, the staleness bound,
stale samples dropped and counted, a killed run resuming with the same task draws, the refused
combinations, and `max_staleness=0` staying the serial loop.

The runs are the tiny model on the real ALFWorld engine over a (2, 1, 4) mesh of fake CPU devices
(tests/helpers.tiny_run_config): one GRPO group of 2 two-turn episodes per iteration.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from sdar_jax.core.batch import TurnSample
from sdar_jax.rollout import ReplayQueue
from sdar_jax.rollout.worker import RolloutCancelled, RolloutWorker, StoppablePool
from tests.helpers import tiny_run_config

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Timings differ between runs; everything else a row holds must not.
_TIMING = ("seconds", "tokens_per_s", "_share")


def _rows(workdir) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _untimed(row: dict) -> dict:
  return {k: v for k, v in row.items() if not any(t in k for t in _TIMING)}


def _rollout_threads() -> list[threading.Thread]:
  return [t for t in threading.enumerate() if t.name == "sdar-rollout" and t.is_alive()]


# ------------------------------------------------------------------------------------ replay
def _sample(version: int) -> TurnSample:
  return TurnSample([1], [2], [-1.0], 0.0, 0.0, 0, policy_version=version, valid=True)


def test_replay_queue_drops_and_counts_every_stale_sample_wherever_it_sits():
  """Versions out of order: the stale ones are dropped even behind fresh ones, counted, and
  what is taken keeps its order."""
  q = ReplayQueue(max_staleness=1)
  q.put([_sample(v) for v in (2, 0, 1, 5, -3, 2)])
  taken = q.take(None, current_version=3)
  assert [s.policy_version for s in taken] == [2, 5, 2]  # 0, 1 and -3 are over 1 version old
  assert q.dropped_stale == 3 and len(q) == 0
  q.put([_sample(v) for v in (3, 4, 2)])
  assert [s.policy_version for s in q.take(1, current_version=4)] == [3]  # the 2 is dropped
  assert q.dropped_stale == 4 and [s.policy_version for s in q.take(None, 4)] == [4]
  assert q.state_dict() == {"dropped_stale": 4, "dropped_overflow": 0}


def test_replay_queue_at_staleness_zero_takes_only_the_current_version():
  q = ReplayQueue(max_staleness=0)
  q.put([_sample(v) for v in (7, 6, 7)])
  assert [s.policy_version for s in q.take(None, current_version=7)] == [7, 7]
  assert q.dropped_stale == 1


# ------------------------------------------------------------------------------------ worker
def test_worker_runs_jobs_in_order_on_its_thread_and_reraises_their_errors():
  seen = []

  def job(i):
    seen.append((i, threading.current_thread().name))
    if i == 2:
      raise KeyError("rollout 2 failed")
    return i * 10

  worker = RolloutWorker(setup=lambda: seen.append(("setup", threading.current_thread().name)))
  futures = [worker.submit(job, i) for i in range(4)]
  assert futures[0].result(timeout=30) == 0 and futures[1].result(timeout=30) == 10
  with pytest.raises(KeyError, match="rollout 2 failed"):
    futures[2].result(timeout=30)
  assert futures[3].result(timeout=30) == 30  # a failed rollout does not stop the thread
  assert seen == [("setup", "sdar-rollout")] + [(i, "sdar-rollout") for i in range(4)]
  assert worker.close(timeout=30) and not worker.alive
  with pytest.raises(RuntimeError, match="after close"):
    worker.submit(job, 5)


def test_worker_setup_error_reaches_every_job():
  def setup():
    raise ValueError("no mesh")

  worker = RolloutWorker(setup=setup)
  with pytest.raises(ValueError, match="no mesh"):
    worker.submit(lambda: 1).result(timeout=30)
  worker.close(timeout=30)


def test_close_stops_a_running_rollout_at_its_next_env_call():
  """A rollout stepping its envs ends with RolloutCancelled once the worker is closed; the
  rollouts queued behind it never start; the pool itself is not closed by the worker."""

  class Pool:
    steps = 0

    def __len__(self):
      return 2

    def step(self, actions):
      Pool.steps += 1
      time.sleep(0.01)
      return ["ok"] * len(actions)

  started = threading.Event()
  worker = RolloutWorker()
  pool = StoppablePool(Pool(), worker.stop)
  assert len(pool) == 2

  def rollout():
    started.set()
    while True:  # an endless episode: only the stop flag ends it
      pool.step(["look", "look"])

  running = worker.submit(rollout)
  queued = worker.submit(lambda: "never")
  assert started.wait(30)
  assert worker.close(timeout=30) and not worker.alive
  with pytest.raises(RolloutCancelled, match="'step'"):
    running.result(timeout=1)
  with pytest.raises((RolloutCancelled, Exception)):
    queued.result(timeout=1)
  assert Pool.steps >= 1


# ------------------------------------------------------------------------------------ refusals
def _validate(config):
  from sdar_jax.run.config_validation import validate

  return validate(config, num_devices=8)


def test_asynchronous_training_is_accepted_on_one_process():
  _validate(tiny_run_config(1, **{"train.max_staleness": 2}))


@pytest.mark.parametrize("bad", [-1, True])  # (a float is refused by the config itself)
def test_max_staleness_must_be_a_whole_number(bad):
  from sdar_jax.run.config_validation import ConfigError

  with pytest.raises(ConfigError, match=rf"train.max_staleness={bad!r}: must be a whole number"):
    _validate(tiny_run_config(1, **{"train.max_staleness": bad}))


def test_recompute_old_logp_with_async_is_refused_before_anything_is_written(tmp_path):
  from sdar_jax.run import trainer
  from sdar_jax.run.config_validation import ConfigError

  config = tiny_run_config(1, **{"train.max_staleness": 1, "algo.recompute_old_logp": True})
  expected = (
    r"train.max_staleness=1 with algo.recompute_old_logp=True: .*not give their behaviour "
    r"log-probs. Fix: set algo.recompute_old_logp=False .* or train.max_staleness=0"
  )
  with pytest.raises(ConfigError, match=expected):
    _validate(config)
  with pytest.raises(ValueError, match=expected):
    trainer.Trainer(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_several_processes_with_async_are_refused(tmp_path, monkeypatch):
  import jax

  from sdar_jax.run import trainer
  from sdar_jax.run.setup import staleness_problems

  config = tiny_run_config(1, **{"train.max_staleness": 1})
  (problem,) = staleness_problems(config, processes=2)
  assert problem.startswith("train.max_staleness=1 with 2 processes: asynchronous training runs")
  assert "Fix: set train.max_staleness=0, or run one process" in problem
  assert staleness_problems(config, processes=1) == []
  monkeypatch.setattr(jax, "process_count", lambda: 3)  # what a distributed job reports
  with pytest.raises(ValueError, match="train.max_staleness=1 with 3 processes"):
    trainer.Trainer(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_train_cli_refuses_async_with_several_processes_before_joining_them(tmp_path):
  """--num_processes=2 with max_staleness > 0 exits at once, naming both; without the check the
  process would wait for a coordinator that never comes."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "sdar_jax.train",
      "--config=configs/alfworld.py:model=tiny,local=True",
      "--config.train.max_staleness=1",
      f"--workdir={tmp_path / 'run'}",
      "--distributed",
      "--coordinator_address=localhost:1",
      "--num_processes=2",
      "--process_id=0",
    ],
    capture_output=True,
    text=True,
    cwd=_REPO,
    env=env,
    timeout=300,
    check=False,
  )
  assert result.returncode != 0
  assert "Invalid config: train.max_staleness=1 with 2 processes" in result.stderr, result.stderr
  assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------ runs
# Heavy (~55 s under make test): two whole runs, inline and threaded, whose rows must match.
@pytest.mark.slow
def test_max_staleness_zero_runs_serially_and_matches_the_threaded_path(tmp_path, monkeypatch):
  """max_staleness=0 plays every rollout inline (no rollout thread is made); the same run through
  the rollout thread, handed a copy of the parameters at each iteration, logs the same rows
  (evaluation and the teacher branch included), apart from timings and the async-only metrics."""
  from sdar_jax.run import trainer

  config = tiny_run_config(
    2, **{"train.eval_every": 2, "train.eval_before_train": False, "checkpoint.every": 0}
  )

  def no_thread(*args, **kwargs):
    raise AssertionError("max_staleness=0 made a rollout thread")

  with monkeypatch.context() as mp:
    mp.setattr(trainer, "RolloutWorker", no_thread)
    trainer.run(config, str(tmp_path / "serial"))
  serial = _rows(tmp_path / "serial")
  assert [r["step"] for r in serial] == [1, 2]
  assert not any("dropped_stale" in k or "wait_seconds" in k for r in serial for k in r)
  assert all(r["perf/staleness_max"] == 0.0 for r in serial)

  with monkeypatch.context() as mp:
    mp.setattr(trainer.Trainer, "_asynchronous", lambda self: True)  # 0 versions ahead
    trainer.run(config, str(tmp_path / "threaded"))
  threaded = _rows(tmp_path / "threaded")
  for s, t in zip(serial, threaded, strict=True):
    assert t["rollout/dropped_stale"] == 0.0 and t["rollout/wait_seconds"] > 0.0
    extra = {"rollout/dropped_stale", "rollout/wait_seconds"}
    assert _untimed({k: v for k, v in t.items() if k not in extra}) == _untimed(s)
  assert "val/success_rate" in threaded[-1] and "sdar/loss" in threaded[-1]
  assert not _rollout_threads()


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
  """3 iterations at max_staleness=1, evaluation at 2 and 3; iteration 3's rollout (index 2) has
  its second episode marked as sampled by policy version -1, 3 versions before the update."""
  from sdar_jax.run import trainer

  workdir = str(tmp_path_factory.mktemp("async"))
  config = tiny_run_config(
    3,
    **{
      "train.max_staleness": 1,
      "train.eval_every": 2,
      "train.eval_before_train": False,
      "checkpoint.every": 0,
      "logging.every": 1,
    },
  )
  played = []
  real_play = trainer.Trainer._play

  def play(self, iteration, params, policy_version, tasks, groups, timings=None):
    rollout = real_play(self, iteration, params, policy_version, tasks, groups, timings)
    if iteration == 2:
      for turn in rollout.episodes[1].turns:
        turn.policy_version = -1
    played.append((iteration, policy_version, threading.current_thread().name, rollout))
    return rollout

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(trainer.Trainer, "_play", play)
    trainer.run(config, workdir)
  return _rows(workdir), played


@pytest.mark.slow
def test_async_run_plays_ahead_on_the_rollout_thread(async_run):
  rows, played = async_run
  assert [r["step"] for r in rows] == [1, 2, 3]
  # iteration index -> the policy version that played it: 0 and 1 queued at 0, 2 queued at 1
  assert [(i, v) for i, v, _, _ in played] == [(0, 0), (1, 0), (2, 1)]
  assert {name for _, _, name, _ in played} == {"sdar-rollout"}
  assert "val/success_rate" in rows[1] and "val/success_rate" in rows[2]
  assert not _rollout_threads()  # stopped at the end of the run


@pytest.mark.slow
def test_async_trained_samples_are_at_most_max_staleness_old(async_run):
  rows, _ = async_run
  assert [r["perf/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
  assert all(r["perf/staleness_max"] <= 1 for r in rows)
  assert rows[1]["perf/staleness_mean"] == 1.0


@pytest.mark.slow
def test_async_stale_samples_are_dropped_counted_and_not_trained(async_run):
  rows, played = async_run
  (rollout,) = [r for i, _, _, r in played if i == 2]
  stale = len(rollout.episodes[1].turns)
  fresh = len(rollout.episodes[0].turns)
  assert stale > 0 and fresh > 0
  assert [r["rollout/dropped_stale"] for r in rows] == [0.0, 0.0, float(stale)]
  assert rows[2]["rollout/turn_samples"] == float(fresh)  # only episode 0's turns were trained
  assert rows[2]["train/tokens"] == float(
    sum(len(t.response_ids) for t in rollout.episodes[0].turns)
  )


@pytest.mark.slow
def test_killed_async_run_resumes_with_the_same_task_draws(tmp_path, monkeypatch):
  """Killed right after checkpoint 2 of 4 while iteration 3's rollout was queued (its tasks
  drawn): the rollout thread stops, the resumed run restores checkpoint 2, draws the same tasks
  for iteration 3 (the checkpoint's task sampler predates the discarded rollout), plays it with
  the restored parameters and finishes."""
  from sdar_jax.run import trainer
  from sdar_jax.run.checkpoint import CheckpointManager

  workdir = str(tmp_path / "run")
  config = tiny_run_config(
    4,
    **{
      "train.max_staleness": 1,
      "train.eval_every": 0,
      "train.eval_before_train": False,
      "checkpoint.every": 1,
      "checkpoint.keep": 5,
      "logging.every": 1,
    },
  )
  draws: list[tuple[str, int, list[int], dict]] = []  # (run, iteration, tasks, sampler before)
  run_name = ["killed"]
  real_draw, real_save = trainer.Trainer._draw_tasks, trainer.Trainer.save

  def draw(self, iteration):
    before = self.task_rng.bit_generator.state
    tasks, groups = real_draw(self, iteration)
    draws.append((run_name[0], iteration, tasks, before))
    return tasks, groups

  def killed_after_2(self, force=False):
    real_save(self, force)
    if self.loop_state.iteration == 2:
      raise KeyboardInterrupt("killed after checkpoint 2")

  monkeypatch.setattr(trainer.Trainer, "_draw_tasks", draw)
  with monkeypatch.context() as mp:
    mp.setattr(trainer.Trainer, "save", killed_after_2)
    with pytest.raises(KeyboardInterrupt):
      trainer.run(config, workdir)
  assert not _rollout_threads()  # closing the trainer stopped the rollout thread
  assert [r["step"] for r in _rows(workdir)] == [1, 2]
  killed = {i: (t, before) for name, i, t, before in draws if name == "killed"}
  assert sorted(killed) == [0, 1, 2]  # iteration 3's tasks were drawn, its rollout queued

  run_name[0] = "resumed"
  trainer.run(config, workdir)
  rows = _rows(workdir)
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  resumed = {i: (t, before) for name, i, t, before in draws if name == "resumed"}
  assert sorted(resumed) == [2, 3]  # drawn again from the checkpoint's task sampler
  assert resumed[2] == killed[2]  # the same sampler state before the draw, the same tasks
  # iteration 3 played by the restored version 2 (fresh), iteration 4 queued at 2 (1 behind)
  assert [r["perf/staleness_max"] for r in rows] == [0.0, 1.0, 0.0, 1.0]
  with CheckpointManager(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
    assert ckpt.all_steps() == [1, 2, 3, 4]
  assert not _rollout_threads()
