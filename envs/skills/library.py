"""Skill libraries: Markdown skill files per environment, parsed into numbered items, and their mapping.

A folder `envs/skills/<env>/` holds `skill_mapping.json` and Markdown files. Each file starts with
a header line ("### GENERAL SKILLS ###" or "### TASK: <name> ###"), one intro sentence, then
numbered items "N. Title: principle. Apply this when ...". The mapping has
- `skill_files`: skill name -> file; the general file is named "general_skills" (the authors'
  layout) or "general" (ours),
- `task_to_skill`: task-type key -> skill name; a key matches a game path or task type that
  contains it, the first matching key in file order wins,
- `task_keywords` (optional): keywords for the keyword rule, keyed by skill name (ours) or by
  task type (the authors' layout; resolved to its skill through `task_to_skill`).
Both layouts load to the same library; a name neither layout knows is an error that names the
folder and the key.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

from envs.errors import EnvFileNotFoundError, EnvInputError

__all__ = ["SkillItem", "SkillFile", "SkillLibrary", "skills_dir"]

_ITEM_START = re.compile(r"^(\d+)\.\s+(.*)$")
GENERAL = "general"  # the general file's name inside a SkillLibrary
GENERAL_KEYS = ("general_skills", "general")  # its key in skill_files: the authors', ours


def skills_dir(env: str) -> str:
  """The folder of the skills shipped for environment `env`."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), env)
  if not os.path.isdir(path):
    raise EnvFileNotFoundError(f"no skills for environment {env!r} (expected the folder {path})")
  return path


@dataclasses.dataclass(frozen=True)
class SkillItem:
  """One numbered strategy from a skill file."""

  skill: str  # the skill (file) it comes from, e.g. "heat"
  number: int  # its number in that file
  text: str  # "Title: principle. Apply this when ...", without the number

  @property
  def title(self) -> str:
    return self.text.split(":", 1)[0]


@dataclasses.dataclass(frozen=True)
class SkillFile:
  name: str
  header: str
  intro: str
  items: tuple[SkillItem, ...]
  raw: str  # the file's text, stripped

  def render(self, items: tuple[SkillItem, ...] | None = None) -> str:
    """Header, intro and the given items (default all), renumbered from 1."""
    chosen = self.items if items is None else items
    lines = [self.header, self.intro, ""] + [
      f"{n}. {item.text}" for n, item in enumerate(chosen, 1)
    ]
    return "\n".join(lines)


def _parse_skill_file(name: str, text: str) -> SkillFile:
  lines = text.strip().splitlines()
  if not lines or not lines[0].startswith("###"):
    raise ValueError(
      f"skill file {name!r} must start with a '### ... ###' header line, got {lines[:1]}"
    )
  header, intro_lines, items, current = lines[0].strip(), [], [], None
  for line in lines[1:]:
    match = _ITEM_START.match(line.strip())
    if match:
      if current:
        items.append(current)
      current = [int(match.group(1)), match.group(2).strip()]
    elif current:
      if line.strip():
        current[1] += " " + line.strip()
    elif line.strip():
      intro_lines.append(line.strip())
  if current:
    items.append(current)
  if not items:
    raise ValueError(f"skill file {name!r} has no numbered items ('1. Title: ...')")
  return SkillFile(
    name,
    header,
    " ".join(intro_lines),
    tuple(SkillItem(name, number, body) for number, body in items),
    text.strip(),
  )


@dataclasses.dataclass(frozen=True)
class SkillLibrary:
  """The general file, the task files (in mapping order) and the matching rules of one environment."""

  general: SkillFile | None
  tasks: dict[str, SkillFile]
  task_to_skill: dict[str, str]
  task_keywords: dict[str, list[str]]
  folder: str = ""  # where it was loaded from ("" when built in memory)

  @classmethod
  def load(cls, folder_or_env: str) -> SkillLibrary:
    """Loads a skills folder (the authors' layout or ours), or the shipped skills of an
    environment name (e.g. "alfworld")."""
    folder = folder_or_env if os.path.isdir(folder_or_env) else skills_dir(folder_or_env)
    mapping_path = os.path.join(folder, "skill_mapping.json")
    if not os.path.isfile(mapping_path):
      raise EnvFileNotFoundError(
        f"skills folder {folder} has no skill_mapping.json. Fix: point env.skills.dir at a "
        "folder holding skill_mapping.json and its Markdown files"
      )
    with open(mapping_path) as f:
      try:
        mapping = json.load(f)
      except json.JSONDecodeError as e:
        raise EnvInputError(
          f"{mapping_path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}). Fix: "
          "correct the file (skill_mapping.json holds one object with 'skill_files')"
        ) from None
    if not isinstance(mapping, dict) or not isinstance(mapping.get("skill_files"), dict):
      raise EnvInputError(  # a bad file's content, not a bad argument type
        f"{mapping_path} has no 'skill_files' object (skill name -> Markdown file). Fix: add "
        '"skill_files": {"general_skills": "general_skills.md", ...}'
      )
    general_keys = [k for k in GENERAL_KEYS if k in mapping["skill_files"]]
    if len(general_keys) > 1:
      raise EnvInputError(
        f"{mapping_path}: skill_files names the general file twice ({general_keys}). Fix: keep "
        "one of them"
      )
    files = {}
    for name, filename in mapping["skill_files"].items():
      name = GENERAL if name in GENERAL_KEYS else name
      path = os.path.join(folder, filename)
      if not os.path.isfile(path):
        raise EnvFileNotFoundError(
          f"{mapping_path}: skill_files[{name!r}] = {filename!r}, but {path} does not exist. Fix: "
          "add the file or correct its name in skill_files"
        )
      with open(path) as f:
        try:
          files[name] = _parse_skill_file(name, f.read())
        except ValueError as e:
          raise EnvInputError(f"{path}: {e}. Fix: correct the file") from None
    task_to_skill = dict(mapping.get("task_to_skill", {}))
    unknown = sorted({s for s in task_to_skill.values() if s not in files or s == GENERAL})
    if unknown:
      raise EnvInputError(
        f"task_to_skill in {mapping_path} names skills without a task file: {unknown}. Fix: add "
        "them to skill_files or map the task types to skills that skill_files lists"
      )
    keywords: dict[str, list[str]] = {}
    for key, words in mapping.get("task_keywords", {}).items():
      skill = key if key in files and key != GENERAL else task_to_skill.get(key)
      if skill is None:
        raise EnvInputError(
          f"task_keywords in {mapping_path} has the key {key!r}, which is neither a skill of "
          f"skill_files nor a task type of task_to_skill. Fix: key it by one of "
          f"{sorted(set(files) - {GENERAL}) + sorted(task_to_skill)}"
        )
      merged = keywords.setdefault(skill, [])
      merged.extend(w for w in words if w not in merged)
    return cls(
      general=files.pop(GENERAL, None),
      tasks=files,
      task_to_skill=task_to_skill,
      task_keywords=keywords,
      folder=folder,
    )

  def all_items(self) -> list[SkillItem]:
    """Every item: general first, then the task files in mapping order."""
    files = ([self.general] if self.general else []) + list(self.tasks.values())
    return [item for f in files for item in f.items]

  def file(self, name: str) -> SkillFile:
    if name == GENERAL and self.general:
      return self.general
    return self.tasks[name]

  def match_task(self, key: str) -> str | None:
    """The skill for a game path or task type: the first task_to_skill key contained in it."""
    for task_key, skill in self.task_to_skill.items():
      if task_key in key:
        return skill
    return None

  def match_keywords(self, text: str) -> list[str]:
    """Skills whose keywords occur in `text` (lower-cased substring test), in task_keywords order."""
    lowered = text.lower()
    return [
      skill for skill, words in self.task_keywords.items() if any(w and w in lowered for w in words)
    ]
