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
import dataclasses
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
CATEGORIES = ("beauty", "electronics", "fashion", "food", "furniture")

_COLORS = ("black", "white", "navy blue", "heather gray", "olive green", "wine red", "beige")
_APPAREL_SIZES = ("small", "medium", "large", "x-large", "xx-large")
_SHOE_SIZES = ("6", "7", "8", "9", "10", "11", "12")


@dataclasses.dataclass(frozen=True)
class ProductType:
  category: str
  query: str
  path: str  # product_category, levels separated by " › "
  nouns: tuple[str, ...]
  modifiers: tuple[str, ...]
  attributes: tuple[str, ...]
  options: tuple[tuple[str, tuple[str, ...]], ...]
  price: tuple[float, float]
  use: str  # what the product is for, used in descriptions


def _t(category, query, path, nouns, modifiers, attributes, options, price, use) -> ProductType:
  return ProductType(
    category,
    query,
    " › ".join(path),
    tuple(nouns),
    tuple(modifiers),
    tuple(attributes),
    tuple((name, tuple(values)) for name, values in options),
    price,
    use,
  )


PRODUCT_TYPES = (
  # beauty
  _t(
    "beauty",
    "shampoo",
    ["Beauty & Personal Care", "Hair Care", "Shampoo & Conditioner", "Shampoos"],
    ["Shampoo", "Daily Shampoo"],
    ["Tea Tree", "Argan Oil", "Coconut Milk", "Biotin", "Keratin", "Rosemary"],
    [
      "sulfate free",
      "paraben free",
      "natural ingredients",
      "dry hair",
      "hair growth",
      "damaged hair",
      "color treated",
      "cruelty free",
    ],
    [("size", ["8.5 fl oz", "12 fl oz", "16.9 fl oz", "33.8 fl oz"])],
    (6, 38),
    "washing and caring for hair",
  ),
  _t(
    "beauty",
    "lipstick",
    ["Beauty & Personal Care", "Makeup", "Lips", "Lipstick"],
    ["Lipstick", "Liquid Lipstick"],
    ["Velvet", "Satin", "Creamy", "Hydrating", "Bold"],
    [
      "long lasting",
      "matte finish",
      "cruelty free",
      "highly pigmented",
      "moisturizing",
      "waterproof",
    ],
    [("color", ["ruby red", "nude pink", "berry", "coral", "mauve", "deep plum"])],
    (5, 30),
    "everyday lip color",
  ),
  _t(
    "beauty",
    "face moisturizer",
    ["Beauty & Personal Care", "Skin Care", "Face", "Creams & Moisturizers"],
    ["Face Moisturizer", "Face Cream"],
    ["Daily", "Night", "Vitamin C", "Ceramide", "Aloe"],
    [
      "fragrance free",
      "sensitive skin",
      "hyaluronic acid",
      "oil free",
      "anti aging",
      "non comedogenic",
    ],
    [("size", ["1.7 oz", "2.5 oz", "3.4 oz"])],
    (9, 65),
    "hydrating facial skin",
  ),
  _t(
    "beauty",
    "nail polish",
    ["Beauty & Personal Care", "Foot, Hand & Nail Care", "Nail Art & Polish", "Nail Polish"],
    ["Nail Polish", "Gel Nail Polish"],
    ["Glossy", "Shimmer", "Classic", "Salon"],
    ["quick dry", "long lasting", "non toxic", "chip resistant", "vegan"],
    [("color", ["cherry", "lilac", "coral", "ivory", "teal"])],
    (4, 22),
    "manicures at home",
  ),
  _t(
    "beauty",
    "perfume for women",
    ["Beauty & Personal Care", "Fragrance", "Women's", "Eau de Parfum"],
    ["Eau de Parfum", "Perfume Spray"],
    ["Floral", "Vanilla", "Amber", "Citrus", "Musk"],
    ["long lasting", "floral scent", "travel size", "alcohol free", "gift set"],
    [("size", ["1 fl oz", "1.7 fl oz", "3.4 fl oz"])],
    (18, 120),
    "a signature scent",
  ),
  _t(
    "beauty",
    "makeup brush set",
    ["Beauty & Personal Care", "Tools & Accessories", "Makeup Brushes & Tools", "Brush Sets"],
    ["Makeup Brush Set", "Brush Kit"],
    ["Professional", "Kabuki", "Vegan", "Travel"],
    ["synthetic bristles", "easy clean", "travel case", "cruelty free", "soft bristles"],
    [("color", ["rose gold", "black", "marble white", "pink"])],
    (8, 45),
    "applying foundation and powder",
  ),
  _t(
    "beauty",
    "toothpaste",
    ["Health & Household", "Oral Care", "Toothpaste"],
    ["Toothpaste", "Whitening Toothpaste"],
    ["Charcoal", "Herbal", "Enamel", "Baking Soda"],
    ["fluoride free", "whitening", "sensitive teeth", "fresh breath", "natural ingredients"],
    [("flavor", ["fresh mint", "cinnamon", "cool mint"]), ("size", ["1 pack", "2 pack", "4 pack"])],
    (3, 25),
    "daily brushing",
  ),
  # electronics
  _t(
    "electronics",
    "wireless earbuds",
    [
      "Electronics",
      "Headphones, Earbuds & Accessories",
      "Headphones & Earbuds",
      "Earbud Headphones",
    ],
    ["Wireless Earbuds", "Bluetooth Earbuds"],
    ["True Wireless", "Sport", "Mini", "Pro"],
    [
      "noise cancelling",
      "bluetooth 5.0",
      "long battery life",
      "water resistant",
      "charging case",
      "hands free",
    ],
    [("color", ["black", "white", "navy blue", "mint green"])],
    (15, 150),
    "music, calls and workouts",
  ),
  _t(
    "electronics",
    "phone case",
    ["Cell Phones & Accessories", "Cases, Holsters & Sleeves", "Basic Cases"],
    ["Phone Case", "Protective Case"],
    ["Clear", "Rugged", "Silicone", "Leather"],
    ["shockproof", "slim fit", "wireless charging compatible", "scratch resistant", "raised edges"],
    [
      ("color", ["black", "clear", "midnight blue", "pink"]),
      ("style", ["for iphone 13", "for galaxy s22", "for pixel 7"]),
    ],
    (6, 30),
    "protecting a phone from drops",
  ),
  _t(
    "electronics",
    "usb c cable",
    [
      "Electronics",
      "Computers & Accessories",
      "Computer Accessories & Peripherals",
      "Cables & Interconnects",
      "USB Cables",
    ],
    ["USB C Cable", "Charging Cable"],
    ["Braided", "Fast", "Right Angle", "Heavy Duty"],
    ["fast charging", "braided nylon", "high speed", "data sync", "durable"],
    [("length", ["3 ft", "6 ft", "10 ft"]), ("color", ["black", "white", "red"])],
    (5, 25),
    "charging and syncing devices",
  ),
  _t(
    "electronics",
    "bluetooth speaker",
    [
      "Electronics",
      "Portable Audio & Video",
      "Portable Speakers & Docks",
      "Portable Bluetooth Speakers",
    ],
    ["Bluetooth Speaker", "Portable Speaker"],
    ["Outdoor", "Mini", "Party", "Shower"],
    ["waterproof", "portable", "deep bass", "long battery life", "built in microphone"],
    [("color", ["black", "blue", "red", "camo"])],
    (20, 180),
    "music indoors and outdoors",
  ),
  _t(
    "electronics",
    "tv wall mount",
    [
      "Electronics",
      "Television & Video",
      "Accessories",
      "TV Mounts, Stands & Turntables",
      "TV Wall & Ceiling Mounts",
    ],
    ["TV Wall Mount", "TV Bracket"],
    ["Full Motion", "Low Profile", "Tilting", "Articulating"],
    ["heavy duty", "easy install", "full motion", "universal fit", "cable management"],
    [("size", ["32-55 inch", "42-70 inch", "55-85 inch"])],
    (20, 120),
    "mounting a television on a wall",
  ),
  _t(
    "electronics",
    "wireless mouse",
    [
      "Electronics",
      "Computers & Accessories",
      "Computer Accessories & Peripherals",
      "Keyboards, Mice & Accessories",
      "Mice",
    ],
    ["Wireless Mouse", "Optical Mouse"],
    ["Ergonomic", "Compact", "Vertical", "Gaming"],
    ["ergonomic design", "silent click", "usb receiver", "rechargeable battery", "plug and play"],
    [("color", ["black", "white", "gray", "pink"])],
    (8, 60),
    "working on a laptop or desktop",
  ),
  _t(
    "electronics",
    "power bank",
    ["Cell Phones & Accessories", "Chargers & Power Adapters", "Portable Power Banks"],
    ["Power Bank", "Portable Charger"],
    ["Slim", "Solar", "Magnetic", "High Capacity"],
    ["fast charging", "usb c", "compact size", "high capacity", "led display"],
    [("capacity", ["10000 mah", "26800 mah"]), ("color", ["black", "white", "blue"])],
    (15, 70),
    "charging phones on the go",
  ),
  # fashion
  _t(
    "fashion",
    "men's t-shirts",
    ["Clothing, Shoes & Jewelry", "Men", "Clothing", "Shirts", "T-Shirts"],
    ["T-Shirt", "Crew Neck Tee"],
    ["Classic", "Athletic", "Pocket", "Vintage"],
    [
      "machine wash",
      "cotton blend",
      "short sleeve",
      "regular fit",
      "moisture wicking",
      "classic fit",
    ],
    [("color", _COLORS), ("size", _APPAREL_SIZES)],
    (8, 35),
    "casual everyday wear",
  ),
  _t(
    "fashion",
    "women's dresses",
    ["Clothing, Shoes & Jewelry", "Women", "Clothing", "Dresses", "Casual"],
    ["Dress", "Midi Dress"],
    ["Floral", "Wrap", "Swing", "Boho"],
    ["hand wash", "polyester spandex", "v neck", "long sleeve", "loose fit", "summer"],
    [("color", ["floral print", "wine red", "black", "royal blue"]), ("size", _APPAREL_SIZES)],
    (18, 60),
    "summer outings and parties",
  ),
  _t(
    "fashion",
    "men's running shoes",
    ["Clothing, Shoes & Jewelry", "Men", "Shoes", "Athletic", "Running"],
    ["Running Shoes", "Sneakers"],
    ["Lightweight", "Trail", "Road", "Cushioned"],
    ["non slip", "rubber sole", "breathable mesh", "lightweight", "arch support"],
    [("color", ["black", "white", "gray", "navy blue"]), ("size", _SHOE_SIZES)],
    (30, 130),
    "running and walking",
  ),
  _t(
    "fashion",
    "women's ankle boots",
    ["Clothing, Shoes & Jewelry", "Women", "Shoes", "Boots", "Ankle & Bootie"],
    ["Ankle Boots", "Booties"],
    ["Chelsea", "Western", "Lace Up", "Suede"],
    ["faux leather", "side zipper", "block heel", "memory foam", "slip resistant"],
    [("color", ["black", "brown", "taupe"]), ("size", _SHOE_SIZES[:5])],
    (25, 90),
    "autumn and winter outfits",
  ),
  _t(
    "fashion",
    "baseball cap",
    ["Clothing, Shoes & Jewelry", "Men", "Accessories", "Hats & Caps", "Baseball Caps"],
    ["Baseball Cap", "Dad Hat"],
    ["Washed", "Trucker", "Classic", "Mesh"],
    ["adjustable strap", "cotton twill", "sun protection", "embroidered logo"],
    [("color", ["black", "khaki", "navy", "white"])],
    (7, 25),
    "sunny days outside",
  ),
  _t(
    "fashion",
    "laptop backpack",
    ["Clothing, Shoes & Jewelry", "Luggage & Travel Gear", "Backpacks", "Laptop Backpacks"],
    ["Laptop Backpack", "Travel Backpack"],
    ["Business", "College", "Slim", "Expandable"],
    ["water resistant", "laptop compartment", "usb charging port", "anti theft", "lightweight"],
    [("color", ["black", "gray", "navy blue", "green"])],
    (20, 80),
    "commuting and travel",
  ),
  _t(
    "fashion",
    "men's watch",
    ["Clothing, Shoes & Jewelry", "Men", "Watches", "Wrist Watches"],
    ["Analog Watch", "Wrist Watch"],
    ["Chronograph", "Minimalist", "Diver", "Dress"],
    ["stainless steel", "water resistant", "quartz movement", "leather band", "date display"],
    [("color", ["silver", "gold", "black"])],
    (25, 200),
    "formal and casual wear",
  ),
  _t(
    "fashion",
    "women's leggings",
    ["Clothing, Shoes & Jewelry", "Women", "Clothing", "Active", "Leggings"],
    ["Leggings", "Yoga Pants"],
    ["High Waisted", "Workout", "Fleece Lined", "Capri"],
    ["high waist", "tummy control", "squat proof", "moisture wicking", "four way stretch"],
    [("color", ["black", "charcoal", "navy", "burgundy"]), ("size", _APPAREL_SIZES[:4])],
    (12, 40),
    "yoga, running and lounging",
  ),
  # food
  _t(
    "food",
    "ground coffee",
    ["Grocery & Gourmet Food", "Beverages", "Coffee, Tea & Cocoa", "Coffee", "Ground Coffee"],
    ["Ground Coffee", "Coffee"],
    ["Colombian", "Breakfast Blend", "French Roast", "Espresso"],
    ["medium roast", "dark roast", "organic", "fair trade", "low acid", "single origin"],
    [("size", ["12 ounce", "2 pound", "5 pound"])],
    (7, 45),
    "brewing at home",
  ),
  _t(
    "food",
    "green tea",
    ["Grocery & Gourmet Food", "Beverages", "Coffee, Tea & Cocoa", "Tea", "Green"],
    ["Green Tea", "Tea Bags"],
    ["Japanese", "Sencha", "Loose Leaf", "Premium"],
    ["organic", "individually wrapped", "non gmo", "natural flavor", "antioxidant rich"],
    [("flavor", ["jasmine", "lemon ginger", "matcha", "original"])],
    (4, 30),
    "a calm afternoon cup",
  ),
  _t(
    "food",
    "protein bars",
    ["Grocery & Gourmet Food", "Snack Foods", "Bars", "Protein Bars"],
    ["Protein Bars", "Snack Bars"],
    ["Whey", "Plant Protein", "Crunchy", "Chewy"],
    ["gluten free", "high protein", "low sugar", "keto friendly", "plant based"],
    [
      ("flavor", ["chocolate chip", "peanut butter", "cookie dough", "salted caramel"]),
      ("size", ["12 count", "24 count"]),
    ],
    (12, 50),
    "snacking after workouts",
  ),
  _t(
    "food",
    "extra virgin olive oil",
    [
      "Grocery & Gourmet Food",
      "Pantry Staples",
      "Cooking & Baking",
      "Oils, Vinegars & Salad Dressings",
      "Oils",
    ],
    ["Extra Virgin Olive Oil", "Olive Oil"],
    ["Italian", "Greek", "Spanish", "First Cold Pressed"],
    ["cold pressed", "non gmo", "organic", "kosher"],
    [("size", ["16.9 fl oz", "25.3 fl oz", "101 fl oz"])],
    (9, 55),
    "cooking and salad dressings",
  ),
  _t(
    "food",
    "dried mango",
    ["Grocery & Gourmet Food", "Snack Foods", "Dried Fruit & Raisins", "Mangoes"],
    ["Dried Mango Slices", "Dried Mango"],
    ["Philippine", "Organic", "Chewy", "Thick Cut"],
    ["no sugar added", "resealable bag", "vegan", "gluten free"],
    [("size", ["8 ounce", "16 ounce", "32 ounce"])],
    (6, 30),
    "a healthy snack",
  ),
  _t(
    "food",
    "seasoning blend",
    [
      "Grocery & Gourmet Food",
      "Pantry Staples",
      "Herbs, Spices & Seasonings",
      "Mixed Spices & Seasonings",
    ],
    ["Seasoning Blend", "Spice Mix"],
    ["Cajun", "Italian", "Taco", "Everything Bagel"],
    ["salt free", "non gmo", "kosher", "gluten free"],
    [("size", ["2.5 ounce", "6 ounce", "12 ounce"])],
    (4, 20),
    "grilling and roasting",
  ),
  _t(
    "food",
    "sparkling water",
    [
      "Grocery & Gourmet Food",
      "Beverages",
      "Bottled Beverages, Water & Drink Mixes",
      "Water",
      "Sparkling Water",
    ],
    ["Sparkling Water", "Seltzer Water"],
    ["Flavored", "Mineral", "Craft", "Classic"],
    ["zero calories", "sugar free", "natural flavor", "bpa free"],
    [("flavor", ["lime", "grapefruit", "black cherry", "mango"]), ("size", ["12 pack", "24 pack"])],
    (6, 30),
    "refreshing drinks",
  ),
  # furniture
  _t(
    "furniture",
    "office chair",
    [
      "Home & Kitchen",
      "Furniture",
      "Home Office Furniture",
      "Home Office Chairs",
      "Home Office Desk Chairs",
    ],
    ["Office Chair", "Desk Chair"],
    ["Ergonomic", "Executive", "Mid Back", "Mesh"],
    [
      "lumbar support",
      "adjustable height",
      "easy assemble",
      "breathable mesh",
      "swivel",
      "heavy duty",
    ],
    [("color", ["black", "gray", "white", "blue"])],
    (60, 280),
    "long hours at a desk",
  ),
  _t(
    "furniture",
    "bookshelf",
    ["Home & Kitchen", "Furniture", "Living Room Furniture", "Bookcases"],
    ["Bookshelf", "Bookcase"],
    ["5 Tier", "Ladder", "Industrial", "Corner"],
    ["easy assemble", "engineered wood", "storage space", "space saving", "metal frame"],
    [("color", ["white", "black", "espresso", "walnut"])],
    (35, 180),
    "books and decor",
  ),
  _t(
    "furniture",
    "throw pillow covers",
    ["Home & Kitchen", "Bedding", "Decorative Pillows, Inserts & Covers", "Throw Pillow Covers"],
    ["Throw Pillow Covers", "Cushion Covers"],
    ["Velvet", "Linen", "Boho", "Farmhouse"],
    ["double sided", "hidden zipper", "machine washable", "living room"],
    [
      ("size", ["18 x 18 inch", "20 x 20 inch", "24 x 24 inch"]),
      ("color", ["cream", "sage green", "navy", "mustard"]),
    ],
    (8, 30),
    "sofas and beds",
  ),
  _t(
    "furniture",
    "area rug",
    ["Home & Kitchen", "Home Décor Products", "Area Rugs, Runners & Pads", "Area Rugs"],
    ["Area Rug", "Rug"],
    ["Shag", "Moroccan", "Vintage", "Washable"],
    ["non slip", "easy clean", "living room", "stain resistant", "low pile"],
    [
      ("size", ["3 x 5 ft", "5 x 7 ft", "8 x 10 ft"]),
      ("color", ["gray", "beige", "blue", "multicolor"]),
    ],
    (25, 250),
    "living rooms and bedrooms",
  ),
  _t(
    "furniture",
    "blackout curtains",
    ["Home & Kitchen", "Home Décor Products", "Window Treatments", "Curtains & Drapes", "Panels"],
    ["Blackout Curtains", "Curtain Panels"],
    ["Thermal", "Grommet", "Velvet", "Linen Look"],
    ["blackout", "thermal insulated", "noise reducing", "grommet top", "machine washable"],
    [
      ("size", ["52 x 63 inch", "52 x 84 inch", "52 x 95 inch"]),
      ("color", ["gray", "navy", "white", "teal"]),
    ],
    (15, 60),
    "bedrooms and nurseries",
  ),
  _t(
    "furniture",
    "led desk lamp",
    ["Tools & Home Improvement", "Lighting & Ceiling Fans", "Lamps & Shades", "Desk Lamps"],
    ["LED Desk Lamp", "Table Lamp"],
    ["Dimmable", "Architect", "Clamp", "Foldable"],
    ["dimmable", "usb charging port", "eye caring", "touch control", "adjustable arm"],
    [("color", ["black", "white", "silver"])],
    (15, 70),
    "reading and studying",
  ),
  _t(
    "furniture",
    "storage ottoman",
    ["Home & Kitchen", "Furniture", "Living Room Furniture", "Ottomans"],
    ["Storage Ottoman", "Ottoman Bench"],
    ["Folding", "Tufted", "Round", "Cube"],
    ["faux leather", "storage space", "foldable", "living room", "padded seat"],
    [("color", ["brown", "gray", "black", "beige"])],
    (25, 120),
    "extra seating and storage",
  ),
  _t(
    "furniture",
    "nightstand",
    ["Home & Kitchen", "Furniture", "Bedroom Furniture", "Nightstands"],
    ["Nightstand", "Bedside Table"],
    ["Modern", "Rustic", "Floating", "Mid Century"],
    ["easy assemble", "storage drawer", "solid wood", "bedroom", "charging station"],
    [("color", ["white", "black", "walnut", "oak"])],
    (30, 160),
    "the bedside",
  ),
)

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
