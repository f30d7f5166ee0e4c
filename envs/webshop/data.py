"""WebShop data: the product and goal files, product cleaning, prices, goals, and the fixed split.

Files, read from `data_dir` or its `data/` sub-folder:
- products `items_shuffle_1000.json` (`use_small=True`, verl-agent's default) or
  `items_shuffle.json`: a JSON list of raw product records (asin, name, full_description,
  small_description, pricing, customization_options, images, category, query, product_category);
- attributes `items_ins_v2_1000.json` / `items_ins_v2.json`: {asin: {"attributes": [...],
  "instruction": str, "instruction_attributes": [...]}};
- human instructions `items_human_ins.json` (read only with `human_goals=True`):
  {asin: [{"instruction", "instruction_attributes", "instruction_options"}, ...]}.

`build_catalogue` cleans the records as the original's loader does, draws the product prices
(a price range gets a uniform draw), builds the goals (human, or synthetic: one goal per
option combination of every product with an instruction) with their price bounds, and
shuffles the goal list. All draws come from `random.Random(data_seed)` in the original's order
(prices, then bounds, then the shuffle re-seeded with `data_seed`), so a catalogue depends on its
files and `data_seed` only: every worker of a pool, whatever its own seed, sees the same goals at
the same indices. The split is fixed: test = goal indices 0-499, train = 500 onwards. (The
original shuffles with each worker's own seed in verl-agent, so there the same index names
different goals on different workers; here it does not.)
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import random
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from envs.errors import EnvInputError, read_json_file

__all__ = [
  "WebShopDataError",
  "WebShopFilesMissingError",
  "DEFAULT_DATA_SEED",
  "PRICE_RANGE",
  "SPLITS",
  "TEST_GOALS",
  "Catalogue",
  "build_catalogue",
  "clean_products",
  "data_file_names",
  "find_data_files",
  "generate_product_prices",
  "get_human_goals",
  "get_synthetic_goals",
  "load_catalogue",
  "price_bound",
  "read_data_files",
  "split_goal_indices",
]

PRICE_RANGE = [10.0 * i for i in range(1, 100)]  # 10 ... 990
NO_PRICE_BOUND = 1000000
TEST_GOALS = 500  # goals 0..499 are the test split
SPLITS = ("train", "test")
DEFAULT_DATA_SEED = 233  # the original's goal-shuffle seed
DEFAULT_PRICE = 100.0
DUMMY_ATTRIBUTE = "DUMMY_ATTR"
_DROPPED_KEYS = (
  "product_information", "brand", "brand_url", "list_price", "availability_quantity",
  "availability_status", "total_reviews", "total_answered_questions", "seller_id", "seller_name",
  "fulfilled_by_amazon", "fast_track_message", "aplus_present", "small_description_old",
)  # fmt: skip
_NOT_PRICE_CHARS = re.compile(r"[^\d.]")
# The fields of a raw product record the loader reads without a default.
PRODUCT_FIELDS = ("asin", "name", "full_description", "small_description", "query")
GOAL_FIELDS = ("category", "product_category")  # read for the goals of a product
_DATA_FIX = (
  "Fix: download the WebShop data files again, or write generated ones with: python -m "
  "envs.webshop.generator --out DIR"
)


class WebShopDataError(EnvInputError):
  """A WebShop data file that cannot be used: not JSON, or a record without a field the loader
  reads. The message names the file, the record and the field."""


class WebShopFilesMissingError(WebShopDataError, FileNotFoundError):
  """A WebShop data folder without the files the settings ask for."""


@dataclasses.dataclass
class Catalogue:
  """Cleaned products, their prices, the shuffled goals, and (built when first used) the index."""

  products: list[dict[str, Any]]
  product_item_dict: dict[str, dict[str, Any]]
  product_prices: dict[str, float]
  attribute_to_asins: dict[str, set[str]]
  goals: list[dict[str, Any]]
  human_goals: bool
  source: str  # "generated (...)" or the data folder
  index_cache_dir: str | None = None
  _search_engine: Any = dataclasses.field(default=None, repr=False)

  @property
  def search_engine(self):
    """The bm25s engine over the products (built once, cached in `index_cache_dir` when set)."""
    if self._search_engine is None:
      from envs.webshop.search import SearchEngine

      self._search_engine = SearchEngine(self.products, cache_dir=self.index_cache_dir)
    return self._search_engine


def data_file_names(use_small: bool = True) -> tuple[str, str, str]:
  """(products file, attributes file, human-instructions file) names of a WebShop data folder."""
  if use_small:
    return "items_shuffle_1000.json", "items_ins_v2_1000.json", "items_human_ins.json"
  return "items_shuffle.json", "items_ins_v2.json", "items_human_ins.json"


def find_data_files(data_dir: str, use_small: bool = True, human_goals: bool = False) -> list[str]:
  """Paths of the files needed, looked up in `data_dir` and `data_dir/data`."""
  data_dir = os.path.expanduser(os.path.expandvars(data_dir))
  products, attributes, human = data_file_names(use_small)
  wanted = [products, attributes] + ([human] if human_goals else [])
  folders = (data_dir, os.path.join(data_dir, "data"))
  for folder in folders:
    if all(os.path.isfile(os.path.join(folder, name)) for name in wanted):
      return [os.path.join(folder, name) for name in wanted]
  if not os.path.isdir(data_dir):
    raise WebShopFilesMissingError(
      f"WebShop data folder {data_dir!r}: no such folder. Fix: point data_dir at the folder "
      "holding the original files, or write generated ones with: python -m "
      "envs.webshop.generator --out DIR"
    )
  # The folder that has the most of them is the one meant: name only what it lacks.
  folder = max(folders, key=lambda f: sum(os.path.isfile(os.path.join(f, n)) for n in wanted))
  missing = [name for name in wanted if not os.path.isfile(os.path.join(folder, name))]
  present = [name for name in wanted if name not in missing]
  has = f" (it has {present})" if present else ""
  settings = "use_small=True" if use_small else "use_small=False"
  raise WebShopFilesMissingError(
    f"WebShop data folder {folder!r} lacks {missing}{has}; with {settings}"
    f"{', human_goals=True' if human_goals else ''} the run reads {wanted}. Fix: add the missing "
    "file(s) (use_small=False reads items_shuffle.json / items_ins_v2.json, use_small=True the "
    "_1000 files), point data_dir at the folder holding them, or write generated ones with: "
    "python -m envs.webshop.generator --out DIR"
  )


def _read_json(path: str, expected: type, what: str) -> Any:
  """The JSON content of data file `path`, which must be a `expected` (list or dict) of `what`."""
  value = read_json_file(
    path, "WebShop data file", WebShopDataError, f"The file is truncated or corrupted. {_DATA_FIX}"
  )
  if not isinstance(value, expected):
    raise WebShopDataError(
      f"WebShop data file {path!r} holds a JSON {type(value).__name__}; the loader expects a "
      f"JSON {expected.__name__} of {what}. Is it the right file? {_DATA_FIX}"
    )
  return value


def read_data_files(
  data_dir: str, use_small: bool = True, human_goals: bool = False
) -> tuple[list[dict], dict, dict | None]:
  """(raw products, attributes by asin, human instructions by asin or None) from a data folder."""
  paths = find_data_files(data_dir, use_small, human_goals)
  products = _read_json(paths[0], list, "product records")
  attributes = _read_json(paths[1], dict, "{asin: attribute record}")
  human = _read_json(paths[2], dict, "{asin: [instruction, ...]}") if human_goals else None
  return products, attributes, human


def _parse_pricing(asin: str, pricing: Any) -> tuple[list[float], str]:
  if not pricing:
    return [DEFAULT_PRICE], f"${DEFAULT_PRICE}"
  try:
    values = [float(Decimal(_NOT_PRICE_CHARS.sub("", part))) for part in pricing.split("$")[1:]]
  except (InvalidOperation, AttributeError) as e:
    raise ValueError(
      f"product {asin!r} has an unreadable pricing {pricing!r}; expected '$12.99' or "
      "'$10.00 - $20.00'"
    ) from e
  if not values:
    raise ValueError(f"product {asin!r} has pricing {pricing!r} without a '$' amount")
  if len(values) == 1:
    return values, f"${values[0]}"
  return values[:2], f"${values[0]} to ${values[1]}"


def clean_products(
  raw_products: Sequence[Mapping[str, Any]],
  attributes: Mapping[str, Mapping[str, Any]],
  human_instructions: Mapping[str, Any] | None = None,
  human_goals: bool = False,
  num_products: int | None = None,
  source: str = "",
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], dict[str, set[str]]]:
  """(products, {asin: product}, {attribute: asins}) cleaned as the original loader.

  The raw records are copied, not modified. A record without a field the loader reads (or of
  the wrong shape) is a `WebShopDataError` naming `source` (the data folder), the record and the
  field.
  """
  if num_products is not None:
    raw_products = raw_products[:num_products]
  seen: set[str] = set()
  products = []
  for number, raw in enumerate(raw_products):
    try:
      product = _clean_product(raw, seen, attributes, human_instructions, human_goals)
    except (KeyError, TypeError, AttributeError) as err:
      what = (
        f"lacks the field {err.args[0]!r} (a product record needs {list(PRODUCT_FIELDS)})"
        if isinstance(err, KeyError)
        else f"is malformed ({err})"
      )
      asin = raw.get("asin", "?") if isinstance(raw, Mapping) else "?"
      where = f" in {source!r}" if source else ""
      raise WebShopDataError(
        f"WebShop product record #{number} (asin {asin!r}){where} {what}. {_DATA_FIX}"
      ) from err
    if product is not None:
      products.append(product)
  attribute_to_asins: dict[str, set[str]] = defaultdict(set)
  for product in products:
    for attribute in product["Attributes"]:
      attribute_to_asins[attribute].add(product["asin"])
  return products, {p["asin"]: p for p in products}, dict(attribute_to_asins)


def _clean_product(
  raw: Mapping[str, Any],
  seen: set[str],
  attributes: Mapping[str, Mapping[str, Any]],
  human_instructions: Mapping[str, Any] | None,
  human_goals: bool,
) -> dict[str, Any] | None:
  """One raw record cleaned (None: skipped, as the original skips it)."""
  asin = raw["asin"]
  if asin == "nan" or len(asin) > 10 or asin in seen:
    return None
  seen.add(asin)
  product = {k: v for k, v in raw.items() if k not in _DROPPED_KEYS}
  product["Title"] = raw["name"]
  product["Description"] = raw["full_description"]
  product["Reviews"] = []
  product["Rating"] = "N.A."
  bullets = raw["small_description"]
  product["BulletPoints"] = bullets if isinstance(bullets, list) else [bullets]
  product["pricing"], product["Price"] = _parse_pricing(asin, raw.get("pricing"))
  options: dict[str, list[str]] = {}
  option_to_image: dict[str, Any] = {}
  for name, contents in (raw.get("customization_options") or {}).items():
    if contents is None:
      continue
    values = []
    for content in contents:
      value = content["value"].strip().replace("/", " | ").lower()
      values.append(value)
      option_to_image[value] = content.get("image")
    options[name.lower()] = values
  product["options"] = options
  product["option_to_image"] = option_to_image
  record = attributes.get(asin) or {}
  if not isinstance(record, Mapping):
    raise TypeError(
      f"its record in the attributes file is a {type(record).__name__}, not a dict with "
      "'attributes', 'instruction', 'instruction_attributes'"
    )
  product["Attributes"] = record.get("attributes", [DUMMY_ATTRIBUTE])
  if human_goals:
    if human_instructions is not None and asin in human_instructions:
      product["instructions"] = human_instructions[asin]
  else:
    product["instruction_text"] = record.get("instruction")
    product["instruction_attributes"] = record.get("instruction_attributes")
  images = raw.get("images") or [None]
  product["MainImage"] = images[0]
  product["query"] = raw["query"].lower().strip()
  return product


def generate_product_prices(
  products: Sequence[Mapping[str, Any]], rng: random.Random
) -> dict[str, float]:
  """{asin: price}: 100.0 without pricing, the single price, or a uniform draw in a price range."""
  prices = {}
  for product in products:
    pricing = product["pricing"]
    if not pricing:
      prices[product["asin"]] = DEFAULT_PRICE
    elif len(pricing) == 1:
      prices[product["asin"]] = pricing[0]
    else:
      prices[product["asin"]] = rng.uniform(pricing[0], pricing[1])
  return prices


def price_bound(price: float, rng: random.Random) -> tuple[float, str]:
  """(price_upper, price_text) of a goal: the max of 2 of the next four 10-dollar steps."""
  candidates = [p for p in PRICE_RANGE if p > price][:4]
  if len(candidates) < 2:
    return NO_PRICE_BOUND, ""
  upper = max(rng.sample(candidates, 2))
  return upper, f", and price lower than {upper:.2f} dollars"


def _attribute_weights(goals: list[dict[str, Any]]) -> None:
  counts: dict[str, int] = defaultdict(int)
  for goal in goals:
    for attribute in goal["attributes"]:
      counts[attribute] += 1
  for goal in goals:
    goal["weight"] = sum(1.0 / counts[a] for a in goal["attributes"]) / len(goal["attributes"])


def get_synthetic_goals(
  products: Sequence[Mapping[str, Any]], prices: Mapping[str, float], rng: random.Random
) -> list[dict[str, Any]]:
  """One goal per option combination of each product with an instruction; options: a dict."""
  goals = []
  for product in products:
    instruction = product.get("instruction_text")
    if instruction is None:
      continue
    attributes = product["instruction_attributes"]
    if not attributes:
      raise ValueError(
        f"product {product['asin']!r} has an instruction but no instruction_attributes; the "
        "original asserts they are non-empty"
      )
    price_upper, price_text = price_bound(prices[product["asin"]], rng)
    names = sorted(product["options"])
    for combination in itertools.product(*(product["options"][name] for name in names)):
      goal_options = dict(zip(names, combination))
      option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
      option_text = f" with {option_text}" if option_text else ""
      goals.append(
        {
          "asin": product["asin"],
          "category": product["category"],
          "query": product["query"],
          "name": product["Title"],
          "product_category": product["product_category"],
          "instruction_text": f"{instruction}{option_text}{price_text}",
          "attributes": attributes,
          "price_upper": price_upper,
          "goal_options": goal_options,
        }
      )
  _attribute_weights(goals)
  return goals


def get_human_goals(
  products: Sequence[Mapping[str, Any]], prices: Mapping[str, float], rng: random.Random
) -> list[dict[str, Any]]:
  """One goal per human instruction with attributes; options as a list of strings."""
  goals = []
  for product in products:
    for instruction in product.get("instructions", ()):
      attributes = instruction["instruction_attributes"]
      if not attributes:
        continue
      price_upper, price_text = price_bound(prices[product["asin"]], rng)
      goals.append(
        {
          "asin": product["asin"],
          "category": product["category"],
          "query": product["query"],
          "name": product["name"],
          "product_category": product["product_category"],
          "instruction_text": instruction["instruction"].strip(".") + price_text,
          "attributes": attributes,
          "price_upper": price_upper,
          "goal_options": instruction["instruction_options"],
          "weight": 1,
        }
      )
  return goals


def build_catalogue(
  raw_products: Sequence[Mapping[str, Any]],
  attributes: Mapping[str, Mapping[str, Any]],
  human_instructions: Mapping[str, Any] | None = None,
  human_goals: bool = False,
  num_products: int | None = None,
  data_seed: int = DEFAULT_DATA_SEED,
  source: str = "",
  index_cache_dir: str | None = None,
) -> Catalogue:
  """A Catalogue from raw records in the files' formats (see the module docstring)."""
  if human_goals and human_instructions is None:
    raise ValueError("human_goals=True needs the human instructions (items_human_ins.json)")
  products, by_asin, attribute_to_asins = clean_products(
    raw_products, attributes, human_instructions, human_goals, num_products, source
  )
  if not products:
    raise ValueError(f"no usable products in {source or 'the given records'}")
  rng = random.Random(data_seed)
  prices = generate_product_prices(products, rng)
  try:
    goals = (get_human_goals if human_goals else get_synthetic_goals)(products, prices, rng)
  except (KeyError, TypeError, AttributeError) as err:
    what = (
      f"lacks the field {err.args[0]!r}" if isinstance(err, KeyError) else f"is malformed ({err})"
    )
    kind = "human instruction" if human_goals else "product"
    raise WebShopDataError(
      f"WebShop data{f' in {source!r}' if source else ''}: a {kind} record {what} (products "
      f"need {list(GOAL_FIELDS)} for their goals; human instructions 'instruction', "
      f"'instruction_attributes', 'instruction_options'). {_DATA_FIX}"
    ) from err
  if not goals:
    raise ValueError(
      f"no goals in {source or 'the given records'}: no product has an instruction with attributes"
    )
  random.Random(data_seed).shuffle(goals)
  return Catalogue(
    products, by_asin, prices, attribute_to_asins, goals, human_goals, source, index_cache_dir
  )


@functools.lru_cache(maxsize=4)
def load_catalogue(
  data_dir: str,
  use_small: bool = True,
  human_goals: bool = False,
  num_products: int | None = None,
  data_seed: int = DEFAULT_DATA_SEED,
  index_cache_dir: str | None = None,
) -> Catalogue:
  """The Catalogue of a WebShop data folder (cached per process: envs of one process share it)."""
  raw, attributes, human = read_data_files(data_dir, use_small, human_goals)
  return build_catalogue(
    raw, attributes, human, human_goals, num_products, data_seed, data_dir, index_cache_dir
  )


def split_goal_indices(num_goals: int, split: str) -> range:
  """Goal indices of a split: test = 0..499, train = 500..."""
  if split not in SPLITS:
    raise ValueError(f"unknown WebShop split {split!r}; choose one of {SPLITS}")
  indices = range(min(TEST_GOALS, num_goals)) if split == "test" else range(TEST_GOALS, num_goals)
  if not indices:
    raise ValueError(
      f"split {split!r} is empty: the catalogue has {num_goals} goals and test takes the first "
      f"{TEST_GOALS}; use a larger catalogue"
    )
  return indices
