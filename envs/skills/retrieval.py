"""SkillRetriever: which skill text goes into the teacher's privileged block, by strategy.

Strategies:
- "rules" (the reference's deterministic selection; `rules_version` picks which behaviour):
    * "pre_fix": the code the paper ran with: no game file and no keyword fallback reached the
      provider, so ALFWorld (and WebShop) teachers saw the general skills only.
    * "post_fix" (after the authors' June 2026 fix): general + the task file of the first
      task_to_skill key contained in the game path (else in the task type); without either, the
      keyword rule over `query` (every matching task file, in keyword order); else general only.
- "bm25": the `top_k` items (over the general and all task files) that bm25s ranks highest for
  `query` (the task sentence and/or observation; the task type when no query is given).
- "random": `top_k` items drawn uniformly from all items (the paper's robustness ablation); seeded,
  and reproducible per `sample_id` when one is given.
- "none": no skills (empty block).

`places="task"` shortens what any strategy selected: each "Places by type: ..." list (the
regularities of where a household keeps each object type, as in the ALFWorld general skills) keeps
only the entries naming a word of the task sentence, so a small model's teacher prompt carries the
one line that matters instead of forty (the offline demo uses it; "all", the default, keeps the
text as written).

`privileged_block(...)` returns "[Privileged Skill Information]\n" + skill text + "\n\n", the
string the caller places before the chat-templated teacher prompt, or "" when there is no skill text.

`student_block(...)` is Skill-GRPO's block, placed inside the student's user message. With "rules"
it is the keyword rule over that message's text (general + every task file whose keywords occur
in it, in keyword order), whatever `rules_version` says: the reference's Skill-GRPO selects from
the observation text only, never from a game file (docs/reference.md §2.6, §3.2). The other
strategies select for the student as they do for the teacher.
"""

from __future__ import annotations

import os
import random
import re
from typing import Any

from envs.common import import_bm25s
from envs.errors import EnvInputError
from envs.skills.library import GENERAL, GENERAL_KEYS, SkillItem, SkillLibrary

__all__ = [
  "BLOCK_HEADER",
  "RULES_VERSIONS",
  "STRATEGIES",
  "SkillRetriever",
  "check_teacher_blocks",
  "skills_section_problems",
]

STRATEGIES = ("rules", "bm25", "random", "none")
PLACES = ("all", "task")
_PLACES_LIST = re.compile(r"(Places by type: )(.*?)(\.(?:\s|$))")
RULES_VERSIONS = ("pre_fix", "post_fix")
BLOCK_HEADER = "[Privileged Skill Information]\n"


class SkillRetriever:
  """Selects skill text for a turn-sample.

  Args:
    library: a SkillLibrary, or an environment name / skills folder to load one from.
    strategy: one of STRATEGIES.
    rules_version: for "rules", "pre_fix" (general only) or "post_fix" (general + matched task file).
    top_k: items returned by "bm25" and "random".
    seed: seed of the "random" strategy.
    places: "all" (the text as written) or "task" (each "Places by type:" list cut to the entries
      naming a word of the task sentence).
  """

  def __init__(
    self,
    library: SkillLibrary | str = "alfworld",
    strategy: str = "rules",
    rules_version: str = "post_fix",
    top_k: int = 5,
    seed: int = 0,
    places: str = "all",
  ):
    if places not in PLACES:
      raise ValueError(f"unknown skills places={places!r}; choose one of {PLACES}")
    if strategy not in STRATEGIES:
      raise ValueError(f"unknown skill strategy {strategy!r}; choose one of {STRATEGIES}")
    if rules_version not in RULES_VERSIONS:
      raise ValueError(f"unknown rules_version {rules_version!r}; choose one of {RULES_VERSIONS}")
    if top_k < 1:
      raise ValueError(f"top_k must be >= 1, got {top_k}")
    self.library = library if isinstance(library, SkillLibrary) else SkillLibrary.load(library)
    self.strategy = strategy
    self.rules_version = rules_version
    self.top_k = top_k
    self.seed = seed
    self.places = places
    self._items = self.library.all_items()
    self._rng = random.Random(seed)
    self._bm25: Any = None
    self.header = BLOCK_HEADER  # the block's first line (env.prompt_template's [[skill_header]])

  # -- strategies ----------------------------------------------------------------------------

  def _with_general(self, skills: list[str]) -> str:
    """The general skills (if the library has them), then the named task files, blank-line joined."""
    general = [self.library.general.raw] if self.library.general else []
    return "\n\n".join(general + [self.library.file(s).raw for s in skills])

  def _rules(self, task_type: str | None, gamefile: str | None, query: str) -> str:
    """The "rules" strategy's text (subclasses replace this to apply another rule)."""
    if self.rules_version == "pre_fix":
      return self._with_general([])
    skill = None
    if gamefile:
      skill = self.library.match_task(gamefile)
    if skill is None and task_type:
      skill = self.library.match_task(task_type)
    return self._with_general(
      [skill] if skill else (self.library.match_keywords(query) if query else [])
    )

  def _render(self, items: list[SkillItem]) -> str:
    """Items grouped under their file's header, files in library order, renumbered within each file."""
    blocks = []
    for name in ([GENERAL] if self.library.general else []) + list(self.library.tasks):
      chosen = tuple(item for item in items if item.skill == name)
      if chosen:
        blocks.append(self.library.file(name).render(chosen))
    return "\n\n".join(blocks)

  def _bm25_items(self, query: str) -> list[SkillItem]:
    bm25s = import_bm25s()
    if self._bm25 is None:
      corpus = bm25s.tokenize(
        [item.text for item in self._items], stopwords="en", show_progress=False
      )
      self._bm25 = bm25s.BM25()
      self._bm25.index(corpus, show_progress=False)
    tokens = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)
    vocab = self._bm25.vocab_dict
    tokens = [[t for t in tokens[0] if t in vocab]]
    if not tokens[0]:
      return []
    k = min(self.top_k, len(self._items))
    ids, scores = self._bm25.retrieve(
      tokens, k=k, show_progress=False, backend_selection="numpy", n_threads=0
    )
    return [self._items[int(i)] for i, s in zip(ids[0], scores[0]) if s > 0]

  def _random_items(self, sample_id: Any) -> list[SkillItem]:
    rng = self._rng if sample_id is None else random.Random(f"{self.seed}:{sample_id}")
    picked = rng.sample(range(len(self._items)), min(self.top_k, len(self._items)))
    return [self._items[i] for i in sorted(picked)]

  def _cut_places(self, text: str, task: str) -> str:
    """`text` with each "Places by type:" list reduced to the entries naming a word of `task`
    (with places="task" and a task sentence; else `text` as it is)."""
    if self.places != "task" or not task:
      return text
    words = set(re.findall(r"[a-z]+", task.lower()))

    def keep(match: re.Match[str]) -> str:
      entries = [
        entry
        for entry in match.group(2).split("; ")
        if ": " in entry and words & {o.strip() for o in entry.split(": ", 1)[0].split(", ")}
      ]
      return match.group(1) + "; ".join(entries) + match.group(3) if entries else ""

    return _PLACES_LIST.sub(keep, text)

  # -- public --------------------------------------------------------------------------------

  def skill_text(
    self,
    task_type: str | None = None,
    gamefile: str | None = None,
    query: str = "",
    sample_id: Any = None,
    task: str = "",
  ) -> str:
    """The selected skill text ("" for "none", or when bm25 finds nothing relevant). `task`, the
    task sentence, is read only with places="task"."""
    if self.strategy == "none":
      return ""
    if self.strategy == "rules":
      text = self._rules(task_type, gamefile, query)
    elif self.strategy == "bm25":
      text = self._render(self._bm25_items(query or (task_type or "").replace("_", " ")))
    else:
      text = self._render(self._random_items(sample_id))
    return self._cut_places(text, task)

  def keyword_skill_text(self, text: str) -> str:
    """The keyword rule over `text`: general + every task file whose keywords occur in it (lower-
    cased substring test, keyword order); general only when none does."""
    return self._with_general(self.library.match_keywords(text))

  def student_block(
    self,
    prompt_text: str,
    task_type: str | None = None,
    gamefile: str | None = None,
    query: str = "",
    sample_id: Any = None,
    task: str = "",
  ) -> str:
    """Skill-GRPO's block for the student's user message `prompt_text` ("" when no skill text).

    "rules": the keyword rule over `prompt_text` (task type, game file and rules_version are not
    used); the other strategies: the same selection as `privileged_block`.
    """
    if self.strategy != "rules":
      return self.privileged_block(
        task_type=task_type, gamefile=gamefile, query=query, sample_id=sample_id, task=task
      )
    return _as_block(self._cut_places(self.keyword_skill_text(prompt_text), task), self.header)

  def privileged_block(
    self,
    task_type: str | None = None,
    gamefile: str | None = None,
    query: str = "",
    sample_id: Any = None,
    task: str = "",
  ) -> str:
    """The block to place before the chat-templated prompt ("" when there is no skill text)."""
    return _as_block(
      self.skill_text(
        task_type=task_type, gamefile=gamefile, query=query, sample_id=sample_id, task=task
      ),
      self.header,
    )


def _as_block(skill_text: str, header: str = BLOCK_HEADER) -> str:
  """`skill_text` under the block header, followed by a blank line ("" for no skill text)."""
  return f"{header}{skill_text}\n\n" if skill_text else ""


def skills_section_problems(section: Any) -> list[str]:
  """What cannot work in a run config's ``env.skills`` section (the arguments of SkillRetriever),
  one "<key>=<value>: <problem>. Fix: <fix>" line each (reported with the config's other problems)."""
  problems = []
  for key, names in (
    ("strategy", STRATEGIES),
    ("rules_version", RULES_VERSIONS),
    ("places", PLACES),
  ):
    if section.get(key, "all" if key == "places" else None) not in names:
      problems.append(
        f"env.skills.{key}={section.get(key)!r}: unknown name. Fix: use one of {sorted(names)}"
      )
  top_k = section.get("top_k", 1)
  if isinstance(top_k, bool) or not isinstance(top_k, (int, float)) or top_k < 1:
    problems.append(f"env.skills.top_k={top_k!r}: must be a number >= 1. Fix: use a value >= 1")
  directory = section.get("dir")
  if directory and not os.path.isdir(os.path.expanduser(directory)):
    problems.append(
      f"env.skills.dir={directory!r}: no such directory. Fix: unset it to use the shipped skills"
    )
  elif directory and section.get("strategy") != "none":  # its files read as the run will read them
    try:
      SkillLibrary.load(os.path.expanduser(directory))
    except EnvInputError as e:
      problems.append(f"env.skills.dir={directory!r}: {e}")
  return problems


def check_teacher_blocks(retriever: SkillRetriever, task_keys: Any, max_listed: int = 3) -> None:
  """Refuses a skill library whose "rules" block would be empty for one of `task_keys` (the run's
  task names: ALFWorld's game paths, other environments' task ids), with a ValueError naming the
  folder, the missing mapping key and the fix. With the "rules" strategy every block holds the
  general skills, plus the task file a key matches (after the fix): a block is empty only when
  the general file is missing (e.g. named in a way the loader does not know) and the key matches
  no task file. Nothing is checked for strategy "none" (a teacher without skills on purpose) nor
  for "bm25" / "random" (their selection depends on each turn's text)."""
  if retriever.strategy != "rules":
    return
  empty = [
    key
    for key in dict.fromkeys([str(k) for k in task_keys] or [""])
    if not retriever.privileged_block(task_type=key, gamefile=key)
  ]
  if not empty:
    return
  library = retriever.library
  folder = library.folder or "the in-memory skill library"
  general_keys = f"{GENERAL_KEYS[0]!r} or {GENERAL_KEYS[1]!r}"
  missing = [f"skill_mapping.json's skill_files has no general file (key {general_keys})"]
  if retriever.rules_version == "post_fix":
    missing.append("and task_to_skill has no key contained in these task names")
  listed = ", ".join(repr(k) for k in empty[:max_listed]) + (
    " ..." if len(empty) > max_listed else ""
  )
  raise ValueError(
    f"env.skills.dir={folder}: the teacher's skill block would be empty for {len(empty)} task(s) "
    f"({listed}) under env.skills.strategy=rules, rules_version={retriever.rules_version}: "
    f"{' '.join(missing)}, so teacher and student would see the same prompt and the "
    "distillation would have no teacher. Fix: add the general skills to skill_files as "
    f'"{GENERAL_KEYS[0]}": "<file>.md", or set env.skills.strategy=none to run the teacher '
    "without skills on purpose"
  )
