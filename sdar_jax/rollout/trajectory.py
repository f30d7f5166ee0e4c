"""Records of what happened in a rollout: one `Turn` per model call, one `Episode` per env run,
the rollout's `RolloutTimings`, and every process's episodes for the metrics
(`episode_summaries`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax

from sdar_jax.infra import multihost


@dataclasses.dataclass
class Turn:
  """One model call inside an episode.

  The response ids are exactly what the sampler produced (never re-tokenized), and `logprobs` are
  the sampler's log-probs of those ids: the behaviour policy of the PPO ratio.
  """

  prompt_ids: list[int]  # chat-templated student prompt
  response_ids: list[int]
  logprobs: list[float]
  action: str  # what the env received
  valid: bool  # the output had the required format
  policy_version: int  # update count of the params that sampled it
  teacher_prompt_ids: list[int] | None = None  # privileged skill block + the same prompt
  finish_reason: str = ""
  observation: str = ""  # the observation the prompt was built from
  prompt_truncated_from: int | None = None  # prompt length before left truncation (None: uncut)
  # whether the env listed the action as admissible (None: the env has no closed list to check)
  admissible: bool | None = None
  reward: float = 0.0  # the env's reward for this turn's action
  skills_in_prompt: bool = False  # the student prompt held the skills (Skill-GRPO, UCOB's view)
  skill_block: str | None = None  # the retrieved skill block (teacher context source "skills")
  teacher_context: bool = True  # whether a source gave the teacher a context (algos.contexts)
  context_sources: tuple[str, ...] = ()  # the sources that did


@dataclasses.dataclass
class Episode:
  """One environment run. `group_id` ties the G episodes of one GRPO group (same task)."""

  env_index: int
  task_id: int
  group_id: int
  task_type: str = "unknown"
  task: str = ""
  gamefile: str = ""
  turns: list[Turn] = dataclasses.field(default_factory=list)
  reward: float = 0.0  # undiscounted sum of env rewards
  won: bool = False
  done: bool = False
  env_error: str | None = None  # the env raised / hung: the episode is lost, not trained on
  # (kind, message) of every search that failed (info["search_error_kind"], info["search_error"]:
  # Search-QA's retrieval); the episode goes on, its observation says "Search error: ..."
  search_errors: list[tuple[str, str]] = dataclasses.field(default_factory=list)
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  final_observation: str = ""  # the observation after the last turn's action

  @property
  def length(self) -> int:
    return len(self.turns)

  @property
  def truncated_prompts(self) -> int:
    """Turns whose student prompt was cut by left truncation."""
    return sum(t.prompt_truncated_from is not None for t in self.turns)

  @property
  def admissible_turns(self) -> tuple[int, int]:
    """(turns whose action the env listed as admissible, turns that were checked)."""
    checked = [t.admissible for t in self.turns if t.admissible is not None]
    return sum(checked), len(checked)

  @property
  def valid_action_ratio(self) -> float:
    return sum(t.valid for t in self.turns) / max(1, len(self.turns))


@dataclasses.dataclass
class RolloutTimings:
  """What `AgentLoop.run(..., timings=...)` adds up over a rollout."""

  env_seconds: float = 0.0  # blocked in EnvPool.reset / EnvPool.step / EnvPool.wait
  sampler_seconds: float = 0.0  # in Sampler.generate (device work and the copy back included)
  generated_tokens: int = 0  # response tokens the sampler returned
  sampler_calls: int = 0


def episode_summaries(episodes: Sequence[Any]) -> list[Any]:
  """Every process's episodes in process order, each turn without its prompts, log-probs and
  observation (what the rollout metrics and the failure count read: rewards, outcomes, infos,
  response ids, validity, truncation). One process: `episodes` themselves."""
  if jax.process_count() == 1:
    return list(episodes)
  light = [
    dataclasses.replace(
      ep,
      turns=[
        dataclasses.replace(t, prompt_ids=[], teacher_prompt_ids=None, logprobs=[], observation="")
        for t in ep.turns
      ],
    )
    for ep in episodes
  ]
  return [ep for part in multihost.allgather(light) for ep in part]
