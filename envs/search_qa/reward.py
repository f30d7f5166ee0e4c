"""Search-QA answer scoring: SQuAD-style answer normalisation and exact match, as Search-R1 scores.

- `normalize_answer(s)`: lower-case, delete every ASCII punctuation character (nothing inserted in
  its place), replace the whole words "a", "an", "the" by a space, collapse whitespace.
- `em_check(prediction, golden_answers)`: 1 when the normalised prediction equals one normalised
  gold answer, else 0 (a single string counts as a one-element list).
- `subem_check`: 1 when a normalised gold answer is a substring of the normalised prediction.
- `extract_solution(text)`: the stripped content of the **last** ``<answer>...</answer>`` in
  `text` (None when there is none), as verl-agent's search env extracts it.
- `compute_score(text, ground_truth)`: 1.0 when the extracted answer exact-matches, else 0.0; the
  env scores the concatenation of the episode's actions and ``<information>`` blocks.

docs/reference.md §6 has the reference definitions these follow.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
  "compute_score",
  "em_check",
  "extract_solution",
  "golden_list",
  "normalize_answer",
  "subem_check",
]

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def normalize_answer(s: str) -> str:
  """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace."""
  lowered = s.lower()
  no_punct = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
  no_articles = _ARTICLES.sub(" ", no_punct)
  return " ".join(no_articles.split())


def golden_list(golden_answers: str | Iterable[str]) -> list[str]:
  """Gold answers as a list of strings (a single string becomes a one-element list)."""
  if isinstance(golden_answers, str):
    return [golden_answers]
  return [str(g) for g in golden_answers]


def em_check(prediction: str, golden_answers: str | Iterable[str]) -> int:
  """1 if the normalised prediction equals any normalised gold answer, else 0."""
  normalized = normalize_answer(prediction)
  return int(any(normalize_answer(g) == normalized for g in golden_list(golden_answers)))


def subem_check(prediction: str, golden_answers: str | Iterable[str]) -> int:
  """1 if any normalised gold answer occurs inside the normalised prediction, else 0."""
  normalized = normalize_answer(prediction)
  return int(any(normalize_answer(g) in normalized for g in golden_list(golden_answers)))


def extract_solution(text: str) -> str | None:
  """The stripped content of the last <answer>...</answer> block, or None when there is none."""
  matches = _ANSWER_BLOCK.findall(text)
  return matches[-1].strip() if matches else None


def _targets(ground_truth: Any) -> list[str]:
  if isinstance(ground_truth, Mapping):
    if "target" not in ground_truth:
      raise ValueError(
        f"ground_truth {ground_truth!r} has no 'target' key; pass {{'target': [answers]}} or a list"
      )
    return golden_list(ground_truth["target"])
  return golden_list(ground_truth)


def compute_score(
  text: str, ground_truth: Any, format_score: float = 0.0, score: float = 1.0
) -> float:
  """`score` when the last <answer> block of `text` exact-matches a gold answer; 0 without an
  answer block; `format_score` for a wrong answer. `ground_truth` is {"target": [...]} or a list."""
  answer = extract_solution(text)
  if answer is None:
    return 0.0
  return float(score) if em_check(answer, _targets(ground_truth)) else float(format_score)
