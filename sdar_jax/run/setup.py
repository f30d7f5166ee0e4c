"""What a run builds from its config before the host loop starts, and the settings it reads.

`Trainer` (sdar_jax.run.trainer) calls these: the tokenizer and chat template of the model folder,
the policy's parameters (model.path, random init, or a checkpoint's), the skill retriever of the env
family, and the env pools and agent loops of training and evaluation (`build_agent_loops`).
`setting_problems` checks the settings the host loop reads straight from the config; a Trainer
refuses a training config that has any, and sdar_jax.run.config_validation reports them with the
config's other problems.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax

import envs
from envs.prompt_template import apply_prompt_template
from envs.skills.retrieval import check_teacher_blocks
from sdar_jax import algos
from sdar_jax.algos import AlgoConfig
from sdar_jax.core import sharding
from sdar_jax.core.sampling import Sampler, SamplingParams
from sdar_jax.infra import multihost, paths
from sdar_jax.infra.errors import UserError
from sdar_jax.models import ModelConfig, init_params, load_pretrained
from sdar_jax.observe import wandb_log
from sdar_jax.rollout import AgentLoop, validation_tasks
from sdar_jax.rollout.agent_loop import ROW_STREAMS, overlap_problem
from sdar_jax.text.chat_templates import ChatTemplate, resolve_chat_template
from sdar_jax.text.tokenizer import Tokenizer


class ConfigError(UserError, ValueError):
  """A run config that cannot work; the message lists every problem found."""

  heading = "Invalid config"


class UnknownConfigKeyError(ConfigError):
  """A `--config.<path>` override naming a key the config does not have."""

  heading = "Unknown config key(s)"


def model_config_from(config: Any) -> ModelConfig:
  """The ModelConfig a run uses: the checkpoint's config.json when `model.path` is set (it must
  describe the model named by `model.preset`), the tiny demo architecture for preset "tiny",
  else the named preset. dtype / param_dtype / remat / attention / layer_loop always come from the
  config."""
  model = config.model
  numerics = {"dtype": model.dtype, "param_dtype": model.param_dtype, "remat": bool(model.remat)}
  numerics["attention"] = model.get("attention", "auto")
  numerics["layer_loop"] = model.get("layer_loop", "auto")
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
  from sdar_jax.run.checkpoint import model_config_mismatches  # orbax import only when needed

  diffs = model_config_mismatches(dict(found.__dict__), named)
  if diffs:
    fields = ", ".join(f"{f}={a!r} (preset: {b!r})" for f, a, b in diffs)
    raise ConfigError(
      f"model.path={model.path!r} holds a different model than model.preset={model.preset!r}: "
      f"{fields}. Fix: set --config.model.preset to the checkpoint's model."
    )
  return found


# eval.skills -> [(metric prefix, skills in the student prompt)]; Skill-GRPO's table rows read
# "val" without skills and "val_with_skill" with them (docs/reference.md §2.6).
EVAL_MODES = {
  "without": (("val", False),),
  "with": (("val", True),),
  "both": (("val", False), ("val_with_skill", True)),
}
_ALL_MODES = tuple(dict.fromkeys(m for modes in EVAL_MODES.values() for m in modes))
# The host loop's own settings: (section, smallest value, keys), checked by `setting_problems`.
_AT_LEAST = (
  ("train", 0, ("iterations", "eval_every", "max_skipped_updates")),
  ("train", 1, ("mini_batch_size", "micro_batch_size", "max_failed_iterations")),
  ("rollout", 1, ("max_new_tokens", "max_prompt_len")),
  ("rollout", 0, ("row_step",)),
  ("env", 0, ("history",)),
  ("env", 0, ("num_workers",)),
  ("env", 1, ("tasks_per_iteration", "group_size", "max_turns")),
  ("eval", -1, ("num_tasks", "max_env_failures")),
  ("eval", 0, ("seed", "batch_size")),
  ("eval", 1, ("repeats",)),
  ("checkpoint", 0, ("every",)),
  ("checkpoint", 1, ("keep",)),
  ("logging", 1, ("every",)),
)
_FIXES = {
  "eval.num_tasks": "use -1 for the whole split, 0 for none, or how many tasks to draw",
  "eval.batch_size": "use 0 to play every validation episode at once, or a batch size",
  "eval.max_env_failures": "use 0 to finish an evaluation only when no episode failed, -1 for any",
  "train.eval_every": "use 0 to never evaluate during training",
  "train.max_skipped_updates": "use 0 to never stop on skipped (non-finite) updates",
  "checkpoint.every": "use 0 to save only at the end",
  "rollout.row_step": "use 0 for powers of two, or a row multiple such as 64",
}


def setting_problems(config) -> list[str]:
  """What cannot work in the settings the host loop reads, one "<key>=<value>: <problem>. Fix:
  <fix>" line each."""
  problems = []
  for section, low, names in _AT_LEAST:
    for name in names:
      key, value = f"{section}.{name}", config[section].get(name, low)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
        fix = _FIXES.get(key, f"use a value >= {low}")
        problems.append(f"{key}={value!r}: must be a number >= {low}. Fix: {fix}")
  for key, value, names in (
    ("eval.skills", config.eval.skills, tuple(EVAL_MODES)),
    ("eval.streams", config.eval.get("streams", "rank"), ROW_STREAMS),
    ("rollout.prompt_truncation", config.rollout.prompt_truncation, ("error", "left")),
  ):
    if value not in names:
      problems.append(f"{key}={value!r}: unknown name. Fix: use one of {sorted(names)}")
  problem = overlap_problem(config.rollout.get("overlap", "off"))
  if problem:
    problems.append(problem)
  elif config.rollout.get("overlap", "off") != "off" and jax.process_count() > 1:
    problems.append(
      f"rollout.overlap={config.rollout.overlap!r} with {jax.process_count()} processes: the "
      "halves' sampler calls would have to be collectives entered in lockstep. Fix: set "
      "rollout.overlap='off', or run one process"
    )
  problems.extend(staleness_problems(config))
  problems.extend(wandb_log.setting_problems(config.logging if "logging" in config else {}))
  problems.extend(method_problems(config))
  return problems


def _run_hooks(config) -> dict:
  """The method hooks of the run's algorithm (`algos.build_hooks`); none when `config.algo` does
  not build (config_validation reports that)."""
  try:
    return algos.build_hooks(AlgoConfig.from_config(config.algo))
  except (ValueError, TypeError):
    return {}


def method_problems(config) -> list[str]:
  """What the algorithm's hooks cannot run with in this run config (`MethodHooks.run_problems`:
  e.g. RetireOPD's rule needs validations)."""
  return [p for hooks in _run_hooks(config).values() for p in hooks.run_problems(config)]


def staleness_problems(config, processes: int | None = None) -> list[str]:
  """What asynchronous training (train.max_staleness > 0, sdar_jax.run.trainer) cannot run with:
  re-scored old log-probs, and several processes (`processes`, default `jax.process_count()`)."""
  k = config.train.max_staleness
  if isinstance(k, bool) or not isinstance(k, int) or k < 0:
    fix = "use 0 (synchronous on-policy, the paper) or how many policy versions samples may lag"
    return [f"train.max_staleness={k!r}: must be a whole number >= 0. Fix: {fix}"]
  if k == 0:
    return []
  problems = []
  if config.algo.get("recompute_old_logp", False):
    problems.append(
      f"train.max_staleness={k} with algo.recompute_old_logp=True: asynchronous samples were "
      "drawn by an older policy version than the parameters the update starts from, so "
      "re-scoring them there would not give their behaviour log-probs. Fix: set "
      "algo.recompute_old_logp=False (the sampler's log-probs are the exact behaviour "
      "log-probs), or train.max_staleness=0"
    )
  processes = jax.process_count() if processes is None else processes
  if processes > 1:
    problems.append(
      f"train.max_staleness={k} with {processes} processes: asynchronous training runs in one "
      "process only (with several, every sampler call and update is a collective that all "
      "processes enter in lockstep, which a rollout thread per process would break). Fix: set "
      "train.max_staleness=0, or run one process"
    )
  return problems


# ------------------------------------------------------------------------------------ the model
def _tokenizer_folder(model_cfg) -> str | None:
  """Where a run reads its tokenizer and chat template: model.tokenizer_dir, else model.path;
  None: the bundled Qwen tokenizer files."""
  return model_cfg.get("tokenizer_dir") or model_cfg.get("path")


def build_tokenizer(model_cfg) -> Tokenizer:
  directory = _tokenizer_folder(model_cfg)
  return Tokenizer.from_dir(directory) if directory else Tokenizer.bundled_qwen()


def build_chat_template(model_cfg, model_family: str) -> ChatTemplate:
  """model.chat_template resolved against the tokenizer's folder: "auto" takes the template that
  folder ships, else the built-in one of `model_family` (sdar_jax.text.chat_templates)."""
  return resolve_chat_template(model_cfg.chat_template, _tokenizer_folder(model_cfg), model_family)


def build_policy(config, mesh) -> tuple[ModelConfig, Any]:
  """(model config, params placed on the mesh): the checkpoint at model.path, else random init."""
  model_config = model_config_from(config)
  path = config.model.get("path")
  if path:
    loaded_config, params = load_pretrained(path, dtype=config.model.param_dtype, mesh=mesh)
    model_config = loaded_config.replace(
      dtype=config.model.dtype,
      remat=config.model.remat,
      attention=config.model.get("attention", "auto"),
      layer_loop=config.model.get("layer_loop", "auto"),
    )
    return model_config, params
  params = init_params(model_config, jax.random.key(config.train.seed))
  return model_config, sharding.shard_params(params, model_config, mesh)


def restore_policy(config, mesh, checkpoint_dir: str, step: int) -> tuple[ModelConfig, Any]:
  """(model config, params placed on the mesh) of checkpoint `step` in `checkpoint_dir`: the
  parameters alone, read without writing into the directory (no optimizer state is built)."""
  from sdar_jax.run.checkpoint import (
    CheckpointManager,
    CheckpointUnreadableError,
    unreadable_reason,
  )

  model_config = model_config_from(config)
  with CheckpointManager(checkpoint_dir, read_only=True) as ckpt:
    try:
      params, _ = ckpt.restore_params(model_config, mesh, step)
    except Exception as error:
      reason = unreadable_reason(error)
      if reason is None:
        raise
      others = [s for s in ckpt.all_steps() if s != step]
      raise CheckpointUnreadableError(
        f"checkpoint {checkpoint_dir}/{step} cannot be read: {reason}. Fix: evaluate another "
        f"step (--step=N; the others are {others}), or restore that checkpoint's files."
      ) from None
  return model_config, params


def load_teacher(config, model_config: ModelConfig, mesh) -> Any:
  """The frozen teacher's params (algo.teacher_weights="frozen"), placed on the mesh, from
  algo.teacher_path: a Hugging Face folder (config.json + *.safetensors), a checkpoint folder
  (its latest step) or a run's workdir (its checkpoints/). Its architecture must be the
  policy's."""
  from sdar_jax.run.checkpoint import CheckpointManager, model_config_mismatches

  path = config.algo.get("teacher_path") or ""
  if not path:
    raise ConfigError(
      "algo.teacher_weights='frozen' reads the teacher from algo.teacher_path, which is empty. "
      "Fix: set --config.algo.teacher_path=<a checkpoint or Hugging Face folder>, or train the "
      "teacher first with python -m sdar_jax.train (algo.teacher_stage.preset)."
    )
  path = paths.resolve(path)
  if paths.isfile(paths.join(path, "config.json")) and any(
    name.endswith(".safetensors") for name in paths.listdir(path)
  ):
    with paths.local_copy(path) as local:
      found, params = load_pretrained(local, dtype=config.model.param_dtype, mesh=mesh)
    diffs = model_config_mismatches(dict(found.__dict__), model_config)
    if diffs:
      fields = ", ".join(f"{f}={a!r} (policy: {b!r})" for f, a, b in diffs)
      raise ConfigError(
        f"algo.teacher_path={path!r} holds another model than the policy: {fields}. Fix: name "
        "a teacher of the policy's architecture."
      )
    return params
  if paths.isdir(paths.join(path, "checkpoints")):
    path = paths.join(path, "checkpoints")  # a run's workdir
  if not paths.isdir(path):
    raise ConfigError(
      f"algo.teacher_path={path!r}: no such folder. Fix: name a checkpoint folder, a run's "
      "workdir or a Hugging Face folder."
    )
  with CheckpointManager(path, read_only=True) as ckpt:
    if ckpt.latest_step() is None:
      raise ConfigError(
        f"algo.teacher_path={path!r} holds neither a checkpoint nor a Hugging Face model "
        "(config.json + *.safetensors). Fix: name the teacher's run or its export."
      )
    params, _ = ckpt.restore_params(model_config, mesh)
  return params


# ------------------------------------------------------------------------------------ rollouts
def build_retriever(config):
  """The skill retriever of ``env.skills`` (the env family's retriever class, else
  SkillRetriever): its directory, else the env family's skills."""
  from envs.skills.retrieval import SkillRetriever

  s = config.env.skills
  family = envs.env_family(config.env.name)
  return (family.skill_retriever or SkillRetriever)(
    s.get("dir") or family.skills,
    strategy=s.strategy,
    rules_version=s.rules_version,
    top_k=s.top_k,
    seed=s.seed,
    places=s.get("places", "all"),
  )


@dataclasses.dataclass
class Validation:
  """One validation split of a run: its games, the tasks drawn from them, its env pool (as many
  envs as one batch of this process's share: eval.batch_size) and one agent loop per eval mode,
  each with its metric prefix ("val", "val_with_skill"; "val_unseen", ... for another split)."""

  split: str
  games: list[str]  # task names of the split (ALFWorld: game files)
  tasks: list[int]  # ids into games, in play order
  pool: envs.EnvPool
  loops: list[tuple[str, AgentLoop]]
  # prefixes of the modes played only by the evaluation before training (RetireOPD's teacher)
  start_only: set[str] = dataclasses.field(default_factory=set)
  # prefixes the evaluation before training plays with the teacher's weights
  # (`MethodHooks.start_eval_weights`: RetireOPD's frozen teacher with its skills)
  teacher_modes: set[str] = dataclasses.field(default_factory=set)


def validation_prefix(split: str, main_split: str) -> str:
  """ "val" for eval.split, "val_<name>" for another split (valid_unseen -> "val_unseen")."""
  return "val" if split == main_split else "val_" + split.removeprefix("valid_")


def validation_splits(eval_section) -> list[str]:
  """eval.split, then the other splits of eval.splits (comma-separated), each once."""
  extra = [s.strip() for s in str(eval_section.get("splits", "") or "").split(",") if s.strip()]
  return list(dict.fromkeys([eval_section.split, *extra]))


@dataclasses.dataclass
class AgentLoops:
  """A run's env pools and agent loops: training (None in an evaluation) and, per validation
  split, its pool and one loop per eval mode (none when the run never evaluates)."""

  train_games: list[str]  # task names of the training split (ALFWorld: game files)
  pool: envs.EnvPool | None = None
  loop: AgentLoop | None = None
  validations: list[Validation] = dataclasses.field(default_factory=list)

  def close(self) -> None:
    for pool in (self.pool, *(v.pool for v in self.validations)):
      if pool is not None:
        pool.close()


def build_agent_loops(
  config,
  family: envs.EnvFamily,
  sampler: Sampler,
  tokenizer: Tokenizer,
  chat_template: ChatTemplate,
  with_teacher: bool,
  eval_only: bool,
) -> AgentLoops:
  """The env pools (worker processes) and agent loops of a run; the pools are closed again if
  building fails half-way."""
  env, rollout = config.env, config.rollout
  evaluates = eval_only or config.train.eval_every or config.train.eval_before_train
  hooks = _run_hooks(config).values()
  start_modes = [m for h in hooks for m in h.start_eval_modes]
  teacher_modes = {
    m for h in hooks if h.start_eval_weights == "teacher" for m in h.start_eval_modes
  }
  # Each split's pool kwargs and task names (ALFWorld: its game files) from the env family.
  train_split = None if eval_only else family.split(env, env.get("split", "train"))
  eval_splits = (
    [(name, family.split(env, name)) for name in validation_splits(config.eval)]
    if evaluates
    else []
  )
  wants_skills = with_teacher or config.algo.skills_in_student or config.eval.skills != "without"
  sampling = SamplingParams(
    max_new_tokens=rollout.max_new_tokens,
    temperature=rollout.temperature,
    top_p=rollout.top_p,
    top_k=rollout.top_k,
    stop_token_ids=tokenizer.eos_token_ids,
  )
  common = {
    "adapter": family.adapter(),
    "sampler": sampler,
    "tokenizer": tokenizer,
    "chat_template": chat_template,
    "max_turns": env.max_turns,
    "history_length": env.history,
    "max_prompt_len": rollout.max_prompt_len,
    "truncation": rollout.prompt_truncation,
    "retriever": build_retriever(config) if wants_skills else None,
    "enable_thinking": config.model.enable_thinking,
    "overlap": rollout.get("overlap", "off"),
  }
  apply_prompt_template(env.get("prompt_template"), common["adapter"], common["retriever"])
  if common["retriever"] is not None:  # refuse skills that would leave a teacher block empty
    split = train_split or (eval_splits[0][1] if eval_splits else None)
    check_teacher_blocks(common["retriever"], split.task_names if split else [])
  loops = AgentLoops(train_games=train_split.task_names if train_split else [])
  try:
    if train_split is not None:
      # this process's share of the episodes (sdar_jax.infra.multihost; one process: all of them)
      n_train = multihost.max_share_size(env.tasks_per_iteration * env.group_size, env.group_size)
      loops.pool = envs.EnvPool(
        env.name,
        n_train,
        dict(train_split.env_kwargs, seed=env.seed, max_steps=env.max_turns),
        num_workers=min(env.num_workers, n_train),
      )
      loops.loop = AgentLoop(
        loops.pool,
        sampling=sampling,
        with_teacher=with_teacher,
        skills_in_student=config.algo.skills_in_student,
        teacher_context=config.algo.get("teacher_context", "block"),
        mixed_views=with_teacher and config.algo.get("views", "single") == "mixed",
        **common,
      )
    val_sampling = dataclasses.replace(sampling, temperature=rollout.val_temperature)
    for name, split in eval_splits:
      if not split.task_names:
        continue
      games = split.task_names
      # Games drawn from the whole split by a seeded shuffle (sorted paths group task types).
      tasks = validation_tasks(len(games), config.eval.num_tasks, seed=env.seed + 1000)
      batch = config.eval.get("batch_size", 0) or len(tasks)
      n_eval = multihost.max_share_size(min(batch, len(tasks)))
      pool = envs.EnvPool(
        env.name,
        n_eval,
        dict(split.env_kwargs, seed=env.seed + 1000, max_steps=env.max_turns),
        num_workers=min(env.num_workers, n_eval),
      )
      base = validation_prefix(name, config.eval.split)
      validation = Validation(name, games, tasks, pool, [])
      loops.validations.append(validation)
      modes = list(EVAL_MODES[config.eval.skills])
      # modes a method's hooks need once, at the start of training (RetireOPD: the frozen
      # teacher's rate with its skills); an evaluation alone plays only eval.skills' modes
      for prefix in () if eval_only else dict.fromkeys(start_modes):
        mode = next(m for m in _ALL_MODES if m[0] == prefix)
        if mode not in modes:
          modes.append(mode)
          validation.start_only.add(prefix.replace("val", base, 1))
        if prefix in teacher_modes:
          validation.teacher_modes.add(prefix.replace("val", base, 1))
      validation.loops = [
        (
          prefix.replace("val", base, 1),
          AgentLoop(
            pool,
            sampling=val_sampling,
            skills_in_student=skills,
            row_streams=config.eval.get("streams", "rank"),
            **common,
          ),
        )
        for prefix, skills in modes
      ]
  except BaseException:
    loops.close()
    raise
  return loops


def check_first_prompts(loops: AgentLoops, config) -> None:
  """The first turn's prompt of the first training task and of each validation split's first task
  (in every eval mode: with skills the prompt is longer) against rollout.max_prompt_len, before
  anything is compiled (`AgentLoop.check_first_prompt`): with rollout.prompt_truncation='error' a
  first prompt that does not fit is a `PromptTooLongError` at start, not at the first rollout or
  evaluation. Later turns add history, so a run that passes can still meet a longer prompt."""
  checks = []
  if loops.loop is not None and loops.train_games:
    checks.append((loops.loop, 0, config.env.get("split", "train")))
  for validation in loops.validations:
    for _, loop in validation.loops:
      checks.append((loop, validation.tasks[0], validation.split))
  for loop, task, split in checks:
    loop.check_first_prompt(task, where=f"at start: {split} task {task}, first turn")


def dry_run_prompt_check(config, model_config: ModelConfig, eval_only: bool = False) -> int:
  """`check_first_prompts` for `--dry_run` when rollout.prompt_truncation='error': the run's env
  pools and agent loops built without a sampler (nothing is compiled, no weights are read), the
  first prompts checked, the pools closed. Returns how many loops were checked (0 with
  truncation='left', where a long prompt is cut, not refused)."""
  if config.rollout.prompt_truncation != "error":
    return 0
  env = config.env
  if env.name == "alfworld" and not env.get("data_dir"):
    from envs.alfworld.data import offline_games_ready

    wanted = [env.get("split", "train"), *validation_splits(config.eval)]
    if not offline_games_ready(env, wanted):  # generating them takes minutes: not in a dry run
      print(
        "first prompts not checked: the offline ALFWorld games are not generated yet (the run "
        "generates them and checks its first prompts at start, before compiling)."
      )
      return 0
  from sdar_jax.algos import AlgoConfig

  with_teacher = not eval_only and AlgoConfig.from_config(config.algo).records_skill_block
  loops = build_agent_loops(
    config,
    envs.env_family(config.env.name),
    None,
    build_tokenizer(config.model),
    build_chat_template(config.model, model_config.family),
    with_teacher=with_teacher,
    eval_only=eval_only,
  )
  try:
    check_first_prompts(loops, config)
  finally:
    loops.close()
  return int(loops.loop is not None) + sum(len(v.loops) for v in loops.validations)
