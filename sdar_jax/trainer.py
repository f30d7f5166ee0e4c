"""The host loop: rollout -> replay -> update -> eval -> checkpoint -> log.

One iteration (docs/design.md, "One iteration, as data"):

1. `tasks_per_step` tasks are drawn; each is played by `group_size` envs of the pool (a GRPO group).
2. `AgentLoop.run` plays the episodes with the current parameters (`sampling.generate`), recording
   every turn's prompt, teacher prompt, sampled response ids and behaviour log-probs.
3. `episodes_to_samples`: one sample per turn, episode return minus the turn's invalid-format
   penalty, GRPO advantages over each group's turn-samples.
4. The samples pass through the replay queue (synchronous on-policy by default).
5. They are packed into fixed-shape mini-batches; with algo.recompute_old_logp the old log-probs
   are re-scored at θ_old, with teacher_source="rollout" the teacher log-probs of every mini-batch
   are scored once at θ_old, then one compiled update per mini-batch.

Evaluation plays the validation split with group size 1 at `rollout.val_temperature`; checkpoints
hold the TrainState plus the iteration and the task sampler's state, so a killed run resumes
where it stopped (metric rows of iterations after the restored checkpoint are dropped first); the
final policy is exported as Hugging Face safetensors.

A run holds its workdir's lock (sdar_jax.workdir_lock) from start to close. Each iteration logs a
progress line (elapsed time, ETA) and, every `logging.every` iterations, a metrics row. The first
failure of each kind of an environment is logged with its env and game file; failures are counted
in `episode/env_failures`, and the run stops with `EnvFailureError` when every environment failed
in `train.max_failed_iterations` consecutive iterations.

`Trainer(config, out_dir, eval_only=True, params_from=(checkpoint_dir, step))` is an evaluation:
the checkpoint's parameters alone (no optimizer state, no KL reference, no training envs), the
validation episodes of that step, and its own config.json / metrics.jsonl / metrics.png in `out_dir`
(sdar_jax.evaluate picks `<workdir>/eval/step_<N>/`).

Length: one object's lifecycle (build, warm start, resume, iterate, evaluate, checkpoint,
export); splitting evaluation-only runs out of it is the next step.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import envs
from sdar_jax import sharding
from sdar_jax.chat_templates import ChatTemplate, resolve_chat_template
from sdar_jax.checkpoint import CheckpointManager, abstract_train_state, export_hf
from sdar_jax.config_validation import model_config_from
from sdar_jax.metrics import MetricsLogger, plot_history
from sdar_jax.models import ModelConfig, init_params, load_pretrained
from sdar_jax.progress import Progress, ensure_log_handler
from sdar_jax.rollout import (
  AgentLoop,
  ReplayQueue,
  episodes_to_samples,
  pack_batch,
  plan_minibatches,
  validation_tasks,
)
from sdar_jax.rollout.trajectory import Episode
from sdar_jax.sampling import Sampler, SamplingParams
from sdar_jax.tokenizer import Tokenizer
from sdar_jax.train_state import create_train_state
from sdar_jax.train_step import TrainStep, train_step_from_config
from sdar_jax.workdir_lock import WorkdirLock

log = logging.getLogger(__name__)

_PAD_FALLBACK = 0
EVAL_RECORD = "evaluation.json"  # written by an evaluation into its output directory
# eval.skills -> [(metric prefix, skills in the student prompt)]; Skill-GRPO's table rows read
# "val" without skills and "val_with_skill" with them (docs/reference.md §2.6).
_EVAL_MODES = {
  "without": (("val", False),),
  "with": (("val", True),),
  "both": (("val", False), ("val_with_skill", True)),
}


# ------------------------------------------------------------------------------------ building
def _tokenizer_folder(model_cfg) -> str | None:
  """Where a run reads its tokenizer and chat template: model.tokenizer_dir, else model.path;
  None: the bundled Qwen tokenizer files."""
  return model_cfg.get("tokenizer_dir") or model_cfg.get("path")


def build_tokenizer(model_cfg) -> Tokenizer:
  directory = _tokenizer_folder(model_cfg)
  return Tokenizer.from_dir(directory) if directory else Tokenizer.bundled_qwen()


def build_chat_template(model_cfg, model_family: str) -> ChatTemplate:
  """model.chat_template resolved against the tokenizer's folder: "auto" takes the template that
  folder ships, else the built-in one of `model_family` (sdar_jax.chat_templates)."""
  return resolve_chat_template(model_cfg.chat_template, _tokenizer_folder(model_cfg), model_family)


def build_policy(config, mesh) -> tuple[ModelConfig, Any]:
  """(model config, params placed on the mesh): the checkpoint at model.path, else random init."""
  model_config = model_config_from(config)
  path = config.model.get("path")
  if path:
    loaded_config, params = load_pretrained(path, dtype=config.model.param_dtype, mesh=mesh)
    model_config = loaded_config.replace(dtype=config.model.dtype, remat=config.model.remat)
    return model_config, params
  params = init_params(model_config, jax.random.key(config.train.seed))
  return model_config, sharding.shard_params(params, model_config, mesh)


def restore_policy(config, mesh, checkpoint_dir: str, step: int) -> tuple[ModelConfig, Any]:
  """(model config, params placed on the mesh) of checkpoint `step` in `checkpoint_dir`: the
  parameters alone, read without writing into the directory (no optimizer state is built)."""
  model_config = model_config_from(config)
  with CheckpointManager(checkpoint_dir, read_only=True) as ckpt:
    params, _ = ckpt.restore_params(model_config, mesh, step)
  return model_config, params


class EnvFailureError(RuntimeError):
  """Every environment failed in `train.max_failed_iterations` consecutive iterations."""


def check_trainable(config) -> None:
  """Refuses training options the host loop does not implement (also checked by validation)."""
  t = config.train
  if t.max_staleness != 0:
    raise ValueError(
      f"train.max_staleness={t.max_staleness}: asynchronous training (updates on samples of older "
      "policies) is not implemented yet. Fix: use --config.train.max_staleness=0 (synchronous "
      "on-policy, the paper's setting)."
    )
  limit = t.get("max_failed_iterations", 3)
  if not isinstance(limit, int) or limit < 1:
    raise ValueError(
      f"train.max_failed_iterations={limit!r}: must be an integer >= 1 (consecutive iterations in "
      "which every environment fails before the run stops). Fix: use e.g. 3."
    )


def _error_kind(error: str) -> str:
  """'env raised during reset: JSONDecodeError: Expecting ...' -> its first two ': ' fields."""
  return ": ".join(error.split(": ")[:2])


def _due(iteration: int, every: int, total: int) -> bool:
  """Whether something done every `every` iterations (0 = only at the end) is due now."""
  return iteration == total or (every > 0 and iteration % every == 0)


def build_retriever(config):
  """The skill retriever of ``env.skills``: its directory, else the env family's skills."""
  from envs.skills.retrieval import SkillRetriever

  s = config.env.skills
  return SkillRetriever(
    s.get("dir") or envs.env_family(config.env.name).skills,
    strategy=s.strategy,
    rules_version=s.rules_version,
    top_k=s.top_k,
    seed=s.seed,
  )


@dataclasses.dataclass
class LoopState:
  """Host-side state a checkpoint keeps beside the TrainState."""

  iteration: int = 0  # completed training iterations
  task_rng: dict[str, Any] | None = None  # numpy bit-generator state of the task sampler
  replay: dict[str, int] | None = None
  all_failed_iterations: int = 0  # consecutive iterations in which every env failed


# ------------------------------------------------------------------------------------ metrics
def rollout_metrics(episodes: list[Episode], prefix: str = "episode") -> dict[str, float]:
  done = [ep for ep in episodes if ep.env_error is None]
  m: dict[str, float] = {f"{prefix}/env_failures": float(len(episodes) - len(done))}
  # Student prompts cut by rollout.prompt_truncation=left (failed episodes' turns included).
  m[f"{prefix}/truncated_prompts"] = float(sum(ep.truncated_prompts for ep in episodes))
  if not done:
    return m
  m[f"{prefix}/success_rate"] = float(np.mean([ep.won for ep in done]))
  m[f"{prefix}/reward_mean"] = float(np.mean([ep.reward for ep in done]))
  m[f"{prefix}/length_mean"] = float(np.mean([ep.length for ep in done]))
  turns = [t for ep in done for t in ep.turns]
  m[f"{prefix}/valid_action_ratio"] = float(np.mean([t.valid for t in turns])) if turns else 0.0
  m[f"{prefix}/response_tokens_mean"] = (
    float(np.mean([len(t.response_ids) for t in turns])) if turns else 0.0
  )
  by_type = collections.defaultdict(list)
  for ep in done:
    by_type[ep.task_type].append(ep.won)
  for task_type, wins in sorted(by_type.items()):
    m[f"{prefix}/{task_type}_success_rate"] = float(np.mean(wins))
  return m


def _combine(per_batch: list[tuple[dict[str, Any], float]]) -> dict[str, float]:
  """Token-weighted mean of each update's metrics over the iteration's mini-batches."""
  total = sum(w for _, w in per_batch) or 1.0
  keys = {k for m, _ in per_batch for k in m}
  out = {}
  for k in sorted(keys):
    vals = [(float(np.asarray(m[k])), w) for m, w in per_batch if k in m]
    if k in ("train/skipped_update",):
      out[k] = sum(v for v, _ in vals)
    else:
      out[k] = sum(v * w for v, w in vals) / total
  return out


# ------------------------------------------------------------------------------------ trainer
class Trainer:
  """Everything one run holds: mesh, policy, update, env pools, agent loops, logger, checkpoints."""

  def __init__(
    self,
    config,
    workdir: str,
    eval_only: bool = False,
    params_from: tuple[str, int] | None = None,
  ):
    """workdir: the run directory, or where an evaluation (`eval_only`) writes its results.
    params_from: (checkpoint directory, step) whose parameters an evaluation plays; None = the
    config's weights (model.path, or random init)."""
    try:
      self.env_family = envs.env_family(config.env.name)
    except KeyError as e:
      raise NotImplementedError(
        f"env.name={config.env.name!r}: the host loop cannot run it yet ({e.args[0]})"
      ) from None
    if not eval_only:
      check_trainable(config)
    self.config = config
    self.workdir = os.path.abspath(workdir)
    self.eval_only = eval_only
    self.params_from = params_from
    ensure_log_handler()
    self.lock = WorkdirLock(self.workdir, "evaluation" if eval_only else "training").acquire()
    try:
      self._build()
    except BaseException:
      self.close()  # whatever _build made (env worker processes, checkpoint manager), then the lock
      raise

  def _build(self) -> None:
    """Everything `__init__` builds once the workdir's lock is held."""
    config = self.config
    if self.eval_only:
      self._start_eval_record()
    with open(os.path.join(self.workdir, "config.json"), "w") as f:
      json.dump(config.to_dict(), f, indent=2, default=str)
    self.mesh = sharding.make_mesh(dict(config.mesh))
    self.tokenizer = build_tokenizer(config.model)
    if self.params_from is None:
      self.model_config, params = build_policy(config, self.mesh)
    else:
      self.model_config, params = restore_policy(config, self.mesh, *self.params_from)
    self.chat_template = build_chat_template(config.model, self.model_config.family)
    log.info("chat template: %s", self.chat_template.name)
    self.step_fn: TrainStep | None = None
    self.with_teacher = False
    if not self.eval_only:
      self.step_fn = train_step_from_config(self.model_config, config, self.mesh)
      self.with_teacher = self.step_fn.algo_config.scores_teacher
    self.pad_id = self.tokenizer.pad_token_id or _PAD_FALLBACK
    self.sampler = Sampler(
      self.model_config, self.mesh, self.tokenizer, max_prompt_len=config.rollout.max_prompt_len
    )
    env = config.env
    self.group_size = env.group_size
    self.tasks_per_step = env.tasks_per_step
    # Each split's pool kwargs and task names (ALFWorld: its game files) from the env family.
    train_split = None if self.eval_only else self.env_family.split(env, env.get("split", "train"))
    eval_split = (
      self.env_family.split(env, config.eval.split)
      if self.eval_only or config.train.eval_every or config.train.eval_before_train
      else None
    )
    self.train_games = train_split.task_names if train_split else []
    self.eval_games = eval_split.task_names if eval_split else []
    retriever = (
      build_retriever(config)
      if (self.with_teacher or config.algo.skills_in_student or config.eval.skills != "without")
      else None
    )
    n_train = self.tasks_per_step * self.group_size
    self.pool = None
    if not self.eval_only:
      self.pool = envs.EnvPool(
        env.name,
        n_train,
        dict(train_split.env_kwargs, seed=env.seed, max_steps=env.max_turns),
        num_workers=min(env.num_workers, n_train),
      )
    sampling = SamplingParams(
      max_new_tokens=config.rollout.max_new_tokens,
      temperature=config.rollout.temperature,
      top_p=config.rollout.top_p,
      top_k=config.rollout.top_k,
      stop_token_ids=self.tokenizer.eos_token_ids,
    )
    common = dict(
      adapter=self.env_family.adapter(),
      sampler=self.sampler,
      tokenizer=self.tokenizer,
      chat_template=self.chat_template,
      max_turns=env.max_turns,
      history_length=env.history,
      max_prompt_len=config.rollout.max_prompt_len,
      truncation=config.rollout.prompt_truncation,
      retriever=retriever,
      enable_thinking=config.model.enable_thinking,
    )
    self.loop: AgentLoop | None = None
    if not self.eval_only:
      self.loop = AgentLoop(
        self.pool,
        sampling=sampling,
        with_teacher=self.with_teacher,
        skills_in_student=config.algo.skills_in_student,
        **common,
      )
    self.eval_loops: list[tuple[str, AgentLoop]] = []
    self.eval_pool = None
    self.eval_tasks: list[int] = []
    if self.eval_games:
      # Games drawn from the whole split by a seeded shuffle (sorted paths group task types).
      self.eval_tasks = validation_tasks(
        len(self.eval_games), config.eval.num_tasks, seed=env.seed + 1000
      )
      n_eval = len(self.eval_tasks)
      self.eval_pool = envs.EnvPool(
        env.name,
        n_eval,
        dict(eval_split.env_kwargs, seed=env.seed + 1000, max_steps=env.max_turns),
        num_workers=min(env.num_workers, n_eval),
      )
      val_sampling = dataclasses.replace(sampling, temperature=config.rollout.val_temperature)
      self.eval_loops = [
        (
          prefix,
          AgentLoop(self.eval_pool, sampling=val_sampling, skills_in_student=with_skills, **common),
        )
        for prefix, with_skills in _EVAL_MODES[config.eval.skills]
      ]
    self.warm_start_metrics: dict[str, float] = {}
    self.ref_params = None
    self.state = None
    self.eval_params = None  # the evaluated parameters of an eval-only run
    if self.eval_only:
      self.eval_params = params
    else:
      if config.get("warm_start") and config.warm_start.steps > 0:
        params = self._warm_start(params)
      if self.step_fn.algo_config.kl_coef:  # the frozen initial policy (after any warm start)
        self.ref_params = jax.tree.map(jnp.copy, params)
      self.state = self.step_fn.shard_state(create_train_state(params, self.step_fn.optimizer))
    self.replay = ReplayQueue(max_staleness=config.train.max_staleness)
    self.logger = MetricsLogger(
      self.workdir if self.eval_only else (config.logging.get("dir") or self.workdir),
      jsonl=config.logging.jsonl,
      tensorboard=config.logging.tensorboard,
    )
    self.ckpt: CheckpointManager | None = None
    if not self.eval_only:
      self.ckpt = CheckpointManager(
        config.checkpoint.get("dir") or os.path.join(self.workdir, "checkpoints"),
        keep=config.checkpoint.keep,
        async_save=config.checkpoint.async_save,
      )
    self.loop_state = LoopState(iteration=self.params_from[1] if self.params_from else 0)
    self._failure_kinds: dict[str, str] = {}  # first error of each kind, with its env and game
    self.task_rng = np.random.default_rng(config.train.seed)
    self.rng = jax.random.key(config.train.seed + 1)  # rollout keys: see _key

  # ---------------------------------------------------------------------------- warm start
  def _warm_start(self, params):
    """Expert SFT on the env family's expert records (ALFWorld: the walkthroughs), or
    (warm_start.source="expert") on its expert's games with and without skills, then the
    teacher-student gap on held-out expert turns (once per workdir: the result is saved as a
    Hugging Face directory and reloaded on resume, so the KL reference stays the warm-started
    policy)."""
    from sdar_jax import warm_start as ws
    from sdar_jax.models import save_pretrained
    from sdar_jax.warm_start import expert_samples, warm_start

    out = os.path.join(self.workdir, "warm_start_policy")
    if os.path.exists(os.path.join(out, "config.json")):
      _, params = load_pretrained(out, dtype=self.config.model.param_dtype, mesh=self.mesh)
      return params
    w = self.config.warm_start
    end = self.tokenizer.eos_token_ids[0]
    gap, expert_metrics = [], {}
    if w.get("source", "walkthroughs") == "expert":
      loop = ws.warm_start_loop(self.loop, build_retriever(self.config))
      samples, gap, expert_metrics = ws.expert_warm_start_data(
        w,
        loop,
        self.pool,
        len(self.train_games),
        end,
        family=self.env_family,
        seed=self.config.train.seed,
      )
    else:
      if self.env_family.expert_records is None:
        raise ValueError(
          f"warm_start.source={w.get('source', 'walkthroughs')!r}: env {self.env_family.name!r} "
          "has no expert records (EnvFamily.expert_records). Fix: set warm_start.steps=0 or "
          "warm_start.source='expert' if the env has an expert."
        )
      records = self.env_family.expert_records(self.config.env, w.split)
      samples = expert_samples(records, self.loop, end_token_id=end)
    params, losses = warm_start(
      self.model_config,
      params,
      samples,
      steps=w.steps,
      batch_size=w.batch_size,
      lr=w.lr,
      seed=self.config.train.seed,
      shard_batch=self.step_fn.shard_batch,
    )
    self.warm_start_metrics = {
      "warm_start/loss_first": losses[0],
      "warm_start/loss_last": losses[-1],
      "warm_start/expert_samples": float(len(samples)),
      **expert_metrics,
    }
    if gap:  # measured before RL: does the skill text raise the skill-following actions?
      self.warm_start_metrics.update(
        ws.teacher_student_gap_on_expert(
          self.model_config,
          params,
          gap,
          batch_size=w.batch_size,
          shard_batch=self.step_fn.shard_batch,
        )
      )
      log.info(
        "warm start: teacher-student gap on held-out expert turns %.4f (search turns %.4f)",
        self.warm_start_metrics["warm_start/teacher_student_gap_on_expert"],
        self.warm_start_metrics.get("warm_start/teacher_student_gap_on_expert_search", np.nan),
      )
    log.info(
      "warm start: %d expert turn-samples, %d steps, loss %.3f -> %.3f",
      len(samples),
      w.steps,
      losses[0],
      losses[-1],
    )
    save_pretrained(self.model_config, params, out)
    return params

  # ---------------------------------------------------------------------------- resume
  def maybe_restore(self) -> bool:
    """Restores the latest checkpoint if there is one; either way drops the metric rows of
    iterations after it (a run killed between a row and its checkpoint logs that step again)."""
    if self.ckpt.latest_step() is None:
      self._drop_metric_rows_after(-1)
      return False
    target = abstract_train_state(self.model_config, self.step_fn.optimizer, self.mesh)
    state, meta = self.ckpt.restore(target=target, model_config=self.model_config)
    self.state = state
    extra = meta.get("extra") or {}
    self.loop_state = LoopState(**extra.get("loop", {}))
    if self.loop_state.task_rng:
      self.task_rng.bit_generator.state = self.loop_state.task_rng
    if self.loop_state.replay:
      self.replay.load_state_dict(self.loop_state.replay)
    log.info("resumed from %s at iteration %d", self.ckpt.directory, self.loop_state.iteration)
    self._drop_metric_rows_after(self.loop_state.iteration)
    return True

  def _drop_metric_rows_after(self, step: int) -> None:
    if step < 0 and not self.warm_start_metrics and self.logger.path:
      # A restart before the first checkpoint logs step 0 again; a reloaded warm start does not
      # recompute its metrics, so keep them from the dropped row.
      try:
        with open(self.logger.path) as f:
          first = json.loads(f.readline() or "{}")
      except (OSError, ValueError):
        first = {}
      if first.get("step") == 0:
        self.warm_start_metrics = {k: v for k, v in first.items() if k.startswith("warm_start/")}
    dropped = self.logger.drop_rows_after(step)
    if dropped:
      log.warning(
        "dropped %d metrics row(s) after step %d from %s: iterations the restored state does not "
        "contain (the run was stopped before their checkpoint); they are logged again",
        dropped,
        max(step, 0),
        self.logger.path,
      )

  def save(self, force: bool = False) -> None:
    self.loop_state.task_rng = self.task_rng.bit_generator.state
    self.loop_state.replay = self.replay.state_dict()
    self.ckpt.save(
      self.loop_state.iteration,
      self.state,
      self.model_config,
      run_config=self.config,
      extra={"loop": _jsonable(dataclasses.asdict(self.loop_state))},
      force=force,
    )

  # ---------------------------------------------------------------------------- phases
  def _draw_tasks(self) -> tuple[list[int], list[int]]:
    n_games = len(self.train_games)
    picks = self.task_rng.choice(
      n_games, size=self.tasks_per_step, replace=self.tasks_per_step > n_games
    )
    base = self.loop_state.iteration * self.tasks_per_step
    tasks = [int(t) for t in picks for _ in range(self.group_size)]
    groups = [base + k for k in range(self.tasks_per_step) for _ in range(self.group_size)]
    return tasks, groups

  def _key(self, purpose: int) -> jax.Array:
    """The rollout key of this iteration for `purpose` (0 = training episodes, 1+ = eval modes):
    a function of (seed, iteration, purpose) only, so a resumed run samples what an
    uninterrupted one would have."""
    return jax.random.fold_in(jax.random.fold_in(self.rng, self.loop_state.iteration), purpose)

  def evaluate(self) -> dict[str, float]:
    """Validation episodes (group size 1, one per game of `eval_tasks`) per eval mode."""
    tasks = self.eval_tasks
    metrics = {}
    for mode, (prefix, loop) in enumerate(self.eval_loops):
      episodes = loop.run(
        self.eval_params if self.state is None else self.state.params,
        tasks,
        list(range(len(tasks))),
        self._key(1 + mode),
        policy_version=self.loop_state.iteration,
        desc=prefix,
      )
      self._report_env_failures(episodes, self.eval_games, prefix)
      metrics.update(rollout_metrics(episodes, prefix=prefix))
    return metrics

  def _report_env_failures(self, episodes: list[Episode], games: list[str], prefix: str) -> None:
    """Logs the first failure of each kind with its env and game file; the rest are counted."""
    for ep in episodes:
      if ep.env_error is None:
        continue
      kind = _error_kind(ep.env_error)
      if kind in self._failure_kinds:
        continue
      game = ep.gamefile or (games[ep.task_id] if 0 <= ep.task_id < len(games) else "?")
      where = f"{prefix} env {ep.env_index} (task {ep.task_id}, game {game})"
      self._failure_kinds[kind] = f"{where}: {ep.env_error}"
      log.warning(
        "%s failed: %s. Further failures of this kind are counted in %s/env_failures, not shown.",
        where,
        ep.env_error,
        prefix,
      )

  def _check_all_failed(self, episodes: list[Episode]) -> None:
    """Counts iterations in which every env failed; stops the run after too many in a row."""
    if episodes and all(ep.env_error is not None for ep in episodes):
      self.loop_state.all_failed_iterations += 1
    else:
      self.loop_state.all_failed_iterations = 0
    limit = self.config.train.get("max_failed_iterations", 3)
    if self.loop_state.all_failed_iterations >= limit:
      first = "\n  - ".join(self._failure_kinds.values())
      raise EnvFailureError(
        f"every environment failed in {self.loop_state.all_failed_iterations} consecutive "
        "iterations "
        f"(train.max_failed_iterations={limit}); nothing was trained. First error of each kind:"
        f"\n  - {first}\nFix the environment or its data (env.data_dir, the generated games), or "
        "raise --config.train.max_failed_iterations."
      )

  def train_iteration(self) -> dict[str, float]:
    it = self.loop_state.iteration
    t0 = time.perf_counter()
    tasks, groups = self._draw_tasks()
    episodes = self.loop.run(self.state.params, tasks, groups, self._key(0), policy_version=it)
    t_rollout = time.perf_counter() - t0
    self._report_env_failures(episodes, self.train_games, "episode")
    self._check_all_failed(episodes)
    metrics = rollout_metrics(episodes)
    samples = episodes_to_samples(
      episodes,
      invalid_penalty=self.step_fn.algo_config.invalid_penalty,
      norm_adv_by_std=self.step_fn.algo_config.norm_adv_by_std,
    )
    self.replay.put(samples)
    samples = self.replay.take(None, current_version=it)
    metrics["rollout/turn_samples"] = float(len(samples))
    metrics["rollout/generated_tokens"] = float(sum(len(s.response_ids) for s in samples))
    metrics["rollout/seconds"] = t_rollout
    if not samples:
      log.warning(
        "iteration %d: no trainable turn-samples (every env failed, %d in a row); skipping the "
        "update",
        it + 1,
        self.loop_state.all_failed_iterations,
      )
      return metrics
    t1 = time.perf_counter()
    mb_size = self.config.train.mini_batch_size
    batches = [
      self.step_fn.shard_batch(pack_batch(mb, mb_size, self.with_teacher, self.pad_id))
      for mb in plan_minibatches(samples, mb_size)
    ]
    algo = self.step_fn.algo_config
    if algo.recompute_old_logp:  # θ_old re-scores the sampled tokens
      rescored = [self.step_fn.recompute_old_logp(self.state.params, b) for b in batches]
      batches = [b for b, _ in rescored]
      metrics["rollout/max_abs_logp_diff_sampler_vs_recompute"] = max(d for _, d in rescored)
    if self.with_teacher and algo.teacher_source == "rollout":
      batches = [
        b.replace(teacher_logp=self.step_fn.score_teacher(self.state.params, b)) for b in batches
      ]
      metrics.update(teacher_old_gap_metrics(batches))
    per_batch = []
    for b in batches:
      self.state, m = self.step_fn(self.state, b, self.ref_params, iteration=it + 1)
      per_batch.append((jax.device_get(m), float(np.asarray(b.response_mask).sum())))
    metrics.update(_combine(per_batch))
    metrics["train/update_seconds"] = time.perf_counter() - t1
    metrics["train/compilations"] = float(self.step_fn.num_traces)
    metrics["rollout/sampler_compilations"] = float(self.sampler.num_compilations)
    return metrics

  # ---------------------------------------------------------------------------- run
  def run(self) -> dict[str, float]:
    """Trains up to train.total_steps iterations (resuming from the latest checkpoint) and returns
    the last metrics row; an eval-only Trainer evaluates once instead."""
    if self.eval_only:
      return self.run_evaluation()
    cfg = self.config
    total = cfg.train.total_steps
    resumed = self.maybe_restore()
    last: dict[str, float] = {}
    if self.eval_loops and cfg.train.eval_before_train and not resumed:
      last = self.logger.log(
        self.loop_state.iteration, {**self.warm_start_metrics, **self.evaluate()}
      )
      self._plot()
    progress = Progress(total, start=self.loop_state.iteration)
    if self.loop_state.iteration < total:
      log.info(
        "training iterations %d..%d of %d (the first one compiles the sampler and the update)",
        self.loop_state.iteration + 1,
        total,
        total,
      )
    while self.loop_state.iteration < total:
      metrics = self.train_iteration()
      self.loop_state.iteration += 1
      it = self.loop_state.iteration
      evaluated = bool(self.eval_loops and cfg.train.eval_every) and _due(
        it, cfg.train.eval_every, total
      )
      if evaluated:
        metrics.update(self.evaluate())
      duration = progress.tick()
      log.info("%s | %s", progress.line(it, duration), self.logger.summary(metrics))
      if evaluated or _due(it, cfg.logging.every, total):
        last = self.logger.log(it, metrics, echo=False)
        self._plot()
      if _due(it, cfg.checkpoint.every, total):
        self.save(force=True)
    self.ckpt.wait_until_finished()
    if cfg.checkpoint.export_hf:
      out = export_hf(
        self.model_config,
        self.state.params,
        os.path.join(self.workdir, "hf_export"),
        tokenizer_dir=self.tokenizer.path,
        source_dir=self.config.model.get("path"),  # its generation_config.json, when it has one
      )
      if out:
        log.info("final policy exported to %s", out)
    return last

  def run_evaluation(self) -> dict[str, float]:
    """One evaluation of the parameters (validation episodes of every eval mode): a metrics row at
    the evaluated step, metrics.png and evaluation.json (what was evaluated) in the workdir."""
    t0 = time.perf_counter()
    metrics = self.evaluate()
    metrics["val/seconds"] = time.perf_counter() - t0
    row = self.logger.log(self.loop_state.iteration, metrics)
    self._plot()
    self._write_eval_record(finished=time.strftime("%Y-%m-%d %H:%M:%S %z"), metrics=row)
    log.info("evaluation results in %s", self.workdir)
    return row

  def _start_eval_record(self) -> None:
    """Marks the directory as an evaluation's (before anything else is written) and removes the
    results of a previous evaluation there: evaluating again replaces them."""
    config_json = os.path.join(self.workdir, "config.json")
    if os.path.exists(config_json) and not os.path.exists(os.path.join(self.workdir, EVAL_RECORD)):
      raise FileExistsError(
        f"{self.workdir} holds a training run (its config.json); an evaluation never writes into "
        "a run's files. Fix: evaluate into another directory (e.g. <workdir>/eval/step_<N>)."
      )
    for name in ("metrics.jsonl", "metrics.png"):
      if os.path.exists(os.path.join(self.workdir, name)):
        os.remove(os.path.join(self.workdir, name))
    self._write_eval_record(started=time.strftime("%Y-%m-%d %H:%M:%S %z"))

  def _write_eval_record(self, **fields: Any) -> None:
    if self.params_from is not None:
      source = {"checkpoint_dir": self.params_from[0], "step": self.params_from[1]}
    else:
      source = {"model_path": self.config.model.get("path"), "step": 0}
    with open(os.path.join(self.workdir, EVAL_RECORD), "w") as f:
      json.dump({"evaluated": source, **fields}, f, indent=2)

  def _plot(self) -> None:
    if self.config.logging.plots and self.logger.path:
      plot_history(self.logger.path)

  def close(self) -> None:
    """Closes what was built (also after a failed build), each even if another fails to close,
    and releases the workdir lock last."""
    with contextlib.ExitStack() as stack:
      stack.callback(self.lock.release)
      for name in ("eval_pool", "pool", "logger", "ckpt"):
        resource = getattr(self, name, None)
        if resource is not None:
          stack.callback(resource.close)


def teacher_old_gap_metrics(batches) -> dict[str, float]:
  """Teacher minus old (behaviour) log-prob over every response token of the iteration's
  mini-batches, token-weighted (Σ gap / Σ tokens, not a mean of per-mini-batch means), and its
  root mean square (the reference's "std" of this gap is this RMS)."""
  total = sq = tokens = 0.0
  for b in batches:
    mask = np.asarray(b.response_mask, np.float64) > 0
    gap = np.asarray(b.teacher_logp, np.float64) - np.asarray(b.old_logp, np.float64)
    gap = np.where(mask, gap, 0.0)
    total, sq, tokens = total + gap.sum(), sq + (gap * gap).sum(), tokens + mask.sum()
  tokens = max(tokens, 1.0)
  return {
    "rollout/teacher_old_gap_mean": float(total / tokens),
    "rollout/teacher_old_gap_rms": float(np.sqrt(sq / tokens)),
  }


def _jsonable(value):
  return json.loads(
    json.dumps(value, default=lambda x: x.tolist() if hasattr(x, "tolist") else int(x))
  )


def run(config, workdir: str) -> dict[str, float]:
  """Trains with `config` in `workdir` (resuming from its checkpoints); returns the last metrics."""
  trainer = Trainer(config, workdir)
  try:
    return trainer.run()
  finally:
    trainer.close()


def run_evaluation(
  config, out_dir: str, params_from: tuple[str, int] | None = None
) -> dict[str, float]:
  """Evaluates checkpoint `params_from` = (checkpoint directory, step) (None: the config's weights)
  into `out_dir` and returns the metrics row (see `Trainer.run_evaluation`)."""
  trainer = Trainer(config, out_dir, eval_only=True, params_from=params_from)
  try:
    return trainer.run()
  finally:
    trainer.close()
