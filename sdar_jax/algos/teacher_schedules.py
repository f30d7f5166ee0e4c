"""Whose weights the teacher branch runs (`TEACHER_WEIGHTS`, selected by algo.teacher_weights:
the policy, the frozen initial policy, an EMA, a trained teacher read from a folder, or θ_old)
and schedules that move them between iterations (`algos.hooks`): SDPO's EMA teacher moves once per
iteration after its updates (algo.teacher_weights="ema", algo.ema.every="iteration";
lasgroup/SDPO@0e6d510 `_update_teacher`, docs/reference.md §11.3). The per-update form
(algo.ema.every="update") runs inside the compiled update instead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sdar_jax.algos.hooks import MethodHooks, register_hooks
from sdar_jax.algos.registry import Registry

# name -> fn(params, ref_params, ema_params, teacher_params=None) -> the teacher's params (no
# gradient is taken here: the caller stops it); each raises, naming what to pass, when its weights
# are missing. `teacher_params` are weights the trainer hands over (`PASSED_TEACHER_WEIGHTS`).
TeacherWeightsFn = Callable[..., Any]
TEACHER_WEIGHTS: Registry[TeacherWeightsFn] = Registry("teacher weights")
# The settings whose weights the trainer passes to the update and the teacher's scoring as
# `teacher_params`: "frozen" (read once from algo.teacher_path), "old" (the params as they were
# before the iteration's first update, copied then).
PASSED_TEACHER_WEIGHTS = ("frozen", "old")


@TEACHER_WEIGHTS.register("current")
def _current(params, ref_params=None, ema_params=None, teacher_params=None):
  """The policy being trained, given the skills (the authors' code)."""
  return params


@TEACHER_WEIGHTS.register("initial")
def _initial(params, ref_params=None, ema_params=None, teacher_params=None):
  """The frozen initial policy (the KL term's), given the skills."""
  if ref_params is None:
    raise ValueError(
      "algo.teacher_weights='initial' runs the teacher on the frozen initial policy: pass "
      "ref_params=, or set teacher_weights='current'."
    )
  return ref_params


@TEACHER_WEIGHTS.register("ema")
def _ema(params, ref_params=None, ema_params=None, teacher_params=None):
  """An exponential moving average of the policy (`TrainState.ema_params`)."""
  if ema_params is None:
    raise ValueError(
      "algo.teacher_weights='ema' runs the teacher on the EMA of the params: pass ema_params= "
      "(TrainState.ema_params; TrainStep.shard_state starts it from the params), or set "
      "teacher_weights='current'."
    )
  return ema_params


@TEACHER_WEIGHTS.register("frozen")
def _frozen(params, ref_params=None, ema_params=None, teacher_params=None):
  """A trained teacher's weights, frozen: read once from algo.teacher_path (a checkpoint folder or
  a Hugging Face folder; RetireOPD's stage-1 teacher) and handed over by the trainer."""
  if teacher_params is None:
    raise ValueError(
      "algo.teacher_weights='frozen' runs the teacher on the weights read from algo.teacher_path: "
      "pass teacher_params= (the trainer reads them at start), or set teacher_weights='current'."
    )
  return teacher_params


@TEACHER_WEIGHTS.register("old")
def _old(params, ref_params=None, ema_params=None, teacher_params=None):
  """θ_old: the policy as it was before the iteration's first update (UCOB scores its reference
  view once, before the updates). Inside the update the trainer hands over that copy; scored
  before the updates, it is the params themselves."""
  return params if teacher_params is None else teacher_params


class _EmaEveryIteration(MethodHooks):
  """ema ← d·ema + (1 − d)·params once, after an iteration at least one of whose updates was
  applied (SDPO moves its teacher only if an update happened)."""

  def after_updates(self, view):
    if view.algo.keeps_ema and view.updates_applied():  # (a retired algorithm scores no teacher)
      view.move_teacher_ema()


@register_hooks("ema_teacher")
def _ema_teacher(algo) -> MethodHooks | None:
  return _EmaEveryIteration() if algo.keeps_ema and algo.ema.every == "iteration" else None
