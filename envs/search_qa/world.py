"""The generated Search-QA world (envs.search_qa.generator): countries, cities, universities,
people, companies, films and novels with fictional pseudo-word names, their attributes and their
relations, and each entity's wiki-18 style passage, which states its own attributes and outgoing
relations only.

Deterministic from the random generator it is given: the draws follow the vocabularies and the
spec's counts in order, so editing either changes every world of its seed."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence

__all__ = ["Entity", "World", "WorldSpec", "build_world"]

_CONTINENT_COUNT = 4
_OCCUPATIONS = (
  "architect",
  "painter",
  "physicist",
  "composer",
  "chemist",
  "sculptor",
  "economist",
  "engineer",
  "photographer",
  "mathematician",
)
_FILM_GENRES = ("drama", "comedy", "thriller", "western", "musical", "documentary", "horror")
_BOOK_GENRES = ("mystery", "romance", "fantasy", "historical", "adventure", "satirical")
_INDUSTRIES = ("shipping", "textile", "software", "mining", "aviation", "publishing", "brewing")
_COMPANY_SUFFIXES = ("Works", "Systems", "Industries", "Labs", "Holdings", "Motors", "Foods")
_FILM_NOUNS = (
  "Covenant",
  "Harbor",
  "Lantern",
  "Orchard",
  "Frontier",
  "Mirror",
  "Crossing",
  "Garden",
)
_BOOK_NOUNS = ("Lanterns", "Shadows", "Letters", "Winters", "Songs", "Echoes", "Ashes", "Voyages")

_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr")
_ONSETS += ("gr", "kr", "tr", "st", "th", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o")
_CODAS = ("", "", "n", "r", "l", "s", "m", "nd", "th")


@dataclasses.dataclass(frozen=True)
class WorldSpec:
  """How many entities of each kind the world has, and how many questions each split gets."""

  countries: int = 12
  cities_per_country: int = 4
  universities: int = 24
  directors: int = 40
  novelists: int = 30
  other_people: int = 170
  companies: int = 60
  films: int = 120
  books: int = 90
  comparison_pairs: int = 150  # sampled pairs per comparison template
  test_per_source: int = 100
  train_per_source: int = 300


@dataclasses.dataclass(frozen=True)
class Entity:
  key: str  # "film:12"
  kind: str  # country, city, university, person, company, film, book
  name: str
  facts: Mapping[str, str]  # attribute -> value as written
  links: Mapping[str, str]  # relation -> entity key


def _article(word: str) -> str:
  return "an" if word[0].lower() in "aeiou" else "a"


class World:
  """The generated entities and their passages (one per entity, ids "0", "1", ... in entity order)."""

  def __init__(self, entities: Sequence[Entity]):
    self.entities = list(entities)
    self.by_key = {e.key: e for e in self.entities}

  def of_kind(self, kind: str) -> list[Entity]:
    return [e for e in self.entities if e.kind == kind]

  def link(self, entity: Entity, relation: str) -> Entity:
    return self.by_key[entity.links[relation]]

  def passage_text(self, e: Entity) -> str:
    f = e.facts

    def link(relation: str) -> str:
      return self.link(e, relation).name

    if e.kind == "country":
      return (
        f"{e.name} is a country in {f['continent']}. Its capital city is {link('capital')}. The "
        f"official language of {e.name} is {f['language']}, and its currency is the "
        f"{f['currency']}. {e.name} became independent in {f['year']}."
      )
    if e.kind == "city":
      return (
        f"{e.name} is a city in {link('country')}. It was founded in {f['year']} on the banks of "
        f"the {f['river']} river."
      )
    if e.kind == "university":
      return f"{e.name} is a university in {link('city')}. It was founded in {f['year']}."
    if e.kind == "person":
      occupation = f["occupation"]
      return (
        f"{e.name} (born {f['year']}) is {_article(occupation)} {occupation}. {f['pronoun']} was "
        f"born in {link('birthplace')} in {f['year']} and studied at {link('university')}."
      )
    if e.kind == "company":
      return (
        f"{e.name} is {_article(f['industry'])} {f['industry']} company. It was founded in "
        f"{f['year']} by {link('founder')} and has its headquarters in {link('headquarters')}."
      )
    if e.kind == "film":
      return f"{e.name} is a {f['year']} {f['genre']} film directed by {link('director')}."
    if e.kind == "book":
      return (
        f"{e.name} is {_article(f['genre'])} {f['genre']} novel by {link('author')}, first "
        f"published in {f['year']}."
      )
    raise ValueError(f"unknown entity kind {e.kind!r}")

  def contents(self, e: Entity) -> str:
    return f'"{e.name}"\n{self.passage_text(e)}'

  def passages(self) -> list[dict[str, str]]:
    """The corpus: {"id", "contents"} per entity, wiki-18 format."""
    return [{"id": str(i), "contents": self.contents(e)} for i, e in enumerate(self.entities)]


# ------------------------------------------------------------------------------------- naming
_TEMPLATE_WORDS = (
  "country continent capital city official language currency became independent founded banks "
  "river university born studied company headquarters film directed novel author first published "
  "director founder which what who when where were same earlier released written spoken whose "
  "located used runs through birthplace person came out occupation genre attended headquartered "
  "the and of in is it its by on at an a was has"
)


class _Namer:
  """Unique pronounceable pseudo-words, none of them an English word the templates use."""

  def __init__(self, rng: random.Random):
    self._rng = rng
    banned = set(_TEMPLATE_WORDS.split())
    for words in (_OCCUPATIONS, _FILM_GENRES, _BOOK_GENRES, _INDUSTRIES):
      banned.update(w for phrase in words for w in phrase.split())
    for words in (_COMPANY_SUFFIXES, _FILM_NOUNS, _BOOK_NOUNS):
      banned.update(w.lower() for w in words)
    self._used = banned

  def word(self, min_syllables: int = 2, max_syllables: int = 3, suffix: str = "") -> str:
    rng = self._rng
    for _ in range(10_000):
      n = rng.randint(min_syllables, max_syllables)
      parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(n)]
      word = ("".join(parts) + rng.choice(_CODAS) + suffix).lower()
      if len(word) >= 5 and word not in self._used:
        self._used.add(word)
        return word.capitalize()
    raise RuntimeError("ran out of pseudo-words; lower the world size")


# ------------------------------------------------------------------------------------- world
def build_world(spec: WorldSpec, rng: random.Random) -> World:
  namer = _Namer(rng)
  continents = [namer.word(2, 3) for _ in range(_CONTINENT_COUNT)]

  countries, cities = [], []
  for c in range(spec.countries):
    country_key = f"country:{c}"
    first_city = len(cities)
    for _ in range(spec.cities_per_country):
      key = f"city:{len(cities)}"
      year = str(rng.randint(700, 1850))
      cities.append(
        Entity(
          key,
          "city",
          namer.word(2, 3),
          {"year": year, "river": namer.word(2, 2)},
          {"country": country_key},
        )
      )
    facts = {
      "continent": rng.choice(continents),
      "language": namer.word(2, 2, suffix="ic"),
      "currency": namer.word(2, 2).lower(),
      "year": str(rng.randint(1780, 1990)),
    }
    capital = cities[first_city + rng.randrange(spec.cities_per_country)].key
    countries.append(
      Entity(country_key, "country", namer.word(2, 3, suffix="ia"), facts, {"capital": capital})
    )

  universities = []
  for u in range(spec.universities):
    city = rng.choice(cities)
    year = str(rng.randint(max(1150, int(city.facts["year"])), 1960))
    universities.append(
      Entity(
        f"university:{u}",
        "university",
        f"{namer.word(2, 3)} University",
        {"year": year},
        {"city": city.key},
      )
    )

  first_names = [namer.word(2, 2) for _ in range(36)]
  people = []

  def person(occupation: str) -> Entity:
    year = str(rng.randint(1880, 1985))
    facts = {"year": year, "occupation": occupation, "pronoun": rng.choice(("She", "He"))}
    links = {"birthplace": rng.choice(cities).key, "university": rng.choice(universities).key}
    name = f"{rng.choice(first_names)} {namer.word(2, 3)}"
    entity = Entity(f"person:{len(people)}", "person", name, facts, links)
    people.append(entity)
    return entity

  directors = [person("film director") for _ in range(spec.directors)]
  novelists = [person("novelist") for _ in range(spec.novelists)]
  others = [person(rng.choice(_OCCUPATIONS)) for _ in range(spec.other_people)]

  if spec.companies > len(others):
    raise ValueError(
      f"companies={spec.companies} needs at least as many other_people ({spec.other_people})"
    )
  companies = []
  for i, founder in enumerate(rng.sample(others, spec.companies)):
    year = str(min(2015, int(founder.facts["year"]) + rng.randint(22, 50)))
    facts = {"year": year, "industry": rng.choice(_INDUSTRIES)}
    links = {"founder": founder.key, "headquarters": rng.choice(cities).key}
    name = f"{namer.word(2, 3)} {rng.choice(_COMPANY_SUFFIXES)}"
    companies.append(Entity(f"company:{i}", "company", name, facts, links))

  def works(
    kind: str,
    count: int,
    creators: list[Entity],
    creator_link: str,
    min_age: int,
    genres: tuple[str, ...],
    title: Callable[[], str],
  ) -> list[Entity]:
    """`count` works, each by a random creator aged `min_age`..60 at the time (year <= 2020)."""
    made = []
    for i in range(count):
      creator = rng.choice(creators)
      year = str(min(2020, int(creator.facts["year"]) + rng.randint(min_age, 60)))
      name = title()
      facts = {"year": year, "genre": rng.choice(genres)}
      made.append(Entity(f"{kind}:{i}", kind, name, facts, {creator_link: creator.key}))
    return made

  films = works(
    "film",
    spec.films,
    directors,
    "director",
    25,
    _FILM_GENRES,
    lambda: f"The {namer.word(2, 3)} {rng.choice(_FILM_NOUNS)}",
  )
  books = works(
    "book",
    spec.books,
    novelists,
    "author",
    20,
    _BOOK_GENRES,
    lambda: f"{rng.choice(_BOOK_NOUNS)} of {namer.word(2, 3)}",
  )

  return World(countries + cities + universities + people + companies + films + books)
