"""WebShop's reward and catalogue: fuzzy matching as thefuzz 0.19, the reward's scores worked by
hand, and the generated catalogue (large, deterministic, split; an oracle buys every goal at
score 1).

Expected scores are worked by hand from the reward formula:
score = (attribute matches + option matches + [price <= bound]) / (#attributes + #options + 1)
times r_type. Titles' nouns come from the documented rule-based extractor, passed explicitly so the
tests do not depend on whether spaCy's model is installed.
"""

from __future__ import annotations

import pytest

import envs
from envs.webshop import data as data_lib
from envs.webshop import generator
from envs.webshop.fuzz import full_process, token_set_ratio
from envs.webshop.normalize import normalize_color
from envs.webshop.nouns import resolve_noun_extractor, rule_based_nouns
from envs.webshop.reward import get_reward, get_type_reward

RULE = rule_based_nouns
SHAMPOO_PATH = "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos"


# ---------------------------------------------------------------------------------- fuzzing
@pytest.mark.parametrize(
  "first, second, expected",
  [
    # I="essential", A="essential oil", B="essential oils": ratio(A, B) = 2*13/27 -> 96.
    ("essential oil", "essential oils", 96),
    # a tuple is compared as its str: {size, large} contains {large}: ratio(I, A) with I == A.
    ("large", ("size", "large"), 100),
    # no common token: difflib finds "tan" inside "rectangular shape": 2*3/20 -> 30.
    ("tan", ("shape", "rectangular"), 30),
    # force_ascii drops U+00E9: "caf" vs "cafe": 2*3/7 -> 86 (an Indel-based 75 would miss).
    ("Café", "cafe", 86),
    # I="medium pack", A=I+" non", B=I+" ounce": ratio(I, A) = 22/26 -> 85; difflib's greedy
    # blocks give ratio(A, B) = 2*13/32 -> 81 (the LCS, 14 chars, would give 87.5).
    ("non pack medium", "pack ounce medium", 85),
    ("", "anything", 0),
    (None, "anything", 0),
  ],
)
def test_token_set_ratio_follows_thefuzz_0_19(first, second, expected):
  assert token_set_ratio(first, second) == expected


def test_full_process():
  assert full_process(("size", "Large!")) == "size    large"
  assert full_process("Crème Łódź!") == "crme łdź"  # only U+0080..U+00FF are dropped


def test_normalize_color_substring_and_tuple_membership():
  assert normalize_color("navy blue") == "blue"  # "blue" comes before "navy"
  assert normalize_color("rectangular") == "tan"
  assert normalize_color("dark grey") == "dark"
  assert normalize_color("12 fl oz") == "12 fl oz"
  assert normalize_color(("color", "black")) == "black"
  assert normalize_color(("shape", "rectangular")) == ("shape", "rectangular")


# ----------------------------------------------------------------------------------- reward
def _product(**kw):
  product = {
    "query": "shampoo",
    "product_category": SHAMPOO_PATH,
    "name": "Herbal Tea Tree Shampoo",
    "Title": "Herbal Tea Tree Shampoo",
    "Attributes": ["sulfate free"],
    "BulletPoints": [],
    "Description": "",
  }
  product.update(kw)
  return product


def _goal(**kw):
  goal = {
    "query": "shampoo",
    "product_category": SHAMPOO_PATH,
    "name": "Herbal Tea Tree Shampoo",
    "attributes": ["sulfate free"],
    "goal_options": {},
    "price_upper": 40.0,
  }
  goal.update(kw)
  return goal


def test_get_reward_verbose_keys_and_weights():
  goal = _goal(attributes=["sulfate free", "dry hair"], goal_options={"size": "large"})
  score, info = get_reward(
    _product(), goal, price=40.0, options={"size": "large"}, verbose=True, noun_extractor=RULE
  )
  # D = 2 + 1 + 1 = 4; matches: 1 attribute ("dry hair" nowhere), 1 option, price 40 <= 40.
  assert score == pytest.approx(3 / 4, abs=1e-12)
  assert list(info) == [
    "r_type", "r_att", "w_att", "query_match", "category_match", "title_score",
    "r_option", "w_option", "r_price", "w_price",
  ]  # fmt: skip
  assert info["r_att"] == 0.5 and info["w_att"] == 0.5 and info["r_option"] == 1.0
  assert info["w_option"] == 0.25 and info["r_price"] is True and info["w_price"] == 0.25
  assert info["query_match"] and info["category_match"] and info["title_score"] == 1.0
  assert get_reward(_product(), goal, 40.0, {"size": "large"}, noun_extractor=RULE) == score
  # Without goal options r_option and w_option are absent.
  _, info = get_reward(_product(), _goal(), 1.0, {}, verbose=True, noun_extractor=RULE)
  assert "r_option" not in info and "w_option" not in info


def test_type_reward_rules_apply_in_order():
  def r_type(product_name, goal_name, **product_fields):
    product = _product(name=product_name, **product_fields)
    return get_type_reward(product, _goal(name=goal_name), RULE)

  # Same nouns, query matches: 1.0.
  assert r_type("Tea Tree Shampoo", "Tea Tree Shampoo")["r_type"] == 1.0
  # Title score 0 gives 0 even though query and category match (the last rule wins).
  info = r_type("Argan Oil", "Tea Tree Shampoo")
  assert info["query_match"] and info["category_match"] and info["r_type"] == 0.0
  # 1 of 5 goal nouns = 0.2 (not > 0.2), nothing else matches: 0.5.
  other = {"query": "candles", "product_category": "Home › Candles"}
  assert r_type("Tea Candle", "Tea Tree Herbal Shampoo Bottle", **other)["r_type"] == 0.5
  # 1 of 11 goal nouns < 0.1: 0.1 even with the query matching.
  eleven = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo"
  assert r_type("alpha zulu", eleven)["title_score"] == pytest.approx(1 / 11)
  assert r_type("alpha zulu", eleven)["r_type"] == 0.1
  # A goal name without nouns scores 0.2: 1.0 with a query match, 0.5 without any match.
  assert r_type("Tea Tree Shampoo", "for the")["r_type"] == 1.0
  assert r_type("Tea Tree Shampoo", "for the", **other)["r_type"] == 0.5
  # The denominator counts repeated goal nouns: {tea, shampoo} / [tea, tea, shampoo].
  assert r_type("Tea Shampoo", "Tea Tea Shampoo")["title_score"] == pytest.approx(2 / 3)
  # Two shared category levels are a category match, one is not.
  two = {"query": "x", "product_category": "Beauty & Personal Care › Hair Care › Brushes"}
  one = {"query": "x", "product_category": "Beauty & Personal Care › Makeup"}
  assert r_type("Brush", "Tea Tree Shampoo", **two)["category_match"]
  assert not r_type("Brush", "Tea Tree Shampoo", **one)["category_match"]


def test_noun_extractor_is_pluggable():
  assert rule_based_nouns("Men's Tea-Tree Shampoo for Dry Hair, 12 Fl Oz (2 Pack)") == [
    "men", "tea", "tree", "shampoo", "dry", "hair", "fl", "oz", "pack",
  ]  # fmt: skip
  assert resolve_noun_extractor("rule_based") is rule_based_nouns
  first_word = lambda text: text.lower().split()[:1]
  # The goal "Herbal Tea Tree Shampoo" has the one noun "herbal" for this extractor.
  assert get_type_reward(_product(name="Tea Kettle"), _goal(), first_word)["title_score"] == 0.0
  assert get_type_reward(_product(name="Herbal X"), _goal(), first_word)["title_score"] == 1.0
  with pytest.raises(ValueError, match="'nltk'"):
    resolve_noun_extractor("nltk")


def test_attribute_reward_fuzzy_then_text_fallback():
  def matches(goal_attributes, **product):
    goal = _goal(attributes=goal_attributes)
    return get_reward(_product(**product), goal, 1.0, {}, verbose=True, noun_extractor=RULE)[1]

  assert matches(["essential oils"], Attributes=["essential oil"])["r_att"] == 1.0  # 96 > 85
  assert matches(["1 pack"], Attributes=["2 pack"])["r_att"] == 0.0  # 83
  assert matches(["tea tree"], Attributes=[])["r_att"] == 1.0  # in the lower-cased Title
  assert matches(["Tea Tree"], Attributes=[])["r_att"] == 0.0  # the goal side is not lower-cased
  assert matches(["dry hair"], Attributes=[], BulletPoints=["For Dry Hair"])["r_att"] == 1.0
  # A BulletPoints string is joined character by character: "f o r   d r y ..." has no "dry hair".
  assert matches(["dry hair"], Attributes=[], BulletPoints="For Dry Hair")["r_att"] == 0.0
  assert matches(["gentle"], Attributes=[], Description="Very GENTLE.")["r_att"] == 1.0


def test_option_reward_dict_goals_compare_tuples():
  def option_score(goal_options, bought):
    goal = _goal(attributes=["sulfate free"], goal_options=goal_options)
    return get_reward(_product(), goal, 1.0, bought, verbose=True, noun_extractor=RULE)[1][
      "r_option"
    ]

  assert option_score({"size": "large"}, {"size": "large"}) == 1.0
  assert option_score({"color": "black"}, {"color": "black"}) == 1.0  # tuple contains "black"
  assert option_score({"color": "navy blue"}, {"color": "navy blue"}) == 1.0  # "blue" in tokens
  # The quirk: the bought "rectangular" becomes "tan"; the goal tuple stays: 30, no match.
  assert option_score({"shape": "rectangular"}, {"shape": "rectangular"}) == 0.0
  # Human goals hold a list: both sides are normalised, "tan" == "tan".
  assert option_score(["rectangular"], {"shape": "rectangular"}) == 1.0
  assert option_score({"color": "mint", "size": "large"}, {"a": "lavender", "b": "large"}) == 0.5


def test_price_bound_is_inclusive_and_required():
  assert get_reward(_product(), _goal(price_upper=40.0), 40.0, {}, noun_extractor=RULE) == 1.0
  # D = 1 + 0 + 1 = 2: only the attribute matches.
  assert get_reward(_product(), _goal(price_upper=40.0), 40.01, {}, noun_extractor=RULE) == 0.5
  with pytest.raises(ValueError, match="price_upper=0"):
    get_reward(_product(), _goal(price_upper=0), 1.0, {}, noun_extractor=RULE)


# ----------------------------------------------------------------------- generated catalogue
def test_generated_catalogue_is_large_deterministic_and_split():
  catalogue = generator.generated_catalogue()
  assert len(catalogue.products) >= 1000 and len(catalogue.goals) >= 1000
  assert {p["category"] for p in catalogue.products} == set(generator.CATEGORIES)
  assert sum(bool(p["options"]) for p in catalogue.products) > 500
  assert {len(p["pricing"]) for p in catalogue.products} == {1, 2}  # single prices and ranges
  assert generator.generate_records(50, seed=3) == generator.generate_records(50, seed=3)
  assert generator.generate_records(50, seed=3) != generator.generate_records(50, seed=4)
  train = envs.make("webshop", split="train", seed=1, noun_extractor="rule_based")
  test_a = envs.make("webshop", split="test", seed=1, noun_extractor="rule_based")
  test_b = envs.make("webshop", split="test", seed=2, noun_extractor="rule_based")
  assert test_a.num_tasks == 500 and train.num_tasks == len(catalogue.goals) - 500
  # A task id names the same goal whatever the env's seed; train and test do not overlap.
  assert test_a.reset(task=7)[1]["task"] == test_b.reset(task=7)[1]["task"]
  assert test_a.reset(task=7)[1]["goal_index"] == 7 and train.reset(task=0)[1]["goal_index"] == 500
  # reset() without a task is a seeded draw.
  again = envs.make("webshop", split="test", seed=1, noun_extractor="rule_based")
  assert [test_a.reset()[1]["goal_index"] for _ in range(5)] == [
    again.reset()[1]["goal_index"] for _ in range(5)
  ]


def test_generated_files_read_back_identically(tmp_path):
  generator.write_files(str(tmp_path), num_products=120, seed=5)
  from_files = data_lib.load_catalogue(str(tmp_path), human_goals=True)
  data_lib.load_catalogue.cache_clear()
  records = generator.generate_records(120, seed=5)
  direct = data_lib.build_catalogue(*records, human_goals=True)
  assert from_files.goals == direct.goals and from_files.products == direct.products


def test_oracle_buys_every_goal_at_score_one():
  env = envs.make("webshop", split="test", noun_extractor="rule_based")
  for task in range(0, 500, 5):
    obs, info = env.reset(task=task)
    assert obs == f"WebShop [SEP] Instruction: [SEP] {info['task']} [SEP] Search"
    done = False
    while not done:
      obs, reward, done, info = env.step(env.expert_action())
    assert (reward, info["task_score"], info["won"], info["acc"]) == (10.0, 1.0, True, 1.0), task
    assert info["steps"] <= 10 and obs.startswith(
      "Thank you for shopping with us! [SEP] Your code:"
    )
