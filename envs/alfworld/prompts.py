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

__all__ = ["HISTORY_LENGTH", "build_prompt", "format_admissible", "format_history"]

HISTORY_LENGTH = 2

_PREAMBLE = (
  "You are an expert household agent acting in the text version of the ALFRED embodied environment."
)

_INSTRUCTION = (
  "It is your turn to act. First reason step by step about the situation and what to do next, and "
  "enclose all of this reasoning in <think> </think> tags. Then pick exactly one admissible action for "
  "this step and write it inside <action> </action> tags."
)

_FIRST_TURN = (
  "{preamble}\n"
  "Your current observation is: {observation}\n"
  "The admissible actions in the current situation are: [{admissible}].\n"
  "\n"
  "{instruction}"
)

_LATER_TURN = (
  "{preamble} Your task is to: {task}\n"
  "You have already taken {step_count} step(s). Here are the last {shown} observation(s) and the action "
  "you took after each one:\n"
  "{history}\n"
  "You are now at step {current_step} and your current observation is: {observation}\n"
  "The admissible actions in the current situation are: [{admissible}].\n"
  "\n"
  "{instruction}"
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
  """
  step_count = steps_taken(history, step)
  if step_count == 0 or history_length <= 0:
    return _FIRST_TURN.format(
      preamble=_PREAMBLE,
      observation=observation,
      admissible=format_admissible(admissible),
      instruction=_INSTRUCTION,
    )
  window = list(history)[-history_length:]
  return _LATER_TURN.format(
    preamble=_PREAMBLE,
    task=task,
    step_count=step_count,
    shown=len(window),
    history=format_history(window, step_count),
    current_step=step_count + 1,
    observation=observation,
    admissible=format_admissible(admissible),
    instruction=_INSTRUCTION,
  )
