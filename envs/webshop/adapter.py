"""The WebShop adapter of the agent loop: its user message, action projection and skill query
(verl-agent's WebShop prompt structure in our wording, and its projection, docs/reference.md
§4.2-4.3)."""

from __future__ import annotations

from envs.base import EpisodeView
from envs.webshop.projection import project_action
from envs.webshop.prompts import HISTORY_LENGTH, build_prompt

__all__ = ["WebShopAdapter"]


class WebShopAdapter:
  """WebShop prompts (`build_prompt`), projection (`project_action`) and skill query.

  The skill query is the user message as the reference builds it (history 2): its keyword rule
  reads the whole prompt text, not the instruction alone (docs/reference.md §3.2).
  """

  # (first-turn, later-turn) template text from env.prompt_template; None: the built-in prompts
  templates: tuple[str, str] | None = None

  def user_text(self, view: EpisodeView, history_length: int) -> str:
    # The instruction as the page shows it (a stripped text node), so the observation formatter
    # finds it among the page's fields.
    return build_prompt(
      view.task.strip(),
      view.history,
      view.observation,
      view.admissible,
      step=len(view.history),
      history_length=history_length,
      templates=self.templates,
    )

  def project(self, text: str) -> tuple[str, bool]:
    return project_action(text)

  def skill_query(self, view: EpisodeView) -> str:
    return self.user_text(view, HISTORY_LENGTH)
