"""Noun extraction for WebShop's title score: spaCy's en_core_web_sm when installed, else a rule.

The reward's title score compares the nouns of the purchased product's name with those of the
goal's name. The original tags both with spaCy's `en_core_web_sm` and
keeps the tokens whose part of speech is NOUN, PROPN (or the never-produced PNOUN), lower-cased,
duplicates kept. That model is not a PyPI package; when a user has installed it, `"spacy"` (and
`"auto"`) use it exactly so. Without it, `"auto"` falls back to `rule_based_nouns`:

    every maximal run of ASCII letters and digits in the lower-cased text that has at least two
    characters, contains a letter, and is not an English function word (`FUNCTION_WORDS`:
    articles, pronouns, prepositions, conjunctions, auxiliary and modal verbs, and a few
    adverbs and quantifiers), in order, duplicates kept.

In product titles ("Herbal Essences Tea Tree Shampoo for Dry Hair, 12 Fl Oz") spaCy tags most
capitalised content words NOUN or PROPN, so the rule keeps content words and drops numbers and
function words; it counts adjectives and verbs as nouns where spaCy may not, and splits "men's"
into "men" + "s" (dropped) as spaCy splits off "'s". Title scores that depend on such words can
therefore differ from the original's (they already differ between spaCy model versions).

A noun extractor is any callable `text -> list[str]`; `resolve_noun_extractor` turns the names
"auto", "spacy", "rule_based" (or a callable, or None = "auto") into one.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Callable

__all__ = [
  "FUNCTION_WORDS",
  "NOUN_EXTRACTORS",
  "NounExtractor",
  "resolve_noun_extractor",
  "rule_based_nouns",
  "spacy_noun_extractor",
]

NounExtractor = Callable[[str], list[str]]
NOUN_EXTRACTORS = ("auto", "spacy", "rule_based")
SPACY_MODEL = "en_core_web_sm"
_SPACY_NOUN_TAGS = ("PNOUN", "NOUN", "PROPN")
_WORD = re.compile(r"[a-z0-9]+")
_LETTER = re.compile(r"[a-z]")

FUNCTION_WORDS = frozenset((
  "a", "an", "the", "this", "that", "these", "those", "each", "every", "either", "neither",
  "some", "any", "no", "all", "both", "another", "such", "i", "me", "my", "mine", "we", "us",
  "our", "ours", "you", "your", "yours", "he", "him", "his", "she", "her", "hers", "it", "its",
  "they", "them", "their", "theirs", "who", "whom", "whose", "which", "what", "whatever",
  "whoever", "one", "ones", "about", "above", "across", "after", "against", "along", "amid",
  "among", "around", "as", "at", "before", "behind", "below", "beneath", "beside", "besides",
  "between", "beyond", "by", "despite", "down", "during", "except", "for", "from", "in", "inside",
  "into", "like", "near", "of", "off", "on", "onto", "out", "outside", "over", "past", "per",
  "since", "than", "through", "throughout", "till", "to", "toward", "towards", "under",
  "underneath", "unlike", "until", "up", "upon", "via", "with", "within", "without", "and", "but",
  "or", "nor", "so", "yet", "if", "then", "else", "because", "although", "though", "while",
  "whereas", "unless", "whether", "be", "am", "is", "are", "was", "were", "been", "being", "have",
  "has", "had", "having", "do", "does", "did", "doing", "done", "can", "could", "may", "might",
  "must", "shall", "should", "will", "would", "not", "very", "too", "also", "just", "only",
  "even", "still", "again", "ever", "never", "more", "most", "less", "least", "much", "many",
  "few", "here", "there", "where", "when", "why", "how", "now",
))  # fmt: skip


def rule_based_nouns(text: str) -> list[str]:
  """The documented fallback: lower-cased content words of `text`, in order, duplicates kept."""
  return [
    word
    for word in _WORD.findall(text.lower())
    if len(word) >= 2 and _LETTER.search(word) and word not in FUNCTION_WORDS
  ]


@functools.cache
def _load_spacy(model: str):
  import spacy

  return spacy.load(model)


def spacy_noun_extractor(model: str = SPACY_MODEL) -> NounExtractor:
  """The original's extractor: tokens tagged NOUN/PROPN/PNOUN by spaCy `model`, lower-cased.

  Raises OSError/ImportError with the install hint when spaCy or the model is missing.
  """
  try:
    nlp = _load_spacy(model)
  except (ImportError, OSError) as e:
    raise type(e)(
      f"spaCy model {model!r} is not available ({e}). Install spaCy and the official model "
      f"(python -m spacy download {model}) or use noun_extractor='rule_based'."
    ) from e

  def extract(text: str) -> list[str]:
    return [token.text.lower() for token in nlp(text) if token.pos_ in _SPACY_NOUN_TAGS]

  return extract


@functools.cache
def _auto() -> NounExtractor:
  # The official model installs as the package en_core_web_sm; without it, do not import spaCy.
  if importlib.util.find_spec(SPACY_MODEL) is None:
    return rule_based_nouns
  try:
    return spacy_noun_extractor()
  except (ImportError, OSError):
    return rule_based_nouns


def resolve_noun_extractor(choice: str | NounExtractor | None = None) -> NounExtractor:
  """A noun extractor from a name in NOUN_EXTRACTORS, a callable, or None ("auto")."""
  if callable(choice):
    return choice
  if choice is None or choice == "auto":
    return _auto()
  if choice == "spacy":
    return spacy_noun_extractor()
  if choice == "rule_based":
    return rule_based_nouns
  raise ValueError(
    f"unknown noun_extractor {choice!r}; use one of {NOUN_EXTRACTORS} or a callable text -> nouns"
  )
