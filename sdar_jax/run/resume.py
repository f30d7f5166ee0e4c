"""A run's checkpoints beside its TrainState: the host-side `LoopState` (the iteration, the task
sampler, the replay queue, the failure counters, the method hooks' states) and the Trainer's
`save` and `maybe_restore`, which resumes a killed run where it stopped (metric rows of
iterations after the restored checkpoint are dropped first, so they are logged again). orbax
itself is `sdar_jax.run.checkpoint`; this module holds no training step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from sdar_jax.infra import multihost, paths
from sdar_jax.run.checkpoint import (
  CheckpointUnreadableError,
  abstract_train_state,
  unreadable_reason,
)
from sdar_jax.run.iteration import RunView

log = logging.getLogger(__name__)


@dataclasses.dataclass
class LoopState:
  """Host-side state a checkpoint keeps beside the TrainState."""

  iteration: int = 0  # completed training iterations
  task_rng: dict[str, Any] | None = None  # numpy bit-generator state of the task sampler
  replay: dict[str, int] | None = None
  all_failed_iterations: int = 0  # consecutive iterations in which every env failed
  skipped_in_a_row: int = 0  # consecutive updates skipped for a non-finite loss or gradient
  # a stop came before the validation due after `iteration`: the resumed run plays it first
  validation_due: bool = False
  hooks: dict[str, Any] | None = None  # each method hook's state, by its registered name
  # entries of older checkpoints' loop state that are no field here (a hook's state saved under
  # its own key before hooks existed: `MethodHooks.legacy_state_key`)
  legacy: dict[str, Any] | None = None

  @classmethod
  def from_saved(cls, saved: dict[str, Any]) -> LoopState:
    names = {f.name for f in dataclasses.fields(cls)}
    known = {k: v for k, v in saved.items() if k in names and k != "legacy"}
    legacy = {**(saved.get("legacy") or {}), **{k: v for k, v in saved.items() if k not in names}}
    return cls(**known, legacy=legacy or None)


class ResumeMixin:
  """The Trainer's checkpoint methods (`sdar_jax.run.trainer.Trainer`: they read the state, the
  checkpoint manager, the logger, the task sampler, the replay queue and the hooks it builds)."""

  def maybe_restore(self) -> bool:
    """Restores the latest readable checkpoint if there is one; either way drops the metric rows
    of iterations after it (a run killed between a row and its checkpoint logs that step again).
    A checkpoint whose files cannot be read is said, moved aside (`CheckpointManager.set_aside`)
    and the one before it tried; CheckpointUnreadableError when none is readable."""
    target = abstract_train_state(
      self.model_config,
      self.step_fn.optimizer,
      self.mesh,
      ema=self.step_fn.algo_config.keeps_ema,
    )
    restored, unreadable = None, []
    while restored is None and self.ckpt.latest_step() is not None:
      step = self.ckpt.latest_step()
      try:
        restored = self.ckpt.restore(step, target=target, model_config=self.model_config)
      except Exception as error:
        reason = unreadable_reason(error)
        if reason is None:
          raise
        aside = self.ckpt.set_aside(step) if paths.is_primary_process() else "(by process 0)"
        multihost.sync("checkpoint set aside")
        log.warning(
          "checkpoint %s/%d cannot be read (%s); moved aside to %s, resuming from the one "
          "before it",
          self.ckpt.directory,
          step,
          reason,
          aside,
        )
        unreadable.append(f"step {step} ({reason}), moved to {aside}")
    if restored is None:
      if unreadable:
        raise CheckpointUnreadableError(
          f"no checkpoint of {self.ckpt.directory} can be read: "
          + "; ".join(unreadable)
          + ". Fix: restore those files from a copy, or start the run afresh in a new workdir."
        )
      self._drop_metric_rows_after(-1)
      RunView(self, self.loop_state.iteration).hooks("at_run_start")
      return False
    state, meta = restored
    self.state = state
    extra = meta.get("extra") or {}
    self.loop_state = LoopState.from_saved(extra.get("loop", {}))
    if self.loop_state.task_rng:
      self.task_rng.bit_generator.state = self.loop_state.task_rng
    if self.loop_state.replay:
      self.replay.load_state_dict(self.loop_state.replay)
    saved, legacy = self.loop_state.hooks or {}, self.loop_state.legacy or {}
    for name, hooks in self.hooks.items():
      state = saved.get(name, legacy.get(hooks.legacy_state_key or name))
      if state is not None:
        hooks.load_state_dict(state, RunView(self, self.loop_state.iteration))
    self.loop_state.legacy = None  # translated: the next checkpoint keeps the hooks' states only
    log.info("resumed from %s at iteration %d", self.ckpt.directory, self.loop_state.iteration)
    self._drop_metric_rows_after(self.loop_state.iteration)
    RunView(self, self.loop_state.iteration).hooks("at_run_start")
    return True

  def validate_first(self, resumed: bool) -> dict[str, float]:
    """Before the first iteration: a fresh run's validation before training
    (train.eval_before_train), or, resumed, the validation of the restored iteration that a stop
    request came before (a signal to the whole job has ended the env workers by then, and hooks
    decide from the validations): played now, as a run never stopped would have, its row merged
    into the iteration's (`read_history`). Returns the row logged, else {}."""
    it = self.loop_state.iteration
    if not resumed and self.validations and self.config.train.eval_before_train:
      evaluation = self.evaluate(start=True)
      RunView(self, it, evaluation).hooks("at_evaluation", evaluation, True)
      last = self.logger.log(it, {**self.warm_start_metrics, **evaluation})
      self.figures.draw_metrics(self.logger.path)
      return last
    if not (resumed and self.loop_state.validation_due):
      return {}
    log.info("iteration %d's validation was not played before the stop: playing it now", it)
    evaluation = self.evaluate()
    RunView(self, it, evaluation).hooks("at_evaluation", evaluation, False)
    self.loop_state.validation_due = False
    last = self.logger.log(it, evaluation)
    self.figures.draw_metrics(self.logger.path, force=True)
    return last

  def _drop_metric_rows_after(self, step: int) -> None:
    if step < 0 and not self.warm_start_metrics and self.logger.path:
      # A restart before the first checkpoint logs step 0 again; a reloaded warm start does not
      # recompute its metrics, so keep them from the dropped row.
      try:
        text = paths.read_text(self.logger.path) if paths.exists(self.logger.path) else ""
        first = json.loads((text.splitlines() or ["{}"])[0])
      except (OSError, ValueError):
        first = {}
      if first.get("step") == 0:
        self.warm_start_metrics = {k: v for k, v in first.items() if k.startswith("warm_start/")}
    dropped = self.logger.drop_rows_after(step)
    if dropped:
      log.warning(
        "dropped %d metrics row(s) after iteration %d from %s: iterations the restored state does not "
        "contain (the run was stopped before their checkpoint); they are logged again",
        dropped,
        max(step, 0),
        self.logger.path,
      )

  def save(self, force: bool = False) -> None:
    """Checkpoints the TrainState and the loop state. Rollouts queued for later iterations are
    not saved (a resumed run plays them again): the task sampler's state saved is the one from
    before the first of them drew its tasks, so the resumed run draws the same tasks."""
    self.loop_state.task_rng = (
      self._queued[min(self._queued)].task_rng
      if self._queued
      else self.task_rng.bit_generator.state
    )
    self.loop_state.replay = self.replay.state_dict()
    self.loop_state.hooks = {name: hooks.state_dict() for name, hooks in self.hooks.items()}
    self.ckpt.save(
      self.loop_state.iteration,
      self.state,
      self.model_config,
      run_config=self.config,
      extra={"loop": _jsonable(dataclasses.asdict(self.loop_state))},
      force=force,
    )


def _jsonable(value):
  return json.loads(
    json.dumps(value, default=lambda x: x.tolist() if hasattr(x, "tolist") else int(x))
  )
