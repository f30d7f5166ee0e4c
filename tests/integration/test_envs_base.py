"""The env registry and EnvPool: batched reset/step, and survival of envs that raise, hang or crash."""

import os
import signal
import subprocess
import time

import pytest

import envs
from envs.base import StepResult
from envs.dummy import WORDS, DummyEnv
from envs.pool import AwakeClock


def test_make_builds_registered_env_and_imports_modules_on_demand():
  env = envs.make("dummy", seed=3)
  assert isinstance(env, DummyEnv)
  assert "dummy" in envs.registered_names()
  assert isinstance(env, envs.TextEnv)


def test_make_unknown_name_names_the_fix():
  with pytest.raises(KeyError, match="no_such_env"):
    envs.make("no_such_env")


def test_register_refuses_a_second_factory_under_a_taken_name():
  with pytest.raises(ValueError, match="already registered"):
    envs.register("dummy")(lambda: None)


def test_envpool_is_importable_from_base():
  from envs.pool import EnvPool

  assert EnvPool is envs.EnvPool


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pool_batched_reset_and_step_follow_the_game_rules(num_workers):
  with envs.EnvPool("dummy", 4, num_workers=num_workers, timeout_s=30) as pool:
    counts = []
    results = pool.reset(tasks=[0, 1, 1, 5], progress=counts.append)
    assert counts == sorted(counts) and counts[-1] == 4 and counts.count(4) == 1  # as they arrive
    assert [r.observation for r in results] == [
      f"Your task is to: say {WORDS[t]}." for t in (0, 1, 1, 5)
    ]
    assert all(isinstance(r, StepResult) and not r.done and r.reward == 0 for r in results)
    # Env 0 and 2 say their word and win; env 1 and 3 say a wrong word.
    results = pool.step([WORDS[0], "nope", WORDS[1], WORDS[0]])
    assert [r.done for r in results] == [True, False, True, False]
    assert [r.reward for r in results] == [1.0, 0.0, 1.0, 0.0]
    assert [r.info["won"] for r in results] == [True, False, True, False]
    # Stepping a subset only touches those envs.
    results = pool.step([WORDS[5]], indices=[3])
    assert len(results) == 1 and results[0].info["won"] and results[0].info["steps"] == 2


def test_pool_checks_argument_lengths():
  with envs.EnvPool("dummy", 2, num_workers=0) as pool:
    with pytest.raises(ValueError, match="2 envs"):
      pool.step(["a"])
    with pytest.raises(ValueError, match="one task per env"):
      pool.reset(tasks=[0, 1, 2])
    with pytest.raises(ValueError, match="entries for num_envs"):
      envs.EnvPool("dummy", 3, env_kwargs=[{}, {}], num_workers=0)


def test_pool_survives_an_env_that_raises():
  kwargs = [{"seed": 0}, {"seed": 1, "fail_on_step": 2}, {"seed": 2}]
  with envs.EnvPool("dummy", 3, env_kwargs=kwargs, num_workers=3, timeout_s=30) as pool:
    pool.reset(tasks=[0, 1, 2])
    assert not any(r.failed for r in pool.step(["x", "x", "x"]))
    results = pool.step(["x", "x", "x"])
    assert results[1].failed and results[1].done and not results[1].info["won"]
    assert "fail on step 2" in results[1].info["env_error"]
    assert results[1].info["task_type"] == "say_word"  # kept for per-type metrics
    assert not results[0].failed and not results[2].failed
    # The failed env keeps answering "failed" until it is reset; then it is rebuilt and plays normally.
    assert pool.step(["x"], indices=[1])[0].failed
    assert not pool.reset(tasks=[1], indices=[1])[0].failed
    won = pool.step([WORDS[1]], indices=[1])[0]
    assert won.info["won"] and won.reward == 1.0
    assert pool.restarts == 0  # an exception does not cost a worker


def test_pool_restarts_a_worker_whose_env_hangs():
  # Envs 0 and 2 share worker 0 (env i lives on worker i % 2); env 0 hangs on its first step.
  kwargs = [{"hang_on_step": 1}, {}, {}, {}]
  with envs.EnvPool("dummy", 4, env_kwargs=kwargs, num_workers=2, timeout_s=1.0) as pool:
    pool.reset(tasks=[0, 1, 2, 3])
    results = pool.step(["x", "x", "x"], indices=[0, 1, 3])
    assert results[0].failed and "timed out" in results[0].info["env_error"] and results[0].done
    assert not results[1].failed and not results[2].failed  # other worker untouched
    assert pool.restarts == 1
    # Env 2 was not stepped, but its episode died with the worker: its next step says so.
    lost = pool.step(["x"], indices=[2])[0]
    assert lost.failed and "worker was restarted" in lost.info["env_error"]
    # After a reset every env plays again (the restarted worker's start does not count toward
    # the 1 s timeout).
    results = pool.reset(tasks=[1, 1, 2, 3])
    assert not any(r.failed for r in results)
    assert pool.step([WORDS[2]], indices=[2])[0].info["won"]


def test_a_workers_start_does_not_count_toward_the_timeout():
  """A spawned worker takes about a second to start (interpreter, imports); a first reset with a
  timeout shorter than that still succeeds, since the clock starts at the worker's ready message.
  A start that takes longer than startup_timeout_s restarts the worker."""
  with envs.EnvPool("dummy", 2, num_workers=2, timeout_s=0.5) as pool:
    results = pool.reset(tasks=[0, 1])
    assert not any(r.failed for r in results) and pool.restarts == 0
  with envs.EnvPool("dummy", 1, num_workers=1, startup_timeout_s=0.001) as pool:
    (result,) = pool.reset(tasks=[0])
    assert result.failed and "did not start within 0.001s" in result.info["env_error"]
  with pytest.raises(ValueError, match="startup_timeout_s must be > 0 seconds, got 0"):
    envs.EnvPool("dummy", 1, num_workers=0, startup_timeout_s=0)


def _stop_for(seconds: float, pids: list[int]) -> None:
  """Stops `pids` and then this process for about `seconds`, as Ctrl-Z or `kill -STOP` would: a
  shell continues them, and keeps sending SIGCONT for a while so a slow start of it cannot leave
  this process stopped."""
  resume = 'sleep "$0"; i=0; while [ $i -lt 150 ]; do kill -CONT "$@"; sleep 0.2; i=$((i+1)); done'
  helper = subprocess.Popen(["sh", "-c", resume, str(seconds), *map(str, pids), str(os.getpid())])
  try:
    for pid in pids:
      os.kill(pid, signal.SIGSTOP)
    os.kill(os.getpid(), signal.SIGSTOP)  # returns once the shell has continued this process
  finally:
    helper.kill()
    helper.wait()


def test_time_the_process_spends_stopped_does_not_count_toward_the_timeout():
  """The trainer and its worker stopped for 3 s at the start of a 0.3 s step (paced sleeps, which
  the stop pauses whatever the load) whose limit is 2 s: by the monotonic clock the limit has
  passed when they continue, with the step still to finish, and the worker would be killed, its
  episode lost; by the pool's AwakeClock the step finishes and the episode goes on."""
  clock = AwakeClock(tick=0.05, grace=0.2)
  kwargs = [{"paced_s": 0.3}]
  with envs.EnvPool(
    "dummy", 1, env_kwargs=kwargs, num_workers=1, timeout_s=2.0, clock=clock.now
  ) as pool:
    pool.reset(tasks=[0])
    before, awake_before = time.monotonic(), clock.now()
    request = pool.step_async([WORDS[0]])
    _stop_for(3.0, [pool._workers[0].process.pid])
    (result,) = pool.wait(request)
    assert time.monotonic() - before >= 3.0  # the stop happened
    assert not result.failed and result.info["won"] and pool.restarts == 0
    assert clock.skipped >= 3.0 - 0.2 - 0.3  # the clock left the stop out (less its grace)
    assert 0.3 <= clock.now() - awake_before < 2.0  # and counted the work


def test_a_forked_child_gets_a_clock_of_its_own(monkeypatch):
  """A forked process inherits the shared clock but not the thread that keeps it (its `now()`
  would stop 2.5 s on and no limit would ever pass there): a process whose pid is not the
  clock's starts its own. (Seen here through `os.getpid`: a real fork of this process, which
  runs JAX's threads, is what the check is for and what a test should not do.)"""
  from envs import pool as pool_module

  parent = pool_module.default_clock().__self__
  monkeypatch.setattr(pool_module, "_DEFAULT_CLOCK", parent)  # restored after the test
  monkeypatch.setattr(pool_module.os, "getpid", lambda: parent.pid + 1)
  child = pool_module.default_clock().__self__
  assert child is not parent and child.pid == parent.pid + 1
  assert pool_module.default_clock().__self__ is child  # kept while the pid stays


def test_pool_restarts_a_worker_that_dies():
  kwargs = [{}, {"exit_on_step": 1}]
  with envs.EnvPool("dummy", 2, env_kwargs=kwargs, num_workers=2, timeout_s=30) as pool:
    pool.reset(tasks=[0, 1])
    results = pool.step([WORDS[0], "x"])
    assert results[0].info["won"]
    assert results[1].failed and "died" in results[1].info["env_error"]
    assert pool.restarts == 1
    assert not pool.reset(tasks=[1], indices=[1])[0].failed


def test_pool_reports_an_env_that_fails_to_reset():
  with envs.EnvPool("dummy", 2, env_kwargs=[{}, {"fail_on_reset": True}], num_workers=0) as pool:
    results = pool.reset()
    assert not results[0].failed
    assert results[1].failed and "reset" in results[1].info["env_error"]


def test_env_family_is_looked_up_by_name_importing_its_module():
  """The trainer's only way to an environment: `env_family(name)` imports ``envs.<name>``."""
  family = envs.env_family("alfworld")
  assert family.name == "alfworld" and family.skills == "alfworld"
  assert isinstance(family.adapter(), envs.EnvAdapter)
  assert family.play_expert is not None and family.expert_modes == ("plain", "skills")


def test_env_family_unknown_or_registered_twice_names_the_fix():
  with pytest.raises(KeyError, match="register_family"):
    envs.env_family("no_such_env")
  family = envs.env_family("alfworld")
  twin = envs.EnvFamily(name="alfworld", split=family.split, adapter=family.adapter, skills="x")
  with pytest.raises(ValueError, match="already registered"):
    envs.register_family(twin)
  assert envs.env_family("alfworld") is family


def test_play_walkthroughs_keeps_won_episodes_and_draws_actions_lazily():
  closed = []

  class ClosingDummy(DummyEnv):
    def close(self) -> None:
      closed.append(True)

  drawn = []

  def actions():
    for word in ("fig", "cherry", "never drawn"):
      drawn.append(word)
      yield word

  env = ClosingDummy(max_steps=3)  # task 2 is won by saying "cherry"
  # won after a wrong word; lost at the step limit; actions run out before the end
  walkthroughs = [(2, actions()), (2, ["fig", "fig", "fig", "cherry"]), (2, ["fig"])]
  records = envs.play_walkthroughs(env, walkthroughs, none_won="no win")
  assert drawn == ["fig", "cherry"]  # the episode ended on "cherry": nothing more is drawn
  assert records == [
    {
      "task": "say cherry",
      "task_type": "say_word",
      "gamefile": "",
      "steps": [
        {
          "observation": "Your task is to: say cherry.",
          "admissible_commands": list(WORDS),
          "action": "fig",
        },
        {
          "observation": "Nothing happens. Step 1.",
          "admissible_commands": list(WORDS),
          "action": "cherry",
        },
      ],
    }
  ]
  assert closed == [True]
  with pytest.raises(ValueError, match=r"^the dummy expert won nothing\. Fix: raise env\.expert"):
    envs.play_walkthroughs(env, [(0, ["fig"])], none_won="the dummy expert won nothing")
  assert closed == [True, True]
