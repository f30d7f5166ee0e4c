"""How a training run uses WebShop: a split's pool kwargs and goal names, the oracle's expert
episodes for the warm start, and the "score" / "acc" metrics (the pieces of its `EnvFamily`).

The run config's ``env`` section (configs/common.webshop) gives:
- ``data_dir``: a folder with the original's files (items_shuffle_1000.json, items_ins_v2_1000.json,
  ...; `envs.webshop.data`) or a tfds dataset built from them (`envs.datasets`); None: the
  generated catalogue of ``num_products`` products from seed ``offline.seed``;
- ``use_small``, ``human_goals``, ``data_seed`` (prices, price bounds, goal shuffle),
  ``noun_extractor`` (title nouns of the reward), ``index_dir`` (bm25s index cache of real data);
- ``expert_episodes``: oracle episodes the warm start imitates (goals 0.. of the split).
Splits are the original's: test = goals 0-499, train = goals 500 onwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from envs.base import EnvSplit, play_walkthroughs
from envs.webshop.data import DEFAULT_DATA_SEED
from envs.webshop.env import MAX_STEPS, WebShopEnv
from envs.webshop.generator import DEFAULT_NUM_PRODUCTS

__all__ = ["env_kwargs", "episode_metrics", "expert_records", "split"]

DEFAULT_EXPERT_EPISODES = 100


def env_kwargs(env_cfg: Any, split_name: str) -> dict[str, Any]:
  """`envs.make("webshop", ...)` keyword arguments of `split_name` for the ``env`` section."""
  offline = env_cfg.get("offline") or {}
  return {
    "data_dir": env_cfg.get("data_dir"),
    "split": split_name,
    "use_small": bool(env_cfg.get("use_small", True)),
    "human_goals": bool(env_cfg.get("human_goals", False)),
    "data_seed": int(env_cfg.get("data_seed", DEFAULT_DATA_SEED)),
    "num_generated_products": int(env_cfg.get("num_products", DEFAULT_NUM_PRODUCTS)),
    "catalogue_seed": int(offline.get("seed", 0)),
    "noun_extractor": env_cfg.get("noun_extractor", "auto"),
    "index_cache_dir": env_cfg.get("index_dir"),
  }


def _env(env_cfg: Any, split_name: str, **extra: Any) -> WebShopEnv:
  import envs

  return envs.make("webshop", **env_kwargs(env_cfg, split_name), **extra)


def split(env_cfg: Any, split_name: str) -> EnvSplit:
  """The pool kwargs of `split_name` and one name per task id ("goal_<catalogue index>")."""
  env = _env(env_cfg, split_name)
  names = [f"goal_{index}" for index in env.goal_indices]
  env.close()
  return EnvSplit(env_kwargs=env_kwargs(env_cfg, split_name), task_names=names)


def expert_records(env_cfg: Any, split_name: str) -> list[dict[str, Any]]:
  """The scripted oracle (`WebShopEnv.expert_action`: search the product's name, open it, choose
  the goal's options, buy) on goals 0.. of the split, ``env.expert_episodes`` of them; only
  purchases scoring 1.0 within the reference's 15 steps are kept (whatever ``env.max_turns``: a
  longer walkthrough still teaches its first moves). Records as the warm start reads
  them: {"task", "task_type", "gamefile", "steps": [{"observation", "admissible_commands",
  "action"}, ...]}."""
  wanted = int(env_cfg.get("expert_episodes", DEFAULT_EXPERT_EPISODES))
  env = _env(env_cfg, split_name, max_steps=MAX_STEPS)
  return play_walkthroughs(
    env,
    ((task, _oracle_actions(env)) for task in range(min(wanted, env.num_tasks))),
    none_won=f"the WebShop oracle bought no goal of split {split_name!r} at score 1.0 in "
    f"{MAX_STEPS} steps (env.expert_episodes={wanted})",
  )


def _oracle_actions(env: WebShopEnv) -> Iterator[str]:
  """The oracle's action for the env's current state, for as long as the episode runs."""
  while True:
    yield env.expert_action()


def episode_metrics(infos: list[dict[str, Any]]) -> dict[str, float]:
  """The paper's WebShop columns over finished episodes: "score" (mean purchase score, 0 without a
  purchase: verl-agent's task_score) and "acc" (share of purchases scoring 1.0)."""
  if not infos:
    return {}
  return {
    "score": sum(float(i.get("task_score", 0.0)) for i in infos) / len(infos),
    "acc": sum(bool(i.get("won", False)) for i in infos) / len(infos),
  }
