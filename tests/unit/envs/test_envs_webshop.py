"""WebShop offline: the data files and goals, the env's pages, scores and limits, search analysis,
prompts and projection, skills. The reward, fuzzy matching and the generated catalogue:
test_webshop_reward.py.
"""

from __future__ import annotations

import json
import os
import re

import pytest

import envs
from envs.skills import BLOCK_HEADER, SkillLibrary, SkillRetriever, skills_dir
from envs.webshop import data as data_lib
from envs.webshop import generator, prompts
from envs.webshop.env import WebShopEnv, parse_action
from envs.webshop.nouns import rule_based_nouns
from envs.webshop.porter import stem
from envs.webshop.projection import project_action
from envs.webshop.search import SearchEngine, analyze

RULE = rule_based_nouns
SHAMPOO_PATH = "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos"
GOAL_ASIN, PRICEY_ASIN, SPEAKER_ASIN, CANDLE_ASIN, RANGE_ASIN, NOPRICE_ASIN = (
  f"B00000000{i}" for i in range(1, 7)
)


# ------------------------------------------------------------------------------------ fixtures
def _raw(asin, name, pricing, options=None, **kw):
  record = {
    "asin": asin,
    "name": name,
    "full_description": kw.get("description", ""),
    "small_description": kw.get("bullets", []),
    "pricing": pricing,
    "customization_options": options,
    "images": [f"https://img/{asin}.jpg"],
    "category": kw.get("category", "beauty"),
    "query": kw.get("query", "shampoo"),
    "product_category": kw.get("path", SHAMPOO_PATH),
    "brand": "dropped by the loader",
  }
  return record


def _opts(**groups):
  return {name: [{"value": v, "image": None} for v in values] for name, values in groups.items()}


SHAMPOO_OPTIONS = _opts(Size=["12 fl oz", "32 fl oz"], Scent=["Mint", "Lavender"])
ELECTRONICS_PATH = "Electronics › Portable Audio & Video › Portable Speakers & Docks"
CONDITIONER_PATH = "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Conditioners"
GOAL_BULLETS = ["Sulfate free formula", "Made with natural ingredients"]
RAW_PRODUCTS = [
  _raw(GOAL_ASIN, "Herbal Tea Tree Shampoo for Dry Hair", "$12.00", SHAMPOO_OPTIONS,
       description="A gentle daily shampoo.", bullets=GOAL_BULLETS),
  _raw(PRICEY_ASIN, "Luxe Tea Tree Shampoo", "$95.00", SHAMPOO_OPTIONS),
  _raw(SPEAKER_ASIN, "Wireless Bluetooth Speaker", "$30.00", category="electronics",
       query="Bluetooth Speaker ", path=ELECTRONICS_PATH),
  _raw(CANDLE_ASIN, "Tea Candle Set", "$8.00", category="home", query="candles",
       path="Home & Kitchen › Home Décor Products › Candles"),
  _raw(RANGE_ASIN, "Argan Oil Conditioner", "$10.00 - $20.00", _opts(Color=["Red/White"]),
       query="conditioner", path=CONDITIONER_PATH),
  _raw(NOPRICE_ASIN, "Bamboo Hair Brush", None, bullets="Detangles gently", query="hair brush"),
  _raw(GOAL_ASIN, "A duplicate asin, dropped", "$1.00"),
  _raw("nan", "No asin, dropped", "$1.00"),
  _raw("B0000000007X", "A 12-character asin, dropped", "$1.00"),
]  # fmt: skip
ATTRIBUTES = {
  GOAL_ASIN: {
    "attributes": ["sulfate free", "dry hair", "natural ingredients"],
    "instruction": "i need a tea tree shampoo for dry hair that is sulfate free",
    "instruction_attributes": ["sulfate free", "dry hair"],
  },
  PRICEY_ASIN: {"attributes": ["sulfate free", "dry hair"]},
  SPEAKER_ASIN: {"attributes": ["waterproof"]},
  CANDLE_ASIN: {"attributes": ["natural ingredients"]},
  RANGE_ASIN: {"attributes": ["argan oil"]},
}
HUMAN = {
  GOAL_ASIN: [
    {
      "asin": GOAL_ASIN,
      "instruction": "I want a sulfate free tea tree shampoo in mint, 12 fl oz.",
      "instruction_attributes": ["sulfate free"],
      "instruction_options": ["mint", "12 fl oz"],
      "worker_id": "unused",
    },
    {
      "instruction": "skipped: no attributes",
      "instruction_attributes": [],
      "instruction_options": [],
    },
  ]
}


def _write(folder, small=True, human=True):
  products, attributes, human_name = data_lib.data_file_names(small)
  os.makedirs(folder, exist_ok=True)
  files = [(products, RAW_PRODUCTS), (attributes, ATTRIBUTES)] + (
    [(human_name, HUMAN)] if human else []
  )
  for name, content in files:
    with open(os.path.join(folder, name), "w") as f:
      json.dump(content, f, ensure_ascii=False)
  return str(folder)


@pytest.fixture
def shop(tmp_path):
  """A WebShopEnv over the fixture files (4 synthetic goals, all of the first product)."""
  env = envs.make("webshop", data_dir=_write(tmp_path), split="test", noun_extractor="rule_based")
  yield env
  env.close()
  data_lib.load_catalogue.cache_clear()


def _play_to(env, goal_options, asin, options, search="search[tea tree shampoo]"):
  """Resets to the goal with `goal_options`, opens `asin` and clicks `options`; returns the env."""
  task = next(i for i, g in enumerate(env.catalogue.goals) if g["goal_options"] == goal_options)
  env.reset(task=task)
  env.step(search)
  obs, *_ = env.step(f"click[{asin.lower()}]")
  assert "[SEP] < Prev [SEP]" in obs, obs
  for value in options:
    assert env.step(f"click[{value}]")[3]["action_accepted"]
  return env


MINT_12 = {"scent": "mint", "size": "12 fl oz"}


# ------------------------------------------------------------------- data files and goals
def test_loading_the_real_file_formats(tmp_path):
  _write(tmp_path / "webshop" / "data")  # the original's layout: webshop/data/*.json
  catalogue = data_lib.load_catalogue(str(tmp_path / "webshop"))
  data_lib.load_catalogue.cache_clear()
  asins = [p["asin"] for p in catalogue.products]
  assert asins == [GOAL_ASIN, PRICEY_ASIN, SPEAKER_ASIN, CANDLE_ASIN, RANGE_ASIN, NOPRICE_ASIN]
  goal_product = catalogue.product_item_dict[GOAL_ASIN]
  assert goal_product["Title"] == "Herbal Tea Tree Shampoo for Dry Hair"
  assert goal_product["options"] == {
    "size": ["12 fl oz", "32 fl oz"],
    "scent": ["mint", "lavender"],
  }
  assert goal_product["Price"] == "$12.0" and goal_product["Rating"] == "N.A."
  assert goal_product["MainImage"] == f"https://img/{GOAL_ASIN}.jpg" and "brand" not in goal_product
  ranged = catalogue.product_item_dict[RANGE_ASIN]
  assert ranged["Price"] == "$10.0 to $20.0" and ranged["options"] == {"color": ["red | white"]}
  assert 10.0 <= catalogue.product_prices[RANGE_ASIN] <= 20.0
  no_price = catalogue.product_item_dict[NOPRICE_ASIN]
  assert no_price["Price"] == "$100.0" and catalogue.product_prices[NOPRICE_ASIN] == 100.0
  assert no_price["BulletPoints"] == ["Detangles gently"] and no_price["Attributes"] == [
    "DUMMY_ATTR"
  ]
  assert catalogue.product_item_dict[SPEAKER_ASIN]["query"] == "bluetooth speaker"
  assert catalogue.attribute_to_asins["sulfate free"] == {GOAL_ASIN, PRICEY_ASIN}
  # Synthetic goals: one per option combination of the one product with an instruction.
  assert sorted(tuple(g["goal_options"].items()) for g in catalogue.goals) == [
    (("scent", s), ("size", z)) for s in ("lavender", "mint") for z in ("12 fl oz", "32 fl oz")
  ]
  goal = next(g for g in catalogue.goals if g["goal_options"] == MINT_12)
  # price 12.0: candidates 20, 30, 40, 50; the bound is the larger of two of them.
  assert goal["price_upper"] in (30.0, 40.0, 50.0)
  assert goal["instruction_text"] == (
    "i need a tea tree shampoo for dry hair that is sulfate free with scent: mint, and size: "
    f"12 fl oz, and price lower than {goal['price_upper']:.2f} dollars"
  )
  assert goal["name"] == goal_product["Title"] and goal["attributes"] == [
    "sulfate free",
    "dry hair",
  ]
  assert len({g["price_upper"] for g in catalogue.goals}) == 1  # one bound per product
  assert all(g["weight"] == pytest.approx(1 / 4) for g in catalogue.goals)


def test_human_goals_and_the_full_file_names(tmp_path):
  folder = _write(tmp_path, small=False)
  with pytest.raises(FileNotFoundError, match="items_shuffle_1000.json"):
    data_lib.load_catalogue(folder)
  catalogue = data_lib.load_catalogue(folder, use_small=False, human_goals=True)
  data_lib.load_catalogue.cache_clear()
  (goal,) = catalogue.goals  # the instruction without attributes is skipped
  assert goal["goal_options"] == ["mint", "12 fl oz"] and goal["weight"] == 1
  assert goal["instruction_text"] == (  # the final "." is stripped before the price text
    f"I want a sulfate free tea tree shampoo in mint, 12 fl oz, and price lower than "
    f"{goal['price_upper']:.2f} dollars"
  )
  env = WebShopEnv(catalogue, [0], noun_extractor=RULE)
  env.reset(task=0)
  done = False
  while not done:
    _, reward, done, info = env.step(env.expert_action())
  assert reward == 10.0 and info["purchased"]["options"] == {"scent": "mint", "size": "12 fl oz"}


def test_price_bound_rule():
  class Fixed:  # a stand-in rng whose sample returns the first k candidates
    def sample(self, population, k):
      return list(population)[:k]

  assert data_lib.price_bound(12.0, Fixed()) == (30.0, ", and price lower than 30.00 dollars")
  assert data_lib.price_bound(20.0, Fixed()) == (40.0, ", and price lower than 40.00 dollars")
  assert data_lib.price_bound(985.0, Fixed()) == (1000000, "")  # one candidate (990) only


def test_split_indices_are_fixed():
  assert data_lib.split_goal_indices(1200, "test") == range(500)
  assert data_lib.split_goal_indices(1200, "train") == range(500, 1200)
  with pytest.raises(ValueError, match="'valid'"):
    data_lib.split_goal_indices(1200, "valid")
  with pytest.raises(ValueError, match="empty"):
    data_lib.split_goal_indices(300, "train")


# ------------------------------------------------------------------ env: partial scores
def test_oracle_and_partial_scores_on_the_fixture(shop):
  # D = 2 attributes + 2 options + 1 = 5 for every goal of the fixture.
  _play_to(shop, MINT_12, GOAL_ASIN, ["mint", "12 fl oz"])
  _, reward, done, info = shop.step("click[buy now]")
  assert (reward, done, info["task_score"], info["won"]) == (10.0, True, 1.0, True)
  assert info["reward_info"]["r_type"] == 1.0 and info["purchased"]["asin"] == GOAL_ASIN

  # A wrong scent: 2 attributes + 1 option + price = 4/5.
  _play_to(shop, MINT_12, GOAL_ASIN, ["lavender", "12 fl oz"])
  _, reward, done, info = shop.step("click[buy now]")
  assert (reward, done, info["won"]) == (0.0, True, False)
  assert info["task_score"] == pytest.approx(0.8, abs=1e-12) and info["score"] == info["task_score"]

  # Over the price bound ($95): 2 + 2 + 0 = 4/5 (same query, 3 of 6 title nouns: r_type 1).
  _play_to(shop, MINT_12, PRICEY_ASIN, ["mint", "12 fl oz"])
  _, reward, _, info = shop.step("click[buy now]")
  assert reward == 0.0 and info["task_score"] == pytest.approx(0.8, abs=1e-12)
  assert info["reward_info"]["r_price"] is False

  # Wrong category: a speaker shares no title noun with the goal: r_type 0, score 0.
  _play_to(shop, MINT_12, SPEAKER_ASIN, [], search="search[bluetooth speaker]")
  _, reward, _, info = shop.step("click[buy now]")
  assert (reward, info["task_score"], info["reward_info"]["r_type"]) == (0.0, 0.0, 0.0)

  # "Tea Candle Set": 1 of 6 goal nouns (0.17), other query and category: r_type 0.5;
  # only the price matches: 1/5 * 0.5 = 0.1.
  _play_to(shop, MINT_12, CANDLE_ASIN, [], search="search[tea candle]")
  _, reward, _, info = shop.step("click[buy now]")
  assert info["reward_info"]["title_score"] == pytest.approx(1 / 6)
  assert info["task_score"] == pytest.approx(0.1, abs=1e-12) and reward == 0.0


# ----------------------------------------------------------------------- env: pages
def test_pages_and_observation_strings(shop):
  task = next(i for i, g in enumerate(shop.catalogue.goals) if g["goal_options"] == MINT_12)
  obs, info = shop.reset(task=task)
  instruction = info["task"]
  assert obs == f"WebShop [SEP] Instruction: [SEP] {instruction} [SEP] Search"
  assert info["admissible_commands"] == ["search[<your query>]", "click[search]"]
  assert info["available_actions"] == {"has_search_bar": True, "clickables": ["search"]}
  assert info["task_type"] == "beauty" and info["won"] is False and info["task_score"] == 0.0

  obs, reward, done, info = shop.step("search[Tea Tree Shampoo]")
  head = f"Instruction: [SEP] {instruction} [SEP] Back to Search [SEP] Page 1 (Total results: "
  assert obs.startswith(head) and (reward, done) == (0.0, False)
  assert f"[SEP] {GOAL_ASIN} [SEP] Herbal Tea Tree Shampoo for Dry Hair [SEP] $12.0" in obs
  assert f"[SEP] {PRICEY_ASIN} [SEP] Luxe Tea Tree Shampoo [SEP] $95.0" in obs
  assert SPEAKER_ASIN not in obs and "< Prev" not in obs
  assert info["admissible_commands"][:2] == ["click[back to search]", "click[next >]"]
  assert f"click[{GOAL_ASIN.lower()}]" in info["admissible_commands"]

  obs, *_ = shop.step(f"click[{GOAL_ASIN.lower()}]")
  item = (
    f"Instruction: [SEP] {instruction} [SEP] Back to Search [SEP] < Prev [SEP] size [SEP] 12 fl oz "
    "[SEP] 32 fl oz [SEP] scent [SEP] mint [SEP] lavender [SEP] Herbal Tea Tree Shampoo for Dry "
    "Hair [SEP] Price: $12.0 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews "
    "[SEP] Buy Now"
  )
  assert obs == item
  assert shop.available_actions()["clickables"] == [
    "back to search", "< prev", "description", "features", "reviews", "buy now",
    "12 fl oz", "32 fl oz", "mint", "lavender",
  ]  # fmt: skip
  sub = f"Instruction: [SEP] {instruction} [SEP] Back to Search [SEP] < Prev"
  assert shop.step("click[description]")[0] == f"{sub} [SEP] A gentle daily shampoo."
  assert shop.available_actions() == {
    "has_search_bar": False,
    "clickables": ["back to search", "< prev"],
  }
  assert shop.step("click[< prev]")[0] == item
  assert shop.step("click[features]")[0] == (
    f"{sub} [SEP] Sulfate free formula [SEP] Made with natural ingredients"
  )
  shop.step("click[< prev]")
  assert shop.step("click[reviews]")[0] == sub
  shop.step("click[< prev]")
  shop.step("click[Mint]")  # the argument is lower-cased
  assert shop.options == {"scent": "mint"}
  # "< Prev" from the item page returns to the same results page and forgets the options.
  obs, *_ = shop.step("click[< prev]")
  assert obs.startswith(head) and shop.options == {} and shop.asin is None
  shop.step(f"click[{GOAL_ASIN.lower()}]")
  shop.step("click[mint]")
  shop.step("click[12 fl oz]")
  obs, reward, done, info = shop.step("click[buy now]")
  assert obs == (
    "Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it in your MTurk "
    f"interface.) [SEP] Purchased [SEP] asin [SEP] {GOAL_ASIN} [SEP] options [SEP] "
    '{"scent": "mint", "size": "12 fl oz"} [SEP] attrs [SEP] None [SEP] category [SEP] None [SEP] '
    "query [SEP] None [SEP] product category [SEP] None [SEP] Target [SEP] asin [SEP] options "
    "[SEP] attrs [SEP] price upper [SEP] instuction text [SEP] category [SEP] product category "
    "[SEP] query [SEP] Goal [SEP] None [SEP] Reward [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0 "
    "[SEP] Reward Details [SEP] None"
  )
  assert info["admissible_commands"] == [] and reward == 10.0
  # A finished episode stays finished.
  assert shop.step("click[back to search]") == (obs, 0.0, True, info)
  # Back to Search forgets everything and shows the search page.
  shop.reset(task=task)
  shop.step("search[shampoo]")
  assert (
    shop.step("click[back to search]")[0]
    == f"WebShop [SEP] Instruction: [SEP] {instruction} [SEP] Search"
  )


def test_malformed_actions_are_no_op_steps(shop):
  shop.reset(task=0)
  search_page = shop.observation()
  for step, action in enumerate(
    ["click[search]", "search[]", "search", "buy now", "click[next >]", "Search[shampoo]",
     "click[b000000001]", "[shampoo]", "click [buy now]"], start=1
  ):  # fmt: skip
    obs, reward, done, info = shop.step(action)
    assert (obs, reward, done, info["action_accepted"]) == (search_page, 0.0, False, False), action
    assert info["steps"] == step
  shop.reset(task=0)  # a fresh episode: the 15-step limit is not reached below
  shop.step("search[tea tree shampoo]")
  results = shop.observation()
  for action in ["click[buy now]", "click[ b000000001]", "click[description]", "click[< prev]"]:
    assert shop.step(action)[0] == results, action
  shop.step(f"click[{GOAL_ASIN.lower()}]")
  item = shop.observation()
  for action in ["click[next >]", "click[12 FL OZ ]", "click[orange]", "click[search]"]:
    obs, _, _, info = shop.step(action)
    assert obs == item and not info["action_accepted"], action
  # The greedy pattern: "search[a] b" searches for "a"; "search[a] and click[b]" is the name
  # "search[a] and click" with argument "b", not a valid action.
  assert parse_action("search[a] b") == ("search", "a")
  assert parse_action("search[a] and click[b]") == ("search[a] and click", "b")
  assert parse_action("click[]") == ("click[]", None)
  assert shop.step("search[argan] trailing text")[3]["action_accepted"]


def test_search_works_on_any_page_and_clears_the_item(shop):
  shop.reset(task=0)
  shop.step("search[tea tree shampoo]")
  shop.step(f"click[{GOAL_ASIN.lower()}]")
  shop.step("click[mint]")
  obs, *_ = shop.step("search[conditioner]")
  assert "Page 1 (Total results: 1)" in obs and RANGE_ASIN in obs
  assert shop.asin is None and shop.options == {}
  obs, *_ = shop.step("search[zzzz qqqq]")
  assert obs.endswith("Page 1 (Total results: 0) [SEP] Next >")
  # The original's special keywords bypass BM25.
  assert f"{SPEAKER_ASIN} [SEP]" in shop.step("search[<c> electronics]")[0]
  assert "(Total results: 2)" in shop.step("search[<q> shampoo]")[0]
  assert "(Total results: 2)" in shop.step("search[<a> sulfate free]")[0]


def test_paging_ten_per_page_up_to_fifty(tmp_path):
  widgets = [_raw(f"B0W{i:07d}", f"Blue Widget {i}", "$5.00") for i in range(60)]
  attributes = {w["asin"]: {"attributes": ["blue"], "instruction": "i need a blue widget",
                            "instruction_attributes": ["blue"]} for w in widgets}  # fmt: skip
  catalogue = data_lib.build_catalogue(widgets, attributes)
  env = WebShopEnv(catalogue, [0], noun_extractor=RULE)
  env.reset(task=0)
  obs, *_ = env.step("search[widget]")
  # Every document has "widget" once and the same length: equal scores, so the 50 kept are the
  # first 50 in catalogue order, 10 per page.
  assert "Page 1 (Total results: 50) [SEP] Next > [SEP] " in obs
  asins_on_page = lambda text: re.findall(r"B0W\d{7}", text)
  first = asins_on_page(obs)
  assert first == [f"B0W{i:07d}" for i in range(10)]
  seen = list(first)
  for page in range(2, 6):
    obs, *_ = env.step("click[next >]")
    assert f"Page {page} (Total results: 50) [SEP] < Prev [SEP] Next > [SEP] " in obs
    seen += asins_on_page(obs)
  assert seen == [f"B0W{i:07d}" for i in range(50)]
  obs, *_ = env.step("click[next >]")  # past the last hit: an empty page, still with both buttons
  assert obs.endswith("Page 6 (Total results: 50) [SEP] < Prev [SEP] Next >")
  obs, *_ = env.step("click[< prev]")
  assert asins_on_page(obs) == [f"B0W{i:07d}" for i in range(40, 50)]
  assert env.available_actions()["clickables"][:3] == ["back to search", "< prev", "next >"]


def test_fifteen_step_limit(shop):
  shop.reset(task=0)
  for step in range(1, 16):
    obs, reward, done, info = shop.step("click[nothing]")
    assert done == (step == 15) and reward == 0.0
  assert info["truncated"] and info["task_score"] == 0.0 and not info["won"]
  assert shop.step("search[shampoo]") == (obs, 0.0, True, info)
  # A purchase at the 15th step still counts.
  shop.reset(task=0)
  for _ in range(10):  # then search, open, two options, buy: steps 11-15
    shop.step("noop")
  while not (result := shop.step(shop.expert_action()))[2]:
    pass
  assert result[3]["steps"] == 15 and result[1] == 10.0 and not result[3]["truncated"]


def test_env_errors_name_the_problem(shop):
  with pytest.raises(IndexError, match="task 4 out of range"):
    shop.reset(task=4)
  with pytest.raises(ValueError, match="num_generated_products"):
    envs.make("webshop", num_products=100)
  with pytest.raises(FileNotFoundError, match="envs.webshop.generator"):
    envs.make("webshop", data_dir="/nonexistent/webshop")


# ------------------------------------------------------------------------- search analysis
def test_search_analysis_is_lucene_like():
  assert analyze("Men's Running Shoes for the Trail, 3.5 oz") == [
    "men", "run", "shoe", "trail", "3.5", "oz",
  ]  # fmt: skip
  assert [stem(w) for w in ("caresses", "ponies", "relational", "hopping", "generalizations")] == [
    "caress", "poni", "relat", "hop", "gener",
  ]  # fmt: skip


def test_search_index_cache_gives_the_same_results(tmp_path):
  products = generator.generated_catalogue().products[:200]
  built = SearchEngine(products, cache_dir=str(tmp_path))
  (folder,) = os.listdir(tmp_path)
  loaded = SearchEngine(products, cache_dir=str(tmp_path))
  assert os.listdir(tmp_path) == [folder]  # loaded, not rebuilt under another name
  for query in ("tea tree shampoo", "black running shoes 9", "office chair lumbar support"):
    assert loaded.search(query) == built.search(query) and built.search(query)
  # Another catalogue text gets another cache entry.
  SearchEngine(products[:100], cache_dir=str(tmp_path))
  assert len(os.listdir(tmp_path)) == 2


# ------------------------------------------------------------------ prompts and projection
INSTRUCTION_TAIL = (
  "Decide on this step's action. Reason about the page and the request first, and put all of "
  "this reasoning between <think> </think> tags. Then write a single action from the list above "
  "between <action> </action> tags.\n"
)


def test_prompts_keep_the_reference_structure():
  first_obs = "WebShop [SEP] Instruction: [SEP] i need a mug [SEP] Search"
  task = prompts.extract_task(first_obs)
  assert task == "i need a mug"
  admissible = ["search[<your query>]", "click[search]"]
  assert prompts.build_prompt(task, [], first_obs, admissible) == (
    "You are shopping on the WebShop website on behalf of a customer.\n"
    "The customer's request: i need a mug.\n"
    "The page you see now: 'Search'.\n"
    "Actions you can take on this page:\n[\n"
    "'search[<your query>]',\n'click[search]',\n].\n\n" + INSTRUCTION_TAIL
  )
  results = (
    "Instruction: [SEP] i need a mug [SEP] Back to Search [SEP] Page 1 (Total results: 0) [SEP] "
    "Next >"
  )
  history = [(first_obs, "search[mug]"), (results, "click[next >]"), (results, "click[x]")]
  later = prompts.build_prompt(task, history, results, ["click[back to search]", "click[next >]"])
  page = "'Back to Search' [SEP] 'Page 1 (Total results: 0)' [SEP] 'Next >'"
  assert later == (
    "You are shopping on the WebShop website on behalf of a customer.\n"
    "The customer's request: i need a mug.\n"
    "So far you have taken 3 step(s); the latest 2 page(s) you saw, each with the action you "
    "took on it: "
    f"[Observation 2: '{page}', Action 2: 'click[next >]']\n"
    f"[Observation 3: '{page}', Action 3: 'click[x]']\n"
    f"This is step 4. The page you see now: {page}.\n"
    "Actions you can take on this page:\n[\n"
    "'click[back to search]',\n'click[next >]',\n].\n\n" + INSTRUCTION_TAIL
  )
  # An observation without the instruction (the done page) is shown as it is.
  assert prompts.format_observation("Thank you [SEP] x", task) == "Thank you [SEP] x"
  # Over 13,000 characters: the prompt without history.
  long_history = [("x" * 7000, "a"), ("y" * 7000, "b")]
  assert "So far you have taken" not in prompts.build_prompt(task, long_history, results, [])
  with pytest.raises(ValueError, match="not a WebShop"):
    prompts.extract_task("Thank you for shopping with us!")


def test_prompt_uses_the_env_admissible_list(shop):
  obs, info = shop.reset(task=0)
  text = prompts.build_prompt(info["task"], [], obs, info["admissible_commands"])
  assert "'search[<your query>]',\n'click[search]',\n]." in text


@pytest.mark.parametrize(
  "text, action, valid",
  [
    ("<think>ok</think><action>Click[Buy Now]</action>", "click[buy now]", True),
    ("<think>ok</think> <action> search[red mug] </action> tail", "search[red mug]", True),
    ("<action>click[x]</action>", "click[x]", False),  # no think tags
    ("<think>好</think><action>click[x]</action>", "click[x]", False),  # CJK
    ("<think>a</think> I would click[buy now] here", " click[buy now] here", False),
    ("</action> then <action>click[x]", "hen <action>click[x]", False),
  ],
)
def test_projection(text, action, valid):
  assert project_action(text) == (action, valid)


# ---------------------------------------------------------------------------------- skills
WEBSHOP_SKILL_FILES = ("general", "apparel", "footwear", "home_decor", "electronics",
                       "accessories", "beauty_health", "other")  # fmt: skip


def _skill_file(name):
  filename = "general_skills.md" if name == "general" else f"{name}.md"
  with open(os.path.join(skills_dir("webshop"), filename)) as f:
    return f.read().strip()


@pytest.mark.parametrize("name", WEBSHOP_SKILL_FILES)
def test_webshop_skill_files_follow_the_format(name):
  lines = _skill_file(name).splitlines()
  header = "### GENERAL SKILLS ###" if name == "general" else f"### TASK: {name} ###"
  assert lines[0] == header and lines[1] and not lines[2]
  items = [line for line in lines[3:] if line]
  assert len(items) >= 5 and all(
    re.match(rf"{n}\. [^:]+: .+ Apply this ", line) for n, line in enumerate(items, 1)
  )


def test_webshop_rules_use_substring_keywords():
  """The keyword rule of docs/reference.md §3.2, with its substring matches."""
  library = SkillLibrary.load("webshop")
  assert len(library.general.items) == 15 and list(library.tasks) == list(WEBSHOP_SKILL_FILES[1:])
  rules = SkillRetriever("webshop", strategy="rules", rules_version="post_fix")
  general = _skill_file("general")

  def block(*names):
    return BLOCK_HEADER + "\n\n".join([general] + [_skill_file(n) for n in names]) + "\n\n"

  assert rules.privileged_block(query="i need a bluetooth speaker") == block("electronics")
  # Substring quirks: "hat" inside "what", "hair" inside "chair", "boot" inside "bootcut".
  assert rules.privileged_block(query="what office chair") == block(
    "home_decor", "accessories", "beauty_health"
  )
  assert rules.privileged_block(query="bootcut jeans") == block("apparel", "footwear")
  # The task type (the product category) does not select a file: WebShop has no task_to_skill.
  assert rules.privileged_block(task_type="fashion", query="a mug") == block()
  assert (
    SkillRetriever("webshop", rules_version="pre_fix").privileged_block(query="bluetooth speaker")
    == block()
  )
  assert "other" not in library.match_keywords(
    " ".join(w for ws in library.task_keywords.values() for w in ws)
  )
  bm25 = SkillRetriever("webshop", strategy="bm25", top_k=3).skill_text(query="shoe size running")
  assert "### TASK: footwear ###" in bm25
