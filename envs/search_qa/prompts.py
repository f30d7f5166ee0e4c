"""The Search-QA user message shown to the agent each turn (chat templating happens elsewhere).

verl-agent's search prompt structure and formats, in our own words (docs/environments.md lists
what differs):
- first turn (or `history_length` <= 0): the preamble, the question, and the instruction to
  reason inside <think> </think> and then either search (<search> query </search>) or answer
  (<answer> ... </answer>), not both;
- later turns: the same text with, after the question, the number of steps taken k, a line
  saying how queries and results are wrapped, "History:" and the last <= `history_length`
  records, each
  ``Step {n}:{action} {observation}\n``, joined by a newline. A record pairs the action sent at
  step n with the observation it returned (an ``<information>...</information>`` block, or ""
  after an invalid action).
There is no separate "current observation": the newest search result is the last history record.
The text contains "for" (the authors' data_source rule then never picks the compare skill for a
whole-prompt query, as in the reference). `build_prompt(..., templates=(first, later))` fills other
template text instead (the placeholders of `envs.prompt_template`).

`search_r1_prefix(question)` is Search-R1's own single-prompt template, the text its parquet
files carry in the `prompt` column; the env does not use it.
"""

from __future__ import annotations

from collections.abc import Sequence

from envs.common import steps_taken
from envs.prompt_template import fill

__all__ = [
  "HISTORY_LENGTH",
  "TEMPLATE",
  "TEMPLATE_NO_HISTORY",
  "build_prompt",
  "build_prompt_from_records",
  "format_memory",
  "records_from_history",
  "search_r1_prefix",
]

HISTORY_LENGTH = 4

_INSTRUCTION = (
  "Respond for this step. Reason first, inside <think> </think> tags.\n"
  "Then do exactly one of the following, not both:\n"
  "(1) to look up facts you are missing, write a search query as <search> your query </search>;\n"
  "(2) once you are sure of the answer, give it alone, with no explanation, inside "
  "<answer> </answer> tags, for example <answer>Lisbon</answer>.\n"
)

_HEAD = (
  "You answer questions by reasoning step by step, looking facts up with a search engine when "
  "you need them.\n"
  "Question: {task_description}\n"
)

TEMPLATE_NO_HISTORY = _HEAD + "\n" + _INSTRUCTION

TEMPLATE = (
  _HEAD + "\n"
  "Steps taken so far: {step_count}. In the history below your earlier queries appear inside "
  "<search> </search> and what the search engine returned for each inside "
  "<information> </information>. History:\n"
  "{memory_context}\n"
  "\n" + _INSTRUCTION
)

_SEARCH_R1_PREFIX = (
  "Answer the given question. You must conduct reasoning inside <think> and </think> first every "
  "time you get new information. After reasoning, if you find you lack some knowledge, you can call "
  "a search engine by <search> query </search> and it will return the top searched results between "
  "<information> and </information>. You can search as many times as your want. If you find no "
  "further external knowledge needed, you can directly provide the answer inside <answer> and "
  "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
  "Question: {question}\n"
)


def search_r1_prefix(question: str) -> str:
  """Search-R1's prompt for `question` (its `make_prefix`, template 'base')."""
  return _SEARCH_R1_PREFIX.format(question=question)


def format_memory(records: Sequence[tuple[str, str]], step_count: int) -> str:
  """History text for (action, observation it returned) records, the last one being step `step_count`."""
  first = step_count - len(records) + 1
  return "\n".join(
    f"Step {first + j}:{action} {observation}\n" for j, (action, observation) in enumerate(records)
  )


def records_from_history(
  history: Sequence[tuple[str, str]], observation: str
) -> list[tuple[str, str]]:
  """(action, observation it returned) records from the agent loop's (observation before the
  action, action) pairs and the current observation."""
  after = [obs for obs, _ in history[1:]] + [observation]
  return [(action, after[j]) for j, (_, action) in enumerate(history)]


def build_prompt_from_records(
  question: str,
  records: Sequence[tuple[str, str]],
  step: int | None = None,
  history_length: int = HISTORY_LENGTH,
  templates: tuple[str, str] | None = None,
) -> str:
  """The user message from (action, observation) records, oldest first.

  Args:
    question: the question (the env's first observation, `info["task"]`).
    records: the full list of past records or at least its last `history_length` entries.
    step: steps already taken (default: len(records)).
    history_length: how many past records to show (4 in the reference).
    templates: (first-turn, later-turn) template text (`envs.prompt_template`); default the
      built-in TEMPLATE_NO_HISTORY and TEMPLATE.
  """
  first, later = templates or (TEMPLATE_NO_HISTORY, TEMPLATE)
  step_count = steps_taken(records, step)
  fields = {
    "task_description": question,
    "current_observation": records[-1][1] if records else "",
    "step_count": step_count,
    "current_step": step_count + 1,
  }
  if step_count == 0 or history_length <= 0:
    return fill(first, **fields)
  window = list(records)[-history_length:]
  return fill(
    later,
    **fields,
    history_length=len(window),
    memory_context=format_memory(window, step_count),
  )


def build_prompt(
  task: str,
  history: Sequence[tuple[str, str]],
  observation: str,
  admissible: Sequence[str] = (),
  step: int | None = None,
  history_length: int = HISTORY_LENGTH,
  templates: tuple[str, str] | None = None,
) -> str:
  """The user message for the current turn, with the same arguments as ALFWorld's `build_prompt`.

  Args:
    task: the question.
    history: (observation before the action, action sent) for past steps, oldest first (the
      first observation is the question itself); the full list or at least its last
      `history_length` entries.
    observation: the current observation (what the last action returned).
    admissible: unused (Search-QA has no finite action set); accepted for a uniform call.
    step: steps already taken (default: len(history)).
    history_length: how many past records to show (4 in the reference).
  """
  del admissible
  return build_prompt_from_records(
    task,
    records_from_history(history, observation),
    step=step,
    history_length=history_length,
    templates=templates,
  )
