"""Catalogue search: BM25 (bm25s) over the products, standing in for the original's Lucene index.

Each product is indexed as the original's index document: the lower-cased
"Title Description BulletPoints[0] option_text" with option_text = ", and ".join("name: v1, v2").
Text is analysed like Lucene's English analyzer: word tokens (letters/digits, "3.5" and "men's"
kept whole), the possessive "'s" removed, Lucene's 33 English stop words removed, Porter stems
(`envs.webshop.porter`). Scores are BM25 with pyserini's defaults k1 = 0.9, b = 0.4 (Lucene's
formula); a search returns the best `SEARCH_RETURN_N` = 50 products with a positive score, ties in
catalogue order.

Keywords starting with the original's special tokens bypass BM25: "<r>" (50 random products),
"<a> attribute" (products with that attribute), "<c> category" (that category), "<q> query" (that
query).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from envs.common import import_bm25s
from envs.webshop.porter import stem

__all__ = [
  "LUCENE_STOPWORDS",
  "SEARCH_RETURN_N",
  "SearchEngine",
  "analyze",
  "index_text",
  "top_n_products",
]

SEARCH_RETURN_N = 50
BM25_K1, BM25_B = 0.9, 0.4  # pyserini's defaults
LUCENE_STOPWORDS = frozenset((
  "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
  "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they",
  "this", "to", "was", "will", "with",
))  # fmt: skip
_TOKEN = re.compile(r"\w+(?:[.'’]\w+)*")
_POSSESSIVE = re.compile(r"['’]s$")


def analyze(text: str) -> list[str]:
  """Index terms of `text`: lower-cased word tokens, no possessive 's, no stop words, stemmed."""
  terms = []
  for token in _TOKEN.findall(text.lower()):
    token = _POSSESSIVE.sub("", token)
    if token and token not in LUCENE_STOPWORDS:
      terms.append(stem(token))
  return terms


def index_text(product: Mapping[str, Any]) -> str:
  """The original's index document text of a cleaned product."""
  option_text = ", and ".join(
    f"{name}: {', '.join(values)}" for name, values in product.get("options", {}).items()
  )
  bullets = product.get("BulletPoints") or [""]
  parts = [product.get("Title"), product.get("Description"), bullets[0], option_text]
  return " ".join(str(part) if part is not None else "" for part in parts).lower()


class SearchEngine:
  """BM25 over a product list; `search(text)` returns asins, best first.

  Args:
    products: cleaned products (the index is over them, in this order).
    cache_dir: a folder for the index: loaded from there when the catalogue's text is unchanged,
      else built and saved (worth it for the 1.18M-product file, which takes long to index).
  """

  def __init__(self, products: Sequence[Mapping[str, Any]], cache_dir: str | None = None):
    self.asins = [p["asin"] for p in products]
    texts = [index_text(p) for p in products]
    self._bm25 = self._load_or_build(texts, cache_dir)
    self._vocab = self._bm25.vocab_dict

  @staticmethod
  def _load_or_build(texts: list[str], cache_dir: str | None) -> Any:
    bm25s = import_bm25s()
    folder = None
    if cache_dir:
      digest = hashlib.sha1()
      for text in texts:
        digest.update(text.encode())
        digest.update(b"\0")
      digest = digest.hexdigest()[:16]
      folder = os.path.join(os.path.expanduser(cache_dir), f"webshop-bm25s-{digest}")
      if os.path.isfile(os.path.join(folder, "params.index.json")):
        return bm25s.BM25.load(folder, show_progress=False)
    retriever = bm25s.BM25(k1=BM25_K1, b=BM25_B, method="lucene")
    retriever.index([analyze(t) for t in texts], show_progress=False)
    if folder:
      tmp = f"{folder}.tmp{os.getpid()}"
      retriever.save(tmp, show_progress=False)
      try:
        os.replace(tmp, folder)
      except OSError:  # another process saved the same index first
        pass
    return retriever

  def search(self, text: str, k: int = SEARCH_RETURN_N) -> list[str]:
    """The asins of the (at most) `k` best products with a positive BM25 score for `text`."""
    terms = [t for t in analyze(text) if t in self._vocab]
    if not terms:
      return []
    scores = self._bm25.get_scores(terms)
    positive = np.flatnonzero(scores > 0)
    if positive.size > k:  # keep the k best, then order them (ties by catalogue position)
      kth = np.partition(scores[positive], positive.size - k)[positive.size - k]
      positive = positive[scores[positive] >= kth]
    order = np.lexsort((positive, -scores[positive]))[:k]
    return [self.asins[i] for i in positive[order]]


def top_n_products(
  keywords: Sequence[str],
  catalogue: Any,
  rng: random.Random,
  k: int = SEARCH_RETURN_N,
) -> list[dict[str, Any]]:
  """Products for the search keywords (the action's lower-cased text split on single spaces)."""
  products = catalogue.products
  head = keywords[0] if keywords else ""
  if head == "<r>":
    return rng.sample(products, k=min(k, len(products)))
  if head == "<a>":
    asins = catalogue.attribute_to_asins.get(" ".join(keywords[1:]).strip(), set())
    return [p for p in products if p["asin"] in asins]
  if head == "<c>":
    category = keywords[1].strip() if len(keywords) > 1 else ""
    return [p for p in products if p["category"] == category]
  if head == "<q>":
    query = " ".join(keywords[1:]).strip()
    return [p for p in products if p["query"] == query]
  asins = catalogue.search_engine.search(" ".join(keywords), k=k)
  return [catalogue.product_item_dict[a] for a in asins if a in catalogue.product_item_dict]
