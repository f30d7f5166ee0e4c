"""Fuzzy string scores with the semantics of thefuzz 0.19 (the version WebShop's reward pins).

thefuzz 0.19 without python-Levenshtein (no WebShop requirements file lists it) scores with
`difflib.SequenceMatcher`. Its `token_set_ratio(a, b)`:

1. pre-processes each side (`full_process`): a non-string is turned into `str(value)` (so a tuple
   ``('size', 'large')`` becomes ``"('size', 'large')"``), the characters U+0080..U+00FF are
   dropped (``force_ascii``; other non-ASCII characters stay), every non-word character becomes a
   space, the text is lower-cased and stripped; an empty result scores 0;
2. splits both into token sets and builds ``I`` = the sorted intersection, ``A`` = I + the sorted
   tokens only in the first, ``B`` = I + the sorted tokens only in the second (space-joined,
   stripped);
3. returns max(ratio(I, A), ratio(I, B), ratio(A, B)) where ratio(x, y) is 100 when x == y, 0 when
   either is empty, else ``int(round(100 * SequenceMatcher(None, x, y).ratio()))``.

rapidfuzz's `token_set_ratio` is not a drop-in replacement: it scores with the Indel (LCS)
distance, which differs from difflib's greedy matching blocks ("non pack medium" vs "pack ounce
medium": 85 here, 87.5 in rapidfuzz, on opposite sides of WebShop's > 85 threshold), it keeps
U+0080..U+00FF ("Café" vs "cafe": 86 here, 75 in rapidfuzz) and it does not round. We therefore
implement the algorithm above directly.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

__all__ = ["full_process", "ratio", "token_set_ratio"]

_LATIN1_UPPER_HALF = {code: None for code in range(128, 256)}
_NON_WORD = re.compile(r"(?ui)\W")


def full_process(value: Any) -> str:
  """thefuzz's force_ascii pre-processing: str(), drop U+0080..U+00FF, \\W -> " ", lower, strip."""
  text = value if isinstance(value, str) else str(value)
  text = text.translate(_LATIN1_UPPER_HALF)
  return _NON_WORD.sub(" ", text).lower().strip()


def ratio(first: str, second: str) -> int:
  """difflib similarity as a rounded percentage (100 when equal, 0 when one is empty)."""
  if first == second:
    return 100
  if not first or not second:
    return 0
  return round(100 * difflib.SequenceMatcher(None, first, second).ratio())


def token_set_ratio(first: Any, second: Any) -> int:
  """thefuzz 0.19 `fuzz.token_set_ratio(first, second)` (force_ascii and full_process on)."""
  if first is None or second is None:
    return 0
  processed_first, processed_second = full_process(first), full_process(second)
  if not processed_first or not processed_second:
    return 0
  tokens_first, tokens_second = set(processed_first.split()), set(processed_second.split())
  common = " ".join(sorted(tokens_first & tokens_second))
  only_first = " ".join(sorted(tokens_first - tokens_second))
  only_second = " ".join(sorted(tokens_second - tokens_first))
  combined_first = f"{common} {only_first}".strip()
  combined_second = f"{common} {only_second}".strip()
  common = common.strip()
  return max(
    ratio(common, combined_first),
    ratio(common, combined_second),
    ratio(combined_first, combined_second),
  )
