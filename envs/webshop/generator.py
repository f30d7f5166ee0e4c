"""An offline WebShop catalogue: products, attributes, instructions in the original files' formats.

    python -m envs.webshop.generator --out data/webshop --num-products 1000 --seed 0

writes `items_shuffle_1000.json` (products), `items_ins_v2_1000.json` (attributes and synthetic
instructions) and `items_human_ins.json` (one human-style instruction per product, with options)
in the formats the original reads, so `envs.make("webshop", data_dir=...)` plays them exactly as
real files. Without `data_dir` the env generates the same records in memory
(`generated_catalogue`, a fraction of a second for 1,000 products).

The catalogue spans WebShop's five categories (beauty for makeup, electronics, fashion, food,
furniture) with 37 product types; each type has its query, its breadcrumb product_category, title
nouns and modifiers, an attribute vocabulary, option groups (colour, size, flavour, ...) and a
price band. A product gets a brand, a title, 3-5 attributes, 0-2 option groups of 2-5 values,
a price (a range for some), a description and bullet points; its instruction names the product
type and 1-3 of its attributes ("i am looking for a tea tree shampoo that is sulfate free"); goals
then add the options and the price bound as the original does. Every option value is
checked against the reward's colour normalisation: values that would not match themselves
("grapefruit" -> "grape") are left out, so buying the goal product with the goal options always
scores 1.0.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import string
from typing import Any

from envs.errors import add_verbosity_argument, exit_on_env_error
from envs.webshop.data import DEFAULT_DATA_SEED, Catalogue, build_catalogue, data_file_names
from envs.webshop.fuzz import token_set_ratio
from envs.webshop.normalize import normalize_color
from envs.webshop.product_types import CATEGORIES, PRODUCT_TYPES, ProductType

__all__ = [
  "CATEGORIES",
  "DEFAULT_NUM_PRODUCTS",
  "PRODUCT_TYPES",
  "generate_records",
  "generated_catalogue",
  "main",
  "write_files",
]

DEFAULT_NUM_PRODUCTS = 1000

_BRANDS = {
  "beauty": (
    "Lumera",
    "Verdell",
    "Oakridge Botanics",
    "Sollis",
    "Maribelle",
    "Pure Fern",
    "Avalune",
  ),
  "electronics": ("Voltix", "Nexcell", "Arcwave", "Sonaro", "Kyberline", "Tekora", "Zephyro"),
  "fashion": ("Northwind", "Calder & Co", "Rivet Lane", "Solstice", "Harbor Thread", "Aurelle"),
  "food": (
    "Golden Acre",
    "Hillview Farms",
    "Casa Verde",
    "Sunmeadow",
    "Kettle Creek",
    "Orchard Row",
  ),
  "furniture": ("Hearthwood", "Linden Home", "Stoneway", "Nestora", "Alder & Pine", "Brightloft"),
}
_INSTRUCTIONS = (
  "i need {article} {thing} that is {attrs}",
  "i am looking for {article} {attrs_adj} {thing}",
  "find me {article} {thing} that is {attrs}",
  "i want to buy {article} {thing} which is {attrs}",
  "i'm looking for {article} {attrs_adj} {thing}",
  "get me {article} {thing}, it should be {attrs}",
)
_HUMAN_INSTRUCTIONS = (
  "I want {article} {thing} that is {attrs}{options}.",
  "Looking for {article} {attrs_adj} {thing}{options}.",
  "Please find {article} {thing} that is {attrs}{options}, not too expensive.",
)


def _article(phrase: str) -> str:
  return "an" if phrase[:1] in "aeiou" else "a"


def _fill(template: str, words: dict[str, str]) -> str:
  """The template with `words`, "{article}" becoming "a" or "an" for the word after it."""
  text = template.format(article="<article>", **words)
  return re.sub(r"<article> (\w)", lambda m: f"{_article(m.group(1))} {m.group(1)}", text)


def _join_and(items: list[str]) -> str:
  return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _self_matching(name: str, value: str) -> bool:
  """True when buying `value` matches the goal option (name, value) under the reward's rules."""
  return token_set_ratio(normalize_color(value), normalize_color((name, value))) > 85


def _asin(rng: random.Random, seen: set[str]) -> str:
  alphabet = string.ascii_uppercase + string.digits
  while True:
    asin = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
    if asin not in seen:
      seen.add(asin)
      return asin


def _pricing(rng: random.Random, low: float, high: float) -> str:
  roll = rng.random()
  if roll < 0.01:
    return ""  # the original treats a missing price as $100.0
  price = round(rng.uniform(low, high), 2)
  if roll < 0.15:
    upper = round(price * rng.uniform(1.15, 1.6), 2)
    return f"${price:.2f} - ${upper:.2f}"
  return f"${price:.2f}"


def _product(kind: ProductType, rng: random.Random, seen: set[str]) -> tuple[dict, dict, list]:
  asin = _asin(rng, seen)
  brand = rng.choice(_BRANDS[kind.category])
  modifier = rng.choice(kind.modifiers)
  noun = rng.choice(kind.nouns)
  count = len(kind.attributes)
  attributes = rng.sample(kind.attributes, rng.randint(min(3, count), min(5, count)))
  extra = rng.choice(
    ("", "", f", Pack of {rng.randint(2, 4)}", f" - {rng.choice(attributes).title()}")
  )
  title = f"{brand} {modifier} {noun}{extra}"
  groups = list(kind.options)
  rng.shuffle(groups)
  groups = sorted(groups[: rng.choice((0, 1, 1, 2, 2, 2))], key=kind.options.index)
  customization: dict[str, list[dict[str, Any]]] = {}
  used: set[str] = set()
  for name, pool in groups:
    candidates = [v for v in pool if _self_matching(name, v) and v not in used]
    values = rng.sample(candidates, min(len(candidates), rng.randint(2, 5)))
    if len(values) < 2:
      continue
    values.sort(key=pool.index)
    used.update(values)
    customization[name.title()] = [{"value": v.title(), "image": None} for v in values]
  description = (
    f"{brand} {modifier} {noun.lower()}, made for {kind.use}. "
    f"Key features: {_join_and(attributes)}. Backed by our satisfaction guarantee."
  )
  bullets = [f"{a.upper()}: chosen by customers for {kind.use}." for a in attributes]
  bullets.append(f"WHAT YOU GET: one {brand} {noun.lower()} and friendly customer service.")
  product = {
    "asin": asin,
    "name": title,
    "full_description": description,
    "small_description": bullets,
    "pricing": _pricing(rng, *kind.price),
    "customization_options": customization or None,
    "images": [f"images/{asin}.jpg"],
    "category": kind.category,
    "query": kind.query,
    "product_category": kind.path,
    "brand": brand,
  }
  wanted = rng.sample(attributes, rng.randint(1, min(3, len(attributes))))
  thing = f"{modifier.lower()} {noun.lower()}" if rng.random() < 0.5 else noun.lower()
  words = {"thing": thing, "attrs": _join_and(wanted), "attrs_adj": " ".join(wanted)}
  attribute_record = {
    "attributes": attributes,
    "instruction": _fill(rng.choice(_INSTRUCTIONS), words),
    "instruction_attributes": wanted,
  }
  chosen = [rng.choice(v)["value"].lower() for v in customization.values()]
  words["options"] = f", {' and '.join(chosen)}" if chosen else ""
  human = [
    {
      "asin": asin,
      "instruction": _fill(rng.choice(_HUMAN_INSTRUCTIONS), words),
      "instruction_attributes": wanted,
      "instruction_options": chosen,
    }
  ]
  return product, attribute_record, human


def generate_records(
  num_products: int = DEFAULT_NUM_PRODUCTS, seed: int = 0
) -> tuple[list[dict], dict[str, dict], dict[str, list]]:
  """(products, attributes by asin, human instructions by asin) in the original files' formats.

  Product types are used round-robin (in a seeded order), so every type is represented.
  """
  if num_products < 1:
    raise ValueError(f"num_products must be >= 1, got {num_products}")
  rng = random.Random(seed)
  order = list(PRODUCT_TYPES)
  rng.shuffle(order)
  seen: set[str] = set()
  products, attributes, human = [], {}, {}
  for i in range(num_products):
    product, record, instructions = _product(order[i % len(order)], rng, seen)
    products.append(product)
    attributes[product["asin"]] = record
    human[product["asin"]] = instructions
  rng.shuffle(products)  # the original's file is shuffled too
  return products, attributes, human


@functools.lru_cache(maxsize=4)
def generated_catalogue(
  num_products: int = DEFAULT_NUM_PRODUCTS,
  seed: int = 0,
  human_goals: bool = False,
  data_seed: int = DEFAULT_DATA_SEED,
) -> Catalogue:
  """The Catalogue of `generate_records(num_products, seed)` (cached per process)."""
  products, attributes, human = generate_records(num_products, seed)
  return build_catalogue(
    products,
    attributes,
    human,
    human_goals=human_goals,
    data_seed=data_seed,
    source=f"generated (num_products={num_products}, seed={seed})",
  )


def write_files(out_dir: str, num_products: int = DEFAULT_NUM_PRODUCTS, seed: int = 0) -> list[str]:
  """Writes the three files (the small-set names) into `out_dir`; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  records = generate_records(num_products, seed)
  paths = []
  for name, data in zip(data_file_names(use_small=True), records):
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
      json.dump(data, f, ensure_ascii=False)
    paths.append(path)
  return paths


@exit_on_env_error
def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="folder to write the JSON files into")
  parser.add_argument("--num-products", type=int, default=DEFAULT_NUM_PRODUCTS)
  parser.add_argument("--seed", type=int, default=0)
  add_verbosity_argument(parser)
  args = parser.parse_args(argv)
  for path in write_files(args.out, args.num_products, args.seed):
    print(path)


if __name__ == "__main__":
  main()
