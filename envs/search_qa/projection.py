"""Model output text -> the action sent to the Search-QA env, and whether the output had the right format.

Reference behaviour (verl-agent's search projection, docs/reference.md §5.2):
- trim: if "</search>" occurs (case-sensitive) the text is cut after the first one; else if
  "</answer>" occurs, after the first one of those;
- extract: the first ``<search>...</search>`` of the trimmed text (case-insensitive, across lines)
  becomes ``<search>{content.strip()}</search>``; without one, the first ``<answer>...</answer>``
  becomes ``<answer>{content.strip()}</answer>``; without either the action is "" (the env then
  returns no observation and the turn is spent) and the format is invalid;
- validity: also invalid when the untrimmed text has both a ``<search>`` and an ``<answer>`` tag,
  or more than one ``<search>`` or more than one ``<answer>`` tag (case-insensitive). The extracted
  block is still sent to the env. ``<think>`` is not checked.

The trainer subtracts the invalid-format penalty (`INVALID_ACTION_PENALTY`, 0.01) from an invalid
turn's reward; the env itself never sees validity.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from envs.common import project_each

__all__ = ["INVALID_ACTION_PENALTY", "project_action", "project_actions"]

INVALID_ACTION_PENALTY = 0.01

_SEARCH_BLOCK = re.compile(r"<search>(.*?)</search>", re.IGNORECASE | re.DOTALL)
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_SEARCH_TAG = re.compile(r"<search>", re.IGNORECASE)
_ANSWER_TAG = re.compile(r"<answer>", re.IGNORECASE)


def _trim(text: str) -> str:
  """Everything up to and including the first "</search>", else the first "</answer>"."""
  for closing in ("</search>", "</answer>"):
    if closing in text:
      return text.split(closing, 1)[0] + closing
  return text


def project_action(text: str) -> tuple[str, bool]:
  """Returns (action for the env, format valid)."""
  trimmed = _trim(text)
  match = _SEARCH_BLOCK.search(trimmed)
  if match:
    action = f"<search>{match.group(1).strip()}</search>"
  else:
    match = _ANSWER_BLOCK.search(trimmed)
    if not match:
      return "", False
    action = f"<answer>{match.group(1).strip()}</answer>"
  n_search = len(_SEARCH_TAG.findall(text))
  n_answer = len(_ANSWER_TAG.findall(text))
  valid = not (n_search and n_answer) and n_search <= 1 and n_answer <= 1
  return action, valid


def project_actions(texts: Sequence[str]) -> tuple[list[str], list[bool]]:
  """Batched `project_action`: (actions, validity flags)."""
  return project_each(project_action, texts)
