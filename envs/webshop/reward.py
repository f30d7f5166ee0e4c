"""WebShop's purchase score: `get_reward(purchased_product, goal, price, options, verbose=False)`.

The score of buying `purchased_product` at `price` with the chosen `options` for `goal`, as the
original computes it:

    D      = len(goal["attributes"]) + len(goal["goal_options"]) + 1
    score  = (attribute matches + option matches + [price <= goal["price_upper"]]) / D * r_type

- attribute matches: goal attributes with a product attribute at token_set_ratio > 85, or else
  contained (case-sensitive on the goal side) in the lower-cased Title, the space-joined
  BulletPoints (a string is joined character by character, as the original does) or Description;
- option matches: goal options with a chosen option value at token_set_ratio > 85, both sides
  colour-normalised first. Synthetic goals hold a dict {name: value}, whose `.items()` are
  (name, value) tuples: the tuple is compared as "('name', 'value')" and only a value exactly equal
  to a colour is normalised, while the purchased value is substring-normalised ("rectangular" ->
  "tan"), as in the original. Human goals hold a list of strings;
- r_type: 1.0, then 0.5 when neither the query, >= 2 category levels, nor a title score
  > 0.2 match, then 0.1 when the title score is < 0.1, then 0.0 when it is 0. The title score is
  |set(purchased nouns) & set(goal nouns)| / len(goal nouns) (0.2 when the goal name has none),
  with nouns from `envs.webshop.nouns` (spaCy's en_core_web_sm if installed, else the rule).

The verl-agent wrapper turns the score into the episode reward: 10 when the score is exactly 1.0,
else 0 (`WebShopEnv`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from envs.webshop.fuzz import token_set_ratio
from envs.webshop.normalize import normalize_color
from envs.webshop.nouns import NounExtractor, resolve_noun_extractor

__all__ = [
  "CATEGORY_SEPARATOR",
  "MATCH_THRESHOLD",
  "get_attribute_reward",
  "get_option_reward",
  "get_reward",
  "get_type_reward",
]

MATCH_THRESHOLD = 85  # a fuzzy match needs token_set_ratio > 85
CATEGORY_SEPARATOR = "›"  # U+203A, between product_category levels


def get_type_reward(
  purchased_product: Mapping[str, Any],
  goal: Mapping[str, Any],
  noun_extractor: NounExtractor | str | None = None,
) -> dict[str, Any]:
  """{"r_type", "query_match", "category_match", "title_score"} of a purchase."""
  nouns_of = resolve_noun_extractor(noun_extractor)
  query_match = purchased_product["query"] == goal["query"]
  purchased_levels = {
    level.strip() for level in purchased_product["product_category"].split(CATEGORY_SEPARATOR)
  }
  goal_levels = {level.strip() for level in goal["product_category"].split(CATEGORY_SEPARATOR)}
  category_match = len(purchased_levels & goal_levels) >= 2
  purchased_nouns = nouns_of(purchased_product["name"])
  goal_nouns = nouns_of(goal["name"])
  if goal_nouns:
    title_score = len(set(purchased_nouns) & set(goal_nouns)) / len(goal_nouns)
  else:
    title_score = 0.2
  r_type = 1.0
  if not (query_match or category_match or title_score > 0.2):
    r_type = 0.5
  if title_score < 0.1:
    r_type = 0.1
  if title_score == 0.0:
    r_type = 0.0
  return {
    "r_type": r_type,
    "query_match": query_match,
    "category_match": category_match,
    "title_score": title_score,
  }


def get_attribute_reward(
  purchased_product: Mapping[str, Any], goal: Mapping[str, Any]
) -> tuple[float, int]:
  """(fraction of goal attributes matched, number matched)."""
  goal_attributes = goal["attributes"]
  matches = 0
  for goal_attribute in goal_attributes:
    matched = any(
      token_set_ratio(attribute, goal_attribute) > MATCH_THRESHOLD
      for attribute in purchased_product["Attributes"]
    )
    if not matched:
      matched = (
        goal_attribute in purchased_product["Title"].lower()
        or goal_attribute in " ".join(purchased_product["BulletPoints"]).lower()
        or goal_attribute in purchased_product["Description"].lower()
      )
    matches += int(matched)
  return matches / len(goal_attributes), matches


def get_option_reward(
  purchased_options: Iterable[Any], goal_options: Iterable[Any]
) -> tuple[float | None, int]:
  """(fraction of goal options matched or None without goal options, number matched)."""
  purchased = [normalize_color(option) for option in purchased_options]
  wanted = [normalize_color(option) for option in goal_options]
  matches = sum(
    any(token_set_ratio(option, goal_option) > MATCH_THRESHOLD for option in purchased)
    for goal_option in wanted
  )
  return (matches / len(wanted) if wanted else None), matches


def get_reward(
  purchased_product: Mapping[str, Any],
  goal: Mapping[str, Any],
  price: float,
  options: Mapping[str, Any],
  verbose: bool = False,
  *,
  noun_extractor: NounExtractor | str | None = None,
) -> float | tuple[float, dict[str, Any]]:
  """The purchase score in [0, 1]; with `verbose`, (score, info) with the original's info keys.

  Args:
    purchased_product: a product record after loading (keys query, product_category, name, Title,
      Attributes, BulletPoints, Description).
    goal: a goal (keys query, product_category, name, attributes, goal_options, price_upper).
    price: the price paid (the product's sampled price).
    options: the chosen options {option name: value}; only the values are used.
    verbose: also return the components: r_type, r_att, w_att, query_match, category_match,
      title_score, then r_option and w_option when the goal has options, then r_price and w_price.
    noun_extractor: for the title score: "auto" (None), "spacy", "rule_based" or a callable.
  """
  type_info = get_type_reward(purchased_product, goal, noun_extractor)
  price_upper = goal["price_upper"]
  r_price = (price <= price_upper) if price_upper > 0 else None
  r_att, attribute_matches = get_attribute_reward(purchased_product, goal)
  goal_options = goal["goal_options"]
  r_option, option_matches = get_option_reward(
    list(options.values()),
    goal_options.items() if isinstance(goal_options, dict) else goal_options,
  )
  denominator = len(goal["attributes"]) + len(goal_options) + 1
  if r_price is None:
    raise ValueError(
      f"goal price_upper={price_upper!r} must be > 0 (the original fails on it too); goals built "
      "by envs.webshop.data always have one"
    )
  score = (attribute_matches + option_matches + r_price) / denominator
  score *= type_info["r_type"]
  if not verbose:
    return score
  info: dict[str, Any] = {
    "r_type": type_info["r_type"],
    "r_att": r_att,
    "w_att": len(goal["attributes"]) / denominator,
    "query_match": type_info["query_match"],
    "category_match": type_info["category_match"],
    "title_score": type_info["title_score"],
  }
  if r_option is not None:
    info["r_option"] = r_option
    info["w_option"] = len(goal_options) / denominator
  info["r_price"] = r_price
  info["w_price"] = 1 / denominator
  return score, info
