"""The WebShop user-message text shown to the agent each turn (chat templating happens elsewhere).

verl-agent's WebShop prompt structure and formats, in our own words (docs/environments.md lists
what differs):
- the task is the instruction: field 2 of the first observation split on " [SEP] "
  (`extract_task`);
- an observation is shown from just after the instruction, each field single-quoted and joined by
  " [SEP] " (`format_observation`); an observation without the instruction (the done page) is
  shown raw;
- the available actions are "search[<your query>]" when the page has a search bar, then
  "click[<clickable>]" for every clickable (so the search page also offers "click[search]", which
  the env refuses), each rendered "'<action>'," on its own line (`format_available_actions`);
  `WebShopEnv` already reports this list as info["admissible_commands"];
- the first turn uses the template without history; later turns add the number of steps taken
  k, the number of records shown h, and the last <= `history_length` (2) records
  "[Observation i: '<formatted observation before action i>', Action i: '<action i>']" one per
  line, numbered by absolute step, then the current step number; a prompt longer than 13,000
  characters falls back to the template without history;
- the instruction asks for the reasoning inside <think> </think> and one listed action inside
  <action> </action>.
`build_prompt(..., templates=(first, later))` fills other template text instead (the
placeholders of `envs.prompt_template`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from envs.common import format_history, steps_taken
from envs.prompt_template import fill

__all__ = [
  "HISTORY_LENGTH",
  "MAX_PROMPT_CHARS",
  "SEARCH_ACTION",
  "available_action_list",
  "build_prompt",
  "extract_task",
  "format_available_actions",
  "format_history",
  "format_observation",
]

HISTORY_LENGTH = 2
MAX_PROMPT_CHARS = 13000
SEARCH_ACTION = "search[<your query>]"
SEP = " [SEP] "

_INSTRUCTION = (
  "Decide on this step's action. Reason about the page and the request first, and put all of "
  "this reasoning between <think> </think> tags. Then write a single action from the list above "
  "between <action> </action> tags.\n"
)

_PREAMBLE = "You are shopping on the WebShop website on behalf of a customer.\n"

TEMPLATE_NO_HISTORY = (
  _PREAMBLE + "The customer's request: {task_description}.\n"
  "The page you see now: {current_observation}.\n"
  "Actions you can take on this page:\n"
  "[\n"
  "{available_actions}\n"
  "].\n"
  "\n" + _INSTRUCTION
)

TEMPLATE = (
  _PREAMBLE + "The customer's request: {task_description}.\n"
  "So far you have taken {step_count} step(s); the latest {history_length} page(s) you saw, each "
  "with the action you took on it: {action_history}\n"
  "This is step {current_step}. The page you see now: {current_observation}.\n"
  "Actions you can take on this page:\n"
  "[\n"
  "{available_actions}\n"
  "].\n"
  "\n" + _INSTRUCTION
)


def extract_task(first_observation: str) -> str:
  """The instruction text of a WebShop text observation (field 2 after splitting on " [SEP] ")."""
  parts = first_observation.split(SEP)
  if len(parts) < 3 or parts[1] != "Instruction:":
    raise ValueError(
      "not a WebShop search-page observation (expected 'WebShop [SEP] Instruction: [SEP] <task> "
      f"...'): {first_observation[:120]!r}"
    )
  return parts[2]


def format_observation(observation: str, task: str) -> str:
  """The fields after the instruction, quoted, joined by " [SEP] " (raw when `task` is absent)."""
  parts = observation.split(SEP)
  if task not in parts:
    return observation
  start = parts.index(task) + 1
  return SEP.join(f"'{part}'" for part in parts[start:])


def available_action_list(available: Mapping[str, Any]) -> list[str]:
  """verl-agent's action list from the original's {"has_search_bar", "clickables"}."""
  unknown = set(available) - {"has_search_bar", "clickables"}
  if unknown:
    raise ValueError(f"unknown keys {sorted(unknown)} in available actions {dict(available)}")
  actions = [SEARCH_ACTION] if available["has_search_bar"] else []
  return actions + [f"click[{c}]" for c in available["clickables"]]


def format_available_actions(actions: Sequence[str]) -> str:
  """Each action quoted and followed by a comma, one per line."""
  return "\n".join(f"'{action}'," for action in actions)


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
    task: the instruction (`extract_task` of the first observation, or info["task"]).
    history: (observation before the action, action sent) for past steps, oldest first; raw env
      observations are formatted here (already formatted ones are kept as they are).
    observation: the current raw env observation.
    admissible: info["admissible_commands"] (the available-action list).
    step: steps already taken (default: len(history)).
    history_length: how many past records to show (2 in the reference).
    templates: (first-turn, later-turn) template text (`envs.prompt_template`); default the
      built-in TEMPLATE_NO_HISTORY and TEMPLATE.
  """
  first, later = templates or (TEMPLATE_NO_HISTORY, TEMPLATE)
  step_count = steps_taken(history, step)
  fields = {
    "task_description": task,
    "current_observation": format_observation(observation, task),
    "available_actions": format_available_actions(admissible),
    "step_count": step_count,
    "current_step": step_count + 1,
  }
  first_turn = fill(first, **fields)
  if step_count == 0 or history_length <= 0:
    return first_turn
  window = [(format_observation(obs, task), action) for obs, action in history[-history_length:]]
  prompt = fill(
    later,
    **fields,
    history_length=len(window),
    action_history=format_history(window, step_count),
  )
  return first_turn if len(prompt) > MAX_PROMPT_CHARS else prompt
