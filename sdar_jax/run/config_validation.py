"""Checks a run config before anything is built, and resolves its model.

`validate(config)` raises one `ConfigError` listing every problem ("<key>=<value>: <problem>. Fix:
<what to do>" per line); a valid config's environment then checks what it reaches outside the run
(`envs.base.env_start_check`: Search-QA's retrieval server answers a test query), raising
`envs.errors.EnvInputError`. The checks here span sections (model folder vs preset / random_init and
its files, model length and vocabulary vs rollout and tokenizer, the linked temperatures, batches
vs mesh); each component checks its own section (the configs it builds, its `setting_problems`)
and this module collects their lines. It reads config.json, safetensors headers and chat
templates; it writes nothing. Unknown keys never get here: configs are locked
(configs/common.finalize), and `sdar_jax.train` names a mistyped `--config.*` key and its closest
valid one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import jax

from envs.base import env_section_problems, env_start_check, families_among
from envs.skills.retrieval import skills_section_problems
from sdar_jax.algos import AlgoConfig
from sdar_jax.core.sampling import SamplingParams
from sdar_jax.core.sharding import batch_divisor, resolve_mesh_shape
from sdar_jax.core.train_state import make_optimizer
from sdar_jax.models import ModelConfig
from sdar_jax.rollout.batching import MINIBATCH_ORDERS
from sdar_jax.rollout.shaping import RewardShaping
from sdar_jax.run import setup as run_setup
from sdar_jax.run import warm_start
from sdar_jax.run.setup import ConfigError, model_config_from
from sdar_jax.text.chat_templates import resolve_chat_template

ENVS = ("alfworld", "webshop", "search_qa")  # the environments that have configs
IMPLEMENTED_ENVS = families_among(ENVS)  # those the host loop can run (an `envs.EnvFamily`)
SECTIONS = ("model", "algo", "mesh", "optim", "train", "rollout", "eval", "checkpoint", "logging")
SECTIONS += ("env",)  # set by the environment's config; the others by configs.common.base
OPTIONAL_SECTIONS = ("paper", "warm_start", "run")
QWEN_TOKENIZER_SIZE = 151669  # the bundled tokenizer's ids: a model it drives needs as many rows


# ------------------------------------------------------------------------------------ checks
class _Problems(list):
  """The problem lines found so far."""

  def build(self, make: Callable[..., Any], *args: Any, prefix: str = "", **kwargs: Any) -> Any:
    """make(*args, **kwargs), or None with each line of its ValueError added (after `prefix`)."""
    try:
      return make(*args, **kwargs)
    except (ValueError, TypeError, FileNotFoundError, NotImplementedError) as e:
      self.extend(prefix + line for line in str(e).splitlines())
      return None


def _check_model(config, p: _Problems) -> ModelConfig | None:
  m = config.model
  if not m.path and not m.get("random_init", False):
    p.append(
      f"model.path=None: no weights given for model.preset={m.preset!r}: the run would train "
      f"random weights. Fix: set --config.model.path to a local copy of {m.get('hf_id') or 'the model'} "
      "(config.json + *.safetensors), or --config.model.random_init=True to train from random "
      "weights on purpose"
    )
  if m.tokenizer_dir and not os.path.isdir(os.path.expanduser(m.tokenizer_dir)):
    p.append(
      f"model.tokenizer_dir={m.tokenizer_dir!r}: no such directory. Fix: point it at a folder "
      "holding tokenizer.json, or unset it"
    )
  folder = m.tokenizer_dir or m.path  # where the run reads its tokenizer and chat template
  is_dir = bool(folder) and os.path.isdir(folder)
  if is_dir and not os.path.isfile(os.path.join(folder, "tokenizer.json")):
    p.append(
      f"{'model.tokenizer_dir' if m.tokenizer_dir else 'model.path'}={folder!r}: no tokenizer.json "
      "in it (the tokenizer is read from model.tokenizer_dir, else model.path). Fix: copy the "
      "model's tokenizer files into it, or set model.tokenizer_dir to a folder that holds them"
    )
  model_config = p.build(model_config_from, config)
  if model_config is None:
    return None
  if m.path:  # complete weight files that match the model (reads the safetensors headers only)
    from sdar_jax.models.hf_io import verify_checkpoint

    try:
      verify_checkpoint(m.path, model_config)
    except (OSError, ValueError) as e:
      fix = " Fix: point model.path at a complete model directory (config.json + model.safetensors"
      fix = "" if "Fix:" in str(e) else fix + ", or the sharded index and all its shards)."
      p.append(f"model.path={m.path!r}: the weights cannot be used: {e}{fix}")
  template = p.build(
    resolve_chat_template, m.chat_template, folder if is_dir else None, model_config.family
  )
  if template is not None:  # rendered once now, as every prompt will be (the sandbox's refusals)
    probe = [{"role": "system", "content": "Act."}, {"role": "user", "content": "Go."}]
    p.build(template.render, probe, prefix=f"model.chat_template={m.chat_template!r}: ")
  tokenizer_json = os.path.join(folder, "tokenizer.json") if is_dir else ""
  if tokenizer_json and os.path.isfile(tokenizer_json):
    ids = _tokenizer_ids(tokenizer_json)
    if ids is not None and ids > model_config.vocab_size:
      p.append(
        f"{'model.tokenizer_dir' if m.tokenizer_dir else 'model.path'}={folder!r}: its tokenizer "
        f"has ids up to {ids - 1}, beyond the model's {model_config.vocab_size} embeddings (the "
        "first sampled such id would index past them). Fix: use the tokenizer the model was "
        "trained with, or a model whose vocab_size covers it"
      )
  if not m.path and not m.tokenizer_dir and model_config.vocab_size < QWEN_TOKENIZER_SIZE:
    p.append(
      f"{'model.tiny.vocab_size' if m.preset == 'tiny' else 'model.preset'}="
      f"{model_config.vocab_size}: fewer embeddings than the {QWEN_TOKENIZER_SIZE} ids of the "
      f"bundled Qwen tokenizer. Fix: use a vocab_size >= {QWEN_TOKENIZER_SIZE} or set "
      "model.tokenizer_dir to a smaller tokenizer"
    )
  r, limit = config.rollout, model_config.max_position_embeddings
  lengths = (r.max_prompt_len, r.max_new_tokens)
  if all(isinstance(n, int) for n in lengths) and sum(lengths) > limit:
    p.append(
      f"rollout.max_prompt_len={r.max_prompt_len}: max_prompt_len + max_new_tokens = "
      f"{sum(lengths)} exceeds the model's max_position_embeddings={limit}. Fix: shorten the "
      "prompt or the responses"
    )
  return model_config


def _tokenizer_ids(path: str) -> int | None:
  """One past the largest id of a tokenizer.json (its vocabulary and added tokens); None when the
  file cannot be read as one (the tokenizer's own loading then says why)."""
  try:
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(path).get_vocab(with_added_tokens=True)
  except Exception:  # noqa: BLE001 - reported where the tokenizer is loaded
    return None
  return max(vocab.values()) + 1 if vocab else None


def _check_finite(node: Any, p: _Problems, prefix: str = "") -> None:
  """Every float of the config (nested sections, lists) is finite: an inf or a nan passes every
  range check written as a comparison and then makes every update non-finite."""
  for key, value in node.items():
    name = f"{prefix}{key}"
    if hasattr(value, "items"):
      _check_finite(value, p, name + ".")
      continue
    for item in value if isinstance(value, (list, tuple)) else (value,):
      if isinstance(item, float) and not math.isfinite(item):
        p.append(f"{name}={value!r}: not a finite number. Fix: give a finite value")
        break


def _check_group(config, p: _Problems) -> None:
  """Group-relative advantages need a group: with one episode per task each is its own
  baseline and every policy-gradient advantage is 0."""
  group, pg = config.env.get("group_size"), config.algo.get("pg_coef", 1.0)
  if group == 1 and isinstance(pg, (int, float)) and pg != 0:
    p.append(
      f"env.group_size=1: algo.advantage={config.algo.get('advantage', 'grpo')!r} compares each "
      "episode with the others of its task's group, so with one per task every advantage is 0 and "
      "the policy gradient trains nothing. Fix: env.group_size >= 2 (the reference runs 8), or "
      "algo.pg_coef=0 for distillation alone"
    )


def _check_temperatures(config, p: _Problems) -> None:
  """Tokens are scored (algo.temperature) at the temperature they were sampled at."""
  sampled, scored = config.rollout.temperature, config.algo.temperature
  if not (isinstance(sampled, (int, float)) and sampled > 0):
    p.append(
      f"rollout.temperature={sampled!r}: training rollouts must sample (> 0); their log-probs "
      "divide by it. Fix: use 1.0 (the reference); greedy decoding is for evaluation: "
      "rollout.val_temperature=0"
    )
  elif scored != sampled:
    p.append(
      f"algo.temperature={scored!r}: differs from rollout.temperature={sampled!r}: tokens must be "
      "scored at the temperature they were sampled at. Fix: set only rollout.temperature"
    )


def _check_batches(config, num_devices: int, p: _Problems) -> None:
  """Every batch splits evenly over the mesh's batch shards."""
  t, env = config.train, config.env
  order = t.get("minibatch_order", "rollout")
  if order not in MINIBATCH_ORDERS:
    p.append(
      f"train.minibatch_order={order!r}: unknown. Fix: use one of {list(MINIBATCH_ORDERS)} "
      "('length' groups samples of similar length: less padding, the same samples)"
    )
  cache = t.get("xla_cache_dir", "")
  if not isinstance(cache, str):
    p.append(
      f"train.xla_cache_dir={cache!r}: must be a folder path (str). Fix: give a path such as "
      "~/.cache/sdar_jax/xla, or '' to compile every run afresh"
    )
  shape = p.build(resolve_mesh_shape, config.mesh, num_devices)
  sizes = (t.mini_batch_size, t.micro_batch_size, env.tasks_per_iteration, env.group_size)
  if shape is None or not all(isinstance(n, int) and n >= 1 for n in sizes):
    return
  divisor = batch_divisor(shape)
  where = f"data x fsdp = {shape['data']} x {shape['fsdp']} = {divisor}"
  mini, micro, tasks, group = sizes
  if mini % micro:
    p.append(
      f"train.mini_batch_size={mini}: not divisible by train.micro_batch_size={micro}. Fix: make "
      "mini_batch_size a multiple of micro_batch_size"
    )
  if micro % divisor:
    p.append(
      f"train.micro_batch_size={micro}: not divisible by the mesh's batch shards ({where}). Fix: "
      f"use a multiple of {divisor}, or change the mesh"
    )
  if (tasks * group) % divisor:
    p.append(
      f"env.tasks_per_iteration={tasks}: tasks_per_iteration x group_size = {tasks} x {group} = "
      f"{tasks * group} episodes per step do not divide over the mesh's batch shards ({where}). "
      f"Fix: make tasks_per_iteration x group_size a multiple of {divisor}, or change the mesh"
    )


# ------------------------------------------------------------------------------------ entry
def validate(config: Any, num_devices: int | None = None) -> ModelConfig:
  """Raises ConfigError listing every problem of `config`; returns the resolved ModelConfig.
  `num_devices` defaults to `jax.device_count()` (all devices of all hosts)."""
  missing = [s for s in SECTIONS if s not in config]
  unknown = sorted(set(config) - set(SECTIONS) - set(OPTIONAL_SECTIONS))
  if missing or unknown:
    raise ConfigError(
      f"config sections: missing {missing}, unknown {unknown}. Fix: build the config with "
      f"configs.common.base(...) and set config.env; sections are {SECTIONS + OPTIONAL_SECTIONS}."
    )
  p = _Problems()
  _check_finite(config, p)
  model_config = _check_model(config, p)
  p.build(AlgoConfig.from_config, config.algo)
  p.build(RewardShaping.from_config, config.rollout.get("shaping"))
  p.build(make_optimizer, **dict(config.optim))
  r = config.rollout  # the training sampler, and the validation one (val_temperature)
  p.build(SamplingParams, top_p=r.top_p, top_k=r.top_k, prefix="rollout.")
  p.build(SamplingParams, temperature=r.val_temperature, prefix="rollout.val_")
  _check_temperatures(config, p)
  _check_group(config, p)
  _check_batches(config, jax.device_count() if num_devices is None else num_devices, p)
  p.extend(run_setup.setting_problems(config))
  p.extend(env_section_problems(config.env, ENVS))
  p.extend(skills_section_problems(config.env.skills))
  if "warm_start" in config:
    p.extend(warm_start.setting_problems(config.warm_start))
  if p:
    raise ConfigError(f"{len(p)} problem(s) in the config:\n  - " + "\n  - ".join(p))
  assert model_config is not None
  env_start_check(config.env)  # what the env reaches (a retrieval server): EnvInputError
  return model_config
