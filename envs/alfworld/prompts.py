"""The ALFWorld user-message text shown to the agent each turn (chat templating happens elsewhere).

Same structure as the reference prompts, in our own words:
- first turn: preamble, the raw first observation (it contains "Your task is to: ..."), the
  admissible actions, the <think>/<action> instruction;
- later turns: preamble with the task, "already taken k step(s)", the last <= `history_length`
  records ``[Observation i: '<observation before action i>', Action i: '<action i>']`` one per line,
  the current step number and observation, the admissible actions, the same instruction.
Admissible actions omit "help"; each is single-quoted, joined by a newline and a space, inside [ ].
"""

from __future__ import annotations

from collections.abc import Sequence

from envs.common import format_history, steps_taken
from envs.prompt_template import fill

__all__ = [
  "HISTORY_LENGTH",
  "TEMPLATE",
  "TEMPLATE_NO_HISTORY",
  "build_prompt",
  "format_admissible",
  "format_history",
]

HISTORY_LENGTH = 2

_PREAMBLE = (
  "You are an expert household agent acting in the text version of the ALFRED embodied environment."
)

_INSTRUCTION = (
  "It is your turn to act. First reason step by step about the situation and what to do next, and "
  "enclose all of this reasoning in <think> </think> tags. Then pick exactly one admissible action for "
  "this step and write it inside <action> </action> tags."
)

TEMPLATE_NO_HISTORY = (
  _PREAMBLE + "\n"
  "Your current observation is: {current_observation}\n"
  "The admissible actions in the current situation are: [{admissible_actions}].\n"
  "\n" + _INSTRUCTION
)

TEMPLATE = (
  _PREAMBLE + " Your task is to: {task_description}\n"
  "You have already taken {step_count} step(s). Here are the last {history_length} "
  "observation(s) and the action you took after each one:\n"
  "{action_history}\n"
  "You are now at step {current_step} and your current observation is: {current_observation}\n"
  "The admissible actions in the current situation are: [{admissible_actions}].\n"
  "\n" + _INSTRUCTION
)


def format_admissible(commands: Sequence[str]) -> str:
  """The admissible-actions list as shown in the prompt (without "help")."""
  return "\n ".join(f"'{c}'" for c in commands if c != "help")


def build_prompt(
  task: str,
  history: Sequence[tuple[str, str]],
  observation: str,
  admissible: Sequence[str],
  step: int | None = None,
  history_length: int = HISTORY_LENGTH,
  templates: tuple[str, str] | None = None,
) -> str:
  """The user message for the current turn.

  Args:
    task: the task sentence (`extract_task` of the first observation).
    history: (observation before the action, action sent) for past steps, oldest first; the full
      list or at least its last `history_length` entries.
    observation: the current observation text.
    admissible: the env's admissible commands now.
    step: steps already taken (default: len(history)).
    history_length: how many past records to show (2 in the reference).
    templates: (first-turn, later-turn) template text (`envs.prompt_template`); default the
      built-in TEMPLATE_NO_HISTORY and TEMPLATE.
  """
  first, later = templates or (TEMPLATE_NO_HISTORY, TEMPLATE)
  step_count = steps_taken(history, step)
  fields = {
    "task_description": task,
    "current_observation": observation,
    "admissible_actions": format_admissible(admissible),
    "step_count": step_count,
    "current_step": step_count + 1,
  }
  if step_count == 0 or history_length <= 0:
    return fill(first, **fields)
  window = list(history)[-history_length:]
  return fill(
    later,
    **fields,
    history_length=len(window),
    action_history=format_history(window, step_count),
  )
