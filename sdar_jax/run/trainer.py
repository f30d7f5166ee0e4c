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
   are scored once at θ_old (at the frozen initial policy with algo.teacher_weights="initial"),
   then one compiled update per mini-batch.

Asynchronous training (`train.max_staleness = k > 0`, one process): a rollout thread
(sdar_jax.rollout.worker) plays iterations i+1 .. i+k while the main thread updates on iteration
i's samples. Each queued rollout gets a copy of the parameters of the iteration that queued it
(the update donates the TrainState's buffers), so a trained sample is at most k policy versions
old; the replay queue drops (and `rollout/dropped_stale` counts) any staler sample. The
importance ratios use the sampler's behaviour log-probs, so `algo.recompute_old_logp` is refused
with it, as are several processes. Tasks and rollout keys stay functions of (seed, iteration);
a checkpoint saves the task sampler as it was before the first queued rollout drew its tasks,
and the queued rollouts themselves are discarded (a resumed run plays them again, with the
restored parameters). The main thread holds the sampler's lock around its device programs, so
the rollout thread's env steps, not its generations, overlap the update. `max_staleness=0` is
the serial loop above.

Evaluation plays the validation split with group size 1 at `rollout.val_temperature`; checkpoints
hold the TrainState plus the iteration and the task sampler's state, so a killed run resumes
where it stopped (metric rows of iterations after the restored checkpoint are dropped first); the
final policy is exported as Hugging Face safetensors.

The workdir may be local or a gs:// URL (sdar_jax.infra.paths): config.json, metrics, plots,
diagnostics and the export are written by the primary process, checkpoints by every process.
A run holds its workdir's lock (sdar_jax.run.workdir_lock) from start to close. Each iteration
logs a progress line (elapsed time, ETA) and, every `logging.every` iterations, a metrics row
(also to Weights & Biases from the primary process with `logging.wandb`, in the W&B run whose id
the workdir keeps: sdar_jax.observe.wandb_log). The first failure of each kind of an environment
is logged with its env and game file; failures are counted
in `episode/env_failures`, and the run stops with `EnvFailureError` when every environment failed
in `train.max_failed_iterations` consecutive iterations. A Search-QA search that fails is
counted in `rollout/search_errors` and logged once per kind of failure. An update whose loss or
gradient is not finite is skipped (the state unchanged); `train.max_skipped_updates` skipped in a
row stop the run with `SkippedUpdatesError` before another checkpoint or the export is written.

`Trainer(config, out_dir, eval_only=True, params_from=(checkpoint_dir, step))` is an evaluation:
the checkpoint's parameters alone (no optimizer state, no KL reference, no training envs), the
validation episodes of that step, and its own config.json / metrics.jsonl / metrics.png in `out_dir`
(sdar_jax.evaluate runs it and picks `<workdir>/eval/step_<N>/`). What a run builds from its config
(tokenizer, policy, env pools, agent loops) is in sdar_jax.run.setup, the expert warm start in
sdar_jax.run.warm_start, the metric reductions in sdar_jax.observe.metrics.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import envs
from sdar_jax import algos
from sdar_jax.algos import AlgoConfig
from sdar_jax.core import sharding
from sdar_jax.core.sampling import Sampler
from sdar_jax.core.train_state import create_train_state
from sdar_jax.core.train_step import TrainStep, train_step_from_config
from sdar_jax.infra import multihost, paths
from sdar_jax.infra.errors import UserError
from sdar_jax.observe import gate_histograms, token_view, transcripts, wandb_log
from sdar_jax.observe.metrics import (
  MetricsLogger,
  mean_over_updates,
  plot_history,
  rollout_metrics,
  search_error_count,
  teacher_old_gap_metrics,
  validation_summary,
)
from sdar_jax.observe.progress import Progress, ensure_log_handler
from sdar_jax.rollout import ReplayQueue, episodes_to_samples
from sdar_jax.rollout.global_batches import global_minibatches
from sdar_jax.rollout.shaping import RewardShaping
from sdar_jax.rollout.trajectory import Episode, RolloutTimings, episode_summaries
from sdar_jax.rollout.worker import RolloutWorker, StoppablePool
from sdar_jax.run import setup as run_setup
from sdar_jax.run.checkpoint import CheckpointManager, abstract_train_state, export_hf
from sdar_jax.run.config_validation import validate
from sdar_jax.run.evaluation import evaluated_source, now, start_eval_record, write_eval_record
from sdar_jax.run.iteration import Iteration, RunView
from sdar_jax.run.setup import (
  build_agent_loops,
  build_chat_template,
  build_policy,
  build_retriever,
  build_tokenizer,
  check_first_prompts,
  restore_policy,
)
from sdar_jax.run.warm_start import built_policy_metrics, warm_start_run
from sdar_jax.run.workdir_lock import WorkdirLock

log = logging.getLogger(__name__)

_PAD_FALLBACK = 0
_UNSET = object()


class EnvFailureError(UserError, RuntimeError):
  """Every environment failed in `train.max_failed_iterations` consecutive iterations."""

  heading = "EnvFailureError"


class SkippedUpdatesError(UserError):
  """`train.max_skipped_updates` updates in a row were skipped because their loss or gradient
  was not finite: the run stops before another checkpoint or the export is written."""


def _error_kind(error: str) -> str:
  """'env raised during reset: JSONDecodeError: Expecting ...' -> its first two ': ' fields."""
  return ": ".join(error.split(": ")[:2])


def _due(iteration: int, every: int, total: int) -> bool:
  """Whether something done every `every` iterations (0 = only at the end) is due now."""
  return iteration == total or (every > 0 and iteration % every == 0)


@dataclasses.dataclass
class LoopState:
  """Host-side state a checkpoint keeps beside the TrainState."""

  iteration: int = 0  # completed training iterations
  task_rng: dict[str, Any] | None = None  # numpy bit-generator state of the task sampler
  replay: dict[str, int] | None = None
  all_failed_iterations: int = 0  # consecutive iterations in which every env failed
  skipped_in_a_row: int = 0  # consecutive updates skipped for a non-finite loss or gradient
  hooks: dict[str, Any] | None = None  # each method hook's state, by its registered name
  # entries of older checkpoints' loop state that are no field here (a hook's state saved under
  # its own key before hooks existed: `MethodHooks.legacy_state_key`)
  legacy: dict[str, Any] | None = None

  @classmethod
  def from_saved(cls, saved: dict[str, Any]) -> LoopState:
    names = {f.name for f in dataclasses.fields(cls)}
    known = {k: v for k, v in saved.items() if k in names and k != "legacy"}
    legacy = {**(saved.get("legacy") or {}), **{k: v for k, v in saved.items() if k not in names}}
    return cls(**known, legacy=legacy or None)


@dataclasses.dataclass
class _Rollout:
  """One iteration's episodes with the rollout's wall time and timings (sdar_jax.observe.perf)."""

  episodes: list[Episode]
  seconds: float
  timings: RolloutTimings


@dataclasses.dataclass
class _Queued:
  """Asynchronous training: a rollout handed to the rollout thread, with the task sampler's
  state from before its tasks were drawn (what a checkpoint saves while it is pending)."""

  task_rng: dict[str, Any]
  rollout: concurrent.futures.Future


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
      problems = run_setup.setting_problems(config)
      if problems:
        raise ValueError("\n".join(problems))
      wandb_log.require(config.logging)  # logging.wandb=True without the package: stop here
    self.config = config
    for what, where in (
      ("workdir", workdir),
      ("checkpoint.dir", config.checkpoint.get("dir")),
      ("logging.dir", config.logging.get("dir")),
    ):
      if where:
        paths.check_remote_workdir(where, what)  # a gs:// run without gcsfs stops here
    self.workdir = paths.resolve(workdir)  # a gs:// URL stays one
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
      start_eval_record(self.workdir, evaluated_source(self.config, self.params_from))
    config_json = json.dumps(config.to_dict(), indent=2, default=str)
    if paths.is_primary_process():
      paths.write_text(paths.join(self.workdir, "config.json"), config_json)
    self.wandb_run: wandb_log.WandbRun | None = None  # process 0 of a training run only
    if not self.eval_only and config.logging.get("wandb") and paths.is_primary_process():
      self.wandb_run = wandb_log.WandbRun.start(
        config.logging, json.loads(config_json), self.workdir
      )
      log.info("W&B run %s (id kept in %s)", self.wandb_run.id, wandb_log.RUN_ID_FILE)
    self.mesh = sharding.make_mesh(dict(config.mesh))
    self.tokenizer = build_tokenizer(config.model)
    if self.params_from is None:
      self.model_config, params = build_policy(config, self.mesh)
    else:
      self.model_config, params = restore_policy(config, self.mesh, *self.params_from)
    sharding.set_kernel_mesh(self.mesh, self.model_config)  # for a TPU attention kernel, if any
    self.chat_template = build_chat_template(config.model, self.model_config.family)
    log.info("chat template: %s", self.chat_template.name)
    self.step_fn: TrainStep | None = None
    self.with_teacher = False
    self.hooks: dict[str, algos.MethodHooks] = {}  # the algorithm's hooks (algos.hooks)
    if not self.eval_only:
      self.step_fn = train_step_from_config(self.model_config, config, self.mesh)
      self.with_teacher = self.step_fn.algo_config.scores_teacher
      self.hooks = algos.build_hooks(self.step_fn.algo_config)
    self.pad_id = self.tokenizer.pad_token_id or _PAD_FALLBACK
    self.sampler = Sampler(
      self.model_config, self.mesh, self.tokenizer, max_prompt_len=config.rollout.max_prompt_len
    )
    self.shaping = RewardShaping.from_config(config.rollout.get("shaping"))
    self.group_size = config.env.group_size
    self.tasks_per_step = config.env.tasks_per_step
    loops = build_agent_loops(
      config,
      self.env_family,
      self.sampler,
      self.tokenizer,
      self.chat_template,
      with_teacher=self.with_teacher,
      eval_only=self.eval_only,
    )
    self.pool, self.loop, self.train_games = loops.pool, loops.loop, loops.train_games
    self.validations = loops.validations  # per validation split: games, tasks, pool, loops
    if config.rollout.prompt_truncation == "error":  # a first prompt too long: now, not later
      check_first_prompts(loops, config)
    self.warm_start_metrics: dict[str, float] = {}
    self.ref_params = None
    self.state = None
    self.eval_params = None  # the evaluated parameters of an eval-only run
    if self.eval_only:
      self.eval_params = params
    else:
      if config.get("warm_start") and config.warm_start.steps > 0:
        params, self.warm_start_metrics = warm_start_run(
          config,
          params,
          model_config=self.model_config,
          family=self.env_family,
          loop=self.loop,
          pool=self.pool,
          num_games=len(self.train_games),
          end_token_id=self.tokenizer.eos_token_ids[0],
          shard_batch=self.step_fn.shard_batch,
          mesh=self.mesh,
          workdir=self.workdir,
        )
      else:
        self.warm_start_metrics = built_policy_metrics(config.model.get("path"))
      # the frozen initial policy (after any warm start): the KL term's, or a frozen teacher's
      if self.step_fn.algo_config.needs_ref_params:
        self.ref_params = jax.tree.map(jnp.copy, params)
      self.state = self.step_fn.shard_state(
        create_train_state(params, self.step_fn.optimizer, self.step_fn.algo_config.keeps_ema)
      )
    self.replay = ReplayQueue(max_staleness=config.train.max_staleness)
    self.logger = MetricsLogger(
      self.workdir if self.eval_only else (config.logging.get("dir") or self.workdir),
      jsonl=config.logging.jsonl,
      tensorboard=config.logging.tensorboard,
      wandb_run=self.wandb_run,
    )
    self.ckpt: CheckpointManager | None = None
    if not self.eval_only:
      self.ckpt = CheckpointManager(
        config.checkpoint.get("dir") or paths.join(self.workdir, "checkpoints"),
        keep=config.checkpoint.keep,
        async_save=config.checkpoint.async_save,
      )
    self.loop_state = LoopState(iteration=self.params_from[1] if self.params_from else 0)
    self._failure_kinds: dict[str, str] = {}  # first error of each kind, with its env and game
    self._search_error_kinds: set[str] = set()  # kinds of failed searches already warned about
    self._searches = config.env.name == "search_qa"  # its episodes search: count failed searches
    self.task_rng = np.random.default_rng(config.train.seed)
    self.rng = jax.random.key(config.train.seed + 1)  # rollout keys: see _key
    self.eval_rng = jax.random.key(config.eval.get("seed", 0))  # validation keys: see evaluate
    # Asynchronous training (train.max_staleness > 0): the rollout thread, made at the first
    # iteration, and the rollouts handed to it by iteration.
    self._worker: RolloutWorker | None = None
    self._queued: dict[int, _Queued] = {}
    self._fallback_retriever: Any = _UNSET  # the token view's skill retriever (_view_retriever)

  # ---------------------------------------------------------------------------- resume
  def maybe_restore(self) -> bool:
    """Restores the latest checkpoint if there is one; either way drops the metric rows of
    iterations after it (a run killed between a row and its checkpoint logs that step again)."""
    if self.ckpt.latest_step() is None:
      self._drop_metric_rows_after(-1)
      return False
    target = abstract_train_state(
      self.model_config,
      self.step_fn.optimizer,
      self.mesh,
      ema=self.step_fn.algo_config.keeps_ema,
    )
    state, meta = self.ckpt.restore(target=target, model_config=self.model_config)
    self.state = state
    extra = meta.get("extra") or {}
    self.loop_state = LoopState.from_saved(extra.get("loop", {}))
    if self.loop_state.task_rng:
      self.task_rng.bit_generator.state = self.loop_state.task_rng
    if self.loop_state.replay:
      self.replay.load_state_dict(self.loop_state.replay)
    saved, legacy = self.loop_state.hooks or {}, self.loop_state.legacy or {}
    for name, hooks in self.hooks.items():
      state = saved.get(name, legacy.get(hooks.legacy_state_key or name))
      if state is not None:
        hooks.load_state_dict(state, RunView(self, self.loop_state.iteration))
    self.loop_state.legacy = None  # translated: the next checkpoint keeps the hooks' states only
    log.info("resumed from %s at iteration %d", self.ckpt.directory, self.loop_state.iteration)
    self._drop_metric_rows_after(self.loop_state.iteration)
    return True

  def _drop_metric_rows_after(self, step: int) -> None:
    if step < 0 and not self.warm_start_metrics and self.logger.path:
      # A restart before the first checkpoint logs step 0 again; a reloaded warm start does not
      # recompute its metrics, so keep them from the dropped row.
      try:
        text = paths.read_text(self.logger.path) if paths.exists(self.logger.path) else ""
        first = json.loads((text.splitlines() or ["{}"])[0])
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
    """Checkpoints the TrainState and the loop state. Rollouts queued for later iterations are
    not saved (a resumed run plays them again): the task sampler's state saved is the one from
    before the first of them drew its tasks, so the resumed run draws the same tasks."""
    self.loop_state.task_rng = (
      self._queued[min(self._queued)].task_rng
      if self._queued
      else self.task_rng.bit_generator.state
    )
    self.loop_state.replay = self.replay.state_dict()
    self.loop_state.hooks = {name: hooks.state_dict() for name, hooks in self.hooks.items()}
    self.ckpt.save(
      self.loop_state.iteration,
      self.state,
      self.model_config,
      run_config=self.config,
      extra={"loop": _jsonable(dataclasses.asdict(self.loop_state))},
      force=force,
    )

  # ---------------------------------------------------------------------------- phases
  def _draw_tasks(self, iteration: int) -> tuple[list[int], list[int]]:
    """The tasks of `iteration` (draws must come in iteration order) and their group ids."""
    n_games = len(self.train_games)
    picks = self.task_rng.choice(
      n_games, size=self.tasks_per_step, replace=self.tasks_per_step > n_games
    )
    base = iteration * self.tasks_per_step
    tasks = [int(t) for t in picks for _ in range(self.group_size)]
    groups = [base + k for k in range(self.tasks_per_step) for _ in range(self.group_size)]
    return tasks, groups

  def _key(self, iteration: int | None = None) -> jax.Array:
    """The training rollout key of `iteration` (default: the current one): a function of
    (train.seed, iteration) only, so a resumed run samples what an uninterrupted one would have."""
    iteration = self.loop_state.iteration if iteration is None else iteration
    return jax.random.fold_in(jax.random.fold_in(self.rng, iteration), 0)

  def evaluate(self, start: bool = False) -> dict[str, float]:
    """Validation episodes (group size 1, one per task of each validation split, eval.repeats
    times) per eval mode. Their sampling keys depend on `eval.seed`, the split, the mode, the
    repeat and the batch only, not on the iteration or `train.seed`: every evaluation of a run
    draws the same random numbers (per episode and turn), so an unchanged policy plays the same
    episodes and a before/after difference is not blurred by fresh sampling noise. Every rate is
    over all of a mode's episodes (batches, repeats and processes together). A mode a
    validation marks start-only (a method hook's `start_eval_modes`) is played only when
    `start` (the evaluation before training)."""
    params = self.eval_params if self.state is None else self.state.params
    out_dir = self.eval_output_dir()
    repeats = int(self.config.eval.get("repeats", 1))
    metrics = {}
    for v, validation in enumerate(self.validations):
      for mode, (prefix, loop) in enumerate(validation.loops):
        if prefix in validation.start_only and not start:
          continue
        first = v == 0 and mode == 0
        if first:  # the token view's episode needs its teacher prompts (observe.token_view)
          loop = token_view.with_teacher_prompts(loop, self._view_retriever(loop))
        key = jax.random.fold_in(self.eval_rng, mode)
        key = jax.random.fold_in(key, 1000 + v) if v else key  # another split: other keys
        episodes, everyone, repeat_of, rates = [], [], [], []
        for r in range(repeats):
          played = self._play_validation(
            loop, validation.tasks, params, jax.random.fold_in(key, 2000 + r) if r else key, prefix
          )
          summary = episode_summaries(played)  # every process's, for the metrics
          episodes += played
          everyone += summary
          repeat_of += [r] * len(summary)
          rates.append(rollout_metrics(summary, prefix).get(f"{prefix}/success_rate", 0.0))
        self._report_env_failures(episodes, validation.games, prefix)
        metrics.update(rollout_metrics(everyone, prefix, self.env_family.episode_metrics))
        self._report_search_errors(episodes, prefix)
        if self._searches:
          metrics[f"{prefix}/search_errors"] = search_error_count(everyone)
        if repeats > 1:  # avg@k is success_rate; the spread of the k repeats' rates
          metrics[f"{prefix}/success_rate_repeat_sd"] = float(np.std(rates, ddof=1))
        transcripts.write_outcomes(
          out_dir,
          prefix,
          everyone,
          arm=str(self.config.algo.get("name", "")),
          seed=int(self.config.train.seed),
          step=self.loop_state.iteration,
          split=validation.split,
          repeats=repeat_of,
        )
        if first:
          token_view.write_token_view(
            token_view.token_view_candidates(episodes),
            paths.join(out_dir, token_view.TOKEN_VIEW_FILE),
            token_view.TokenViewSource(
              self.model_config,
              params,
              self.step_fn.algo_config
              if self.step_fn
              else AlgoConfig.from_config(self.config.algo),
              self.tokenizer,
              self.pad_id,
              initial_params=self.ref_params,
            ),
            step=self.loop_state.iteration,
            run=self.workdir,
          )
        transcripts.write_transcripts(out_dir, prefix, episodes, self.tokenizer.decode)
    return metrics

  def _play_validation(self, loop, tasks: list[int], params, key, prefix: str) -> list[Episode]:
    """This process's episodes of `tasks`, played eval.batch_size at a time (0: all at once);
    batch b samples with `key` folded with b (batch 0 with `key` itself)."""
    size = int(self.config.eval.get("batch_size", 0)) or max(len(tasks), 1)
    starts = range(0, len(tasks), size)
    episodes = []
    for b, start in enumerate(starts):
      chunk = tasks[start : start + size]
      ids = list(range(start, start + len(chunk)))
      mine = multihost.episode_share(len(chunk))  # all of them with one process
      episodes += loop.run(
        params,
        chunk[mine],
        ids[mine],
        jax.random.fold_in(key, b) if b else key,
        policy_version=self.loop_state.iteration,
        desc=prefix if len(starts) == 1 else f"{prefix} {b + 1}/{len(starts)}",
      )
    return episodes

  def eval_output_dir(self) -> str:
    """Where an evaluation's files go: `<workdir>/eval/step_<N>`; an evaluation-only run: its
    results directory (`<workdir>`)."""
    if self.eval_only:
      return self.workdir
    return paths.join(self.workdir, "eval", f"step_{self.loop_state.iteration}")

  def _view_retriever(self, loop):
    """The skill retriever the token view's teacher prompts use when `loop` has none: the
    training loop's or another evaluation loop's, else one built from env.skills (None, with a
    warning, when that fails). Built once."""
    if loop.with_teacher or loop.retriever is not None:
      return None
    if self._fallback_retriever is _UNSET:
      loops = [self.loop, *(l for v in self.validations for _, l in v.loops)]
      found = [l.retriever for l in loops if l is not None and l.retriever is not None]
      if found:
        self._fallback_retriever = found[0]
      else:
        try:
          self._fallback_retriever = build_retriever(self.config)
        except Exception as e:  # noqa: BLE001 (the view goes on without a gate)
          log.warning("token view: no skill retriever (%s); tokens are shown without a gate", e)
          self._fallback_retriever = None
    return self._fallback_retriever

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

  def _report_search_errors(self, episodes: list[Episode], where: str) -> None:
    """Logs the first failed search of each kind (unreachable, timeout, HTTP 500, ...) once per
    run; every failed search is counted in rollout/search_errors (<prefix>/search_errors in an
    evaluation)."""
    for ep in episodes:
      for kind, message in ep.search_errors:
        if kind in self._search_error_kinds:
          continue
        self._search_error_kinds.add(kind)
        log.warning(
          "%s: a search failed (%s): %s. The episode goes on with the error as its observation; "
          "further failures of this kind are counted in rollout/search_errors, not shown. Check "
          "the retrieval server at env.search_url (env.search_timeout_s, env.search_retries).",
          where,
          kind,
          message,
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

  def _count_skipped(self, metrics: dict[str, Any], iteration: int, k: int, n: int) -> None:
    """Counts updates skipped in a row (train/skipped_update of update `k` of `n` in
    `iteration`); stops the run with SkippedUpdatesError at train.max_skipped_updates (0: never).
    Raised before the iteration's checkpoint: the last saved one holds the last good state."""
    if float(metrics.get("train/skipped_update", 0.0)) > 0:
      self.loop_state.skipped_in_a_row += 1
    else:
      self.loop_state.skipped_in_a_row = 0
    limit = self.config.train.get("max_skipped_updates", 3)
    if limit > 0 and self.loop_state.skipped_in_a_row >= limit:
      saved = self.ckpt.latest_step() if self.ckpt is not None else None
      kept = (
        f"the last checkpoint (iteration {saved}) is kept as it was"
        if saved is not None
        else "no checkpoint was written"
      )
      count = self.loop_state.skipped_in_a_row
      raise SkippedUpdatesError(
        f"{count} update{'s' if count > 1 else ''} in a row {'were' if count > 1 else 'was'} "
        "skipped because the loss or the gradient was not finite (NaN or inf), the last at "
        f"iteration {iteration}, update {k} of {n} (train.max_skipped_updates={limit}); {kept} "
        "and nothing was exported. Fix: check the weights the run started from (model.path), "
        "lower optim.lr or keep optim.clip_norm on, and read train/grad_norm in metrics.jsonl; "
        "--config.train.max_skipped_updates=0 never stops."
      )

  def _play(
    self,
    iteration: int,
    params,
    policy_version: int,
    tasks: list[int],
    groups: list[int],
    timings: RolloutTimings | None = None,
  ) -> _Rollout:
    """The training episodes of `iteration` played with `params` (`policy_version`): on the
    main thread (synchronous) or on the rollout thread (asynchronous)."""
    timings = RolloutTimings() if timings is None else timings
    t0 = time.perf_counter()
    mine = multihost.episode_share(len(tasks), self.group_size)  # all of them with one process
    episodes = self.loop.run(
      params,
      tasks[mine],
      groups[mine],
      self._key(iteration),
      policy_version=policy_version,
      timings=timings,
    )
    return _Rollout(episodes, time.perf_counter() - t0, timings)

  def _asynchronous(self) -> bool:
    return self.config.train.max_staleness > 0

  def device_turn(self):
    """Asynchronous training: the sampler's lock, held by the main thread around its device
    programs (updates, evaluation) so that they never run at the same time as a generation of
    the rollout thread (two multi-device programs could interleave their collectives and wait on
    each other). The rollout thread's env steps and prompt building still overlap them."""
    return self.sampler.lock if self._asynchronous() else contextlib.nullcontext()

  def _rollout_worker(self) -> RolloutWorker:
    if self._worker is None:
      self._worker = RolloutWorker(
        setup=lambda: sharding.set_kernel_mesh(self.mesh, self.model_config)  # thread-local
      )
      self.loop.pool = StoppablePool(self.pool, self._worker.stop)  # stops at close
    return self._worker

  def _queued_rollout(self, it: int) -> _Rollout:
    """Asynchronous training: the rollout of iteration `it` from the rollout thread, once the
    rollouts of iterations it+1 .. it+max_staleness (up to the last iteration) are queued
    behind it. Each is played with the parameters of the iteration that queued it, so a sample
    trained at iteration i was sampled by policy version i - max_staleness at the oldest (the
    first iterations of a run, or after a resume, are fresher). Tasks are drawn here, on the main
    thread, in iteration order, and each rollout's key is its iteration's (`_key`)."""
    last = min(it + self.config.train.max_staleness, self.config.train.total_steps - 1)
    params = None
    for j in range(it, last + 1):
      if j in self._queued:
        continue
      if params is None:  # a copy: each update donates the TrainState's buffers
        with self.device_turn():
          params = jax.block_until_ready(jax.tree.map(jnp.copy, self.state.params))
      before = self.task_rng.bit_generator.state
      tasks, groups = self._draw_tasks(j)
      future = self._rollout_worker().submit(self._play, j, params, it, tasks, groups)
      self._queued[j] = _Queued(before, future)
    rollout = self._queued[it].rollout.result()  # re-raises the rollout thread's exception
    del self._queued[it]
    return rollout

  def _stop_rollouts(self) -> None:
    """Stops the rollout thread (queued rollouts are discarded; `_queued` keeps their task
    sampler state for a checkpoint)."""
    if self._worker is not None:
      for queued in self._queued.values():
        queued.rollout.cancel()
      self._worker.close()
      self._worker = None
      self.loop.pool = self.pool

  def train_iteration(self) -> dict[str, float]:
    """One iteration as its phases in order (each timed: perf/phase_<name>_seconds), the run's
    method hooks between them (`algos.hooks`); returns its metrics."""
    view = Iteration(self, self.loop_state.iteration)
    with view.phase("rollout"):
      self._rollout_phase(view)
    with view.phase("teacher_context"):
      view.hooks("after_rollout")
      self._teacher_context_metrics(view)
    if not view.metrics["rollout/turn_samples"]:
      log.warning(
        "iteration %d: no trainable turn-samples (every env failed, %d in a row); skipping the "
        "update",
        view.iteration + 1,
        self.loop_state.all_failed_iterations,
      )
      return {
        **view.metrics,
        **view.clock.metrics(view.samples, view.iteration, view.rollout_seconds),
      }
    with view.phase("batches"):
      self._batches_phase(view)
    with view.phase("teacher_scoring"):
      self._teacher_scoring_phase(view)
    with view.phase("advantages"):
      view.hooks("after_teacher_scoring")
    with view.phase("update"):
      self._update_phase(view)
      view.hooks("after_updates")
    return self._iteration_metrics(view)

  def _rollout_phase(self, view: Iteration) -> None:
    """The iteration's episodes (played now, or taken from the rollout thread), their failures
    reported, their turn-samples with GRPO advantages through the replay queue."""
    it, metrics = view.iteration, view.metrics
    if self._asynchronous():
      waited = time.perf_counter()
      rollout = self._queued_rollout(it)
      metrics["rollout/wait_seconds"] = time.perf_counter() - waited  # what the thread did not hide
      view.clock.rollout = rollout.timings
    else:  # this iteration's rollout, now, with the current parameters
      tasks, groups = self._draw_tasks(it)
      rollout = self._play(it, self.state.params, it, tasks, groups, timings=view.clock.rollout)
    view.episodes, view.rollout_seconds = rollout.episodes, rollout.seconds
    self._report_env_failures(view.episodes, self.train_games, "episode")
    everyone = episode_summaries(view.episodes)  # every process's, for the metrics
    self._check_all_failed(everyone)
    metrics.update(rollout_metrics(everyone, "episode", self.env_family.episode_metrics))
    self._report_search_errors(view.episodes, "training")
    if self._searches:
      metrics["rollout/search_errors"] = search_error_count(everyone)
    samples = episodes_to_samples(view.episodes, **self.shaping.kwargs())
    self.replay.put(samples)
    dropped = self.replay.dropped_stale
    view.samples = self.replay.take(None, current_version=it)  # none staler than max_staleness
    if self._asynchronous():
      metrics["rollout/dropped_stale"] = float(self.replay.dropped_stale - dropped)
    metrics["rollout/turn_samples"], metrics["rollout/generated_tokens"] = (
      multihost.sum_over_processes(
        [len(view.samples), sum(len(s.response_ids) for s in view.samples)]
      )
    )
    metrics["rollout/seconds"] = view.rollout_seconds

  def _teacher_context_metrics(self, view: Iteration) -> None:
    """rollout/skill_block_tokens: the mean length of the teacher's privileged block (its prompt
    minus the student's) over the turn-samples that have one."""
    if not self.with_teacher:
      return
    block_tokens, teacher_samples = multihost.sum_over_processes(
      [
        sum(
          len(s.teacher_prompt_ids) - len(s.prompt_ids)
          for s in view.samples
          if s.teacher_prompt_ids is not None
        ),
        sum(s.teacher_prompt_ids is not None for s in view.samples),
      ]
    )
    view.metrics["rollout/skill_block_tokens"] = block_tokens / max(teacher_samples, 1)

  def _batches_phase(self, view: Iteration) -> None:
    """plan_minibatches + pack_batch of every process's samples, placed on the mesh; with
    algo.recompute_old_logp the old log-probs re-scored at θ_old."""
    view.batches = global_minibatches(
      self.step_fn,
      view.samples,
      self.config.train.mini_batch_size,
      self.with_teacher,
      self.pad_id,
      order=self.config.train.minibatch_order,
    )
    if self.step_fn.algo_config.recompute_old_logp:
      rescored = [self.step_fn.recompute_old_logp(self.state.params, b) for b in view.batches]
      view.batches = [b for b, _ in rescored]
      view.metrics["rollout/max_abs_logp_diff_sampler_vs_recompute"] = max(d for _, d in rescored)

  def _teacher_scoring_phase(self, view: Iteration) -> None:
    """teacher_source="rollout": the teacher's log-probs of every mini-batch, once at θ_old (the
    frozen initial policy's with teacher_weights="initial"), and the teacher–rollout gap."""
    algo = self.step_fn.algo_config
    if not (self.with_teacher and algo.teacher_source == "rollout"):
      return
    teacher_params = algos.TEACHER_WEIGHTS.get(algo.teacher_weights)(
      self.state.params, self.ref_params, getattr(self.state, "ema_params", None)
    )
    with self.device_turn():
      view.batches = [
        b.replace(teacher_logp=self.step_fn.score_teacher(teacher_params, b)) for b in view.batches
      ]
      jax.block_until_ready([b.teacher_logp for b in view.batches])
    view.metrics.update(
      teacher_old_gap_metrics(
        view.batches, rows=multihost.host_rows, combine=multihost.sum_over_processes
      )
    )

  def _update_phase(self, view: Iteration) -> None:
    """One compiled update per mini-batch; skipped ones counted (train.max_skipped_updates)."""
    it = view.iteration
    for b in view.batches:
      with self.device_turn():  # the rollout thread may generate between mini-batches
        self.state, m = self.step_fn(self.state, b, self.ref_params, iteration=it + 1)
        m = jax.device_get(m)
      view.per_batch.append((m, multihost.total(b.response_mask)))
      self._count_skipped(m, it + 1, len(view.per_batch), len(view.batches))

  def _iteration_metrics(self, view: Iteration) -> dict[str, float]:
    """The iteration's metrics row: the updates' means, the diagnostics' histogram files, the
    perf/* timings, and the compilation counts."""
    metrics, it = view.metrics, view.iteration
    # takes the gap / gate histogram counts out of per_batch (files in <workdir>/diagnostics/)
    gate_histograms.record_update_histograms(
      view.per_batch, it + 1, self.workdir, self.logger, self.config.logging.plots
    )
    metrics.update(mean_over_updates(view.per_batch))
    metrics["train/update_seconds"] = sum(
      view.seconds.get(p, 0.0) for p in ("batches", "teacher_scoring", "advantages", "update")
    )
    metrics.update(
      view.clock.metrics(view.samples, it, view.rollout_seconds, metrics["train/update_seconds"])
    )
    metrics.update(view.phase_metrics())
    # Running totals when the row is logged. With asynchronous training the rollout thread may be
    # compiling the next rollout's shapes meanwhile, so, like the timings, they vary between runs.
    metrics["train/compilations"] = float(self.step_fn.num_traces)
    metrics["rollout/sampler_compilations"] = float(self.sampler.num_compilations)
    return metrics

  # ---------------------------------------------------------------------------- run
  def run(self) -> dict[str, float]:
    """Trains up to train.total_steps iterations (resuming from the latest checkpoint) and returns
    the last metrics row; an eval-only Trainer evaluates once instead."""
    if self.eval_only:
      return self._evaluate_once()
    cfg = self.config
    total = cfg.train.total_steps
    resumed = self.maybe_restore()
    last: dict[str, float] = {}
    if self.validations and cfg.train.eval_before_train and not resumed:
      evaluation = self.evaluate(start=True)
      RunView(self, self.loop_state.iteration, evaluation).hooks("at_evaluation", evaluation, True)
      last = self.logger.log(self.loop_state.iteration, {**self.warm_start_metrics, **evaluation})
      self.plot_metrics()
    progress = Progress(total)
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
      evaluated = bool(self.validations and cfg.train.eval_every) and _due(
        it, cfg.train.eval_every, total
      )
      if evaluated:
        with self.device_turn():  # the rollout thread keeps stepping its envs meanwhile
          metrics.update(self.evaluate())
        RunView(self, it, metrics).hooks("at_evaluation", metrics, False)
      RunView(self, it, metrics).hooks("at_iteration_end")
      duration = progress.tick()
      log.info("%s | %s", progress.line(it, duration), self.logger.summary(metrics))
      if evaluated or _due(it, cfg.logging.every, total):
        last = self.logger.log(it, metrics, echo=False)
        self.plot_metrics()
      if _due(it, cfg.checkpoint.every, total):
        self.save(force=True)
    self._stop_rollouts()  # idle by now: no rollout is queued past the last iteration
    self.ckpt.wait_until_finished()
    if cfg.checkpoint.export_hf:
      out = export_hf(
        self.model_config,
        self.state.params,
        paths.join(self.workdir, "hf_export"),
        tokenizer_dir=self.tokenizer.path,
        source_dir=self.config.model.get("path"),  # its generation_config.json, when it has one
      )
      if out:
        log.info("final policy exported to %s", out)
    summary = validation_summary(self.logger.path) if self.logger.path else None
    if summary:
      log.info("%s", summary)
    return last

  # --------------------------------------------------------------------------- hooks
  def set_algo(self, algo: AlgoConfig) -> None:
    """Trains on with `algo` (a hook's request, e.g. RetireOPD's retired algorithm): the update
    rebuilt with the same model, optimizer, mesh and settings (one more compilation), the teacher
    scored only if `algo` reads it."""
    old = self.step_fn
    self.step_fn = TrainStep(
      old.model_config,
      algo,
      old.optimizer,
      mesh=old.mesh,
      micro_batch_size=old.micro_batch_size,
      lr_schedule=old.lr_schedule,
      rules=old.rules,
      histograms=old.histograms,
    )
    self.step_fn.num_traces = old.num_traces
    self.with_teacher = algo.scores_teacher

  def _evaluate_once(self) -> dict[str, float]:
    """What an eval-only Trainer runs: one evaluation of its parameters (validation episodes of
    every eval mode), a metrics row at the evaluated step, metrics.png and evaluation.json (what
    was evaluated) in its directory."""
    t0 = time.perf_counter()
    metrics = self.evaluate()
    metrics["val/seconds"] = time.perf_counter() - t0
    row = self.logger.log(self.loop_state.iteration, metrics)
    self.plot_metrics()
    source = evaluated_source(self.config, self.params_from)
    write_eval_record(self.workdir, source, finished=now(), metrics=row)
    log.info("evaluation results in %s", self.workdir)
    return row

  def plot_metrics(self) -> None:
    """metrics.png from metrics.jsonl (logging.plots)."""
    if self.config.logging.plots and self.logger.path:
      plot_history(self.logger.path)

  def close(self, failed: bool = False) -> None:
    """Closes what was built (also after a failed build), each even if another fails to close,
    and releases the workdir lock last. failed: the W&B run, if any, is marked failed."""
    with contextlib.ExitStack() as stack:
      stack.callback(self.lock.release)
      if getattr(self, "wandb_run", None) is not None:
        stack.callback(self.wandb_run.finish, exit_code=1 if failed else 0)
      pools = [v.pool for v in getattr(self, "validations", [])]
      for resource in [*pools, *(getattr(self, n, None) for n in ("pool", "logger", "ckpt"))]:
        if resource is not None:
          stack.callback(resource.close)
      if getattr(self, "_worker", None) is not None:
        stack.callback(self._stop_rollouts)  # first: the rollout thread plays on `pool`


def _jsonable(value):
  return json.loads(
    json.dumps(value, default=lambda x: x.tolist() if hasattr(x, "tolist") else int(x))
  )


def run(config, workdir: str, validated: bool = False) -> dict[str, float]:
  """Trains with `config` in `workdir` (resuming from its checkpoints); returns the last metrics.
  The config is checked first (`config_validation.validate`: one `ConfigError` listing every
  problem, before anything is built) unless the caller did (`validated=True`)."""
  if not validated:
    validate(config)
  trainer = Trainer(config, workdir)
  finished = False
  try:
    last = trainer.run()
    finished = True
    return last
  finally:
    trainer.close(failed=not finished)


def run_evaluation(
  config, out_dir: str, params_from: tuple[str, int] | None = None, validated: bool = False
) -> dict[str, float]:
  """Evaluates checkpoint `params_from` = (checkpoint directory, step) (None: the config's weights)
  into `out_dir` with an eval-only Trainer and returns the metrics row
  (`Trainer._evaluate_once`); the config is checked first as in `run`."""
  if not validated:
    validate(config)
  trainer = Trainer(config, out_dir, eval_only=True, params_from=params_from)
  try:
    return trainer.run()
  finally:
    trainer.close()
