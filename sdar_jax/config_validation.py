"""Checks a run config before anything is built, and resolves its model and mesh.

`validate(config)` collects every problem (unknown names, impossible values, batches that do not
divide over the mesh, a mesh that does not match the devices, a model without weights or with
incomplete weight files, options that are not implemented yet) and raises one `ConfigError` listing
them, each as "<key>=<value>: <problem>. Fix: <what to do>". It reads nothing but config.json and
the safetensors headers, and writes nothing. Unknown keys are caught earlier: the configs are
locked (configs/common.finalize), so `--config.algo.betta=2` or `config.algo.betta = 2` fails
naming the key.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Mapping

import jax

from sdar_jax.algos import (
  ADVANTAGE_ESTIMATORS,
  AGG_MODES,
  DISTILL_LOSSES,
  GATES,
  KL_PENALTIES,
  PRESET_KEYS,
  SDAR_FORMS,
)
from sdar_jax.chat_templates import CHAT_TEMPLATE_SETTINGS
from sdar_jax.models import ModelConfig
from sdar_jax.models.config import DTYPES
from sdar_jax.sharding import DEFAULT_RULES, MESH_AXES

__all__ = [
  "ConfigError",
  "validate",
  "model_config_from",
  "mesh_shape",
  "batch_divisor_of",
  "ALGO_KEYS",
  "ENVS",
  "IMPLEMENTED_ENVS",
  "TEACHER_SOURCES",
  "check_weight_files",
]

ENVS = ("alfworld", "webshop", "search_qa")
# Environments the host loop runs; the others have configs (their keys stay) but no environment yet.
IMPLEMENTED_ENVS = ("alfworld",)
TEACHER_SOURCES = ("step", "rollout")
TRUNCATIONS = ("error", "left")
EVAL_SKILLS = ("without", "with", "both")
ALGO_KEYS = tuple(PRESET_KEYS) + ("teacher_source", "temperature", "recompute_old_logp")
SECTIONS = (
  "model",
  "algo",
  "mesh",
  "optim",
  "train",
  "rollout",
  "eval",
  "checkpoint",
  "logging",
  "env",
)
OPTIONAL_SECTIONS = ("paper", "warm_start")
# The bundled Qwen tokenizer's size: a model driven by it needs at least this many embeddings.
QWEN_TOKENIZER_SIZE = 151669

try:  # envs/ is pure Python; its skill strategies are the source of truth when importable
  from envs.skills.retrieval import RULES_VERSIONS, STRATEGIES as SKILL_STRATEGIES
except ImportError:  # pragma: no cover - envs/ is part of this repository
  SKILL_STRATEGIES = ("rules", "bm25", "random", "none")
  RULES_VERSIONS = ("pre_fix", "post_fix")


class ConfigError(ValueError):
  """A run config that cannot work; the message lists every problem found."""


class _Problems:
  """Collects "<key>=<value>: <problem>. Fix: <fix>" lines."""

  def __init__(self):
    self.lines: list[str] = []

  def add(self, key: str, value: Any, problem: str, fix: str) -> None:
    self.lines.append(f"{key}={value!r}: {problem}. Fix: {fix}")

  def require(self, ok: bool, key: str, value: Any, problem: str, fix: str) -> None:
    if not ok:
      self.add(key, value, problem, fix)

  def one_of(self, key: str, value: Any, valid: Iterable[str]) -> None:
    valid = sorted(valid)
    if value not in valid:
      self.add(key, value, "unknown name", f"use one of {valid}")

  def at_least(self, key: str, value: Any, low: float, fix: str = "") -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= low:
      self.add(key, value, f"must be a number >= {low}", fix or f"set it to a value >= {low}")


def _get(section: Mapping[str, Any], key: str, default: Any = None) -> Any:
  return section[key] if key in section else default


# ------------------------------------------------------------------------------------ mesh
def mesh_shape(mesh: Mapping[str, int], num_devices: int) -> dict[str, int]:
  """The mesh section with -1 resolved against `num_devices`. Raises ConfigError."""
  unknown = sorted(set(mesh) - set(MESH_AXES))
  if unknown:
    raise ConfigError(f"mesh has unknown axes {unknown}. Fix: use only {MESH_AXES}.")
  shape = {a: int(mesh[a]) if a in mesh else 1 for a in MESH_AXES}
  bad = {a: s for a, s in shape.items() if s == 0 or s < -1}
  if bad:
    raise ConfigError(
      f"mesh {bad}: axis sizes must be >= 1 (or -1 for all remaining devices). "
      "Fix: set them to positive sizes."
    )
  free = [a for a, s in shape.items() if s == -1]
  if len(free) > 1:
    raise ConfigError(f"mesh {shape}: only one axis may be -1 (got {free}). Fix: size the others.")
  fixed = math.prod(s for s in shape.values() if s != -1)
  if free:
    if num_devices % fixed:
      raise ConfigError(
        f"mesh {shape}: the fixed axes need a multiple of {fixed} devices but {num_devices} are "
        f"available. Fix: choose axis sizes whose product divides {num_devices}."
      )
    shape[free[0]] = num_devices // fixed
  elif fixed != num_devices:
    raise ConfigError(
      f"mesh {shape}: the product of the axes is {fixed} but {num_devices} devices are available. "
      f"Fix: make data x fsdp x tensor = {num_devices}, or set one axis to -1."
    )
  return shape


def batch_divisor_of(shape: Mapping[str, int], rules=DEFAULT_RULES) -> int:
  """How many shards the batch dimension is split into (the 'batch' rule's mesh axes)."""
  targets = dict(rules).get("batch") or ()
  targets = (targets,) if isinstance(targets, str) else tuple(targets)
  return math.prod(int(shape[t]) for t in targets)


# ------------------------------------------------------------------------------------ model
def model_config_from(config: Any) -> ModelConfig:
  """The ModelConfig a run uses: the checkpoint's config.json when `model.path` is set (it must
  describe the model named by `model.preset`), the tiny demo architecture for preset "tiny",
  else the named preset. dtype / param_dtype / remat always come from the config."""
  model = config.model
  numerics = dict(dtype=model.dtype, param_dtype=model.param_dtype, remat=bool(model.remat))
  if model.preset == "tiny":
    named = ModelConfig.tiny(**dict(model.tiny), **numerics, name="tiny")
  elif model.preset in ModelConfig.preset_names():
    named = ModelConfig.preset(model.preset, **numerics)
  else:
    raise ConfigError(
      f"model.preset={model.preset!r}: unknown model. Fix: use one of "
      f"{ModelConfig.preset_names() + ['tiny']}."
    )
  if not model.path:
    return named
  if not os.path.isdir(model.path):
    raise ConfigError(
      f"model.path={model.path!r}: no such directory. Fix: point it at a local "
      "Hugging Face model directory (config.json + *.safetensors)."
    )
  found = ModelConfig.from_hf_config(model.path, **numerics)
  from sdar_jax.checkpoint import model_config_mismatches  # orbax import only when needed

  diffs = model_config_mismatches(dict(found.__dict__), named)
  if diffs:
    fields = ", ".join(f"{f}={a!r} (preset: {b!r})" for f, a, b in diffs)
    raise ConfigError(
      f"model.path={model.path!r} holds a different model than model.preset={model.preset!r}: "
      f"{fields}. Fix: set --config.model.preset to the checkpoint's model."
    )
  return found


def check_weight_files(path: str, model_config: ModelConfig | None = None) -> None:
  """Raises ConfigError unless `path` holds complete weight files (model.safetensors, or the
  sharded index and every shard it lists) whose tensors match `model_config` (default: the
  directory's config.json). Reads only the safetensors headers; every tensor's byte range is checked
  against its file's size, so a truncated file is caught here."""
  from sdar_jax.models.hf_io import verify_checkpoint

  try:
    verify_checkpoint(path, model_config)
  except (OSError, ValueError) as e:
    fix = (
      ""
      if "Fix:" in str(e)
      else " Fix: point model.path at a complete Hugging Face model directory (config.json + "
      "model.safetensors, or the sharded index and all its shards)."
    )
    raise ConfigError(f"model.path={path!r}: the weights cannot be used: {e}{fix}") from None


# ------------------------------------------------------------------------------------ sections
def _check_weights_source(m, p: _Problems) -> bool:
  """Initial weights come from model.path; without it, only when model.random_init asks for random
  weights explicitly. True when a path is set (its files are checked next)."""
  if not m.path and not _get(m, "random_init", False):
    p.add(
      "model.path",
      None,
      f"no weights given for model.preset={m.preset!r}: the run would train random weights",
      f"set --config.model.path to a local copy of {_get(m, 'hf_id') or 'the model'} "
      "(config.json + *.safetensors), or --config.model.random_init=True to train from random "
      "weights on purpose",
    )
  return bool(m.path)


def _check_model(config, p: _Problems) -> ModelConfig | None:
  m = config.model
  has_path = _check_weights_source(m, p)
  p.one_of("model.chat_template", m.chat_template, CHAT_TEMPLATE_SETTINGS)
  p.one_of("model.dtype", m.dtype, DTYPES)
  p.one_of("model.param_dtype", m.param_dtype, DTYPES)
  if m.tokenizer_dir and not os.path.isdir(m.tokenizer_dir):
    p.add(
      "model.tokenizer_dir",
      m.tokenizer_dir,
      "no such directory",
      "point it at a folder holding tokenizer.json, or unset it",
    )
  tokenizer_dir = m.tokenizer_dir or m.path  # where the run reads its tokenizer from
  if (
    tokenizer_dir
    and os.path.isdir(tokenizer_dir)
    and not os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json"))
  ):
    p.add(
      "model.tokenizer_dir" if m.tokenizer_dir else "model.path",
      tokenizer_dir,
      "no tokenizer.json in it (the tokenizer is read from model.tokenizer_dir, else model.path)",
      "copy the model's tokenizer files (tokenizer.json, tokenizer_config.json, vocab.json, "
      "merges.txt, chat_template.jinja) into it, or set model.tokenizer_dir to a folder that "
      "holds them",
    )
  try:
    model_config = model_config_from(config)
    if has_path:
      check_weight_files(m.path, model_config)
  except (ValueError, TypeError, FileNotFoundError, NotImplementedError) as e:
    p.lines.append(str(e))
    return None
  if not m.path and not m.tokenizer_dir and model_config.vocab_size < QWEN_TOKENIZER_SIZE:
    p.add(
      "model.tiny.vocab_size" if m.preset == "tiny" else "model.preset",
      model_config.vocab_size,
      f"fewer embeddings than the {QWEN_TOKENIZER_SIZE} ids of the bundled Qwen tokenizer",
      f"use a vocab_size >= {QWEN_TOKENIZER_SIZE} or set "
      "model.tokenizer_dir to a smaller tokenizer",
    )
  return model_config


def _check_algo(a, rollout, p: _Problems) -> None:
  keys = set(a)
  missing, extra = sorted(set(ALGO_KEYS) - keys), sorted(keys - set(ALGO_KEYS))
  p.require(
    not missing, "algo", missing, "missing keys", "build the section with configs.common.algo(name)"
  )
  p.require(
    not extra,
    "algo",
    extra,
    "keys the train step does not read",
    f"remove them; algo keys are {sorted(ALGO_KEYS)}",
  )
  for key, registry in (
    ("gate", GATES),
    ("form", SDAR_FORMS),
    ("agg", AGG_MODES),
    ("kl_kind", KL_PENALTIES),
    ("distill", DISTILL_LOSSES),
    ("advantage", ADVANTAGE_ESTIMATORS),
  ):
    if key in a:
      p.one_of(f"algo.{key}", a[key], registry.names())
  p.one_of("algo.teacher_source", _get(a, "teacher_source"), TEACHER_SOURCES)
  for key in (
    "beta",
    "lam",
    "pg_coef",
    "kl_coef",
    "entropy_coef",
    "invalid_penalty",
    "clip_low",
    "clip_high",
    "rlsd_clip_eps",
    "rlsd_lam0",
  ):
    if key in a:
      p.at_least(f"algo.{key}", a[key], 0)
  if _get(a, "clip_low", 0) >= 1:
    p.add(
      "algo.clip_low",
      a.clip_low,
      "a lower clip of 1 or more makes the ratio bound <= 0",
      "use a value in [0, 1), the reference uses 0.2",
    )
  if _get(a, "rlsd_lam0", 0) > 1:
    p.add(
      "algo.rlsd_lam0",
      a.rlsd_lam0,
      "RLSD mixes (1-λ)·A + λ·w·A, λ must be in [0, 1]",
      "use a value in [0, 1], the reference uses 0.5",
    )
  if not _get(a, "clip_c", 3.0) > 1:
    p.add("algo.clip_c", a.clip_c, "dual-clip bound must be > 1", "use 3.0 (the reference)")
  if _get(a, "advantage") == "rlsd" and not _get(a, "rlsd_warmdown_steps", 1) >= 1:
    p.add(
      "algo.rlsd_warmdown_steps",
      a.rlsd_warmdown_steps,
      "the RLSD schedule λ0·(1-k/K) needs K >= 1",
      "use a positive number of steps, the reference uses 100",
    )
  needs_teacher = _get(a, "distill", "none") != "none" or _get(a, "advantage") == "rlsd"
  if needs_teacher and not _get(a, "teacher", False):
    p.add(
      "algo.teacher",
      False,
      f"algo.distill={_get(a, 'distill')!r} / "
      f"algo.advantage={_get(a, 'advantage')!r} need teacher log-probs",
      "set --config.algo.teacher=True",
    )
  if _get(a, "distill") == "none" and _get(a, "lam", 0) > 0:
    p.add(
      "algo.lam",
      a.lam,
      "a distillation weight with algo.distill='none' has no effect",
      "set algo.distill to 'sdar' or 'skill_sd' (and algo.teacher=True), or lam=0",
    )
  temperature = _get(a, "temperature")
  if not (isinstance(temperature, (int, float)) and temperature > 0):
    p.add(
      "algo.temperature",
      temperature,
      "log-probs divide the logits by it; it must be > 0",
      "set rollout.temperature > 0 (algo.temperature follows it)",
    )
  elif temperature != rollout.temperature:
    p.add(
      "algo.temperature",
      temperature,
      f"differs from rollout.temperature="
      f"{rollout.temperature!r}: tokens must be scored at the temperature they were sampled at",
      "set only rollout.temperature (configs link the two)",
    )


def _check_rollout(r, model_config: ModelConfig | None, p: _Problems) -> None:
  if not (isinstance(r.temperature, (int, float)) and r.temperature > 0):
    p.add(
      "rollout.temperature",
      r.temperature,
      "training rollouts must sample (> 0); their log-probs divide by it",
      "use 1.0 (the reference); greedy decoding is for evaluation: rollout.val_temperature=0",
    )
  p.at_least("rollout.val_temperature", r.val_temperature, 0, "use 0 (greedy) or a positive value")
  p.require(
    isinstance(r.top_p, (int, float)) and 0 < r.top_p <= 1,
    "rollout.top_p",
    r.top_p,
    "must be in (0, 1]",
    "use 1.0 to disable nucleus sampling",
  )
  p.at_least("rollout.top_k", r.top_k, 0, "use 0 to disable top-k")
  p.at_least("rollout.max_new_tokens", r.max_new_tokens, 1)
  p.at_least("rollout.max_prompt_len", r.max_prompt_len, 1)
  p.one_of("rollout.prompt_truncation", r.prompt_truncation, TRUNCATIONS)
  if (
    model_config is not None
    and isinstance(r.max_prompt_len, int)
    and isinstance(r.max_new_tokens, int)
  ):
    total = r.max_prompt_len + r.max_new_tokens
    p.require(
      total <= model_config.max_position_embeddings,
      "rollout.max_prompt_len",
      r.max_prompt_len,
      f"max_prompt_len + max_new_tokens = {total} exceeds the model's "
      f"max_position_embeddings={model_config.max_position_embeddings}",
      "shorten the prompt or the responses",
    )


def _check_optim(o, p: _Problems) -> None:
  p.at_least("optim.lr", o.lr, 0)
  p.at_least("optim.warmup_steps", o.warmup_steps, 0)
  for key in ("b1", "b2"):
    p.require(
      isinstance(o[key], (int, float)) and 0 <= o[key] < 1,
      f"optim.{key}",
      o[key],
      "Adam decay rates must be in [0, 1)",
      "use 0.9 / 0.999",
    )
  p.require(
    isinstance(o.eps, (int, float)) and o.eps > 0, "optim.eps", o.eps, "must be > 0", "use 1e-8"
  )
  p.at_least("optim.weight_decay", o.weight_decay, 0)
  p.at_least("optim.clip_norm", o.clip_norm, 0, "use 0 to disable clipping")


def _check_batches(config, divisor: int, shape: Mapping[str, int], p: _Problems) -> None:
  t, env = config.train, config.env
  where = f"data x fsdp = {shape['data']} x {shape['fsdp']} = {divisor}"
  p.at_least("train.total_steps", t.total_steps, 0)
  p.at_least("train.mini_batch_size", t.mini_batch_size, 1)
  p.at_least("train.micro_batch_size", t.micro_batch_size, 1)
  p.at_least("train.eval_every", t.eval_every, 0, "use 0 to never evaluate during training")
  p.at_least("train.max_failed_iterations", _get(t, "max_failed_iterations", 3), 1, "use e.g. 3")
  p.require(
    t.max_staleness == 0,
    "train.max_staleness",
    t.max_staleness,
    "asynchronous training is not implemented yet (only synchronous on-policy updates)",
    "use 0",
  )
  mini, micro = t.mini_batch_size, t.micro_batch_size
  if isinstance(mini, int) and isinstance(micro, int) and mini >= 1 and micro >= 1:
    p.require(
      mini % micro == 0,
      "train.mini_batch_size",
      mini,
      f"not divisible by train.micro_batch_size={micro}",
      "make mini_batch_size a multiple of micro_batch_size",
    )
    p.require(
      micro % divisor == 0,
      "train.micro_batch_size",
      micro,
      f"not divisible by the mesh's batch shards ({where})",
      f"use a multiple of {divisor}, or change the mesh",
    )
  tasks, group = env.tasks_per_step, env.group_size
  p.at_least("env.tasks_per_step", tasks, 1)
  p.at_least("env.group_size", group, 1)
  if isinstance(tasks, int) and isinstance(group, int) and tasks >= 1 and group >= 1:
    p.require(
      (tasks * group) % divisor == 0,
      "env.tasks_per_step",
      tasks,
      f"tasks_per_step x group_size = {tasks} x {group} = {tasks * group} episodes per step "
      f"do not divide over the mesh's batch shards ({where})",
      f"make tasks_per_step x group_size a multiple of {divisor}, or change the mesh",
    )


def _check_env(e, p: _Problems) -> None:
  p.one_of("env.name", e.name, ENVS)
  if e.name in ENVS and e.name not in IMPLEMENTED_ENVS:
    p.add(
      "env.name",
      e.name,
      "this environment is not implemented yet (its config keys exist, the host loop cannot run "
      "it)",
      f"use one of {list(IMPLEMENTED_ENVS)}",
    )
  p.at_least("env.history", e.history, 0)
  p.at_least("env.max_turns", e.max_turns, 1)
  p.at_least("env.num_workers", e.num_workers, 1)
  if e.data_dir and not os.path.isdir(os.path.expanduser(e.data_dir)):
    p.add(
      "env.data_dir",
      e.data_dir,
      "no such directory",
      "point it at the prepared data, or unset it for the offline generated data",
    )
  s = e.skills
  p.one_of("env.skills.strategy", s.strategy, SKILL_STRATEGIES)
  p.one_of("env.skills.rules_version", s.rules_version, RULES_VERSIONS)
  p.at_least("env.skills.top_k", s.top_k, 1)
  if s.dir and not os.path.isdir(s.dir):
    p.add("env.skills.dir", s.dir, "no such directory", "unset it to use the shipped skills")


def _check_rest(config, p: _Problems) -> None:
  p.at_least("eval.num_tasks", config.eval.num_tasks, 0)
  p.one_of("eval.skills", config.eval.skills, EVAL_SKILLS)
  p.at_least("checkpoint.keep", config.checkpoint.keep, 1)
  p.at_least("checkpoint.every", config.checkpoint.every, 0, "use 0 to save only at the end")
  p.at_least("logging.every", config.logging.every, 1)
  if "warm_start" in config:
    w = config.warm_start
    p.at_least("warm_start.steps", w.steps, 0, "use 0 to start RL from the given weights")
    p.at_least("warm_start.batch_size", w.batch_size, 1)
    if not w.lr > 0:
      p.add("warm_start.lr", w.lr, "must be > 0", "set a positive learning rate")


# ------------------------------------------------------------------------------------ entry
def validate(config: Any, num_devices: int | None = None) -> ModelConfig:
  """Raises ConfigError listing every problem of `config`; returns the resolved ModelConfig.
  `num_devices` defaults to `jax.device_count()` (all devices of all hosts)."""
  missing = [s for s in SECTIONS if s not in config]
  unknown = sorted(set(config) - set(SECTIONS) - set(OPTIONAL_SECTIONS))
  if missing or unknown:
    raise ConfigError(
      f"config sections: missing {missing}, unknown {unknown}. Fix: build the "
      f"config with configs.common.base(...) and set config.env; sections are "
      f"{SECTIONS + OPTIONAL_SECTIONS}."
    )
  num_devices = jax.device_count() if num_devices is None else num_devices
  p = _Problems()
  model_config = _check_model(config, p)
  _check_algo(config.algo, config.rollout, p)
  _check_rollout(config.rollout, model_config, p)
  _check_optim(config.optim, p)
  _check_env(config.env, p)
  _check_rest(config, p)
  try:
    shape = mesh_shape(config.mesh, num_devices)
  except ConfigError as e:
    p.lines.append(str(e))
  else:
    _check_batches(config, batch_divisor_of(shape), shape, p)
  if p.lines:
    raise ConfigError(f"{len(p.lines)} problem(s) in the config:\n  - " + "\n  - ".join(p.lines))
  assert model_config is not None
  return model_config
