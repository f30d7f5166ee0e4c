"""Prompt templates from a file (``env.prompt_template=PATH``): run an environment with another
wording of its per-turn user message, e.g. the authors' own template text, kept in one's own file.

The file is Python ``str.format`` text with named placeholders. It holds one template for every
turn, or two, each after a marker line: ``[[first_turn]]`` (no history yet, or history 0) and
``[[later_turns]]``. An optional ``[[skill_header]]`` section replaces the teacher's skill-block
header (default "[Privileged Skill Information]"; the block is that line, the skill text and a
blank line). Text before the first marker is ignored when markers are used; a section's leading
and trailing newlines are kept except the one that ends the marker line.

Placeholders (the names the authors' templates use; each environment fills what it has):
  {task_description}      the task (ALFWorld's task sentence, WebShop's instruction, the question)
  {current_observation}   the current observation (WebShop: its page fields, quoted)
  {admissible_actions}    the admissible actions as the environment lists them (also
                          {available_actions}; Search-QA: empty)
  {step_count}            steps taken so far
  {history_length}        history records shown
  {action_history}        the history records (also {memory_context})
  {current_step}          step_count + 1
The history, observation and action formats, the history window and WebShop's fallback to the
first-turn template over 13,000 characters stay the environment's own; only the wording changes.
"""

from __future__ import annotations

import dataclasses
import os
import string
from typing import Any

from envs.errors import EnvFileNotFoundError

__all__ = [
  "PLACEHOLDERS",
  "PromptTemplate",
  "apply_prompt_template",
  "fill",
  "load_prompt_template",
]

PLACEHOLDERS = (
  "task_description",
  "current_observation",
  "admissible_actions",
  "available_actions",
  "step_count",
  "history_length",
  "action_history",
  "memory_context",
  "current_step",
)
_SECTIONS = ("first_turn", "later_turns", "skill_header")


def fill(template: str, **fields: Any) -> str:
  """`template` with its placeholders filled; the aliases (available_actions, memory_context)
  follow admissible_actions and action_history."""
  values = dict.fromkeys(PLACEHOLDERS, "")
  values.update(fields)
  values["available_actions"] = fields.get("available_actions", values["admissible_actions"])
  values["admissible_actions"] = fields.get("admissible_actions", values["available_actions"])
  values["memory_context"] = fields.get("memory_context", values["action_history"])
  values["action_history"] = fields.get("action_history", values["memory_context"])
  return template.format(**values)


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
  first_turn: str
  later_turns: str
  skill_header: str | None = None  # the skill block's first line, None: the built-in one
  path: str = ""

  @property
  def turns(self) -> tuple[str, str]:
    return self.first_turn, self.later_turns

  @classmethod
  def parse(cls, text: str, path: str = "<text>") -> PromptTemplate:
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines(keepends=True):
      marker = line.strip()
      if marker.startswith("[[") and marker.endswith("]]"):
        current = marker[2:-2].strip()
        if current not in _SECTIONS:
          raise ValueError(
            f"prompt template {path}: unknown section marker {marker!r}. Fix: use "
            f"{', '.join(f'[[{s}]]' for s in _SECTIONS)}"
          )
        if current in sections:
          raise ValueError(f"prompt template {path}: {marker} appears twice. Fix: keep one")
        sections[current] = []
      elif current is not None:
        sections[current].append(line)
    if not sections:
      first = later = text
    else:
      first = "".join(sections.get("first_turn", sections.get("later_turns", [])))
      later = "".join(sections.get("later_turns", sections.get("first_turn", [])))
      if not (first or later):
        raise ValueError(
          f"prompt template {path}: no [[first_turn]] or [[later_turns]] text. Fix: add the "
          "template text after one of these markers"
        )
    header = "".join(sections["skill_header"]).strip("\n") if "skill_header" in sections else None
    for name, template in (("first_turn", first), ("later_turns", later)):
      _check(template, path, name)
    if header is not None and not header:
      raise ValueError(
        f"prompt template {path}: the [[skill_header]] section is empty. Fix: write the header "
        "line after it, or drop the marker to keep the built-in header"
      )
    return cls(first, later, header, path)


def _check(template: str, path: str, name: str) -> None:
  """Every placeholder of `template` is known (named, no format spec needing a type)."""
  try:
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
  except ValueError as e:
    raise ValueError(
      f"prompt template {path} ({name}): {e}. Fix: write a literal brace as {{{{ or }}}}"
    ) from None
  unknown = sorted({f for f in fields if f not in PLACEHOLDERS})
  if unknown:
    raise ValueError(
      f"prompt template {path} ({name}): unknown placeholder(s) {unknown}. Fix: use only "
      f"{list(PLACEHOLDERS)} (a literal brace is written {{{{ or }}}})"
    )


def load_prompt_template(path: str | None) -> PromptTemplate | None:
  """The template file at `path` (None or "": none, the environment's built-in prompts)."""
  if not path:
    return None
  full = os.path.expanduser(path)
  if not os.path.isfile(full):
    raise EnvFileNotFoundError(
      f"env.prompt_template={path!r}: no such file. Fix: point it at a template file, or unset "
      "it for the built-in prompts"
    )
  with open(full, encoding="utf-8") as f:
    return PromptTemplate.parse(f.read(), path)


def apply_prompt_template(path: str | None, adapter: Any = None, retriever: Any = None) -> None:
  """Makes `adapter` (an environment's EnvAdapter with a `templates` attribute) build its prompts
  from the template file at `path`, and `retriever` (a SkillRetriever) head its blocks with the
  file's [[skill_header]], if it has one. No `path`: both keep their built-in text."""
  template = load_prompt_template(path)
  if template is None:
    return
  if adapter is not None:
    if not hasattr(adapter, "templates"):
      raise ValueError(
        f"env.prompt_template={path!r}: the environment's adapter {type(adapter).__name__} builds "
        "its prompts without templates. Fix: unset env.prompt_template for this environment"
      )
    adapter.templates = template.turns
  if retriever is not None and template.skill_header is not None:
    retriever.header = template.skill_header + "\n"
