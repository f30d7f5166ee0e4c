"""Model output text -> the command sent to ALFWorld, and whether the output had the required format.

Reference behaviour (verl-agent's ALFWorld projection, used by SDAR):
- the output is lower-cased; the action is the stripped text between the first "<action>" and the
  first "</action>" after it;
- the format is valid only when both action tags are present, "<think>" and "</think>" both occur
  in the original (not lower-cased) output, and there is no CJK character (U+4E00..U+9FFF);
- without action tags the env receives the last 30 characters of the lower-cased output: almost
  always a command the engine does not know, answered "Nothing happens." (a no-op step);
- validity is about format only: a well-formed action that is not admissible is still valid.

One deliberate difference: when "</action>" occurs only before "<action>", the reference slices an
empty string and calls it valid; we look for the closing tag after the opening one and otherwise
treat the tags as missing (no-op, invalid).
"""

from __future__ import annotations

from collections.abc import Sequence

from envs.common import project_each, project_tagged_action

__all__ = ["NO_TAG_TAIL_CHARS", "project_action", "project_actions"]

NO_TAG_TAIL_CHARS = 30


def project_action(text: str) -> tuple[str, bool]:
  """Returns (command for the env, format valid)."""
  return project_tagged_action(text, NO_TAG_TAIL_CHARS)


def project_actions(texts: Sequence[str]) -> tuple[list[str], list[bool]]:
  """Batched `project_action`: (commands, validity flags)."""
  return project_each(project_action, texts)
