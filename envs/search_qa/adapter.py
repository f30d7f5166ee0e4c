"""The Search-QA adapter of the agent loop: its user message, action projection and skill query
(verl-agent's search prompt structure in our wording, and its projection, docs/reference.md
§5.2, §8.2)."""

from __future__ import annotations

from envs.base import EpisodeView
from envs.search_qa.projection import project_action
from envs.search_qa.prompts import HISTORY_LENGTH, build_prompt

__all__ = ["SearchQAAdapter"]


class SearchQAAdapter:
  """Search-QA prompts (`build_prompt`), projection (`project_action`) and skill query.

  The skill query is the user message as the reference builds it (history 4): the data_source
  rule's "compare" test reads the whole prompt (docs/reference.md §3.2), which always contains
  "for", so compare.md is never chosen, as in the reference.
  """

  # (first-turn, later-turn) template text from env.prompt_template; None: the built-in prompts
  templates: tuple[str, str] | None = None

  def user_text(self, view: EpisodeView, history_length: int) -> str:
    return build_prompt(
      view.task,
      view.history,
      view.observation,
      step=len(view.history),
      history_length=history_length,
      templates=self.templates,
    )

  def project(self, text: str) -> tuple[str, bool]:
    return project_action(text)

  def skill_query(self, view: EpisodeView) -> str:
    return self.user_text(view, HISTORY_LENGTH)
