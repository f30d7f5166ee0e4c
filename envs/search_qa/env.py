"""SearchQAEnv: answer a question by searching a corpus, with verl-agent's search-env protocol.

One step is one (projected) model response (docs/reference.md §5.2):
- the turn counter goes up and the action joins the episode's history;
- the episode ends when the action holds both "<answer>" and "</answer>", or when `max_turns`
  (4) turns have been played. The reward is then computed on the whole history (actions and
  information blocks, concatenated): 1.0 when its last <answer>...</answer> exact-matches a gold
  answer after normalisation (`reward.compute_score`), else 0; the observation is "";
- otherwise, when the action holds "<search>" and "</search>", the first
  ``<search>(.*?)</search>`` (case-sensitive, across lines) is searched (content stripped) and the
  observation is ``<information>{result}</information>``: the top `topk` (3) passages as
  verl-agent's JSON (`{"result": "Doc 1: ...\\nDoc 2: ...\\n"}`) or as Search-R1's
  ``Doc i(Title: ...) text`` lines (`passage_format="search_r1"`), each passage cut to
  `max_passage_chars` characters (the cut marked). A failed search shows
  `{"result": "Search error: ..."}` and sets `info["search_error"]` (the message) and
  `info["search_error_kind"]` ("unreachable", "timeout", "HTTP 500", ...), which the trainer
  counts (`rollout/search_errors`) and warns about once per kind;
- any other action (e.g. "" from an output the projection could not read) returns no observation
  (""), reward 0, and spends the turn.
`info["won"]` is done and reward >= 1. The first observation is the question itself.

Invalid formats are penalised by the trainer (0.01 per invalid turn), not here.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from envs.search_qa.data import QARecord
from envs.search_qa.retrieval import (
  DEFAULT_MAX_PASSAGE_CHARS,
  PASSAGE_FORMATS,
  Retriever,
  SearchError,
  error_text,
  information_text,
)
from envs.search_qa.reward import compute_score

__all__ = ["MAX_TURNS", "TOPK", "SearchQAEnv"]

MAX_TURNS = 4
TOPK = 3
_QUERY = re.compile(r"<search>(.*?)</search>", re.DOTALL)


class SearchQAEnv:
  """Plays questions `records[task]`, searching with `retriever`.

  Args:
    records: the questions.
    retriever: anything with `search(queries, topk) -> [[Passage, ...], ...]`.
    max_turns: turns before the episode is cut (an answer ends it earlier).
    topk: passages per search.
    passage_format: "verl_agent" (JSON, the reference's env) or "search_r1" (Doc i(Title: ...)).
    max_passage_chars: characters of a passage shown (the rest cut, the cut marked); 0 = whole.
    seed: order of `reset()` without a task (a seeded shuffle, reshuffled after each pass).
    owns_retriever: close the retriever in `close()`.
  """

  def __init__(
    self,
    records: Sequence[QARecord],
    retriever: Retriever,
    max_turns: int = MAX_TURNS,
    topk: int = TOPK,
    passage_format: str = "verl_agent",
    seed: int = 0,
    owns_retriever: bool = False,
    max_passage_chars: int = DEFAULT_MAX_PASSAGE_CHARS,
  ):
    if not records:
      raise ValueError("SearchQAEnv needs at least one question")
    if passage_format not in PASSAGE_FORMATS:
      raise ValueError(
        f"unknown passage_format {passage_format!r}; choose one of {PASSAGE_FORMATS}"
      )
    if max_turns < 1 or topk < 1:
      raise ValueError(f"max_turns and topk must be >= 1, got max_turns={max_turns}, topk={topk}")
    if max_passage_chars < 0:
      raise ValueError(
        f"max_passage_chars must be >= 0 (0: whole passages), got {max_passage_chars}"
      )
    self.max_passage_chars = max_passage_chars
    self.records = list(records)
    self.retriever = retriever
    self.max_turns = max_turns
    self.topk = topk
    self.passage_format = passage_format
    self.owns_retriever = owns_retriever
    self._rng = random.Random(seed)
    self._order: list[int] = []
    self._record: QARecord | None = None
    self._history: list[str] = []
    self._turns = 0
    self._done = True
    self._last: tuple[str, dict[str, Any]] = ("", {})

  @property
  def num_tasks(self) -> int:
    return len(self.records)

  def _next_task(self) -> int:
    if not self._order:
      self._order = list(range(len(self.records)))
      self._rng.shuffle(self._order)
    return self._order.pop()

  def _info(self, won: bool) -> dict[str, Any]:
    record = self._record
    assert record is not None
    return {
      "won": won,
      "admissible_commands": [],
      "task_type": record.data_source,
      "data_source": record.data_source,
      "task": record.question,
      "golden_answers": list(record.golden_answers),
      "question_id": record.id,
      "steps": self._turns,
    }

  def reset(self, task: int | None = None) -> tuple[str, dict[str, Any]]:
    index = self._next_task() if task is None else int(task)
    if not 0 <= index < len(self.records):
      raise IndexError(f"task {index} out of range: this env has {len(self.records)} questions")
    self._record = self.records[index]
    self._history = []
    self._turns = 0
    self._done = False
    self._last = (self._record.question, self._info(False))
    return self._record.question, dict(self._last[1])

  def _search(self, query: str) -> tuple[str, SearchError | None]:
    """(information text, the error or None) for one query."""
    try:
      passages = self.retriever.search([query], self.topk)[0]
    except SearchError as e:
      return error_text(str(e), self.passage_format), e
    text = information_text(passages[: self.topk], self.passage_format, self.max_passage_chars)
    return text, None

  def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
    if self._record is None:
      raise RuntimeError("step() before reset(); call reset() first")
    if self._done:  # stepping a finished episode changes nothing
      return "", 0.0, True, dict(self._last[1])
    self._turns += 1
    self._history.append(action)
    done = self._turns >= self.max_turns or ("<answer>" in action and "</answer>" in action)
    if done:
      reward = compute_score("".join(self._history), self._record.golden_answers)
      info = self._info(won=reward >= 1.0)
      info.update(tool_calling=False, postprocessed_action=action)
      self._done = True
      self._last = ("", info)
      return "", reward, True, dict(info)
    observation, error = "", None
    match = _QUERY.search(action) if "<search>" in action and "</search>" in action else None
    if match is not None:
      text, error = self._search(match.group(1).strip())
      if self.passage_format == "search_r1":
        raw = f"\n\n<information>{text.strip()}</information>\n\n"
      else:
        raw = f"\n<information>{text}</information>\n"
      self._history.append(raw)
      observation = raw.strip()
    info = self._info(won=False)
    info.update(tool_calling=True, postprocessed_action=action)
    if error is not None:
      info["search_error"] = str(error)
      info["search_error_kind"] = error.kind
    self._last = (observation, info)
    return observation, 0.0, False, dict(info)

  def close(self) -> None:
    if self.owns_retriever:
      self.retriever.close()
