"""The training rollouts of a run: an iteration's episodes played on the main thread, or, with
`train.max_staleness` = k > 0 (asynchronous training, one process), on a rollout thread
(`sdar_jax.rollout.worker`) k iterations ahead, each with a copy of the parameters of the
iteration that queued it. Tasks and rollout keys stay functions of (seed, iteration); the main
thread holds the sampler's lock around its device programs (`device_turn`). The Trainer's methods
(`RolloutsMixin`); the replay queue and the update are the trainer's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp

from sdar_jax.core import sharding
from sdar_jax.infra import multihost
from sdar_jax.rollout.trajectory import Episode, RolloutTimings
from sdar_jax.rollout.worker import RolloutWorker, StoppablePool


@dataclasses.dataclass
class Rollout:
  """One iteration's episodes with the rollout's wall time and timings (sdar_jax.observe.perf)."""

  episodes: list[Episode]
  seconds: float
  timings: RolloutTimings


@dataclasses.dataclass
class Queued:
  """Asynchronous training: a rollout handed to the rollout thread, with the task sampler's
  state from before its tasks were drawn (what a checkpoint saves while it is pending)."""

  task_rng: dict[str, Any]
  rollout: concurrent.futures.Future


class RolloutsMixin:
  """The Trainer's rollouts (`sdar_jax.run.trainer.Trainer`: they read its loop, pools, sampler,
  task sampler and state)."""

  def _draw_tasks(self, iteration: int) -> tuple[list[int], list[int]]:
    """The tasks of `iteration` (draws must come in iteration order) and their group ids."""
    n_games = len(self.train_games)
    picks = self.task_rng.choice(
      n_games, size=self.tasks_per_iteration, replace=self.tasks_per_iteration > n_games
    )
    base = iteration * self.tasks_per_iteration
    tasks = [int(t) for t in picks for _ in range(self.group_size)]
    groups = [base + k for k in range(self.tasks_per_iteration) for _ in range(self.group_size)]
    return tasks, groups

  def _key(self, iteration: int | None = None) -> jax.Array:
    """The training rollout key of `iteration` (default: the current one): a function of
    (train.seed, iteration) only, so a resumed run samples what an uninterrupted one would have."""
    iteration = self.loop_state.iteration if iteration is None else iteration
    return jax.random.fold_in(jax.random.fold_in(self.rng, iteration), 0)

  def _play(
    self,
    iteration: int,
    params,
    policy_version: int,
    tasks: list[int],
    groups: list[int],
    timings: RolloutTimings | None = None,
  ) -> Rollout:
    """The training episodes of `iteration` played with `params` (`policy_version`): on the
    main thread (synchronous) or on the rollout thread (asynchronous)."""
    timings = RolloutTimings() if timings is None else timings
    t0 = time.perf_counter()
    mine = multihost.episode_share(len(tasks), self.group_size)  # all of them with one process
    episodes = self.loop.run(
      params,
      tasks[mine],
      groups[mine],
      self._key(iteration),
      policy_version=policy_version,
      timings=timings,
    )
    return Rollout(episodes, time.perf_counter() - t0, timings)

  def _asynchronous(self) -> bool:
    return self.config.train.max_staleness > 0

  def device_turn(self):
    """Asynchronous training: the sampler's lock, held by the main thread around its device
    programs (updates, evaluation) so that they never run at the same time as a generation of
    the rollout thread (two multi-device programs could interleave their collectives and wait on
    each other). The rollout thread's env steps and prompt building still overlap them."""
    return self.sampler.lock if self._asynchronous() else contextlib.nullcontext()

  def _rollout_worker(self) -> RolloutWorker:
    if self._worker is None:
      self._worker = RolloutWorker(
        setup=lambda: sharding.set_kernel_mesh(self.mesh, self.model_config)  # thread-local
      )
      self.loop.pool = StoppablePool(self.pool, self._worker.stop)  # stops at close
    return self._worker

  def _queued_rollout(self, it: int) -> Rollout:
    """Asynchronous training: the rollout of iteration `it` from the rollout thread, once the
    rollouts of iterations it+1 .. it+max_staleness (up to the last iteration) are queued
    behind it. Each is played with the parameters of the iteration that queued it, so a sample
    trained at iteration i was sampled by policy version i - max_staleness at the oldest (the
    first iterations of a run, or after a resume, are fresher). Tasks are drawn here, on the main
    thread, in iteration order, and each rollout's key is its iteration's (`_key`)."""
    last = min(it + self.config.train.max_staleness, self.config.train.iterations - 1)
    params = None
    for j in range(it, last + 1):
      if j in self._queued:
        continue
      if params is None:  # a copy: each update donates the TrainState's buffers
        with self.device_turn():
          params = jax.block_until_ready(jax.tree.map(jnp.copy, self.state.params))
      before = self.task_rng.bit_generator.state
      tasks, groups = self._draw_tasks(j)
      future = self._rollout_worker().submit(self._play, j, params, it, tasks, groups)
      self._queued[j] = Queued(before, future)
    rollout = self._queued[it].rollout.result()  # re-raises the rollout thread's exception
    del self._queued[it]
    return rollout

  def _stop_rollouts(self) -> None:
    """Stops the rollout thread (queued rollouts are discarded; `_queued` keeps their task
    sampler state for a checkpoint)."""
    if self._worker is not None:
      for queued in self._queued.values():
        queued.rollout.cancel()
      self._worker.close()
      self._worker = None
      self.loop.pool = self.pool
