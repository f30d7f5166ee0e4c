"""Model output text -> the action sent to WebShop, and whether the output had the required format.

The reference behaviour (verl-agent's WebShop projection):
- the output is lower-cased; the action is the stripped text between the first "<action>" and the
  first "</action>" after it;
- the format is valid only when both action tags are present, "<think>" and "</think>" both occur
  in the original (not lower-cased) output, and there is no CJK character (U+4E00..U+9FFF);
- without action tags the env receives the last 20 characters of the lower-cased output: almost
  never a valid `search[...]` / `click[...]` action, so a no-op step;
- validity is about format only: a well-formed action the page does not offer is still valid.

One deliberate difference, shared with the ALFWorld projection: when "</action>" occurs only
before "<action>", the reference slices an empty string and calls it valid; we look for the closing
tag after the opening one and otherwise treat the tags as missing (no-op, invalid).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["NO_TAG_TAIL_CHARS", "project_action", "project_actions"]

NO_TAG_TAIL_CHARS = 20
_CJK = re.compile(r"[\u4e00-\u9fff]")
_OPEN, _CLOSE = "<action>", "</action>"


def project_action(text: str) -> tuple[str, bool]:
  """Returns (action for the env, format valid)."""
  lowered = text.lower()
  start = lowered.find(_OPEN)
  end = lowered.find(_CLOSE, start + len(_OPEN)) if start != -1 else -1
  if start == -1 or end == -1:
    return lowered[-NO_TAG_TAIL_CHARS:], False
  action = lowered[start + len(_OPEN) : end].strip()
  valid = "<think>" in text and "</think>" in text and not _CJK.search(text)
  return action, valid


def project_actions(texts: Sequence[str]) -> tuple[list[str], list[bool]]:
  """Batched `project_action`: (actions, validity flags)."""
  pairs = [project_action(t) for t in texts]
  return [a for a, _ in pairs], [v for _, v in pairs]
