"""Search-QA (Search-R1 questions, verl-agent's search-env protocol), offline by default.

    import envs
    env = envs.make("search_qa", split="test", seed=0)             # generated world, BM25
    env = envs.make("search_qa", data_dir="/data/search_r1", split="train",
                    corpus_path="/data/wiki-18.jsonl")                # real files, BM25 (cached)
    env = envs.make("search_qa", data_dir="/data/search_r1", split="test",
                    search_url="http://127.0.0.1:8000/retrieve")      # the original e5 server
    question, info = env.reset(task=0)
    obs, reward, done, info = env.step("<search>who founded helix works</search>")
    obs, reward, done, info = env.step("<answer>Mira Castell</answer>")  # reward 1.0 if right

`make_search_qa` arguments (all keywords):
- data_dir: None = the generated offline data (`envs.search_qa.generator`, world `data_seed`);
  else a folder with `{split}.parquet` (Search-R1's or verl-agent's layout) and, unless
  `search_url` or `corpus_path` is given, `corpus.jsonl` or `wiki-18.jsonl` (wiki-18 format);
  or a search_qa_data tfds dataset (`python -m envs.datasets search_qa`: its question splits,
  and BM25 in memory over its corpus split unless `search_url` or `corpus_path` is given).
- split: "train" or "test" (any `{split}.parquet` of data_dir; or a parquet path).
- seed: order of `reset()` without a task.
- search_url: a Search-R1 retrieval server's /retrieve endpoint; `server_protocol` "search_r1"
  ({"queries": [...]}) or "verl_agent" ({"query": q}); `timeout_s` per request (30) and
  `search_retries` (3) more attempts after a failed one.
- corpus_path: a wiki-18 style JSONL corpus to index with BM25 (index cached under `index_dir`,
  default $SDAR_CACHE_DIR/search_qa_bm25 or ~/.cache/sdar_jax/search_qa_bm25).
- data_sources: keep only these sources (a sequence or a comma-separated string, e.g. "nq,hotpotqa").
- max_turns (4), topk (3), passage_format ("verl_agent" JSON or "search_r1" Doc i(Title: ...)),
  max_passage_chars (2000: characters of a passage shown, the cut marked; 0 = whole passages).
- data_seed: the generated world's seed (train and test share one world).
- max_steps: the same as max_turns (the name the trainer passes).

Importing the package registers `SEARCH_QA_FAMILY` (`envs.env_family("search_qa")`): splits, the
scripted warm-start expert and the "em" metric from `envs.search_qa.family`, prompts, projection
and skill query from `envs.search_qa.adapter.SearchQAAdapter`, and the authors' data_source skill
rule (`envs.skills.data_source_rules.DataSourceSkillRetriever`) for the teacher.

Differences from the originals (verl-agent's search env over Search-R1's data) are listed in
docs/environments.md: chiefly BM25 instead of the e5 + FAISS retriever (whose server is supported
through `search_url`), verl-agent's protocol rather than Search-R1's own loop, and the generated
world.

The returned `SearchQAEnv` follows the TextEnv contract: `reset(task) -> (question, info)`,
`step(action) -> (observation, reward, done, info)`, `num_tasks`, `close()`; `info["won"]`,
`info["admissible_commands"]` (always [], no finite action set), `info["task_type"]` and
`info["data_source"]` (the question's data set, for per-source success rates), `info["task"]`
(the question), `info["golden_answers"]`.

Beside the env: `reward` (normalize_answer, em_check, compute_score), `projection` (model output
-> action + format validity, penalty 0.01), `prompts` (verl-agent's
prompt structure, our wording, history 4),
`retrieval` (BM25, server client, passage formats), `data` (parquet I/O, success rates),
`generator` (the offline world; `python -m envs.search_qa.generator --out DIR`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from envs import datasets
from envs.base import EnvFamily, register, register_family
from envs.search_qa import family
from envs.search_qa.adapter import SearchQAAdapter
from envs.search_qa.data import (
  DATA_SOURCES,
  TRAIN_SOURCES,
  QARecord,
  find_split_file,
  read_parquet,
  success_rates,
)
from envs.search_qa.env import MAX_TURNS, TOPK, SearchQAEnv
from envs.search_qa.projection import INVALID_ACTION_PENALTY, project_action, project_actions
from envs.search_qa.prompts import HISTORY_LENGTH, build_prompt
from envs.search_qa.retrieval import (
  DEFAULT_MAX_PASSAGE_CHARS,
  BM25Retriever,
  Passage,
  RetrievalServerClient,
  Retriever,
  SearchError,
  corpus_in,
)
from envs.search_qa.reward import compute_score, em_check, normalize_answer
from envs.skills.data_source_rules import DataSourceSkillRetriever

__all__ = [
  "DATA_SOURCES",
  "HISTORY_LENGTH",
  "INVALID_ACTION_PENALTY",
  "MAX_TURNS",
  "SEARCH_QA_FAMILY",
  "TOPK",
  "TRAIN_SOURCES",
  "BM25Retriever",
  "Passage",
  "QARecord",
  "RetrievalServerClient",
  "Retriever",
  "SearchError",
  "SearchQAAdapter",
  "SearchQAEnv",
  "build_prompt",
  "compute_score",
  "em_check",
  "make_search_qa",
  "normalize_answer",
  "project_action",
  "project_actions",
  "read_parquet",
  "success_rates",
]

_BM25_CACHE: dict[tuple[str, str | None], BM25Retriever] = {}


def _sources(data_sources: Sequence[str] | str | None) -> list[str] | None:
  if data_sources is None:
    return None
  if isinstance(data_sources, str):
    data_sources = data_sources.split(",")
  names = [s.strip() for s in data_sources if s.strip()]
  return names or None


def _bm25_for(corpus_path: str, index_dir: str | None) -> BM25Retriever:
  key = (os.path.abspath(os.path.expanduser(corpus_path)), index_dir)
  if key not in _BM25_CACHE:  # one index per corpus per process, shared by its envs
    _BM25_CACHE[key] = BM25Retriever.from_jsonl(key[0], cache_dir=index_dir)
  return _BM25_CACHE[key]


def _bm25_of_dataset(path: str) -> BM25Retriever:
  key = (os.path.abspath(os.path.expanduser(path)), "tfds")
  if key not in _BM25_CACHE:  # one index per dataset per process, shared by its envs
    _BM25_CACHE[key] = BM25Retriever(datasets.search_qa_passages(key[0]))
  return _BM25_CACHE[key]


@register("search_qa")
def make_search_qa(
  data_dir: str | None = None,
  split: str = "train",
  seed: int = 0,
  search_url: str | None = None,
  corpus_path: str | None = None,
  data_sources: Sequence[str] | str | None = None,
  max_turns: int = MAX_TURNS,
  topk: int = TOPK,
  passage_format: str = "verl_agent",
  server_protocol: str = "search_r1",
  timeout_s: float = 30.0,
  search_retries: int = 3,
  max_passage_chars: int = DEFAULT_MAX_PASSAGE_CHARS,
  index_dir: str | None = None,
  data_seed: int = 0,
  max_steps: int | None = None,
) -> SearchQAEnv:
  """Builds a SearchQAEnv over the questions of `split` (see the package docstring).

  `max_steps`, when given, replaces `max_turns` (the trainer's pools pass ``env.max_turns`` under
  that name to every environment).
  """
  if max_steps is not None:
    max_turns = max_steps
  sources = _sources(data_sources)
  retriever: Retriever | None = None
  if data_dir is None:
    from envs.search_qa.generator import offline_data

    offline = offline_data(data_seed)
    if split not in offline.splits:
      raise ValueError(
        f"the generated data has splits {sorted(offline.splits)}, not {split!r}; pass data_dir "
        "for other splits"
      )
    all_records = offline.splits[split]
    retriever = offline.retriever
    where = f"the generated data (data_seed={data_seed}) split {split!r}"
  elif datasets.find_dataset(data_dir, datasets.SEARCH_QA):  # a tfds dataset (envs.datasets)
    all_records = datasets.search_qa_records(data_dir, split)
    where = f"the search_qa_data dataset at {data_dir} split {split!r}"
    if search_url is None and corpus_path is None:
      retriever = _bm25_of_dataset(data_dir)
  else:
    where = find_split_file(data_dir, split)
    all_records = read_parquet(where)
  records = [r for r in all_records if sources is None or r.data_source in sources]
  if not records:
    raise ValueError(
      f"no questions of data sources {sources} in {where}; the sources there are "
      f"{sorted({r.data_source for r in all_records})}"
    )
  if search_url is not None:
    retriever = RetrievalServerClient(
      search_url, protocol=server_protocol, timeout_s=timeout_s, max_attempts=search_retries + 1
    )
  elif corpus_path is not None:
    retriever = _bm25_for(corpus_path, index_dir)
  elif retriever is None and data_dir is not None:
    retriever = _bm25_for(corpus_in(data_dir), index_dir)
  assert retriever is not None
  return SearchQAEnv(
    records,
    retriever,
    max_turns=max_turns,
    topk=topk,
    passage_format=passage_format,
    seed=seed,
    max_passage_chars=max_passage_chars,
  )


SEARCH_QA_FAMILY = register_family(
  EnvFamily(
    name="search_qa",
    split=family.split,
    adapter=SearchQAAdapter,
    skills="search",
    expert_records=family.expert_records,
    episode_metrics=family.episode_metrics,
    skill_retriever=DataSourceSkillRetriever,
    config_problems=family.config_problems,
    start_check=family.start_check,
  )
)
