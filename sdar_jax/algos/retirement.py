"""RetireOPD's retirement rule: distil from a frozen teacher until the distillation stops helping.

Host-side bookkeeping, no arrays: `Retirement` takes each iteration's reverse KL −(lT − lθ) on
the student's rollouts and each validation success rate, and after a validation says whether to
retire: once progress_t = (K_{t−W} − K_t) / K_{t−W} ≤ `progress_at_most` (K: the mean KL of the
last W iterations) and competence_t = (SR_t + SR_{t−1}) / (2·SR_teacher) ≥ `competence_at_least`,
the distillation's weight becomes 0 for the rest of the run and the teacher is no longer scored.
Its state (`state_dict`) is checkpointed, so a resumed run retires at the same iteration.
`RetirementHooks` (registered for algo.retire.window >= 1) plugs the rule into the iteration
(`algos.hooks`). The README's `retire_opd` row and docs/reference.md §11 give the source.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any

from sdar_jax.algos.hooks import MethodHooks, register_hooks


@dataclasses.dataclass
class Retirement:
  """The rule's settings (W = `window`, the two thresholds) and what it has seen."""

  window: int = 5
  progress_at_most: float = 0.0
  competence_at_least: float = 0.9
  kl: list[float] = dataclasses.field(default_factory=list)  # the last 2W per-iteration values
  success: list[float] = dataclasses.field(default_factory=list)  # the last two validation SRs
  teacher_success: float | None = None
  retired_at: int | None = None  # the iteration after which the distillation stopped

  def __post_init__(self):
    if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 1:
      raise ValueError(f"Retirement window={self.window!r}: must be an integer >= 1")

  @property
  def retired(self) -> bool:
    return self.retired_at is not None

  def record_kl(self, kl: float) -> None:
    """One iteration's token-mean reverse KL −(lT − lθ) on its rollouts (non-finite: skipped)."""
    if math.isfinite(kl):
      self.kl = (self.kl + [float(kl)])[-2 * self.window :]

  def record_success(self, success_rate: float) -> None:
    """One validation's success rate of the student."""
    self.success = (self.success + [float(success_rate)])[-2:]

  def progress(self) -> float | None:
    """progress_t, or None before 2W iterations are recorded or when K_{t−W} = 0."""
    w = self.window
    if len(self.kl) < 2 * w:
      return None
    before, now = sum(self.kl[:w]) / w, sum(self.kl[w:]) / w
    return None if before == 0 else (before - now) / before

  def competence(self) -> float | None:
    """competence_t, or None before two validations and the teacher's rate are known."""
    if len(self.success) < 2 or self.teacher_success is None:
      return None
    return (self.success[0] + self.success[1]) / max(2.0 * self.teacher_success, 1e-9)

  def should_retire(self) -> bool:
    """Whether both conditions hold now (False once retired: it happens once)."""
    progress, competence = self.progress(), self.competence()
    if self.retired or progress is None or competence is None:
      return False
    return progress <= self.progress_at_most and competence >= self.competence_at_least

  def check(self, iteration: int) -> bool:
    """Retires after `iteration` when `should_retire`; returns whether it retired now."""
    if self.should_retire():
      self.retired_at = int(iteration)
      return True
    return False

  def metrics(self) -> dict[str, float]:
    """retire/active (1 while distilling, 0 once retired), retire/retired_at (when it did, else
    absent), retire/progress and retire/competence when defined, retire/kl (K_t)."""
    out = {"retire/active": 0.0 if self.retired else 1.0}
    if self.retired:
      out["retire/retired_at"] = float(self.retired_at)
    if self.kl:
      tail = self.kl[-self.window :]
      out["retire/kl"] = sum(tail) / len(tail)
    for name, value in (("progress", self.progress()), ("competence", self.competence())):
      if value is not None and math.isfinite(value):
        out[f"retire/{name}"] = float(value)
    return out

  def state_dict(self) -> dict[str, Any]:
    return {
      "kl": list(self.kl),
      "success": list(self.success),
      "teacher_success": self.teacher_success,
      "retired_at": self.retired_at,
    }

  def load_state_dict(self, state: dict[str, Any]) -> None:
    self.kl = [float(x) for x in state.get("kl", [])][-2 * self.window :]
    self.success = [float(x) for x in state.get("success", [])][-2:]
    teacher = state.get("teacher_success")
    self.teacher_success = None if teacher is None else float(teacher)
    retired = state.get("retired_at")
    self.retired_at = None if retired is None else int(retired)


class RetirementHooks(MethodHooks):
  """RetireOPD in the iteration: the reverse KL recorded after the teacher is scored, the rule
  checked after each validation (the frozen teacher's rate with its skills at the start, the
  val_with_skill mode), the algorithm swapped for `AlgoConfig.retired()` when it holds."""

  start_eval_modes = ("val_with_skill",)
  legacy_state_key = "retirement"  # the loop state's key for it before hooks (2026-12-06)

  def __init__(self, algo):
    self.lam = float(algo.lam)
    self.rule = Retirement(algo.retire.window, algo.retire.progress, algo.retire.competence)

  def after_teacher_scoring(self, view):
    gap = view.metrics.get("rollout/teacher_old_gap_mean")
    if gap is not None and not self.rule.retired:  # K: the reverse KL to the frozen teacher
      self.rule.record_kl(-gap)
    return {"retire/lam": 0.0 if self.rule.retired else self.lam}

  def at_evaluation(self, view, evaluation: Mapping[str, float], start: bool):
    self.rule.record_success(evaluation.get("val/success_rate", 0.0))
    if start:  # the initial policy: the frozen teacher is the same weights with its skills
      self.rule.teacher_success = evaluation.get("val_with_skill/success_rate", 0.0)
      return {"retire/teacher_success": self.rule.teacher_success}
    if self.rule.check(view.iteration):
      log = logging.getLogger(__name__)
      log.info(
        "RetireOPD: the distillation is retired after iteration %d (progress %.4f <= %g, "
        "competence %.3f >= %g): λ = 0 and the teacher is no longer scored from now on",
        view.iteration,
        self.rule.progress(),
        self.rule.progress_at_most,
        self.rule.competence(),
        self.rule.competence_at_least,
      )
      view.set_algo(view.algo.retired())
    return None

  def at_iteration_end(self, view):
    return self.rule.metrics()

  def state_dict(self):
    return self.rule.state_dict()

  def load_state_dict(self, state, view):
    self.rule.load_state_dict(state)
    if self.rule.retired:
      view.set_algo(view.algo.retired())

  def run_problems(self, config) -> list[str]:
    """What the rule needs from the run: the frozen teacher's success rate with its skills at the
    start (train.eval_before_train) and the student's at later validations (train.eval_every >=
    1, eval.num_tasks != 0)."""
    why = f"algo.retire.window={self.rule.window} (RetireOPD) compares validation success rates"
    problems = []
    for key, value, ok, fix in (
      (
        "train.eval_before_train",
        config.train.eval_before_train,
        bool(config.train.eval_before_train),
        "set --config.train.eval_before_train=True (the frozen teacher is evaluated then)",
      ),
      (
        "train.eval_every",
        config.train.eval_every,
        config.train.eval_every not in (0, None),
        "set --config.train.eval_every to how often the rule is checked (e.g. 5)",
      ),
      (
        "eval.num_tasks",
        config.eval.get("num_tasks", -1),
        config.eval.get("num_tasks", -1) != 0,
        "use -1 (the whole validation split) or a number of tasks",
      ),
    ):
      if not ok:
        problems.append(f"{key}={value!r}: {why}. Fix: {fix}")
    return problems


@register_hooks("retirement")
def _retirement_hooks(algo) -> MethodHooks | None:
  return RetirementHooks(algo) if algo.retires else None
