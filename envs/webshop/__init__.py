"""WebShop, offline: the original's text pages, actions and reward over real or generated products.

    import envs
    env = envs.make("webshop", data_dir=None, split="train", seed=0)   # generated catalogue
    env = envs.make("webshop", data_dir="/data/webshop", split="test")  # the original's files
    obs, info = env.reset(task=0)  # "WebShop [SEP] Instruction: [SEP] i need ... [SEP] Search"
    obs, reward, done, info = env.step("search[tea tree shampoo]")
    obs, reward, done, info = env.step("click[b0abc12345]")

Public API (for the trainer, data builders and tests):

- `envs.make("webshop", data_dir=None | DIR, split="train" | "test", seed=0, max_steps=15,
  use_small=True, human_goals=False, num_products=None, data_seed=233,
  num_generated_products=1000, catalogue_seed=0, noun_extractor="auto", index_cache_dir=None)`
  -> `WebShopEnv`, a `envs.TextEnv`:
    * `reset(task)` plays goal `task` of the split (0 <= task < num_tasks; None: a seeded draw),
      returns (observation, info); `step(action)` -> (observation, reward, done, info);
    * reward 10.0 for a purchase scoring exactly 1.0, else 0.0; done at the purchase or after
      `max_steps` steps; invalid actions are no-op steps;
    * info: "won", "acc" (1.0/0.0), "task_score" and "score" (the purchase score, 0 before a
      purchase), "admissible_commands" (verl-agent's action list), "available_actions" (the
      original's dict), "task_type" (the goal's product category: beauty, electronics, ...),
      "task" (the instruction), "goal_index", "steps", "action_accepted", "truncated", and after a
      purchase "reward_info" (get_reward's verbose info) and "purchased" (asin, options);
    * `expert_action()`: a scripted oracle's next action (it reads the goal).
  `data_dir` holds items_shuffle_1000.json + items_ins_v2_1000.json (`use_small=True`) or
  items_shuffle.json + items_ins_v2.json, and items_human_ins.json for `human_goals=True`, or is
  a webshop_data tfds dataset (`python -m envs.datasets webshop`; its products and settings);
  without it a catalogue of `num_generated_products` products is generated from `catalogue_seed`.
  Split: test = goals 0-499, train = goals 500+ of the goal list shuffled with `data_seed`, the
  same for every worker whatever its `seed` (so a task id names the same goal in every process).
- `envs.webshop.reward.get_reward(purchased_product, goal, price, options, verbose=False)` ->
  score or (score, info); also `get_type_reward`, `get_attribute_reward`, `get_option_reward`.
- `envs.webshop.fuzz.token_set_ratio` (thefuzz 0.19 semantics), `envs.webshop.normalize`
  (`COLOR_SET`, `normalize_color`), `envs.webshop.nouns` (spaCy / rule-based noun extraction).
- `envs.webshop.data`: `read_data_files`, `build_catalogue(raw_products, attributes,
  human_instructions, ...)` -> `Catalogue` (products, prices, goals, search engine),
  `load_catalogue(data_dir, ...)`, `split_goal_indices(num_goals, split)`; builders that hold the
  records in another store (e.g. a tfds dataset) call `build_catalogue` on them and construct
  `WebShopEnv(catalogue, goal_indices, seed=...)` directly.
- `envs.webshop.generator`: `generate_records(num_products, seed)` (the three files' records),
  `generated_catalogue(...)`, `write_files(out_dir, ...)`; CLI
  `python -m envs.webshop.generator --out DIR`.
- `envs.webshop.search`: `SearchEngine` (bm25s), `top_n_products`.
- `envs.webshop.prompts.build_prompt(task, history, observation, admissible, step=None,
  history_length=2)`, `extract_task(first_observation)`;
  `envs.webshop.projection.project_action(text)` -> (action, format valid): the same API as
  `envs.alfworld`'s.
- Training: importing the package registers `WEBSHOP_FAMILY` (`envs.env_family("webshop")`):
  splits, oracle warm-start episodes and the "score" / "acc" metrics from `envs.webshop.family`,
  prompts, projection and skill query from `envs.webshop.adapter.WebShopAdapter`.
- Skills: `envs.skills.SkillRetriever("webshop", strategy="rules")`: the keyword rule of
  docs/reference.md §3.2 (lower-cased substring test, every matching category file) over the query,
  which should be the whole prompt text as in the reference; the mapping has no task_to_skill, so
  the task type never selects a file.

Differences from the original (WebShop at its 2024 head, as vendored and wrapped by verl-agent)
are listed in docs/environments.md: chiefly bm25s search instead of Lucene, rule-based title nouns
when spaCy's model is not installed, one goal order for every worker (`data_seed`), the done page
kept after Buy Now, and the generated catalogue.
"""

from __future__ import annotations

from collections.abc import Callable

from envs import datasets
from envs.base import EnvFamily, register, register_family
from envs.webshop import family
from envs.webshop.adapter import WebShopAdapter
from envs.webshop.data import (
  DEFAULT_DATA_SEED,
  Catalogue,
  build_catalogue,
  load_catalogue,
  split_goal_indices,
)
from envs.webshop.env import MAX_STEPS, WIN_REWARD, WebShopEnv, parse_action
from envs.webshop.generator import DEFAULT_NUM_PRODUCTS, generated_catalogue
from envs.webshop.projection import project_action, project_actions
from envs.webshop.prompts import build_prompt, extract_task
from envs.webshop.reward import get_reward

__all__ = [
  "MAX_STEPS",
  "WEBSHOP_FAMILY",
  "WIN_REWARD",
  "Catalogue",
  "WebShopAdapter",
  "WebShopEnv",
  "build_catalogue",
  "build_prompt",
  "extract_task",
  "generated_catalogue",
  "get_reward",
  "load_catalogue",
  "make_webshop",
  "parse_action",
  "project_action",
  "project_actions",
  "split_goal_indices",
]


@register("webshop")
def make_webshop(
  data_dir: str | None = None,
  split: str = "train",
  seed: int = 0,
  max_steps: int = MAX_STEPS,
  use_small: bool = True,
  human_goals: bool = False,
  num_products: int | None = None,
  data_seed: int = DEFAULT_DATA_SEED,
  num_generated_products: int = DEFAULT_NUM_PRODUCTS,
  catalogue_seed: int = 0,
  noun_extractor: str | Callable[[str], list[str]] | None = "auto",
  index_cache_dir: str | None = None,
) -> WebShopEnv:
  """A WebShopEnv on the `split` of the original files in `data_dir`, or of a generated catalogue.

  Catalogues are cached per process, so the envs of one process share products and index.
  """
  if data_dir is None:
    if num_products is not None:
      raise ValueError(
        "num_products truncates the original's product file; without data_dir set "
        "num_generated_products instead"
      )
    catalogue = generated_catalogue(num_generated_products, catalogue_seed, human_goals, data_seed)
  elif datasets.find_dataset(data_dir, datasets.WEBSHOP):  # a tfds dataset (envs.datasets)
    built = datasets.webshop_settings(data_dir)
    for name, value in (("human_goals", human_goals), ("data_seed", data_seed)):
      if built[name] != value:
        raise ValueError(
          f"{name}={value!r}, but the webshop_data dataset at {data_dir} was built with "
          f"{name}={built[name]!r}. Fix: pass {name}={built[name]!r} (env.{name}) or rebuild it "
          f"with python -m envs.datasets webshop"
        )
    catalogue = datasets.webshop_catalogue(data_dir, index_cache_dir)
  else:
    catalogue = load_catalogue(
      data_dir, use_small, human_goals, num_products, data_seed, index_cache_dir
    )
  indices = split_goal_indices(len(catalogue.goals), split)
  return WebShopEnv(
    catalogue, indices, seed=seed, max_steps=max_steps, noun_extractor=noun_extractor
  )


WEBSHOP_FAMILY = register_family(
  EnvFamily(
    name="webshop",
    split=family.split,
    adapter=WebShopAdapter,
    skills="webshop",
    expert_records=family.expert_records,
    episode_metrics=family.episode_metrics,
  )
)
