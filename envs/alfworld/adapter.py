"""The ALFWorld adapter of the agent loop: its user message, action projection and skill query
(docs/reference.md §4.2-4.3)."""

from __future__ import annotations

from envs.alfworld.projection import project_action
from envs.alfworld.prompts import build_prompt
from envs.base import EpisodeView

__all__ = ["AlfworldAdapter"]


class AlfworldAdapter:
  """ALFWorld prompts (`build_prompt`), projection (`project_action`) and skill query."""

  # (first-turn, later-turn) template text from env.prompt_template; None: the built-in prompts
  templates: tuple[str, str] | None = None

  def user_text(self, view: EpisodeView, history_length: int) -> str:
    return build_prompt(
      view.task,
      view.history,
      view.observation,
      view.admissible,
      step=len(view.history),
      history_length=history_length,
      templates=self.templates,
    )

  def project(self, text: str) -> tuple[str, bool]:
    return project_action(text)

  def is_admissible(self, action: str, view: EpisodeView) -> bool | None:
    """Whether `action` is one of the turn's admissible commands (None without a list): an
    inadmissible command is well formed but changes nothing ("Nothing happens.")."""
    if not view.admissible:
      return None
    return action.strip().lower() in {c.strip().lower() for c in view.admissible}

  def skill_query(self, view: EpisodeView) -> str:
    return f"{view.task} {view.observation}"
