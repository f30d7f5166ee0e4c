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

from collections.abc import Sequence

from envs.common import project_each, project_tagged_action

__all__ = ["NO_TAG_TAIL_CHARS", "project_action", "project_actions"]

NO_TAG_TAIL_CHARS = 20


def project_action(text: str) -> tuple[str, bool]:
  """Returns (action for the env, format valid)."""
  return project_tagged_action(text, NO_TAG_TAIL_CHARS)


def project_actions(texts: Sequence[str]) -> tuple[list[str], list[bool]]:
  """Batched `project_action`: (actions, validity flags)."""
  return project_each(project_action, texts)
