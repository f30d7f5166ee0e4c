"""How an episode's outcome becomes its turns' rewards and GRPO advantages: the run config's
`rollout.shaping` section, read by `episodes_to_samples` (sdar_jax/rollout/batching.py). It is the
rollout's, not the algorithm's: every method trains on the same shaped advantages."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

STEP_ANCHORS = ("observation", "prompt")  # what makes two turns the same state


def _number(value: Any, low: float = float("-inf")) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= low


@dataclasses.dataclass(frozen=True)
class RewardShaping:
  """`rollout.shaping`; invalid values raise ValueError, one "rollout.shaping.<key>=<value>: ...
  Fix: ..." line each."""

  norm_adv_by_std: bool = True
  """GRPO advantages (r − mean) / std over the group (False: r − mean)."""
  invalid_penalty: float = 0.1
  """Subtracted from a turn's reward when its action is not in the expected format."""
  inadmissible_penalty: float = 0.0
  """Subtracted from a turn's reward when its well-formed action is not among the env's
  admissible commands (ALFWorld; 0 = the reference, where such an action is valid). Mind the
  shaping it adds: on the offline demo, 1.0 taught the policy to stop trying to take objects
  (taking one that is not there is inadmissible) and validation success fell to 0."""
  inadmissible_no_credit: bool = False
  """Cap the advantage of a turn whose well-formed action the env did not list at 0: it changed
  nothing, so it shares a lost episode's blame but not a won episode's credit (not in the
  reference; ALFWorld)."""
  step_adv_coef: float = 0.0
  """w of a step-level advantage added to GRPO's (GiGPO's, from verl-agent; 0 = off, the SDAR
  paper): a turn's discounted return less the mean return of the group's turns taken from the
  same state, over their std when norm_adv_by_std."""
  step_gamma: float = 0.95
  """γ of the step-level returns, in [0, 1] (verl-agent's ALFWorld script: 0.95)."""
  step_anchor: str = "observation"
  """What makes two turns "the same state" for the step-level groups: "observation" (the env's
  observation text, as GiGPO) or "prompt" (the identical student prompt, history included)."""

  def __post_init__(self):
    problems = self.problems()
    if problems:
      raise ValueError("\n".join(problems))

  def problems(self) -> list[str]:
    out = []

    def bad(key: str, problem: str, fix: str) -> None:
      out.append(f"rollout.shaping.{key}={getattr(self, key)!r}: {problem}. Fix: {fix}")

    for key in ("invalid_penalty", "inadmissible_penalty", "step_adv_coef"):
      if not _number(getattr(self, key), low=0):
        bad(key, "must be a number >= 0", "set it to a value >= 0")
    if not _number(self.step_gamma, low=0) or self.step_gamma > 1:
      bad("step_gamma", "a discount must be in [0, 1]", "use 0.95 (verl-agent's ALFWorld script)")
    if self.step_anchor not in STEP_ANCHORS:
      bad("step_anchor", "unknown", f"use one of {list(STEP_ANCHORS)}")
    for key in ("norm_adv_by_std", "inadmissible_no_credit"):
      if not isinstance(getattr(self, key), bool):
        bad(key, "must be True or False", "set it to True or False")
    return out

  @classmethod
  def from_config(cls, section: Mapping[str, Any] | None) -> RewardShaping:
    """From a run config's `rollout.shaping` (a ConfigDict or dict; missing keys: the defaults)."""
    values = dict(section.to_dict() if hasattr(section, "to_dict") else section or {})
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in values if k not in known]
    if unknown:
      raise ValueError(
        "\n".join(
          f"rollout.shaping.{k}: not a shaping setting. Fix: use one of {known}" for k in unknown
        )
      )
    return cls(**values)

  def kwargs(self) -> dict[str, Any]:
    """The keyword arguments of `episodes_to_samples`."""
    return dataclasses.asdict(self)
