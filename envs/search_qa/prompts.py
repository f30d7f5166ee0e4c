"""The Search-QA user message shown to the agent each turn (chat templating happens elsewhere).

verl-agent's search prompt, word for word (docs/reference.md §8.2):
- first turn (or `history_length` <= 0): the expert-agent preamble, the question, and the
  instruction to reason inside <think> </think> and then either search or answer;
- later turns: the same text with, after the question, "Prior to this step, you have already
  taken k step(s). ... History:" and the last <= `history_length` records, each
  ``Step {n}:{action} {observation}\n``, joined by a newline. A record pairs the action sent at
  step n with the observation it returned (an ``<information>...</information>`` block, or ""
  after an invalid action).
There is no separate "current observation": the newest search result is the last history record.

`search_r1_prefix(question)` is Search-R1's own single-prompt template, the text its parquet
files carry in the `prompt` column; the env does not use it.
"""

from __future__ import annotations

from collections.abc import Sequence

from envs.common import steps_taken

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
  "Now it's your turn to respond for the current step.\n"
  "You should first conduct reasoning process. This process MUST be enclosed within <think> </think> "
  "tags. \n"
  "After completing your reasoning, choose only one of the following actions (do not perform both):\n"
  "(1) If you find you lack some knowledge, you can call a search engine to get more external "
  "information using format: <search> your query </search>.\n"
  "(2) If you have enough knowledge to answer the question confidently, provide your final answer "
  "within <answer> </answer> tags, without detailed illustrations. For example, "
  "<answer>Beijing</answer>.\n"
)

_HEAD = (
  "\n"
  "You are an expert agent tasked with answering the given question step-by-step.\n"
  "Your question: {task_description}\n"
)

TEMPLATE_NO_HISTORY = _HEAD + "\n" + _INSTRUCTION

TEMPLATE = (
  _HEAD + "\n"
  "Prior to this step, you have already taken {step_count} step(s). Below is the interaction history "
  "where <search> </search> wrapped your past search queries and <information> </information> "
  "wrapped the corresponding search results returned by the external search engine. History:\n"
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
) -> str:
  """The user message from (action, observation) records, oldest first.

  Args:
    question: the question (the env's first observation, `info["task"]`).
    records: the full list of past records or at least its last `history_length` entries.
    step: steps already taken (default: len(records)).
    history_length: how many past records to show (4 in the reference).
  """
  step_count = steps_taken(records, step)
  if step_count == 0 or history_length <= 0:
    return TEMPLATE_NO_HISTORY.format(task_description=question)
  window = list(records)[-history_length:]
  return TEMPLATE.format(
    task_description=question,
    step_count=step_count,
    memory_context=format_memory(window, step_count),
  )


def build_prompt(
  task: str,
  history: Sequence[tuple[str, str]],
  observation: str,
  admissible: Sequence[str] = (),
  step: int | None = None,
  history_length: int = HISTORY_LENGTH,
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
    task, records_from_history(history, observation), step=step, history_length=history_length
  )
