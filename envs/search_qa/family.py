"""How a training run uses Search-QA: a split's pool kwargs and question names, scripted expert
episodes for the warm start, and the "em" metric (the pieces of its `EnvFamily`).

The run config's ``env`` section (configs/common.search_qa) gives:
- ``data_dir``: a folder with Search-R1's or verl-agent's ``{split}.parquet`` (and a wiki-18 style
  ``corpus.jsonl`` / ``wiki-18.jsonl``), or a tfds dataset built from them (`envs.datasets`);
  None: the generated world of seed ``offline.seed`` (`envs.search_qa.generator`);
- ``train_sources`` / ``eval_sources``: comma-separated data sources of the "train" split and of
  every other split (Search-R1 trains on nq,hotpotqa and tests on all seven);
- ``retriever``: "bm25" (over ``corpus``, else data_dir's corpus, else the generated corpus;
  index cached under ``index_dir``) or "server" (a Search-R1 retrieval server at ``search_url``,
  ``server_protocol`` "search_r1" or "verl_agent");
- ``search_timeout_s`` (30) and ``search_retries`` (3): the server's per-request timeout and how
  many more attempts a failed request gets; the server must answer a test query at start
  (`start_check`, before anything is compiled);
- ``retrieval_top_k`` (3), ``passage_format`` ("verl_agent" JSON or "search_r1" Doc i(Title: ...)),
  ``search_max_passage_chars`` (2000: characters of a passage shown, the cut marked; 0 = whole);
- ``expert_episodes``: scripted expert episodes the warm start imitates.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from envs.base import EnvSplit, play_walkthroughs
from envs.search_qa.env import MAX_TURNS, SearchQAEnv
from envs.search_qa.retrieval import DEFAULT_MAX_PASSAGE_CHARS, check_server

__all__ = [
  "RETRIEVERS",
  "config_problems",
  "env_kwargs",
  "episode_metrics",
  "expert_records",
  "split",
  "start_check",
]

RETRIEVERS = ("bm25", "server")
DEFAULT_EXPERT_EPISODES = 100


def env_kwargs(env_cfg: Any, split_name: str) -> dict[str, Any]:
  """`envs.make("search_qa", ...)` keyword arguments of `split_name` for the ``env`` section."""
  retriever = env_cfg.get("retriever", "bm25")
  search_url = env_cfg.get("search_url")
  if retriever not in RETRIEVERS:
    raise ValueError(
      f"env.retriever={retriever!r}: unknown retriever. Fix: use one of {RETRIEVERS}."
    )
  if retriever == "server" and not search_url:
    raise ValueError(
      "env.retriever='server' needs env.search_url. Fix: set --config.env.search_url to the "
      "retrieval server's /retrieve endpoint (e.g. http://127.0.0.1:8000/retrieve)."
    )
  if retriever == "bm25" and search_url:
    raise ValueError(
      f"env.search_url={search_url!r} is set but env.retriever='bm25'. Fix: set "
      "--config.env.retriever=server to search through the server, or unset env.search_url."
    )
  sources_key = "train_sources" if split_name == "train" else "eval_sources"
  offline = env_cfg.get("offline") or {}
  kwargs = {
    "data_dir": env_cfg.get("data_dir"),
    "split": split_name,
    "data_sources": env_cfg.get(sources_key) or None,
    "topk": int(env_cfg.get("retrieval_top_k", 3)),
    "passage_format": env_cfg.get("passage_format", "verl_agent"),
    "data_seed": int(offline.get("seed", 0)),
    "index_dir": env_cfg.get("index_dir"),
    "max_passage_chars": int(env_cfg.get("search_max_passage_chars", DEFAULT_MAX_PASSAGE_CHARS)),
  }
  if retriever == "server":
    kwargs.update(
      search_url=search_url,
      server_protocol=env_cfg.get("server_protocol", "search_r1"),
      timeout_s=float(env_cfg.get("search_timeout_s", 30.0)),
      search_retries=int(env_cfg.get("search_retries", 3)),
    )
  elif env_cfg.get("corpus"):
    kwargs["corpus_path"] = env_cfg.get("corpus")
  return kwargs


def config_problems(section: Any) -> list[str]:
  """Search-QA's own keys of a run config's ``env`` section (`EnvFamily.config_problems`): the
  retrieval server's timeout and retries, the passage cut."""
  problems = []
  for key, low, strict, fix in (
    ("search_timeout_s", 0, True, "give the seconds a search may take, e.g. 30"),
    ("search_retries", 0, False, "use 0 for one attempt per search, or how many more to make"),
    ("search_max_passage_chars", 0, False, "use 0 to show whole passages, or e.g. 2000"),
  ):
    value = section.get(key, low + 1)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    whole = key == "search_timeout_s" or isinstance(value, int)
    if not number or not whole or value < low or (strict and value <= low):
      need = f"a number > {low}" if strict else f"a whole number >= {low}"
      problems.append(f"env.{key}={value!r}: must be {need}. Fix: {fix}")
  return problems


def start_check(section: Any) -> None:
  """What a run checks before anything is compiled (`EnvFamily.start_check`): with
  ``retriever="server"``, that the server at ``search_url`` answers a test query within
  ``search_timeout_s`` (`retrieval.check_server`; raises `envs.errors.EnvInputError`)."""
  if section.get("retriever", "bm25") == "server" and section.get("search_url"):
    check_server(
      section.get("search_url"),
      protocol=section.get("server_protocol", "search_r1"),
      timeout_s=float(section.get("search_timeout_s", 30.0)),
    )


def _env(env_cfg: Any, split_name: str, **extra: Any) -> SearchQAEnv:
  import envs

  return envs.make("search_qa", **env_kwargs(env_cfg, split_name), **extra)


def split(env_cfg: Any, split_name: str) -> EnvSplit:
  """The pool kwargs of `split_name` and one name per task id (the question's id).

  The questions are read (and a BM25 corpus indexed into its cache) once here, before the pool's
  workers start."""
  env = _env(env_cfg, split_name)
  names = [record.id for record in env.records]
  env.close()
  return EnvSplit(env_kwargs=env_kwargs(env_cfg, split_name), task_names=names)


def expert_records(env_cfg: Any, split_name: str) -> list[dict[str, Any]]:
  """A scripted expert on the first ``env.expert_episodes`` questions of the split: it searches
  each hop's query of a generated question (the question itself for real data, which has no hops)
  and answers with the first gold answer; only episodes that end with EM 1 within the reference's
  4 turns are kept (whatever ``env.max_turns``: a longer episode still teaches its first turns).
  Records as the warm start reads them: {"task", "task_type", "gamefile", "steps":
  [{"observation", "admissible_commands", "action"}, ...]}. (With real data the answer comes from
  the label, not from what the search returned.)"""
  wanted = int(env_cfg.get("expert_episodes", DEFAULT_EXPERT_EPISODES))
  env = _env(env_cfg, split_name, max_steps=MAX_TURNS)

  def walkthroughs() -> Iterator[tuple[int, list[str]]]:
    for task in range(min(wanted, env.num_tasks)):
      question_record = env.records[task]
      hops = (question_record.metadata or {}).get("hops") or [{"query": question_record.question}]
      if len(hops) + 1 <= MAX_TURNS:
        actions = [f"<search>{hop['query']}</search>" for hop in hops]
        yield task, [*actions, f"<answer>{question_record.golden_answers[0]}</answer>"]

  return play_walkthroughs(
    env,
    walkthroughs(),
    none_won=f"the scripted Search-QA expert answered no question of split {split_name!r} in "
    f"{MAX_TURNS} turns (env.expert_episodes={wanted})",
  )


def episode_metrics(infos: list[dict[str, Any]]) -> dict[str, float]:
  """ "em": the share of finished episodes whose answer exact-matches a gold answer (the paper's
  Search-QA column; per data source it is "<source>_success_rate")."""
  if not infos:
    return {}
  return {"em": sum(bool(i.get("won", False)) for i in infos) / len(infos)}
