"""Offline Search-QA data: a generated world of linked facts, its corpus, and questions over it.

The world has countries, cities, universities, people, companies, films and novels with fictional
names (so no model knows the answers without searching). Each entity has attributes (years,
genres, occupations, ...) and relations to other entities (a film's director, a person's
birthplace, a city's country, ...). Each entity is written as one wiki-18 style passage
('"Name"\\ntext') that states its own attributes and outgoing relations only: a person's passage
does not list the films they directed, so a question that starts at a film must find the film's
passage before it can name the person.

Questions, labelled like the Search-R1 data sets:
- single hop (one search): "nq" (lower-case, NQ style), "triviaqa" (trivia phrasing, some asked
  from attributes to the entity), "popqa" (PopQA's attribute templates);
- multi hop: "hotpotqa" (bridge questions and comparisons, incl. yes/no), "2wikimultihopqa"
  (compositional and comparison), "musique" (2-3 hop compositions), "bamboogle" (2-3 hops).
Every question carries its oracle chain (metadata "hops": a search query per hop, the passage
title it must retrieve and the text that passage must show: the next bridge entity or the
answer); at most 3 hops, so an oracle answers within 4 turns. A question is kept only when each
hop's query retrieves its passage among the top 3 under the package's BM25, so every answer is
supported by retrievable passages.

Everything is deterministic from the seed and takes about a second.

    python -m envs.search_qa.generator --out data/search_qa --seed 0
writes corpus.jsonl (wiki-18 format), train.parquet and test.parquet (Search-R1 layout), which
`envs.make("search_qa", data_dir="data/search_qa")` reads like the real files.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
from collections.abc import Callable, Sequence
from typing import Any

from envs.errors import add_verbosity_argument, exit_on_env_error
from envs.search_qa.data import DATA_SOURCES, QARecord, write_parquet
from envs.search_qa.retrieval import BM25Retriever
from envs.search_qa.world import Entity, World, WorldSpec, build_world

__all__ = [
  "GENERATOR_VERSION",
  "Entity",
  "Hop",
  "OfflineData",
  "Question",
  "World",
  "WorldSpec",
  "generate",
  "offline_data",
  "write_dataset",
]

GENERATOR_VERSION = 1
TOPK = 3


@dataclasses.dataclass(frozen=True)
class Hop:
  query: str  # the search an oracle issues
  title: str  # the entity whose passage answers it
  reveals: str  # text that passage shows: the next bridge entity, or the answer


@dataclasses.dataclass(frozen=True)
class Question:
  question: str
  answers: tuple[str, ...]
  data_source: str
  kind: str  # "single", "bridge" or "comparison"
  hops: tuple[Hop, ...]

  def record(self, record_id: str) -> QARecord:
    metadata = {
      "kind": self.kind,
      "hops": [dataclasses.asdict(h) for h in self.hops],
      "generator_version": GENERATOR_VERSION,
    }
    return QARecord(self.question, self.answers, self.data_source, record_id, metadata)


# ---------------------------------------------------------------------------------- questions
# The word an oracle adds to an entity's name to look up a relation or attribute of it.
_KEYWORD = {
  ("film", "director"): "director",
  ("film", "year"): "film",
  ("film", "genre"): "film",
  ("book", "author"): "author",
  ("book", "year"): "novel",
  ("company", "founder"): "founded",
  ("company", "headquarters"): "headquarters",
  ("company", "year"): "founded",
  ("person", "birthplace"): "born",
  ("person", "year"): "born",
  ("person", "occupation"): "born",
  ("person", "university"): "studied",
  ("city", "country"): "city",
  ("city", "river"): "river",
  ("country", "capital"): "capital",
  ("country", "language"): "language",
  ("country", "currency"): "currency",
  ("university", "year"): "founded",
}


def _chain(world: World, start: Entity, path: Sequence[str]) -> tuple[str, tuple[Hop, ...]]:
  """Follows relations `path[:-1]` from `start`, then reads attribute (or relation) `path[-1]`.

  Returns the answer and one hop per step: search "<entity name> <keyword>", retrieve that
  entity's passage, read the next entity's name (or the answer) from it.
  """
  hops, entity = [], start
  for i, step in enumerate(path):
    query = f"{entity.name} {_KEYWORD[(entity.kind, step)]}"
    if step in entity.links:
      nxt = world.link(entity, step)
      hops.append(Hop(query, entity.name, nxt.name))
      entity = nxt
    else:
      if i != len(path) - 1:
        raise ValueError(f"{step!r} is an attribute of {entity.kind}, it must end the path {path}")
      hops.append(Hop(query, entity.name, entity.facts[step]))
      return entity.facts[step], tuple(hops)
  return entity.name, tuple(hops)


def _single(world: World, source: str, entity: Entity, relation: str, text: str) -> Question:
  answer, hops = _chain(world, entity, [relation])
  question = text.lower() if source == "nq" else text
  return Question(question, (answer,), source, "single", (Hop(question, hops[0].title, answer),))


def _bridge(world: World, source: str, entity: Entity, path: Sequence[str], text: str) -> Question:
  answer, hops = _chain(world, entity, path)
  return Question(text, (answer,), source, "bridge", hops)


def _single_hop(world: World) -> list[Question]:
  out: list[Question] = []
  people, films, books = world.of_kind("person"), world.of_kind("film"), world.of_kind("book")
  companies, countries = world.of_kind("company"), world.of_kind("country")
  cities, universities = world.of_kind("city"), world.of_kind("university")

  def add(source: str, entities: Sequence[Entity], relation: str, text: Callable[[Entity], str]):
    out.extend(_single(world, source, e, relation, text(e)) for e in entities)

  add("nq", companies, "founder", lambda e: f"who founded {e.name}?")
  add("nq", companies, "year", lambda e: f"when was {e.name} founded?")
  add("nq", films, "director", lambda e: f"who directed the film {e.name}?")
  add("nq", books, "author", lambda e: f"who wrote the novel {e.name}?")
  add("nq", countries, "capital", lambda e: f"what is the capital of {e.name}?")
  add("nq", companies, "headquarters", lambda e: f"where is the headquarters of {e.name}?")
  add("nq", countries, "currency", lambda e: f"what is the currency of {e.name}?")
  add("nq", universities, "year", lambda e: f"when was {e.name} founded?")

  add("triviaqa", books, "author", lambda e: f"The novel {e.name} was written by which author?")
  add("triviaqa", films, "year", lambda e: f"In which year was the film {e.name} released?")
  add(
    "triviaqa", companies, "headquarters", lambda e: f"{e.name} has its headquarters in which city?"
  )
  add("triviaqa", countries, "language", lambda e: f"What is the official language of {e.name}?")
  add("triviaqa", cities, "river", lambda e: f"Which river flows through the city of {e.name}?")
  # Asked from attributes to the person: kept only where the attributes single one person out.
  signature: dict[tuple[str, str, str], list[Entity]] = {}
  for p in people:
    key = (p.facts["occupation"], world.link(p, "birthplace").name, p.facts["year"])
    signature.setdefault(key, []).append(p)
  for (occupation, city, year), matches in signature.items():
    if len(matches) == 1:
      text = f"Which {occupation} was born in {city} in {year}?"
      hop = Hop(text, matches[0].name, matches[0].name)
      out.append(Question(text, (matches[0].name,), "triviaqa", "single", (hop,)))

  add("popqa", people, "occupation", lambda e: f"What is {e.name}'s occupation?")
  add("popqa", people, "birthplace", lambda e: f"In what city was {e.name} born?")
  add("popqa", films, "director", lambda e: f"Who was the director of {e.name}?")
  add("popqa", books, "author", lambda e: f"Who is the author of {e.name}?")
  add("popqa", films, "genre", lambda e: f"What genre is {e.name}?")
  add("popqa", cities, "country", lambda e: f"In what country is {e.name}?")
  add("popqa", countries, "capital", lambda e: f"What is the capital of {e.name}?")
  return out


def _multi_hop(world: World) -> list[Question]:
  out: list[Question] = []
  people, films, books = world.of_kind("person"), world.of_kind("film"), world.of_kind("book")
  companies, cities = world.of_kind("company"), world.of_kind("city")
  # A capital's name is in its country's passage: asked about from the city, that is one hop.
  capitals = {world.link(c, "capital").key for c in world.of_kind("country")}
  non_capitals = [c for c in cities if c.key not in capitals]

  def add(
    source: str, entities: Sequence[Entity], path: Sequence[str], text: Callable[[Entity], str]
  ):
    out.extend(_bridge(world, source, e, path, text(e)) for e in entities)

  add(
    "hotpotqa",
    films,
    ["director", "birthplace"],
    lambda e: f"In which city was the director of the film {e.name} born?",
  )
  add(
    "hotpotqa",
    people,
    ["university", "year"],
    lambda e: f"In what year was the university attended by {e.name} founded?",
  )
  add(
    "hotpotqa",
    books,
    ["author", "birthplace"],
    lambda e: f"The author of {e.name} was born in which city?",
  )
  add(
    "hotpotqa",
    companies,
    ["founder", "occupation"],
    lambda e: f"What is the occupation of the founder of {e.name}?",
  )
  add(
    "hotpotqa",
    companies,
    ["headquarters", "country"],
    lambda e: f"{e.name} is headquartered in a city of which country?",
  )

  add(
    "2wikimultihopqa",
    films,
    ["director", "birthplace"],
    lambda e: f"Where was the director of film {e.name} born?",
  )
  add(
    "2wikimultihopqa",
    films,
    ["director", "year"],
    lambda e: f"When was the director of film {e.name} born?",
  )
  add(
    "2wikimultihopqa",
    books,
    ["author", "birthplace", "country"],
    lambda e: f"Which country was the author of {e.name} born in?",
  )

  add(
    "musique",
    companies,
    ["founder", "birthplace", "country"],
    lambda e: f"In which country was the founder of {e.name} born?",
  )
  add(
    "musique",
    non_capitals,
    ["country", "capital"],
    lambda e: f"What is the capital of the country where {e.name} is located?",
  )
  add(
    "musique",
    companies,
    ["headquarters", "country", "currency"],
    lambda e: f"What currency is used in the country where {e.name} has its headquarters?",
  )
  add(
    "musique",
    books,
    ["author", "birthplace", "river"],
    lambda e: f"What river runs through the birthplace of the author of {e.name}?",
  )

  add(
    "bamboogle",
    companies,
    ["headquarters", "river"],
    lambda e: f"What river flows through the city where {e.name} is headquartered?",
  )
  add(
    "bamboogle",
    companies,
    ["founder", "year"],
    lambda e: f"When was the founder of {e.name} born?",
  )
  add(
    "bamboogle",
    films,
    ["director", "year"],
    lambda e: f"When was the person who directed {e.name} born?",
  )
  add(
    "bamboogle",
    people,
    ["birthplace", "country", "capital"],
    lambda e: f"What is the capital of the country where {e.name} was born?",
  )
  return out


def _comparisons(world: World, rng: random.Random, pairs: int) -> list[Question]:
  out: list[Question] = []

  def sample_pairs(entities: Sequence[Entity], distinct: Callable[[Entity, Entity], bool]):
    found, seen = [], set()
    for _ in range(pairs * 20):
      if len(found) >= pairs:
        break
      a, b = rng.sample(list(entities), 2)
      if (a.key, b.key) in seen or not distinct(a, b):
        continue
      seen.update({(a.key, b.key), (b.key, a.key)})
      found.append((a, b))
    return found

  def earlier(source: str, kind: str, text: str) -> None:
    for a, b in sample_pairs(world.of_kind(kind), lambda a, b: a.facts["year"] != b.facts["year"]):
      first = a if int(a.facts["year"]) < int(b.facts["year"]) else b
      hops = tuple(
        Hop(f"{e.name} {_KEYWORD[(kind, 'year')]}", e.name, e.facts["year"]) for e in (a, b)
      )
      question = text.format(a=a.name, b=b.name)
      out.append(Question(question, (first.name,), source, "comparison", hops))

  earlier("hotpotqa", "company", "Which company was founded first, {a} or {b}?")
  earlier("hotpotqa", "film", "Which film was released earlier, {a} or {b}?")
  earlier("2wikimultihopqa", "film", "Which film came out first, {a} or {b}?")
  earlier("2wikimultihopqa", "person", "Who was born first, {a} or {b}?")

  # Yes/no: half the pairs share a birthplace.
  people = world.of_kind("person")
  by_city: dict[str, list[Entity]] = {}
  for p in people:
    by_city.setdefault(p.links["birthplace"], []).append(p)
  same = [(a, b) for group in by_city.values() for a, b in zip(group[::2], group[1::2])]
  rng.shuffle(same)
  different = sample_pairs(people, lambda a, b: a.links["birthplace"] != b.links["birthplace"])
  for a, b in same[: pairs // 2] + different[: pairs // 2]:
    answer = "yes" if a.links["birthplace"] == b.links["birthplace"] else "no"
    hops = tuple(Hop(f"{e.name} born", e.name, world.link(e, "birthplace").name) for e in (a, b))
    question = f"Were {a.name} and {b.name} born in the same city?"
    out.append(Question(question, (answer,), "hotpotqa", "comparison", hops))
  return out


def _supported(
  questions: Sequence[Question], world: World, retriever: BM25Retriever
) -> list[Question]:
  """The questions whose every hop query retrieves, in its top 3, the hop's passage showing `reveals`."""
  contents = {e.name: world.contents(e) for e in world.entities}
  queries = sorted({hop.query for q in questions for hop in q.hops})
  results = dict(zip(queries, retriever.search(queries, TOPK)))

  def hop_ok(hop: Hop) -> bool:
    wanted = contents[hop.title]
    return hop.reveals in wanted and any(p.contents == wanted for p in results[hop.query])

  return [q for q in questions if all(hop_ok(h) for h in q.hops)]


@dataclasses.dataclass
class OfflineData:
  """A generated world, its corpus, its retriever and the questions of each split."""

  world: World
  passages: list[dict[str, str]]
  retriever: BM25Retriever
  splits: dict[str, list[QARecord]]
  dropped: int  # questions removed because a hop's passage was not retrievable


def generate(seed: int = 0, spec: WorldSpec = WorldSpec()) -> OfflineData:
  """The world, corpus and train/test questions for `seed` (same seed, same data)."""
  rng = random.Random(f"search_qa-world-{seed}")
  world = build_world(spec, rng)
  passages = world.passages()
  retriever = BM25Retriever(passages)
  candidates = (
    _single_hop(world) + _multi_hop(world) + _comparisons(world, rng, spec.comparison_pairs)
  )
  kept = _supported(candidates, world, retriever)
  splits: dict[str, list[QARecord]] = {"train": [], "test": []}
  for source in DATA_SOURCES:
    unique: dict[str, Question] = {}
    for q in kept:
      if q.data_source == source:
        unique.setdefault(q.question, q)
    pool = sorted(unique.values(), key=lambda q: q.question)
    random.Random(f"search_qa-split-{seed}-{source}").shuffle(pool)
    test = pool[: spec.test_per_source]
    train = pool[spec.test_per_source : spec.test_per_source + spec.train_per_source]
    splits["test"] += [q.record(f"{source}_test_{i}") for i, q in enumerate(test)]
    splits["train"] += [q.record(f"{source}_train_{i}") for i, q in enumerate(train)]
  return OfflineData(world, passages, retriever, splits, len(candidates) - len(kept))


@functools.lru_cache(maxsize=4)
def offline_data(seed: int = 0) -> OfflineData:
  """`generate(seed)` with the default spec, built once per process."""
  return generate(seed)


def write_dataset(out_dir: str, seed: int = 0, spec: WorldSpec = WorldSpec()) -> dict[str, Any]:
  """Writes corpus.jsonl, train.parquet and test.parquet to `out_dir`; returns a summary."""
  data = generate(seed, spec)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "corpus.jsonl"), "w") as f:
    f.writelines(json.dumps(p) + "\n" for p in data.passages)
  for split, records in data.splits.items():
    write_parquet(records, os.path.join(out_dir, f"{split}.parquet"), split)
  summary = {
    "seed": seed,
    "passages": len(data.passages),
    "dropped_unretrievable": data.dropped,
    **{f"{split}_questions": len(records) for split, records in data.splits.items()},
  }
  for split, records in data.splits.items():
    for source in DATA_SOURCES:
      summary[f"{split}/{source}"] = sum(r.data_source == source for r in records)
  return summary


@exit_on_env_error
def _main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="output folder")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--test-per-source", type=int, default=WorldSpec.test_per_source)
  parser.add_argument("--train-per-source", type=int, default=WorldSpec.train_per_source)
  add_verbosity_argument(parser)
  args = parser.parse_args(argv)
  spec = WorldSpec(test_per_source=args.test_per_source, train_per_source=args.train_per_source)
  print(json.dumps(write_dataset(args.out, args.seed, spec), indent=1))


if __name__ == "__main__":
  _main()
