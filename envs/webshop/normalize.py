"""Colour normalisation of option values, as WebShop's reward applies it before fuzzy matching.

`normalize_color(value)` returns the first word of `COLOR_SET` (in list order) that `value`
contains, else `value` unchanged. "Contains" is Python's `in`: a substring test on strings, so
"navy blue" -> "blue" ("blue" precedes "navy"), "rectangular" -> "tan", "fashion black" -> "ash",
"dark grey" -> "dark"; and a membership test on tuples, so ("color", "black") -> "black" while
("shape", "rectangular") stays a tuple.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COLOR_SET", "normalize_color"]

COLOR_SET = (
  "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue",
  "blush", "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne",
  "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper",
  "coral", "cranberry", "cream", "crystal", "dark", "denim", "eggplant", "elephant", "espresso",
  "fuchsia", "gold", "granite", "grape", "graphite", "grass", "gray", "green", "grey", "heather",
  "indigo", "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac", "lime",
  "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha", "multicolor", "mushroom",
  "mustard", "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink", "plum",
  "purple", "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver",
  "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal", "tiger",
  "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)  # fmt: skip


def normalize_color(value: Any) -> Any:
  """The first COLOR_SET word in `value` (str: substring, tuple: membership), else `value`."""
  for color in COLOR_SET:
    if color in value:
      return color
  return value
