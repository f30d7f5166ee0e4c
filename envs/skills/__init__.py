"""Skills: our own strategy text per environment and task type, and how to retrieve it for the teacher.

from envs.skills import SkillRetriever
retriever = SkillRetriever("alfworld", strategy="rules", rules_version="post_fix")
block = retriever.privileged_block(task_type=info["task_type"], gamefile=info["gamefile"])
teacher_text = block + chat_templated_student_prompt
"""

from envs.skills.library import GENERAL_KEYS, SkillFile, SkillItem, SkillLibrary, skills_dir
from envs.skills.retrieval import (
  BLOCK_HEADER,
  RULES_VERSIONS,
  STRATEGIES,
  SkillRetriever,
  check_teacher_blocks,
)

__all__ = [
  "SkillRetriever",
  "SkillLibrary",
  "SkillFile",
  "SkillItem",
  "skills_dir",
  "STRATEGIES",
  "RULES_VERSIONS",
  "BLOCK_HEADER",
  "GENERAL_KEYS",
  "check_teacher_blocks",
]
