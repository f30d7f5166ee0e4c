"""The environments' data as tensorflow-datasets builders (ArrayRecord files, no TensorFlow needed).

Each builder turns real or generated data into a tfds dataset whose splits are read with
`tfds.data_source` (random access by index, the same order on every host, so a host can take its
shard of a task list by index: `shard(indices, host, num_hosts)`):

- ``webshop_data`` (`WebshopData`): split ``products`` holds the raw records of the original's
  three files, one per product in file order (``product`` = the items_shuffle record,
  ``attributes`` = its items_ins_v2 record, ``human_instructions`` = its items_human_ins list, each
  as JSON text); splits ``train`` and ``test`` hold the goals (``goal_index``, ``asin``,
  ``instruction_text``, ``goal`` = the whole goal as JSON) of the original's split, test = goals
  0-499. Built from a WebShop data folder, or from the generated catalogue.
- ``search_qa_data`` (`SearchQaData`): one split per question set (``id``, ``question``,
  ``golden_answers``, ``data_source``, ``metadata`` as JSON), and ``corpus`` (``id``,
  ``contents`` in the wiki-18 format). Built from a folder of Search-R1 / verl-agent
  ``{split}.parquet`` files with its wiki-18 style corpus, or from the generated world.
- ``alfworld_games`` (`AlfworldGames`): one split per ALFWorld split (train, valid_seen,
  valid_unseen) listing its playable games (``game_file`` relative to the data folder,
  ``task_type``), in sorted order. Built from a real or generated ALFWorld data folder.

One command builds a dataset (it prints the folder to give as ``data_dir``):

    python -m envs.datasets webshop --out data/tfds [--data_dir /data/webshop] [--full] [--human_goals]
    python -m envs.datasets search_qa --out data/tfds [--data_dir /data/search_r1] [--corpus FILE]
    python -m envs.datasets alfworld --out data/tfds --data_dir /data/alfworld

``envs.make("webshop", data_dir=<out>)`` and ``envs.make("search_qa", data_dir=<out>)`` (and so
``--config.env.data_dir=<out>``) read such a dataset: the catalogue is rebuilt from the
``products`` split (and checked against the stored goals), the questions come from the question
splits and BM25 indexes the ``corpus`` split. So does ``envs.make("alfworld", data_dir=<out>)``
(and a run's split): `alfworld_game_files` gives an ALFWorld split's game files (of some task types)
from its dataset, the files themselves staying in the folder it was built from
(`alfworld_source_dir`, where the walkthroughs are read too). The readers need only
tensorflow-datasets and array_record, not TensorFlow.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import numpy as np

from envs.errors import EnvFileNotFoundError

__all__ = [
  "AlfworldGames",
  "SearchQaData",
  "WebshopData",
  "alfworld_game_files",
  "alfworld_source_dir",
  "build",
  "data_source",
  "find_dataset",
  "search_qa_passages",
  "search_qa_records",
  "shard",
  "webshop_catalogue",
]

VERSION = "1.0.0"
WEBSHOP, SEARCH_QA, ALFWORLD = "webshop_data", "search_qa_data", "alfworld_games"
_ALFWORLD_SPLITS = ("train", "valid_seen", "valid_unseen")


def _tfds():
  import tensorflow_datasets as tfds

  return tfds


def _text(value: Any) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


# ------------------------------------------------------------------------------------ builders
@functools.cache
def _classes() -> dict[str, type]:
  """The builder classes, defined (and registered with tfds) on first use: importing
  tensorflow_datasets is not free, and the environments do not need it otherwise."""
  tfds = _tfds()
  text, texts = tfds.features.Text(), tfds.features.Sequence(tfds.features.Text())

  class _Builder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Shared: keyword settings stored as the dataset's metadata, generation order kept."""

    VERSION = tfds.core.Version(VERSION)
    FEATURES: ClassVar[dict[str, Any]] = {}
    # No checksums or metadata files beside the code (tfds would look them up through
    # importlib_resources, which it does not install).
    code_path = None

    def __init__(self, *, settings: dict[str, Any] | None = None, **kwargs: Any):
      self.settings = dict(settings or {})
      super().__init__(**kwargs)

    def _info(self):
      return tfds.core.DatasetInfo(
        builder=self,
        description=(self.__doc__ or "").strip().split("\n")[0],
        features=tfds.features.FeaturesDict(self.FEATURES),
        disable_shuffling=True,  # examples keep their order: index i is task i on every host
        metadata=tfds.core.MetadataDict(self.settings),
      )

    def _split_generators(self, dl_manager):
      del dl_manager  # everything is local
      return {name: examples for name, examples in self._splits().items()}

    def _generate_examples(self):  # the splits' generators come from _splits
      raise NotImplementedError

  class WebshopData(_Builder):
    """WebShop products (raw records of the original's files) and goals (train / test)."""

    name = WEBSHOP
    FEATURES: ClassVar[dict[str, Any]] = {
      "goal_index": np.int64,
      "asin": text,
      "instruction_text": text,
      "goal": text,
      "product": text,
      "attributes": text,
      "human_instructions": text,
    }

    def _splits(self) -> dict[str, Iterator]:
      raw, attributes, human = _webshop_records(self.settings)
      catalogue = _webshop_build(raw, attributes, human, self.settings)
      self.settings["num_goals"] = len(catalogue.goals)
      self.info.metadata.update(num_goals=len(catalogue.goals))
      from envs.webshop.data import TEST_GOALS

      count = len(catalogue.goals)
      splits = {
        "products": self._products(raw, attributes, human),
        "test": self._goals(catalogue.goals, range(min(TEST_GOALS, count))),
      }
      if count > TEST_GOALS:  # a small catalogue has no train goals (the env refuses the split)
        splits["train"] = self._goals(catalogue.goals, range(TEST_GOALS, count))
      return splits

    def _products(self, raw, attributes, human) -> Iterator:
      for k, record in enumerate(raw):
        asin = str(record.get("asin", ""))
        yield (
          k,
          {
            "goal_index": -1,
            "asin": asin,
            "instruction_text": "",
            "goal": "",
            "product": json.dumps(record),
            "attributes": json.dumps(attributes.get(asin)) if asin in attributes else "",
            "human_instructions": json.dumps(human[asin]) if human and asin in human else "",
          },
        )

    def _goals(self, goals, indices) -> Iterator:
      for index in indices:
        goal = goals[index]
        yield (
          int(index),
          {
            "goal_index": int(index),
            "asin": goal["asin"],
            "instruction_text": goal["instruction_text"],
            "goal": json.dumps(goal),
            "product": "",
            "attributes": "",
            "human_instructions": "",
          },
        )

  class SearchQaData(_Builder):
    """Search-QA questions (one split per question set) and the passage corpus."""

    name = SEARCH_QA
    FEATURES: ClassVar[dict[str, Any]] = {
      "id": text,
      "question": text,
      "golden_answers": texts,
      "data_source": text,
      "metadata": text,
      "contents": text,
    }

    def _splits(self) -> dict[str, Iterator]:
      question_sets, corpus = _search_qa_sources(self.settings)
      splits = {name: self._questions(records) for name, records in question_sets.items()}
      splits["corpus"] = self._passages(corpus)
      return splits

    def _questions(self, records) -> Iterator:
      for k, r in enumerate(records):
        yield (
          k,
          {
            "id": r.id,
            "question": r.question,
            "golden_answers": list(r.golden_answers),
            "data_source": r.data_source,
            "metadata": json.dumps(dict(r.metadata), default=str) if r.metadata else "",
            "contents": "",
          },
        )

    def _passages(self, corpus) -> Iterator:
      for k, passage in enumerate(corpus):
        yield (
          k,
          {
            "id": str(passage.get("id", k)),
            "question": "",
            "golden_answers": [],
            "data_source": "",
            "metadata": "",
            "contents": passage["contents"],
          },
        )

  class AlfworldGames(_Builder):
    """ALFWorld game lists (train / valid_seen / valid_unseen): game files and task types."""

    name = ALFWORLD
    FEATURES: ClassVar[dict[str, Any]] = {"game_file": text, "task_type": text}

    def _splits(self) -> dict[str, Iterator]:
      from envs.alfworld.env import collect_game_files
      from envs.alfworld.tasks import task_type_of_game

      root = os.path.abspath(os.path.expanduser(self.settings["data_dir"]))
      splits = {}
      for name in _ALFWORLD_SPLITS:
        try:
          games = collect_game_files(root, name)
        except FileNotFoundError:
          continue  # a folder without this split
        splits[name] = (
          (k, {"game_file": os.path.relpath(g, root), "task_type": task_type_of_game(g)})
          for k, g in enumerate(games)
        )
      if not splits:
        raise EnvFileNotFoundError(
          f"no ALFWorld games under {root!r}; point --data_dir at an ALFWorld data folder or "
          "generate one: python -m envs.alfworld.generator --out DIR"
        )
      return splits

  return {WEBSHOP: WebshopData, SEARCH_QA: SearchQaData, ALFWORLD: AlfworldGames}


def __getattr__(attr: str) -> Any:
  names = {"WebshopData": WEBSHOP, "SearchQaData": SEARCH_QA, "AlfworldGames": ALFWORLD}
  if attr in names:
    return _classes()[names[attr]]
  raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


# ------------------------------------------------------------------------------------ sources
def _webshop_records(settings: dict[str, Any]) -> tuple[list[dict], dict, dict | None]:
  """(raw products, attributes by asin, human instructions or None) of the builder's source."""
  from envs.webshop import data as webshop_data
  from envs.webshop.generator import generate_records

  if settings.get("source_dir") is None:
    return generate_records(settings["num_products"], settings["catalogue_seed"])
  source, small = settings["source_dir"], settings["use_small"]
  try:
    return webshop_data.read_data_files(source, small, human_goals=True)
  except FileNotFoundError:
    if settings["human_goals"]:
      raise
    return webshop_data.read_data_files(source, small, human_goals=False)


def _webshop_build(raw, attributes, human, settings: dict[str, Any], index_cache_dir=None):
  from envs.webshop.data import build_catalogue

  return build_catalogue(
    raw,
    attributes,
    human,
    human_goals=settings["human_goals"],
    num_products=settings.get("num_products_limit"),
    data_seed=settings["data_seed"],
    source=settings.get("source_dir") or "generated",
    index_cache_dir=index_cache_dir,
  )


def _search_qa_sources(settings: dict[str, Any]) -> tuple[dict[str, list], Iterator[dict]]:
  """({split: [QARecord]}, passages) of the builder's source."""
  from envs.search_qa import data as qa_data
  from envs.search_qa import retrieval

  source = settings.get("source_dir")
  if source is None:
    from envs.search_qa.generator import generate

    offline = generate(settings["data_seed"])
    return dict(offline.splits), iter(offline.passages)
  source = os.path.expanduser(source)
  names = sorted(f[: -len(".parquet")] for f in os.listdir(source) if f.endswith(".parquet"))
  if not names:
    raise EnvFileNotFoundError(
      f"no .parquet question files in {source!r}; expected Search-R1's train.parquet / "
      "test.parquet (or verl-agent's), or omit --data_dir for the generated data"
    )
  question_sets = {n: qa_data.read_parquet(os.path.join(source, f"{n}.parquet")) for n in names}
  corpus = settings.get("corpus")
  if corpus is None:
    from envs.search_qa.retrieval import corpus_in

    corpus = corpus_in(source)
  passages = (
    {"id": str(record.get("id", k)), "contents": record["contents"]}
    for k, (_, _, record) in enumerate(retrieval._iter_corpus_lines(corpus))
  )
  return question_sets, passages


# ------------------------------------------------------------------------------------ build
def build(env: str, out_dir: str, data_dir: str | None = None, **settings: Any) -> str:
  """Builds the dataset of `env` ("webshop", "search_qa" or "alfworld") into `out_dir` and returns
  the dataset's folder (``out_dir/<name>/<version>``). `data_dir`: the real files (None: the
  generated data; ALFWorld needs one). Settings: WebShop ``use_small`` (True), ``human_goals``
  (False), ``data_seed`` (233), ``num_products`` / ``catalogue_seed`` (generated: 1000 / 0),
  ``num_products_limit`` (keep the first N of a real file); Search-QA ``corpus`` (a wiki-18 style
  JSONL instead of data_dir's corpus.jsonl / wiki-18.jsonl), ``data_seed`` (generated world, 0)."""
  from envs.webshop.data import DEFAULT_DATA_SEED
  from envs.webshop.generator import DEFAULT_NUM_PRODUCTS

  names = {"webshop": WEBSHOP, "search_qa": SEARCH_QA, "alfworld": ALFWORLD}
  if env not in names:
    raise ValueError(f"unknown environment {env!r}; choose one of {sorted(names)}")
  source = os.path.abspath(os.path.expanduser(data_dir)) if data_dir else None
  if source is not None and not os.path.isdir(source):  # never the generated data instead
    raise EnvFileNotFoundError(
      f"data_dir={data_dir!r}: no such folder. Fix: point it at the real {env} files, or leave "
      "it out to build from the generated data."
    )
  if env == "webshop":
    values = {
      "source_dir": source,
      "use_small": True,
      "human_goals": False,
      "data_seed": DEFAULT_DATA_SEED,
      "num_products": DEFAULT_NUM_PRODUCTS,
      "catalogue_seed": 0,
      "num_products_limit": None,
    }
  elif env == "search_qa":
    values = {"source_dir": source, "corpus": None, "data_seed": 0}
  else:
    if source is None:
      raise ValueError(
        "the alfworld dataset lists the games of a data folder: pass data_dir (generate one with "
        "python -m envs.alfworld.generator --out DIR)"
      )
    values = {"data_dir": source}
  unknown = set(settings) - set(values)
  if unknown:
    raise ValueError(f"unknown settings {sorted(unknown)} for {env}; valid: {sorted(values)}")
  values.update(settings)
  if values.get("corpus"):
    values["corpus"] = os.path.abspath(os.path.expanduser(values["corpus"]))
  tfds = _tfds()
  builder = _classes()[names[env]](
    settings=values, data_dir=os.path.expanduser(out_dir), file_format="array_record"
  )
  builder.download_and_prepare(
    download_config=tfds.download.DownloadConfig(verify_ssl=False, try_download_gcs=False)
  )
  return str(builder.data_path)


# ------------------------------------------------------------------------------------ reading
def find_dataset(path: str | None, name: str) -> str | None:
  """The version folder of dataset `name` at `path` (that folder itself, ``path/<version>`` or
  ``path/<name>/<version>``), or None when there is none."""
  if not path:
    return None
  path = os.path.abspath(os.path.expanduser(path))
  for candidate in (path, os.path.join(path, VERSION), os.path.join(path, name, VERSION)):
    info = os.path.join(candidate, "dataset_info.json")
    if os.path.isfile(info):
      with open(info) as f:
        if json.load(f).get("name") == name:
          return candidate
  return None


def _require(path: str, name: str) -> str:
  found = find_dataset(path, name)
  if found is None:
    raise EnvFileNotFoundError(
      f"no {name} dataset at {path!r}; build one with python -m envs.datasets "
      f"{name.split('_data')[0].replace('_games', '')} --out DIR"
    )
  return found


def data_source(dataset_dir: str, split: str, name: str | None = None) -> Sequence[dict[str, Any]]:
  """`tfds.data_source` of `split` (random access, len) of the dataset at `dataset_dir`."""
  tfds = _tfds()
  if name is None:
    with open(os.path.join(dataset_dir, "dataset_info.json")) as f:
      name = json.load(f)["name"]
  folder = _require(dataset_dir, name)
  _classes()  # registers the builders, which tfds.data_source looks up by name
  root = os.path.dirname(os.path.dirname(folder))
  splits = _metadata_and_splits(folder)[1]
  if split not in splits:
    raise ValueError(f"the {name} dataset at {folder} has splits {splits}, not {split!r}")
  return tfds.data_source(name, data_dir=root, split=split, download=False)


def _metadata_and_splits(folder: str) -> tuple[dict[str, Any], list[str]]:
  metadata = {}
  path = os.path.join(folder, "metadata.json")
  if os.path.isfile(path):
    with open(path) as f:
      metadata = json.load(f)
  with open(os.path.join(folder, "dataset_info.json")) as f:
    splits = [s["name"] for s in json.load(f).get("splits", [])]
  return metadata, splits


def shard(indices: Sequence[int], host: int, num_hosts: int) -> list[int]:
  """Host `host`'s share of a task list: every `num_hosts`-th index from position `host`."""
  if not 0 <= host < num_hosts:
    raise ValueError(f"host {host} is not in 0..{num_hosts - 1}")
  return list(indices[host::num_hosts])


@functools.lru_cache(maxsize=4)
def webshop_catalogue(path: str, index_cache_dir: str | None = None):
  """The `envs.webshop.data.Catalogue` of a webshop_data dataset: rebuilt from its ``products``
  split with the stored settings, checked against its stored goals (cached per process)."""
  folder = _require(path, WEBSHOP)
  settings, _ = _metadata_and_splits(folder)
  products = data_source(folder, "products", WEBSHOP)
  raw, attributes, human = [], {}, {}
  for k in range(len(products)):
    example = products[k]
    raw.append(json.loads(_text(example["product"])))
    asin = _text(example["asin"])
    if _text(example["attributes"]):
      attributes[asin] = json.loads(_text(example["attributes"]))
    if _text(example["human_instructions"]):
      human[asin] = json.loads(_text(example["human_instructions"]))
  catalogue = _webshop_build(raw, attributes, human or None, settings, index_cache_dir)
  _, splits = _metadata_and_splits(folder)
  stored = [data_source(folder, name, WEBSHOP) for name in ("test", "train") if name in splits]
  count = sum(len(s) for s in stored)
  checks = [s[k] for s in stored for k in (0, len(s) - 1)]  # first and last goal of each split
  if count != len(catalogue.goals) or any(
    json.loads(_text(e["goal"])) != catalogue.goals[int(e["goal_index"])] for e in checks
  ):
    raise ValueError(
      f"the webshop_data dataset at {folder} stores {count} goals that differ from the "
      f"{len(catalogue.goals)} its products give; rebuild it with python -m envs.datasets webshop"
    )
  return catalogue


def webshop_settings(path: str) -> dict[str, Any]:
  """The settings a webshop_data dataset was built with (human_goals, data_seed, source, ...)."""
  return _metadata_and_splits(_require(path, WEBSHOP))[0]


def search_qa_records(path: str, split: str) -> list:
  """The questions (`envs.search_qa.QARecord`) of a split of a search_qa_data dataset (read once
  per process)."""
  return list(_search_qa_records(os.path.abspath(os.path.expanduser(path)), split))


@functools.lru_cache(maxsize=8)
def _search_qa_records(path: str, split: str) -> tuple:
  from envs.search_qa.data import QARecord

  source = data_source(_require(path, SEARCH_QA), split, SEARCH_QA)
  records = []
  for k in range(len(source)):
    e = source[k]
    metadata = _text(e["metadata"])
    records.append(
      QARecord(
        question=_text(e["question"]),
        golden_answers=tuple(_text(a) for a in e["golden_answers"]),
        data_source=_text(e["data_source"]),
        id=_text(e["id"]),
        metadata=json.loads(metadata) if metadata else None,
      )
    )
  return tuple(records)


@functools.lru_cache(maxsize=2)
def search_qa_passages(path: str) -> tuple[dict[str, str], ...]:
  """The ``corpus`` split of a search_qa_data dataset as {"id", "contents"} dicts (cached)."""
  source = data_source(_require(path, SEARCH_QA), "corpus", SEARCH_QA)
  return tuple(
    {"id": _text(source[k]["id"]), "contents": _text(source[k]["contents"])}
    for k in range(len(source))
  )


def alfworld_source_dir(path: str) -> str:
  """The ALFWorld data folder an alfworld_games dataset was built from (its game files and
  ``walkthroughs/`` live there)."""
  return _metadata_and_splits(_require(path, ALFWORLD))[0]["data_dir"]


def alfworld_game_files(
  path: str,
  split: str,
  data_dir: str | None = None,
  task_types: Sequence[str] | None = None,
) -> list[str]:
  """The game files of an ALFWorld split listed by an alfworld_games dataset, in its order, under
  `data_dir` (default: the folder it was built from, which must still hold them); `task_types`
  keeps only games of those types (None: all)."""
  folder = _require(path, ALFWORLD)
  root = os.path.expanduser(data_dir or alfworld_source_dir(folder))
  source = data_source(folder, split, ALFWORLD)
  examples = [source[k] for k in range(len(source))]
  games = [
    os.path.join(root, _text(e["game_file"]))
    for e in examples
    if task_types is None or _text(e["task_type"]) in task_types
  ]
  if not games:
    raise EnvFileNotFoundError(
      f"the alfworld_games dataset at {folder} lists no {split!r} games of types "
      f"{list(task_types or [])}; choose other env.task_types or rebuild it from a folder that "
      "has them: python -m envs.datasets alfworld --out DIR --data_dir ALFWORLD_DIR"
    )
  if data_dir is None and not os.path.isfile(games[0]):
    raise EnvFileNotFoundError(
      f"the alfworld_games dataset at {folder} lists games under {root!r}, but {games[0]!r} does "
      "not exist (the data folder moved?); rebuild it with python -m envs.datasets alfworld "
      "--out DIR --data_dir <the ALFWorld folder>"
    )
  return games
