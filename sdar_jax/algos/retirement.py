"""RetireOPD's retirement rule: distil from a frozen teacher until the distillation stops helping.

Host-side bookkeeping, no arrays: `Retirement` takes each iteration's reverse KL −(lT − lθ) on
the student's rollouts and each validation success rate, and after a validation says whether to
retire: once progress_t = (K_{t−W} − K_t) / K_{t−W} ≤ `progress_at_most` (K: the mean KL of a
window of W iterations: the paper's fixed, non-overlapping windows, `windows="fixed"`, or the
last W recorded, `"sliding"`, this repository's rule until 2026-12-07) and competence_t =
(SR_t + SR_{t−1}) / (2·SR_teacher) ≥ `competence_at_least` (against 1e-9 when the teacher never
succeeds), the distillation's weight becomes 0 for the rest of the run and the teacher is no longer
scored. Its state (`state_dict`) is checkpointed, so a resumed run retires at the same iteration.
`RetirementHooks` (registered for algo.retire.window >= 1) plugs the rule into the iteration
(`algos.hooks`). The README's `retire_opd` row and docs/reference.md §11.4 give the source.
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
  windows: str = "fixed"  # "fixed" (the paper's) or "sliding" (module doc)
  # "sliding": the last 2W per-iteration values; "fixed": [iteration, value] pairs of the current
  # window and the two before it
  kl: list = dataclasses.field(default_factory=list)
  success: list[float] = dataclasses.field(default_factory=list)  # the last two validation SRs
  teacher_success: float | None = None
  retired_at: int | None = None  # the iteration after which the distillation stopped
  iterations: int = 0  # the last iteration recorded (fixed windows: which ones are complete)

  def __post_init__(self):
    if not isinstance(self.window, int) or isinstance(self.window, bool) or self.window < 1:
      raise ValueError(f"Retirement window={self.window!r}: must be an integer >= 1")
    if self.windows not in ("fixed", "sliding"):
      raise ValueError(f"Retirement windows={self.windows!r}: must be 'fixed' or 'sliding'")

  @property
  def retired(self) -> bool:
    return self.retired_at is not None

  def record_kl(self, kl: float, iteration: int | None = None) -> None:
    """The token-mean reverse KL −(lT − lθ) on the rollouts of `iteration` (1-based; default: the
    one after the last recorded). A non-finite value is left out of its window's mean."""
    self.iterations = self.iterations + 1 if iteration is None else int(iteration)
    if not math.isfinite(kl):
      return
    if self.windows == "sliding":
      self.kl = (self.kl + [float(kl)])[-2 * self.window :]
      return
    first = (self._complete() - 2) * self.window  # iterations up to here are in no window kept
    self.kl = [p for p in self.kl if p[0] > first] + [[self.iterations, float(kl)]]

  def _complete(self) -> int:
    """Fixed windows: how many windows the recorded iterations complete."""
    return self.iterations // self.window

  def _window_means(self) -> tuple[float | None, float | None]:
    """(K_{t−W}, K_t): the means of the last two complete windows (None: not complete yet, or a
    window without a finite value)."""
    w = self.window
    if self.windows == "sliding":
      if len(self.kl) < 2 * w:
        return None, None
      return sum(self.kl[:w]) / w, sum(self.kl[w:]) / w
    last = self._complete()
    if last < 2:
      return None, None
    means = []
    for j in (last - 1, last):
      values = [v for t, v in self.kl if (j - 1) * w < t <= j * w]
      means.append(sum(values) / len(values) if values else None)
    return means[0], means[1]

  def record_success(self, success_rate: float) -> None:
    """One validation's success rate of the student."""
    self.success = (self.success + [float(success_rate)])[-2:]

  def progress(self) -> float | None:
    """progress_t, or None before two windows are complete or when K_{t−W} is 0 or unknown."""
    before, now = self._window_means()
    if before is None or now is None or before == 0:
      return None
    return (before - now) / before

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
    now = self._window_means()[1]
    if now is None and self.kl:  # before two windows: the mean of what is recorded so far
      values = [p[1] if isinstance(p, list) else p for p in self.kl][-self.window :]
      now = sum(values) / len(values)
    if now is not None:
      out["retire/kl"] = now
    for name, value in (("progress", self.progress()), ("competence", self.competence())):
      if value is not None and math.isfinite(value):
        out[f"retire/{name}"] = float(value)
    return out

  def state_dict(self) -> dict[str, Any]:
    return {
      "kl": [list(p) if isinstance(p, list) else p for p in self.kl],
      "success": list(self.success),
      "teacher_success": self.teacher_success,
      "retired_at": self.retired_at,
      "iterations": self.iterations,
    }

  def load_state_dict(self, state: dict[str, Any], iteration: int | None = None) -> None:
    """Restores `state_dict`'s state. A state written before fixed windows (a plain list of the
    last values, no iteration count) is read as the iterations that end at `iteration`."""
    saved = list(state.get("kl", []))
    legacy = "iterations" not in state
    self.iterations = int(state.get("iterations", iteration or len(saved)))
    if self.windows == "sliding":
      self.kl = [float(p[1] if isinstance(p, list) else p) for p in saved][-2 * self.window :]
    elif legacy:
      first = self.iterations - len(saved) + 1
      self.kl = [[first + k, float(v)] for k, v in enumerate(saved)]
    else:
      self.kl = [[int(t), float(v)] for t, v in saved]
    self.success = [float(x) for x in state.get("success", [])][-2:]
    teacher = state.get("teacher_success")
    self.teacher_success = None if teacher is None else float(teacher)
    retired = state.get("retired_at")
    self.retired_at = None if retired is None else int(retired)


class RetirementHooks(MethodHooks):
  """RetireOPD in the iteration: the reverse KL recorded after the teacher is scored, the rule
  checked after each validation (the frozen teacher's rate with its skills at the start: the
  val_with_skill mode played with the teacher's weights), the algorithm swapped for
  `AlgoConfig.retired()` when it holds."""

  start_eval_modes = ("val_with_skill",)
  legacy_state_key = "retirement"  # the loop state's key for it before hooks (2026-12-06)

  start_eval_weights = "teacher"  # the frozen teacher plays val_with_skill, not the student

  def __init__(self, algo):
    self.lam = float(algo.lam)
    retire = algo.retire
    self.rule = Retirement(retire.window, retire.progress, retire.competence, retire.windows)

  def after_teacher_scoring(self, view):
    gap = view.metrics.get("rollout/teacher_old_gap_mean")
    if gap is not None and not self.rule.retired:  # K: the reverse KL to the frozen teacher
      self.rule.record_kl(-gap, view.iteration + 1)
    return {"retire/lam": 0.0 if self.rule.retired else self.lam}

  def at_evaluation(self, view, evaluation: Mapping[str, float], start: bool):
    if "val/success_rate" not in evaluation:  # every episode lost to env failures: no rate
      logging.getLogger(__name__).warning(
        "RetireOPD: the validation after iteration %d has no success rate (val/env_failures "
        "%s); the rule skips it",
        view.iteration,
        evaluation.get("val/env_failures"),
      )
      return None
    self.rule.record_success(evaluation["val/success_rate"])
    if start:  # the frozen teacher, with its skills (played with the teacher's weights)
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
    self.rule.load_state_dict(state, view.iteration)
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
