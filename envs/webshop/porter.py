"""The Porter stemmer (M. F. Porter, 1980), as in Lucene's PorterStemFilter, for the search index.

The original WebShop search is a Lucene index built by pyserini with its default English analyzer
(Porter stemming). No stemming package is installed here, so this module implements Porter's
algorithm itself, in the variant of Porter's reference C implementation that Lucene ports: step 2
maps "bli" -> "ble" (not "abli" -> "able") and adds "logi" -> "log", and words of one or two
letters are left unchanged. `stem` works on lower-case ASCII words; other words pass through.
"""

from __future__ import annotations

import functools

__all__ = ["stem"]

_VOWELS = frozenset("aeiou")

_STEP2 = {
  "a": (("ational", "ate"), ("tional", "tion")),
  "c": (("enci", "ence"), ("anci", "ance")),
  "e": (("izer", "ize"),),
  "l": (("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous")),
  "o": (("ization", "ize"), ("ation", "ate"), ("ator", "ate")),
  "s": (("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous")),
  "t": (("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")),
  "g": (("logi", "log"),),
}
_STEP3 = {
  "e": (("icate", "ic"), ("ative", ""), ("alize", "al")),
  "i": (("iciti", "ic"),),
  "l": (("ical", "ic"), ("ful", "")),
  "s": (("ness", ""),),
}
_STEP4 = {
  "a": ("al",),
  "c": ("ance", "ence"),
  "e": ("er",),
  "i": ("ic",),
  "l": ("able", "ible"),
  "n": ("ant", "ement", "ment", "ent"),
  "o": ("ion", "ou"),
  "s": ("ism",),
  "t": ("ate", "iti"),
  "u": ("ous",),
  "v": ("ive",),
  "z": ("ize",),
}


def _is_consonant(word: str, i: int) -> bool:
  letter = word[i]
  if letter in _VOWELS:
    return False
  if letter == "y":
    return i == 0 or not _is_consonant(word, i - 1)
  return True


def _measure(stem_part: str) -> int:
  """m in [C](VC)^m[V]: the number of vowel-consonant sequences."""
  count, previous_vowel = 0, False
  for i in range(len(stem_part)):
    consonant = _is_consonant(stem_part, i)
    if consonant and previous_vowel:
      count += 1
    previous_vowel = not consonant
  return count


def _has_vowel(stem_part: str) -> bool:
  return any(not _is_consonant(stem_part, i) for i in range(len(stem_part)))


def _ends_double_consonant(word: str) -> bool:
  return len(word) >= 2 and word[-1] == word[-2] and _is_consonant(word, len(word) - 1)


def _ends_cvc(word: str) -> bool:
  """consonant-vowel-consonant at the end, the last not w, x or y."""
  n = len(word)
  return (
    n >= 3
    and _is_consonant(word, n - 1)
    and not _is_consonant(word, n - 2)
    and _is_consonant(word, n - 3)
    and word[-1] not in "wxy"
  )


def _step1ab(word: str) -> str:
  if word.endswith("s"):
    if word.endswith(("sses", "ies")):  # sses -> ss, ies -> i
      word = word[:-2]
    elif len(word) >= 2 and word[-2] != "s":
      word = word[:-1]
  if word.endswith("eed"):
    if _measure(word[:-3]) > 0:
      word = word[:-1]
    return word
  for suffix in ("ed", "ing"):
    if word.endswith(suffix) and _has_vowel(word[: -len(suffix)]):
      word = word[: -len(suffix)]
      if word.endswith(("at", "bl", "iz")):
        return word + "e"
      if _ends_double_consonant(word):
        return word if word[-1] in "lsz" else word[:-1]
      if _measure(word) == 1 and _ends_cvc(word):
        return word + "e"
      return word
  return word


def _step1c(word: str) -> str:
  if word.endswith("y") and _has_vowel(word[:-1]):
    return word[:-1] + "i"
  return word


def _replace_first_suffix(word: str, rules: tuple[tuple[str, str], ...]) -> str:
  """The first rule whose suffix ends `word` decides: replaced when the stem's measure is > 0."""
  for suffix, replacement in rules:
    if word.endswith(suffix):
      stem_part = word[: -len(suffix)]
      return stem_part + replacement if _measure(stem_part) > 0 else word
  return word


def _step4(word: str) -> str:
  if len(word) < 2:
    return word
  for suffix in _STEP4.get(word[-2], ()):
    if not word.endswith(suffix):
      continue
    stem_part = word[: -len(suffix)]
    if suffix == "ion" and not (stem_part and stem_part[-1] in "st"):
      continue
    return stem_part if _measure(stem_part) > 1 else word
  return word


def _step5(word: str) -> str:
  if word.endswith("e"):
    measure = _measure(word[:-1])
    if measure > 1 or (measure == 1 and not _ends_cvc(word[:-1])):
      word = word[:-1]
  if word.endswith("ll") and _measure(word) > 1:
    word = word[:-1]
  return word


@functools.cache
def stem(word: str) -> str:
  """The Porter stem of a lower-case word (words of <= 2 letters and non-letter words unchanged)."""
  if len(word) <= 2 or not word.isascii() or not word.isalpha():
    return word
  word = _step1c(_step1ab(word))
  if len(word) >= 2:
    word = _replace_first_suffix(word, _STEP2.get(word[-2], ()))
  if word:
    word = _replace_first_suffix(word, _STEP3.get(word[-1], ()))
  return _step5(_step4(word))
