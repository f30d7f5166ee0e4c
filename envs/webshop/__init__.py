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
  items_shuffle.json + items_ins_v2.json, and items_human_ins.json for `human_goals=True`;
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
- Skills: `envs.skills.SkillRetriever("webshop", strategy="rules")`: the keyword rule of
  docs/reference.md §3.2 (lower-cased substring test, every matching category file) over the query,
  which should be the whole prompt text as in the reference; the mapping has no task_to_skill, so
  the task type never selects a file.

Differences from the original (WebShop at its 2024 head, as vendored and wrapped by verl-agent):
- Search is BM25 from bm25s with pyserini's k1 0.9, b 0.4 and a Lucene-like English analysis
  (our Porter stemmer, Lucene's stop words, "'s" dropped, a simpler tokenizer than Lucene's) over
  the loaded products, so rankings can differ from the Lucene index; equal scores keep catalogue
  order. The original searches an index built at setup and keeps the hits among loaded products.
- "<a> attribute" searches work (the original text env passes no attribute table and fails);
  "<r>" draws from the env's seeded generator instead of the global one.
- Title nouns come from spaCy's en_core_web_sm only when it is installed; otherwise from the
  documented rule in `envs.webshop.nouns`, which can give other title scores.
- Prices, price bounds and the goal shuffle use one `data_seed` (233, upstream's shuffle seed) for
  every env; verl-agent seeds them per worker, so there the same goal index names different goals
  on different workers. `reset()` without a task draws uniformly from the split (verl-agent: a
  seeded draw of distinct indices per batch; upstream: weighted by goal weight).
- After Buy Now the env stays on the done page with no actions (verl-agent's copy starts a new
  random session and reports its search page's actions); the episode also reports done at the
  15-step limit (verl-agent's loop just stops stepping it).
- Only the "text" observation mode; no show_attrs page, no num_prev_obs/num_prev_actions. Pages
  are tracked by state, not inferred from a URL that embeds the search keywords.
- Loading is lenient where the original crashes: a product missing from the attribute file has
  no goal (KeyError there), items_human_ins.json is needed only with human_goals, a product
  without images has MainImage None; an unreadable price or price_upper <= 0 raises ValueError.
- `get_reward` takes `verbose` as a parameter (the original reads it from **kwargs) and an extra
  keyword-only `noun_extractor`. Fuzzy matching re-implements thefuzz 0.19 (difflib), not a
  stand-in.
- The offline catalogue is ours, not WebShop's data; it leaves out option values that could not
  match themselves under the reward's colour rule, so every generated goal can score 1.0.
- The projection looks for "</action>" after "<action>" (see `envs.webshop.projection`).
"""

from __future__ import annotations

from collections.abc import Callable

from envs.base import register
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
  "WIN_REWARD",
  "Catalogue",
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
  else:
    catalogue = load_catalogue(
      data_dir, use_small, human_goals, num_products, data_seed, index_cache_dir
    )
  indices = split_goal_indices(len(catalogue.goals), split)
  return WebShopEnv(
    catalogue, indices, seed=seed, max_steps=max_steps, noun_extractor=noun_extractor
  )
