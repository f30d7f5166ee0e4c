"""WebShopEnv: the original WebShop text environment's pages, actions and observations, in Python.

Pages and actions follow the original's text mode:
- search page: "WebShop [SEP] Instruction: [SEP] <instruction> [SEP] Search";
- `search[keywords]` (on any page) shows results page 1: "Instruction: [SEP] <instruction> [SEP]
  Back to Search [SEP] Page p (Total results: n) [SEP] (< Prev [SEP]) Next > [SEP] <ASIN> [SEP]
  <Title> [SEP] <Price> ..." with 10 of the (at most 50) hits per page;
- `click[<asin>]` opens the item page: "... [SEP] Back to Search [SEP] < Prev [SEP] <option name>
  [SEP] <value> ... [SEP] <Title> [SEP] Price: <Price> [SEP] Rating: N.A. [SEP] Description [SEP]
  Features [SEP] Reviews [SEP] Buy Now"; `click[<value>]` chooses an option;
- `click[description|features|reviews]` opens a sub-page ("... [SEP] < Prev [SEP] <text>");
  `click[< prev]` goes back one level (from an item page to its results, forgetting the chosen
  options); `click[back to search]` starts over; `click[next >]` / `click[< prev]` page results;
- `click[buy now]` ends the episode on the done page and scores the purchase (`get_reward`).

An action is `name[argument]` matched by the original's greedy pattern; the argument is
lower-cased. Anything else - an unknown name, an empty argument, a click on something the page does
not show, and `click[search]` - is a no-op: same page, reward 0, not done, but still a step. The
episode ends at the purchase or after `max_steps` (15) steps.

Rewards and info follow verl-agent's wrapper: reward 10 for a purchase scoring exactly 1.0, else 0;
info["task_score"] (also info["score"]) is the purchase score (0 until something is bought),
info["won"] and info["acc"] say whether it was 1.0. info["admissible_commands"] is verl-agent's
action list: "search[<your query>]" when the page has a search bar, then "click[<x>]" for each
clickable; info["available_actions"] is the original's {"has_search_bar", "clickables"}.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from typing import Any

from envs.webshop.data import Catalogue
from envs.webshop.fuzz import token_set_ratio
from envs.webshop.nouns import NounExtractor, resolve_noun_extractor
from envs.webshop.prompts import available_action_list
from envs.webshop.reward import MATCH_THRESHOLD, get_reward
from envs.webshop.search import top_n_products

__all__ = ["MAX_STEPS", "PRODUCT_WINDOW", "WIN_REWARD", "WebShopEnv", "parse_action"]

MAX_STEPS = 15
WIN_REWARD = 10.0
PRODUCT_WINDOW = 10
SEP = " [SEP] "
SUB_PAGES = ("Description", "Features", "Reviews")
_ACTION = re.compile(r"(.+)\[(.+)\]")
_ITEM_BUTTONS = ("back to search", "< prev", "description", "features", "reviews", "buy now")


def parse_action(action: str) -> tuple[str, str | None]:
  """(name, argument) by the original's greedy `(.+)\\[(.+)\\]` match; else (action, None)."""
  match = _ACTION.match(action)
  if match is None:
    return action, None
  return match.group(1), match.group(2)


def _text_node(value: Any) -> list[str]:
  """How a rendered value shows in the text observation: stripped; nothing if empty or a newline."""
  text = "" if value is None else str(value)
  if not text.strip():
    return [] if (not text or "\n" in text) else [""]
  return [text.strip()]


def _tojson(value: Any) -> str:
  """Flask's `tojson` filter: sorted keys, ASCII, and <, >, &, ' escaped."""
  text = json.dumps(value, sort_keys=True)
  for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
    text = text.replace(char, escaped)
  return text


class WebShopEnv:
  """One shopping episode at a time over a Catalogue; `reset(task=i)` plays the split's i-th goal.

  Args:
    catalogue: products, prices, goals and search index (`envs.webshop.data` / `.generator`).
    goal_indices: the catalogue goals this env plays (task i = goal goal_indices[i]).
    seed: seeds `reset()` without a task (a uniform draw) and the "<r>" random search.
    max_steps: steps per episode (15 in the reference).
    noun_extractor: for the reward's title score ("auto", "spacy", "rule_based" or a callable).
  """

  def __init__(
    self,
    catalogue: Catalogue,
    goal_indices: Sequence[int],
    seed: int = 0,
    max_steps: int = MAX_STEPS,
    noun_extractor: str | NounExtractor | None = "auto",
  ):
    if not goal_indices:
      raise ValueError("WebShopEnv needs at least one goal index")
    bad = [i for i in goal_indices if not 0 <= i < len(catalogue.goals)]
    if bad:
      raise IndexError(
        f"goal index {bad[0]} out of range: the catalogue has {len(catalogue.goals)}"
      )
    if max_steps < 1:
      raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    self.catalogue = catalogue
    self.goal_indices = list(goal_indices)
    self.max_steps = max_steps
    self._nouns = resolve_noun_extractor(noun_extractor)
    self._rng = random.Random(seed)
    self.goal: dict[str, Any] = {}
    self._goal_index = -1
    self._steps = 0
    self._done = True
    self._score = 0.0
    self._reward_info: dict[str, Any] | None = None
    self._go_to_search_page()

  @property
  def num_tasks(self) -> int:
    return len(self.goal_indices)

  # ------------------------------------------------------------------------------ page state
  def _go_to_search_page(self) -> None:
    self.page = "search"
    self.keywords: list[str] | None = None
    self.page_number: int | None = None
    self.asin: str | None = None
    self.asins: set[str] = set()
    self.options: dict[str, str] = {}
    self.sub_page = ""
    self._results: list[dict[str, Any]] = []

  def _show_results(self, keywords: list[str], page_number: int) -> None:
    """The original's results route: (re-)runs the search and forgets the item and its options."""
    self.page = "results"
    self.keywords = keywords
    self.page_number = page_number
    self.asin = None
    self.options = {}
    self._results = top_n_products(keywords, self.catalogue, self._rng)

  def _page_products(self) -> list[dict[str, Any]]:
    start = (self.page_number - 1) * PRODUCT_WINDOW
    return self._results[start : start + PRODUCT_WINDOW]

  def _clickables(self) -> dict[str, tuple[str, str]]:
    """{lower-cased text: (kind, radio group)} in page order (a repeated key keeps its place)."""
    clickables: dict[str, tuple[str, str]] = {}
    if self.page == "search":
      clickables["search"] = ("button", "")
    elif self.page == "results":
      clickables["back to search"] = ("button", "")
      if self.page_number > 1:
        clickables["< prev"] = ("button", "")
      clickables["next >"] = ("button", "")
      for product in self._page_products():
        clickables[product["asin"].lower()] = ("link", "")
    elif self.page == "item":
      for button in _ITEM_BUTTONS:
        clickables[button] = ("button", "")
      for name, values in self._product()["options"].items():
        for value in values:
          clickables[value] = ("radio", name)
    elif self.page == "sub":
      clickables["back to search"] = ("button", "")
      clickables["< prev"] = ("button", "")
    return clickables

  def _product(self) -> dict[str, Any]:
    return self.catalogue.product_item_dict[self.asin]

  def available_actions(self) -> dict[str, Any]:
    """The original's {"has_search_bar": bool, "clickables": [...]} for the current page."""
    return {"has_search_bar": self.page == "search", "clickables": list(self._clickables())}

  # ----------------------------------------------------------------------------- observation
  def observation(self) -> str:
    """The current page in the original's text mode (fields joined by " [SEP] ")."""
    instruction = self.goal.get("instruction_text", "")
    header = ["Instruction:", *_text_node(instruction)]
    if self.page == "search":
      fields = ["WebShop", *header, "Search"]
    elif self.page == "results":
      fields = [*header, "Back to Search"]
      fields.append(f"Page {self.page_number} (Total results: {len(self._results)})")
      if self.page_number > 1:
        fields.append("< Prev")
      fields.append("Next >")
      for product in self._page_products():
        fields += [product["asin"], *_text_node(product["Title"]), *_text_node(product["Price"])]
    elif self.page == "item":
      product = self._product()
      fields = [*header, "Back to Search", "< Prev"]
      for name, values in product["options"].items():
        fields += _text_node(name)
        for value in values:
          fields += _text_node(value)
      fields += _text_node(product["Title"])
      fields += [f"Price: {product['Price']}".strip(), f"Rating: {product['Rating']}".strip()]
      fields += ["Description", "Features", "Reviews", "Buy Now"]
    elif self.page == "sub":
      product = self._product()
      fields = [*header, "Back to Search", "< Prev"]
      if self.sub_page == "Description":
        fields += _text_node(product["Description"])
      elif self.sub_page == "Features":
        for bullet in product["BulletPoints"]:
          fields += _text_node(bullet)
    else:  # done
      fields = self._done_page_fields()
    return SEP.join(fields)

  def _done_page_fields(self) -> list[str]:
    # The original renders its done page with only the asin, options and score; the other
    # fields of the template show as "None" or not at all.
    return [
      "Thank you for shopping with us!", "Your code:", "None",
      "(Paste it in your MTurk interface.)", "Purchased", "asin", *_text_node(self.asin),
      "options", _tojson(self.options), "attrs", "None", "category", "None", "query", "None",
      "product category", "None", "Target", "asin", "options", "attrs", "price upper",
      "instuction text", "category", "product category", "query", "Goal", "None", "Reward",
      "Your score (min 0.0, max 1.0)", str(self._score), "Reward Details", "None",
    ]  # fmt: skip

  def _info(self, accepted: bool) -> dict[str, Any]:
    available = self.available_actions()  # nothing on the done page
    won = self._score == 1.0
    info = {
      "won": won,
      "acc": 1.0 if won else 0.0,
      "task_score": self._score,
      "score": self._score,
      "admissible_commands": available_action_list(available),
      "available_actions": available,
      "task_type": self.goal.get("category", "unknown"),
      "task": self.goal.get("instruction_text", ""),
      "goal_index": self._goal_index,
      "steps": self._steps,
      "action_accepted": accepted,
      "truncated": self._done and self.page != "done",
    }
    if self._reward_info is not None:
      info["reward_info"] = dict(self._reward_info)
      info["purchased"] = {"asin": self.asin, "options": dict(self.options)}
    return info

  # ------------------------------------------------------------------------------ episodes
  def reset(self, task: int | None = None) -> tuple[str, dict[str, Any]]:
    index = self._rng.randrange(len(self.goal_indices)) if task is None else int(task)
    if not 0 <= index < len(self.goal_indices):
      raise IndexError(f"task {index} out of range: this env has {len(self.goal_indices)} goals")
    self._goal_index = self.goal_indices[index]
    self.goal = self.catalogue.goals[self._goal_index]
    self._go_to_search_page()
    self._steps = 0
    self._done = False
    self._score = 0.0
    self._reward_info = None
    self._last = (self.observation(), self._info(accepted=True))
    return self._last

  def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
    if not self.goal:
      raise RuntimeError("step() before reset(); call reset() first")
    if self._done:  # stepping a finished episode changes nothing
      return self._last[0], 0.0, True, dict(self._last[1])
    self._steps += 1
    accepted = self._apply(action)
    bought = self.page == "done"
    self._done = bought or self._steps >= self.max_steps
    reward = WIN_REWARD if bought and self._score == 1.0 else 0.0
    self._last = (self.observation(), self._info(accepted))
    return self._last[0], reward, self._done, self._last[1]

  def _apply(self, action: str) -> bool:
    """Plays `action` on the page; False (and nothing changes) when the original ignores it."""
    name, argument = parse_action(action)
    if argument is not None:
      argument = argument.lower()
    if name == "search" and argument:
      self._show_results(argument.split(" "), 1)
      return True
    clickables = self._clickables()
    if name != "click" or argument not in clickables or argument == "search":
      return False
    if argument == "buy now":
      self._buy()
    elif argument == "back to search":
      self._go_to_search_page()
    elif argument == "next >" and self.page == "results":
      self._show_results(self.keywords, self.page_number + 1)
    elif argument == "< prev" and self.page == "results":
      self._show_results(self.keywords, self.page_number - 1)
    elif argument == "< prev" and self.page == "sub":
      self.page = "item"
    elif argument == "< prev" and self.page == "item":
      self._show_results(self.keywords, self.page_number)
    elif argument in {p.lower() for p in SUB_PAGES}:
      self.page = "sub"
      self.sub_page = argument.capitalize()
    else:
      kind, group = clickables[argument]
      if kind == "link":
        self.asin = argument.upper()
        self.asins.add(self.asin)
      elif kind == "radio":
        self.options[group.lower()] = argument
      self.page = "item"
    return True

  def _buy(self) -> None:
    score, info = get_reward(
      self._product(),
      self.goal,
      price=self.catalogue.product_prices.get(self.asin),
      options=self.options,
      verbose=True,
      noun_extractor=self._nouns,
    )
    self._score = score
    self._reward_info = info
    self.page = "done"

  # -------------------------------------------------------------------------------- expert
  def expert_action(self) -> str:
    """An oracle's next action: search the goal product's name, open it, set the goal options, buy.

    It knows the goal's asin and options (the goal record), so it is a scripted expert for tests
    and demonstrations, not an agent.
    """
    if self._done or not self.goal:
      return ""
    target = self.goal["asin"]
    if self.page == "search":
      query = re.sub(r"[\[\]]", " ", self.goal["name"]).strip()
      return f"search[{query}]"
    if self.page == "results":
      if target.lower() in self._clickables():
        return f"click[{target.lower()}]"
      return "click[next >]"
    if self.page == "sub" or self.asin != target:
      return "click[< prev]"
    for group, value in self._wanted_options().items():
      if self.options.get(group) != value:
        return f"click[{value}]"
    return "click[buy now]"

  def _wanted_options(self) -> dict[str, str]:
    """{option group: value} the goal asks for, among the product's values."""
    product_options = self._product()["options"]
    goal_options = self.goal["goal_options"]
    if isinstance(goal_options, dict):
      return {g: v for g, v in goal_options.items() if v in product_options.get(g, ())}
    wanted = {}
    for goal_value in goal_options:  # human goals: the closest product value above the threshold
      scored = [
        (token_set_ratio(value, goal_value), group, value)
        for group, values in product_options.items()
        for value in values
      ]
      if scored:
        score, group, value = max(scored)
        if score > MATCH_THRESHOLD:
          wanted[group] = value
    return wanted

  def close(self) -> None:
    """Nothing to release (the catalogue is shared and kept)."""
