"""The host loop: rollout -> replay -> update -> eval -> checkpoint -> log.

One iteration (DESIGN.md "One iteration, as data"):

1. `tasks_per_step` tasks are drawn; each is played by `group_size` envs of the pool (a GRPO group).
2. `AgentLoop.run` plays the episodes with the current parameters (`sampling.generate`), recording
   every turn's prompt, teacher prompt, sampled response ids and behaviour log-probs.
3. `episodes_to_samples`: one sample per turn, episode return minus the turn's invalid-format
   penalty, GRPO advantages over each group's turn-samples.
4. The samples pass through the replay queue (synchronous on-policy by default).
5. They are packed into fixed-shape mini-batches; with teacher_source="rollout" the teacher
   log-probs of every mini-batch are scored once at θ_old, then one compiled update per mini-batch.

Evaluation plays the validation split with group size 1 at `rollout.val_temperature`; checkpoints
hold the TrainState plus the iteration and the task sampler's state, so a killed run resumes
where it stopped; the final policy is exported as Hugging Face safetensors.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sdar_jax import sharding
from sdar_jax.checkpoint import CheckpointManager, abstract_train_state, export_hf
from sdar_jax.config_validation import model_config_from
from sdar_jax.metrics import MetricsLogger, plot_history
from sdar_jax.models import ModelConfig, init_params, load_pretrained
from sdar_jax.rollout import (
  AgentLoop,
  ReplayQueue,
  episodes_to_samples,
  get_adapter,
  pack_batch,
  plan_minibatches,
)
from sdar_jax.rollout.trajectory import Episode
from sdar_jax.sampling import Sampler, SamplingParams
from sdar_jax.tokenizer import Tokenizer
from sdar_jax.train_state import create_train_state
from sdar_jax.train_step import TrainStep, train_step_from_config

_PAD_FALLBACK = 0
_HOST_LOOP_ENVS = ("alfworld",)
# eval.skills -> [(metric prefix, skills in the student prompt)]; Skill-GRPO's table rows read
# "val" without skills and "val_with_skill" with them (reference §2.6).
_EVAL_MODES = {
  "without": (("val", False),),
  "with": (("val", True),),
  "both": (("val", False), ("val_with_skill", True)),
}


# ------------------------------------------------------------------------------------ building
def build_tokenizer(model_cfg) -> Tokenizer:
  directory = model_cfg.get("tokenizer_dir") or model_cfg.get("path")
  return Tokenizer.from_dir(directory) if directory else Tokenizer.bundled_qwen()


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


def offline_alfworld_dir(env_cfg) -> str:
  """Generated ALFWorld games (train / valid_seen / valid_unseen), cached per generator settings."""
  from envs.alfworld import generator

  off = env_cfg.offline
  root = os.environ.get(
    "SDAR_DATA_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "sdar_jax")
  )
  out = os.path.join(root, f"alfworld_offline_n{off.num_train}_e{off.num_eval}_s{off.seed}")
  marker = os.path.join(out, "COMPLETE")
  if not os.path.exists(marker):
    print(f"generating offline ALFWorld games into {out} (planner-checked, cached) ...", flush=True)
    generator.generate(out, off.num_train, off.num_eval, seed=off.seed)
    with open(marker, "w") as f:
      f.write("ok\n")
  return out


def game_files(config, split: str) -> list[str]:
  from envs.alfworld import collect_game_files

  data_dir = config.env.get("data_dir") or offline_alfworld_dir(config.env)
  return collect_game_files(data_dir, split)


def build_retriever(config):
  from envs.skills.retrieval import SkillRetriever

  s = config.env.skills
  return SkillRetriever(
    s.get("dir") or config.env.name,
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


# ------------------------------------------------------------------------------------ metrics
def rollout_metrics(episodes: list[Episode], prefix: str = "episode") -> dict[str, float]:
  done = [ep for ep in episodes if ep.env_error is None]
  m: dict[str, float] = {f"{prefix}/env_failures": float(len(episodes) - len(done))}
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

  def __init__(self, config, workdir: str):
    import envs

    if config.env.name not in _HOST_LOOP_ENVS:
      raise NotImplementedError(
        f"env.name={config.env.name!r}: the host loop runs {_HOST_LOOP_ENVS} so far; the "
        f"WebShop and Search-QA environments are not implemented yet (their configs validate and "
        f"--dry_run works)."
      )
    self.config = config
    self.workdir = os.path.abspath(workdir)
    os.makedirs(self.workdir, exist_ok=True)
    with open(os.path.join(self.workdir, "config.json"), "w") as f:
      json.dump(config.to_dict(), f, indent=2, default=str)
    self.mesh = sharding.make_mesh(dict(config.mesh))
    self.tokenizer = build_tokenizer(config.model)
    self.model_config, params = build_policy(config, self.mesh)
    self.step_fn: TrainStep = train_step_from_config(self.model_config, config, self.mesh)
    lc = self.step_fn.loss_config
    self.with_teacher = lc.needs_teacher
    self.pad_id = self.tokenizer.pad_token_id or _PAD_FALLBACK
    self.sampler = Sampler(
      self.model_config, self.mesh, self.tokenizer, max_prompt_len=config.rollout.max_prompt_len
    )
    env = config.env
    self.group_size = env.group_size
    self.tasks_per_step = env.tasks_per_step
    self.train_games = game_files(config, env.get("split", "train"))
    self.eval_games = (
      game_files(config, config.eval.split)
      if config.train.eval_every or config.train.eval_before_train
      else []
    )
    retriever = (
      build_retriever(config)
      if (self.with_teacher or config.algo.skills_in_student or config.eval.skills != "without")
      else None
    )
    n_train = self.tasks_per_step * self.group_size
    self.pool = envs.EnvPool(
      env.name,
      n_train,
      dict(game_files=self.train_games, seed=env.seed, max_steps=env.max_turns),
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
      adapter=get_adapter(env.name),
      sampler=self.sampler,
      tokenizer=self.tokenizer,
      chat_template=config.model.chat_template,
      max_turns=env.max_turns,
      history_length=env.history,
      max_prompt_len=config.rollout.max_prompt_len,
      truncation=config.rollout.prompt_truncation,
      retriever=retriever,
      enable_thinking=config.model.enable_thinking,
    )
    self.loop = AgentLoop(
      self.pool,
      sampling=sampling,
      with_teacher=self.with_teacher,
      skills_in_student=config.algo.skills_in_student,
      **common,
    )
    self.eval_loops: list[tuple[str, AgentLoop]] = []
    self.eval_pool = None
    if self.eval_games:
      n_eval = min(config.eval.num_tasks, len(self.eval_games))
      self.eval_pool = envs.EnvPool(
        env.name,
        n_eval,
        dict(game_files=self.eval_games, seed=env.seed + 1000, max_steps=env.max_turns),
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
    if config.get("warm_start") and config.warm_start.steps > 0:
      params = self._warm_start(params)
    self.ref_params = None
    if lc.kl_coef:  # the frozen initial policy (after any warm start), only when KL is on
      self.ref_params = jax.tree.map(jnp.copy, params)
    self.state = self.step_fn.shard_state(
      create_train_state(params, self.step_fn.optimizer, config.train.seed)
    )
    self.replay = ReplayQueue(max_staleness=config.train.max_staleness)
    self.logger = MetricsLogger(
      config.logging.get("dir") or self.workdir,
      jsonl=config.logging.jsonl,
      tensorboard=config.logging.tensorboard,
    )
    self.ckpt = CheckpointManager(
      config.checkpoint.get("dir") or os.path.join(self.workdir, "checkpoints"),
      keep=config.checkpoint.keep,
      async_save=config.checkpoint.async_save,
    )
    self.loop_state = LoopState()
    self.task_rng = np.random.default_rng(config.train.seed)
    self.rng = jax.random.key(config.train.seed + 1)  # rollout keys: see _key

  # ---------------------------------------------------------------------------- warm start
  def _warm_start(self, params):
    """Expert SFT on the walkthroughs (once per workdir: the result is saved as a Hugging Face
    directory and reloaded on resume, so the KL reference stays the warm-started policy)."""
    from sdar_jax.models import save_pretrained
    from sdar_jax.warm_start import expert_samples, read_walkthroughs, warm_start

    out = os.path.join(self.workdir, "warm_start_policy")
    if os.path.exists(os.path.join(out, "config.json")):
      _, params = load_pretrained(out, dtype=self.config.model.param_dtype, mesh=self.mesh)
      return params
    w = self.config.warm_start
    data_dir = self.config.env.get("data_dir") or offline_alfworld_dir(self.config.env)
    records = read_walkthroughs(os.path.join(data_dir, "walkthroughs", f"{w.split}.jsonl"))
    samples = expert_samples(records, self.loop, end_token_id=self.tokenizer.eos_token_ids[0])
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
    }
    print(
      f"warm start: {len(samples)} expert turn-samples, {w.steps} steps, loss "
      f"{losses[0]:.3f} -> {losses[-1]:.3f}",
      flush=True,
    )
    save_pretrained(self.model_config, params, out)
    return params

  # ---------------------------------------------------------------------------- resume
  def maybe_restore(self) -> bool:
    if self.ckpt.latest_step() is None:
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
    print(
      f"resumed from {self.ckpt.directory} at iteration {self.loop_state.iteration}", flush=True
    )
    return True

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
    """Validation episodes (group size 1, one per eval game up to eval.num_tasks) per eval mode."""
    tasks = list(range(len(self.eval_pool)))
    metrics = {}
    for mode, (prefix, loop) in enumerate(self.eval_loops):
      episodes = loop.run(
        self.state.params,
        tasks,
        tasks,
        self._key(1 + mode),
        policy_version=self.loop_state.iteration,
        desc=prefix,
      )
      metrics.update(rollout_metrics(episodes, prefix=prefix))
    return metrics

  def train_iteration(self) -> dict[str, float]:
    it = self.loop_state.iteration
    t0 = time.perf_counter()
    tasks, groups = self._draw_tasks()
    episodes = self.loop.run(self.state.params, tasks, groups, self._key(0), policy_version=it)
    t_rollout = time.perf_counter() - t0
    metrics = rollout_metrics(episodes)
    samples = episodes_to_samples(
      episodes,
      invalid_penalty=self.config.algo.invalid_penalty,
      norm_adv_by_std=self.config.algo.norm_adv_by_std,
    )
    self.replay.put(samples)
    samples = self.replay.take(None, current_version=it)
    metrics["rollout/turn_samples"] = float(len(samples))
    metrics["rollout/generated_tokens"] = float(sum(len(s.response_ids) for s in samples))
    metrics["rollout/seconds"] = t_rollout
    if not samples:
      print(f"[iteration {it}] no trainable turn-samples (every env failed); skipping the update")
      return metrics
    t1 = time.perf_counter()
    mb_size = self.config.train.mini_batch_size
    batches = [
      self.step_fn.shard_batch(pack_batch(mb, mb_size, self.with_teacher, self.pad_id))
      for mb in plan_minibatches(samples, mb_size)
    ]
    lc = self.step_fn.loss_config
    if self.with_teacher and lc.teacher_source == "rollout":
      batches = [
        b.replace(teacher_logp=self.step_fn.score_teacher(self.state.params, b)) for b in batches
      ]
      gap = [_masked_mean_np(b.teacher_logp - b.old_logp, b.response_mask) for b in batches]
      metrics["rollout/teacher_old_gap_mean"] = float(np.mean(gap))
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
    cfg = self.config
    total = cfg.train.total_steps
    resumed = self.maybe_restore()
    last: dict[str, float] = {}
    if self.eval_loops and cfg.train.eval_before_train and not resumed:
      last = self.logger.log(
        self.loop_state.iteration, {**self.warm_start_metrics, **self.evaluate()}
      )
    while self.loop_state.iteration < total:
      metrics = self.train_iteration()
      self.loop_state.iteration += 1
      it = self.loop_state.iteration
      if (
        self.eval_loops and cfg.train.eval_every and (it % cfg.train.eval_every == 0 or it == total)
      ):
        metrics.update(self.evaluate())
      last = self.logger.log(it, metrics)
      if cfg.checkpoint.every and (it % cfg.checkpoint.every == 0 or it == total):
        self.save(force=True)
      if cfg.logging.plots and self.logger.path:
        plot_history(self.logger.path)
    self.ckpt.wait_until_finished()
    if cfg.checkpoint.export_hf:
      out = export_hf(
        self.model_config,
        self.state.params,
        os.path.join(self.workdir, "hf_export"),
        tokenizer_dir=self.tokenizer.path,
      )
      if out:
        print(f"final policy exported to {out}", flush=True)
    return last

  def close(self) -> None:
    self.ckpt.close()
    self.logger.close()
    self.pool.close()
    if self.eval_pool is not None:
      self.eval_pool.close()


def _masked_mean_np(values, mask) -> float:
  values, mask = np.asarray(values), np.asarray(mask)
  return float((values * mask).sum() / max(mask.sum(), 1.0))


def _jsonable(value):
  return json.loads(
    json.dumps(value, default=lambda x: x.tolist() if hasattr(x, "tolist") else int(x))
  )


def run(config, workdir: str) -> dict[str, float]:
  """Trains with `config` in `workdir` (resuming from its checkpoints) and returns the last metrics."""
  trainer = Trainer(config, workdir)
  try:
    return trainer.run()
  finally:
    trainer.close()
