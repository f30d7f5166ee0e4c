r"""Building blocks shared by every config file (big_vision style: configs are code).

A config file's `get_config(arg)` reads a short "key=value,..." argument with `parse_arg`, starts
from `base(model)`, sets `config.env` with one of `alfworld()`, `webshop()`, `search_qa()`,
`config.algo` with `algo(name)`, applies the environment's differences from the defaults, optionally
`override(config, local_overrides(env))`, and returns `finalize(config)` (links shared values, locks
the config so a misspelled key fails in code and on the command line).

Every default cites the reference scripts (docs/reference.md §6); sizes of the mini / micro batches are in
turn-samples over the whole mesh.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections as mlc
from ml_collections import config_dict

from configs import models
from sdar_jax import config_keys
from sdar_jax.algos import PRESET_RUN_SETTINGS, get_preset
from sdar_jax.rollout.shaping import RewardShaping

ENVS = ("alfworld", "webshop", "search_qa")


# ------------------------------------------------------------------------------------ arguments
def _literal(raw: str) -> Any:
  """'True'/'false' -> bool, 'None' -> None, ints, floats, else the string itself."""
  low = raw.lower()
  if low in ("true", "false"):
    return low == "true"
  if low == "none":
    return None
  for cast in (int, float):
    try:
      return cast(raw)
    except ValueError:
      pass
  return raw


def parse_arg(arg: str | None, **defaults: Any) -> mlc.ConfigDict:
  """Parses a config argument "model=qwen2.5-3b,algo=sdar,local=True" into a locked ConfigDict.

  With `defaults`, only those keys are accepted and each value is converted to its default's type
  (a bare key means True). Without defaults every value is typed by `_literal`.
  """
  values: dict[str, Any] = dict(defaults)
  for item in filter(None, (p.strip() for p in (arg or "").split(","))):
    key, sep, raw = item.partition("=")
    key, raw = key.strip(), raw.strip()
    if defaults and key not in defaults:
      raise ValueError(
        f"unknown config argument {key!r} in {arg!r}; valid arguments: "
        f"{sorted(defaults)} (e.g. {','.join(f'{k}={v}' for k, v in defaults.items())})"
      )
    value: Any = _literal(raw) if sep else True
    default = defaults.get(key)
    if isinstance(default, bool):
      if not isinstance(value, bool):
        raise ValueError(f"config argument {key}={raw!r} must be True or False")
    elif isinstance(default, str):
      value = raw
    elif isinstance(default, (int, float)) and not isinstance(value, (int, float)):
      raise ValueError(f"config argument {key}={raw!r} must be a number")
    elif isinstance(default, float):
      value = float(value)
    values[key] = value
  parsed = mlc.ConfigDict(values)
  parsed.lock()
  return parsed


# ------------------------------------------------------------------------------------ sections
def algo(name: str) -> mlc.ConfigDict:
  """The `config.algo` section: every field of `sdar_jax.algos.AlgoConfig` (each documented there)
  with the values of preset `name` (sdar_jax.algos.ALGO_PRESETS). `finalize` links its
  temperature to rollout.temperature (tokens are scored at the temperature they were sampled at)."""
  fields = dataclasses.asdict(get_preset(name))
  if fields["teacher"] is None:  # unset (follows the terms) but still a bool on the command line
    fields["teacher"] = config_dict.placeholder(bool)
  return mlc.ConfigDict(fields)


def base(model: str = "qwen2.5-3b", algo_name: str = "sdar") -> mlc.ConfigDict:
  """Everything but the environment: model, mesh, optimizer, training loop, rollout, eval,
  checkpoints, logging and the algorithm (reference defaults), with what the preset sets outside
  `algo` (`algos.PRESET_RUN_SETTINGS`)."""
  config = mlc.ConfigDict()
  config.model = models.model(model)
  config.algo = algo(algo_name)
  # ('data', 'fsdp', 'tensor'); one axis may be -1 = all remaining devices. The batch is sharded
  # over data x fsdp, so every batch size must divide by that product.
  config.mesh = mlc.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  config.optim = mlc.ConfigDict(
    dict(  # AdamW, docs/reference.md §1.3
      lr=1e-6, warmup_iterations=0, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01, clip_norm=1.0
    )
  )
  config.train = mlc.ConfigDict(
    dict(
      iterations=150,  # rollouts, each with its updates (reference: 150 epochs x 1 step)
      mini_batch_size=256,  # turn-samples per optimizer update (ppo_mini_batch_size)
      micro_batch_size=32,  # turn-samples per forward/backward (memory knob; same result)
      # mini-batches filled in rollout order (the reference) or "length" order (similar lengths
      # together: less padding, same samples; sdar_jax.rollout.batching.minibatch_permutation)
      minibatch_order="rollout",
      seed=0,
      eval_every=5,  # 0 = never
      eval_before_train=True,
      max_staleness=0,  # 0 = synchronous on-policy (the paper); >0 = async with bounded staleness
      max_failed_iterations=3,  # stop (non-zero exit) when every env fails this many in a row
      # stop when this many updates in a row were skipped for a non-finite loss or gradient
      # (the state and the last checkpoint stay as they were, nothing is exported); 0 = never
      max_skipped_updates=3,
      # a folder (local or gs://) where XLA keeps compiled programs between runs, so a rerun, a
      # resumed run or a sweep's next run of the same shapes loads them instead of compiling;
      # "" = off (JAX's default). Use a folder local to one machine type.
      xla_cache_dir="",
    )
  )
  config.warm_start = mlc.ConfigDict(
    dict(  # expert SFT before RL (sdar_jax/run/warm_start.py)
      steps=0,  # supervised updates; 0 = off (the reference starts from instruction-tuned checkpoints)
      lr=1e-5,
      batch_size=16,
      split="train",  # walkthroughs/<split>.jsonl of the (generated) data directory
      # "walkthroughs": imitate the planner's oracle walkthroughs; "expert": a search expert that
      # sees only observations (envs/alfworld/expert.py), played with and without the skill block
      # so the model learns to read skills (skill-following turns get the teacher's prompt).
      source="walkthroughs",
      expert_games=0,  # games played per mode (0 = every train game once)
      expert_epsilon=0.0,  # share of random actions (context, not targets)
      expert_invalid_share=0.0,  # share of those random actions that are inadmissible commands
      expert_search_order="shuffled",  # knowledge-free order: "shuffled" | "room" (description order)
      expert_holdout=0.1,  # share of games held out to measure the teacher-student gap before RL
      contexts="",  # other teacher context blocks taught too: "sibling", "hindsight" (expert source)
      measure=False,  # with steps=0: measure the starting policy's gaps, train nothing
      memory="",  # a run's skill_memory.json: the memory measured for contexts "skill_memory"
    )
  )
  config.rollout = mlc.ConfigDict(
    dict(
      temperature=1.0,
      top_p=1.0,
      top_k=0,  # top_k 0 = off
      max_new_tokens=512,  # per turn (max_response_length)
      max_prompt_len=2048,
      prompt_truncation="error",  # "error" | "left" (keep the last max_prompt_len tokens)
      val_temperature=0.4,  # 0 = greedy
      # A sampler call of more than 256 rows (a large evaluation) runs at the next multiple of
      # row_step where that is fewer rows than the next power of two (640 games: 640 rows at 64,
      # not 1,024); 0: powers of two. Other row counts move log-probs in their last bits.
      row_step=0,
      # "off": every env steps, then the whole batch decodes; "halves": one half of the episodes
      # decodes while the other half's envs step (the same episodes; sdar_jax.rollout.agent_loop)
      overlap="off",
      # how an episode's outcome becomes its turns' advantages (sdar_jax.rollout.shaping, each
      # key documented there): GRPO's normalisation, penalties, GiGPO's step-level advantage
      shaping=dataclasses.asdict(RewardShaping()),
    )
  )
  config.eval = mlc.ConfigDict(
    dict(
      num_tasks=128,  # validation episodes (val_batch_size), group size 1; -1: the whole split
      # Episodes played at once (0: all of them); a larger evaluation plays in batches of this
      # size, its rates over all episodes (never a mean of the batches' rates).
      batch_size=0,
      repeats=1,  # each task played k times with other sampling keys: the mean (avg@k) and spread
      split="valid_seen",
      # Validation splits besides eval.split, comma-separated (ALFWorld: "valid_unseen"): each
      # under its own prefix (val_unseen/...); eval.split stays under val/.
      splits="",
      skills="without",  # "without" | "with" | "both": skills in the student prompt at eval
      # Validation sampling keys: a function of (eval.seed, eval mode, episode, turn) only, the
      # same at every evaluation of a run and for every train.seed (common random numbers: the
      # change between two evaluations is the policy's, not a new draw's).
      seed=0,
      # Whose stream an episode's draws are within a turn: "rank" (its rank among the episodes
      # still playing) or "task" (its game: two policies on one panel share their draws for as
      # long as their actions agree; common random numbers for comparing arms).
      streams="rank",
      # Evaluation-only runs (sdar_jax.evaluate): an eval mode that lost more episodes than this
      # to env failures (an env that raised or hung, a worker that died) is not recorded as
      # finished, and the run exits with an error once the other modes are played (run the same
      # command again: it plays only the unfinished modes); -1 accepts any number. A training
      # run's evaluations count them in <prefix>/env_failures and go on.
      max_env_failures=0,
    )
  )
  config.checkpoint = mlc.ConfigDict(
    dict(
      dir=config_dict.placeholder(str),  # default: <workdir>/checkpoints
      keep=3,
      every=10,  # iterations between saves; 0 = save only at the end (the last one is always saved)
      async_save=True,
      export_hf=True,  # write the final policy as Hugging Face safetensors
    )
  )
  # what the run is called where runs are compared: `python -m sdar_jax.compare` and the
  # experiments pair runs by this label ("" = the algorithm's name, algo.name)
  config.run = mlc.ConfigDict(dict(arm=""))
  config.logging = mlc.ConfigDict(
    dict(
      dir=config_dict.placeholder(str),  # default: <workdir>
      every=1,  # write a metrics row every N iterations (and at evaluations and the last one)
      jsonl=True,
      tensorboard=True,
      plots=True,
      # metrics.png and the gate histograms' PNGs are drawn again at most every this many seconds
      # (and always at an evaluation and at the last iteration); 0: at every logged iteration
      plot_every_s=120.0,
      # Weights & Biases (the optional extra: pip install -e '.[wandb]'): every metrics row, the
      # run config as W&B config; a resumed run continues the W&B run whose id <workdir>/wandb_run_id
      # keeps. Only process 0 logs.
      wandb=False,
      wandb_project="sdar-jax",
      wandb_entity=config_dict.placeholder(str),  # default: the W&B account's default entity
      wandb_name=config_dict.placeholder(str),  # default: the workdir's folder name
      wandb_tags="",  # comma-separated: "sdar,beta5"
      wandb_mode=config_dict.placeholder(str),  # "online" | "offline" | "disabled"; default: W&B's
    )
  )
  # what the preset sets outside `algo` (UCOB: GiGPO's advantages in rollout.shaping)
  return override(config, PRESET_RUN_SETTINGS.get(algo_name, {}))


def _skills(rules_version: str = "post_fix") -> mlc.ConfigDict:
  """Teacher skill retrieval (envs.skills.SkillRetriever). rules_version "pre_fix" = general
  skills only, what the paper ran for ALFWorld/WebShop; "post_fix" = after the authors' fix."""
  return mlc.ConfigDict(
    dict(
      strategy="rules",  # "rules" | "bm25" | "random" | "none"
      rules_version=rules_version,
      top_k=5,  # bm25 / random
      seed=0,
      places="all",  # "all" | "task": "Places by type:" lists cut to the task's objects
      dir=config_dict.placeholder(str),  # default: the skills shipped in envs/skills/<env>
    )
  )


def _env(
  name: str, history: int, max_turns: int, group_size: int, tasks_per_iteration: int, **extra: Any
) -> mlc.ConfigDict:
  section = mlc.ConfigDict(
    dict(
      name=name,
      data_dir=config_dict.placeholder(str),  # None = offline generated data
      history=history,  # (observation, action) pairs shown in the prompt
      max_turns=max_turns,
      group_size=group_size,  # GRPO group: episodes per task
      tasks_per_iteration=tasks_per_iteration,  # distinct tasks per training iteration
      num_workers=8,  # env processes; 0 plays the envs in the trainer's process (no isolation)
      seed=0,
      skills=_skills(),
      # a template file for the per-turn prompt (envs/prompt_template.py), e.g. the authors' text;
      # None: the environment's built-in prompts
      prompt_template=config_dict.placeholder(str),
      offline=mlc.ConfigDict(dict(num_train=50, num_eval=24, seed=0)),
    )
  )
  for key, value in extra.items():
    section[key] = value
  return section


def alfworld(
  history: int = 2, max_turns: int = 50, group_size: int = 8, tasks_per_iteration: int = 16
) -> mlc.ConfigDict:
  """ALFWorld text games (docs/reference.md §6.1). offline.num_train / num_eval are games per task
  type; task_types is "all" or a comma-separated subset of envs.alfworld.TASK_TYPES;
  offline.rooms is "full" (the catalog's room sizes) or "small" (one receptacle per class)."""
  section = _env(
    "alfworld", history, max_turns, group_size, tasks_per_iteration, split="train", task_types="all"
  )
  section.offline.rooms = "full"
  # Held-out panels (eval splits heldout_seen / heldout_unseen): fresh games per task type, drawn
  # with another generator seed, in a cache folder of their own (the other splits are unchanged).
  section.offline.num_heldout = 0
  section.offline.heldout_seed = 1
  return section


def webshop(
  history: int = 2, max_turns: int = 15, group_size: int = 8, tasks_per_iteration: int = 16
) -> mlc.ConfigDict:
  """WebShop (docs/reference.md §6.2): the small catalogue, synthetic goals; eval on goals < 500.

  data_dir None plays a generated catalogue of `num_products` products (seed offline.seed;
  offline.num_train / num_eval are not used: the split is the original's, test = goals 0-499).
  envs/webshop/family.py reads these keys."""
  return _env(
    "webshop",
    history,
    max_turns,
    group_size,
    tasks_per_iteration,
    use_small=True,  # items_shuffle_1000.json / items_ins_v2_1000.json (verl-agent's default)
    human_goals=False,  # synthetic goals (verl-agent's default)
    num_products=1000,  # generated catalogue size (data_dir None)
    data_seed=233,  # prices, price bounds and the goal shuffle (the original's shuffle seed)
    noun_extractor="auto",  # reward title nouns: spaCy en_core_web_sm if installed, else rules
    index_dir=config_dict.placeholder(str),  # bm25s index cache of a real catalogue
    expert_episodes=100,  # oracle episodes for warm_start.source="walkthroughs"
  )


def search_qa(
  history: int = 4, max_turns: int = 4, group_size: int = 8, tasks_per_iteration: int = 128
) -> mlc.ConfigDict:
  """Search-R1 QA (docs/reference.md §6.3): train on NQ + HotpotQA, BM25 top-3 passages per search.

  data_dir None plays the generated world of seed offline.seed (offline.num_train / num_eval are
  not used). envs/search_qa/family.py reads these keys."""
  return _env(
    "search_qa",
    history,
    max_turns,
    group_size,
    tasks_per_iteration,
    train_sources="nq,hotpotqa",  # data sources of the "train" split
    eval_sources="nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,musique,bamboogle",  # other splits
    retriever="bm25",  # "bm25" (corpus) | "server" (a Search-R1 retrieval server at search_url)
    retrieval_top_k=3,
    corpus=config_dict.placeholder(str),  # wiki-18 style .jsonl; None = data_dir's or generated
    search_url=config_dict.placeholder(str),  # e.g. http://127.0.0.1:8000/retrieve
    server_protocol="search_r1",  # "search_r1" {"queries": [...]} | "verl_agent" {"query": q}
    # the server must answer a test query at start; each search then waits up to
    # search_timeout_s, and a failed one is tried search_retries more times (verl-agent: 60 s x
    # 10 attempts); what still fails is counted in rollout/search_errors
    search_timeout_s=30.0,
    search_retries=3,
    search_max_passage_chars=2000,  # characters of a passage shown (the cut marked); 0 = whole
    passage_format="verl_agent",  # "verl_agent" JSON | "search_r1" Doc i(Title: ...)
    index_dir=config_dict.placeholder(str),  # BM25 index cache (default ~/.cache/sdar_jax)
    expert_episodes=100,  # scripted expert episodes for warm_start.source="walkthroughs"
  )


# ------------------------------------------------------------------------------------ overrides
def override(config: mlc.ConfigDict, values: Mapping[str, Any]) -> mlc.ConfigDict:
  """Sets dotted keys ("algo.beta": 2.0), as sweeps and `local_overrides` do; an unknown key is an
  error naming it and the valid keys at that level."""
  for dotted, value in values.items():
    moved = config_keys.renamed_problem(dotted, value)
    if moved:
      raise KeyError(f"config key {moved}")
    node = config
    *parents, leaf = dotted.split(".")
    for i, key in enumerate(parents):
      if key not in node or not isinstance(node[key], mlc.ConfigDict):
        raise KeyError(
          f"unknown config key {dotted!r}: {'.'.join(parents[: i + 1])!r} is not a "
          f"section; sections here: {sorted(k for k in node if isinstance(node[k], mlc.ConfigDict))}"
        )
      node = node[key]
    if leaf not in node:
      raise KeyError(
        f"unknown config key {dotted!r}; valid keys of "
        f"{'.'.join(parents) or 'config'}: {sorted(node)}"
      )
    node[leaf] = value
  return config


_LOCAL_TURNS = {"alfworld": 6, "webshop": 6, "search_qa": 4}


def local_overrides(env: str) -> dict[str, Any]:
  """The same experiment shrunk to a 2-core CPU: the tiny model, 2 tasks x 4 episodes, short
  turns, a handful of iterations. Keys are dotted paths for `override`."""
  if env not in ENVS:
    raise ValueError(f"unknown env {env!r}; valid envs: {ENVS}")
  return {
    "model.preset": "tiny",
    "model.random_init": True,  # the tiny model has no published weights
    "model.dtype": "float32",
    "model.remat": False,
    "env.tasks_per_iteration": 2,
    "env.group_size": 4,
    "env.max_turns": _LOCAL_TURNS[env],
    "env.num_workers": 2,
    "env.offline.num_train": 4,
    "env.offline.num_eval": 2,
    "env.skills.rules_version": "pre_fix",  # general skills: what the paper ran, shorter prompts
    "eval.num_tasks": 4,
    "rollout.max_new_tokens": 48,
    "train.iterations": 3,
    "train.mini_batch_size": 24,
    "train.micro_batch_size": 8,
    "train.eval_every": 3,
    # A random tiny model never wins, so GRPO would see no reward: a short expert warm start
    # on the generated games' walkthroughs gives it the format and some first moves.
    "warm_start.steps": 80,
    "warm_start.lr": 4e-3,
    "warm_start.batch_size": 8,
    "checkpoint.every": 1,  # a stopped run resumes from its last iteration (a tiny checkpoint)
    "checkpoint.async_save": False,
    "logging.tensorboard": False,
  }


def gate_sweep() -> list[dict[str, Any]]:
  """β x λ x gate grid around the SDAR defaults (β 5, λ 0.01, gap gate): the three β-dependent
  gates at 4 β x 3 λ, the constant gate (which ignores β) at each λ once: 36 + 3 = 39 runs (the
  paper's literal entropy_paper / soft_or_paper gates and the ln V "_lnv" gates are left out)."""
  grid = [
    {"algo.beta": b, "algo.lam": lam, "algo.gate": g}
    for b in (1.0, 2.5, 5.0, 10.0)
    for lam in (0.001, 0.01, 0.1)
    for g in ("gap", "entropy", "soft_or")
  ]
  return grid + [{"algo.lam": lam, "algo.gate": "constant"} for lam in (0.001, 0.01, 0.1)]


def finalize(config: mlc.ConfigDict) -> mlc.ConfigDict:
  """Links values that must agree and locks the config (new keys become errors; existing keys,
  including command-line overrides, stay settable)."""
  config.algo.temperature = config.rollout.get_ref("temperature")
  config.lock()
  return config
