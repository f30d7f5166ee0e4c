"""The authors' data_source rule for Search-QA skills, and a SkillRetriever that applies it.

Rule (docs/reference.md §3.2), for a turn-sample with data source `ds` and prompt text `text`:
1. `ds` == "popqa" -> entity_attribute_lookup;
2. `ds` in {"nq", "triviaqa"} -> direct_retrieval;
3. `ds` == "hotpotqa" -> multi_hop_reasoning;
4. else, if the lower-cased `text` contains "which" and "or" but not "for" (plain substring tests,
   so "or" also matches inside "for", "world", ...) -> compare;
5. else `ds` in {"2wikimultihopqa", "musique", "bamboogle"} -> multi_hop_reasoning;
6. else general skills only.
The skill text is always the general skills, then the chosen file (if any).

The reference applies rule 4 to the whole decoded student prompt. verl-agent's search prompt
contains "for" ("information", "format", "for the current step"), so there compare is never
chosen. `DataSourceSkillRetriever` applies the rule to the `query` it is given: pass the full
prompt to reproduce the reference, or the question alone to let comparisons get compare.md.
The Search-QA rule did not change with the authors' June 2026 skill-retrieval fix, so both
`rules_version`s select the same text.
"""

from __future__ import annotations

from typing import Any

from envs.skills.library import SkillLibrary
from envs.skills.retrieval import SkillRetriever

__all__ = ["MULTI_HOP_SOURCES", "DataSourceSkillRetriever", "skill_for_data_source"]

MULTI_HOP_SOURCES = ("2wikimultihopqa", "musique", "bamboogle")


def skill_for_data_source(data_source: str | None, prompt_text: str = "") -> str | None:
  """The task skill the authors' rule picks, or None (general skills only)."""
  if data_source == "popqa":
    return "entity_attribute_lookup"
  if data_source in ("nq", "triviaqa"):
    return "direct_retrieval"
  if data_source == "hotpotqa":
    return "multi_hop_reasoning"
  lowered = prompt_text.lower()
  if "which" in lowered and "or" in lowered and "for" not in lowered:
    return "compare"
  if data_source in MULTI_HOP_SOURCES:
    return "multi_hop_reasoning"
  return None


class DataSourceSkillRetriever(SkillRetriever):
  """SkillRetriever whose "rules" strategy is the data_source rule (`task_type` = the data source,
  `query` = the prompt text the compare test reads). Other strategies behave as in SkillRetriever.
  """

  def __init__(self, library: SkillLibrary | str = "search", **kwargs: Any):
    super().__init__(library, **kwargs)

  def _rules(self, task_type: str | None, gamefile: str | None, query: str) -> str:
    """The data_source rule (`task_type` is the data source; both rules_versions agree)."""
    skill = skill_for_data_source(task_type, query)
    return self._with_general([skill] if skill else [])
