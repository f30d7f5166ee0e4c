"""The host loop: one run's `Trainer`, and `run` / `run_evaluation`, which build, run and close it.

`Trainer(config, workdir)` builds what one run holds (mesh, policy, update, env pools, agent loops,
logger, checkpoints; from the config through `sdar_jax.run.setup`) under the workdir's lock, and
`Trainer.run` trains `train.iterations` iterations: each one's phases in order
(`train_iteration`: rollout, teacher context, batches, teacher scoring, advantages, update) with
the run's method hooks between them, then its evaluation, metrics row and checkpoint when due, and
the Hugging Face export at the end. Its parts live beside it: the rollouts, also asynchronous
ones (`run.rollouts`), evaluations (`run.evaluation`), checkpoints and resume (`run.resume`),
failures and their limits (`run.guards`). `Trainer(..., eval_only=True, params_from=(checkpoint
dir, step))` evaluates a checkpoint instead. Inputs: a validated run config and a workdir (local or
gs://); outputs: the workdir's files and the last metrics row. docs/design.md, "The host loop".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time

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
from sdar_jax.observe import gate_histograms, wandb_log
from sdar_jax.observe.metrics import (
  FigureClock,
  MetricsLogger,
  mean_over_updates,
  rollout_metrics,
  search_error_count,
  teacher_old_gap_metrics,
  validation_summary,
)
from sdar_jax.observe.progress import Progress, ensure_log_handler
from sdar_jax.rollout import ReplayQueue, episodes_to_samples
from sdar_jax.rollout.global_batches import global_minibatches
from sdar_jax.rollout.shaping import RewardShaping
from sdar_jax.rollout.trajectory import episode_summaries
from sdar_jax.rollout.turn_advantages import context_gap_metrics
from sdar_jax.rollout.worker import RolloutWorker
from sdar_jax.run import setup as run_setup
from sdar_jax.run.checkpoint import CheckpointManager, export_hf
from sdar_jax.run.config_validation import validate
from sdar_jax.run.evaluation import EvaluationMixin, evaluated_source, start_eval_record
from sdar_jax.run.guards import RunGuards
from sdar_jax.run.iteration import Iteration, RunView
from sdar_jax.run.preemption import StopRequest, preempted
from sdar_jax.run.resume import LoopState, ResumeMixin
from sdar_jax.run.rollouts import Queued, RolloutsMixin
from sdar_jax.run.setup import (
  build_agent_loops,
  build_chat_template,
  build_policy,
  build_tokenizer,
  check_first_prompts,
  restore_policy,
)
from sdar_jax.run.warm_start import built_policy_metrics, warm_start_run, warm_start_wanted
from sdar_jax.run.workdir_lock import WorkdirLock

log = logging.getLogger(__name__)

_PAD_FALLBACK = 0


def _due(iteration: int, every: int, total: int) -> bool:
  """Whether something done every `every` iterations (0 = only at the end) is due now."""
  return iteration == total or (every > 0 and iteration % every == 0)


# ------------------------------------------------------------------------------------ trainer
class Trainer(RolloutsMixin, EvaluationMixin, ResumeMixin):
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
    r = config.rollout
    self.sampler = Sampler(
      self.model_config, self.mesh, self.tokenizer, r.max_prompt_len, r.get("row_step", 0)
    )
    self.shaping = RewardShaping.from_config(config.rollout.get("shaping"))
    self.group_size = config.env.group_size
    self.tasks_per_iteration = config.env.tasks_per_iteration
    loops = build_agent_loops(
      config,
      self.env_family,
      self.sampler,
      self.tokenizer,
      self.chat_template,
      # the rollout retrieves each turn's skill block when a teacher context source reads it
      with_teacher=self.with_teacher and self.step_fn.algo_config.records_skill_block,
      eval_only=self.eval_only,
    )
    self.pool, self.loop, self.train_games = loops.pool, loops.loop, loops.train_games
    self.validations = loops.validations  # per validation split: games, tasks, pool, loops
    if config.rollout.prompt_truncation == "error":  # a first prompt too long: now, not later
      check_first_prompts(loops, config)
    self.warm_start_metrics: dict[str, float] = {}
    self.ref_params = None
    self.teacher_params = None  # a teacher read from algo.teacher_path (teacher_weights="frozen")
    self.state = None
    self.eval_params = None  # the evaluated parameters of an eval-only run
    if self.eval_only:
      self.eval_params = params
    else:
      if config.get("warm_start") and warm_start_wanted(config.warm_start):
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
      algo = self.step_fn.algo_config
      if algo.scores_teacher and algo.teacher_weights == "frozen":  # read from a folder, once
        self.teacher_params = run_setup.load_teacher(config, self.model_config, self.mesh)
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
    self.figures = FigureClock(config.logging.plots, config.logging.plot_every_s)
    self.ckpt: CheckpointManager | None = None
    if not self.eval_only:
      self.ckpt = CheckpointManager(
        config.checkpoint.get("dir") or paths.join(self.workdir, "checkpoints"),
        keep=config.checkpoint.keep,
        async_save=config.checkpoint.async_save,
      )
    self.loop_state = LoopState(iteration=self.params_from[1] if self.params_from else 0)
    self.guards = RunGuards(config.train)  # failures logged once per kind, the stop limits
    self._searches = config.env.name == "search_qa"  # its episodes search: count failed searches
    self.task_rng = np.random.default_rng(config.train.seed)
    self.rng = jax.random.key(config.train.seed + 1)  # rollout keys: see _key
    self.eval_rng = jax.random.key(config.eval.get("seed", 0))  # validation keys: see evaluate
    # Asynchronous training (train.max_staleness > 0): the rollout thread, made at the first
    # iteration, and the rollouts handed to it by iteration.
    self._worker: RolloutWorker | None = None
    self._queued: dict[int, Queued] = {}

  # ---------------------------------------------------------------------------- phases
  def _latest_checkpoint(self) -> int | None:
    return self.ckpt.latest_step() if self.ckpt is not None else None

  def train_iteration(self, stop: StopRequest | None = None) -> dict[str, float] | None:
    """One iteration as its phases in order (each timed: perf/phase_<name>_seconds), the run's
    method hooks between them (`algos.hooks`); returns its metrics, or None when `stop` was
    requested during its rollout: the iteration is abandoned before any update, the task
    sampler and the replay queue as they were before it."""
    view = Iteration(self, self.loop_state.iteration)
    queued = self._queued.get(view.iteration)
    before = (
      queued.task_rng if queued else self.task_rng.bit_generator.state,
      self.replay.state_dict(),
      dataclasses.replace(self.loop_state),  # the failure counters the rollout may move
    )
    with view.phase("rollout"):
      self._rollout_phase(view)
    if stop is not None and stop.requested():
      self._stop_rollouts()
      self._queued.clear()  # later iterations' draws: the resumed run draws them again
      self.task_rng.bit_generator.state, replay, self.loop_state = before
      self.replay.load_state_dict(replay)
      return None
    with view.phase("teacher_context"):
      self._teacher_context_phase(view)
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
    self.guards.report_env_failures(view.episodes, self.train_games, "episode")
    everyone = episode_summaries(view.episodes)  # every process's, for the metrics
    self.guards.check_all_failed(self.loop_state, everyone)
    metrics.update(rollout_metrics(everyone, "episode", self.env_family.episode_metrics))
    self.guards.report_search_errors(view.episodes, "training")
    if self._searches:
      metrics["rollout/search_errors"] = search_error_count(everyone)

  def _teacher_context_phase(self, view: Iteration) -> None:
    """The teacher's context of every turn-sample composed from the finished episodes and their
    groups (`algos.compose_teacher_contexts`, the sources `algo.context` names), then the
    turn-samples with GRPO advantages through the replay queue."""
    it, metrics = view.iteration, view.metrics
    if self.with_teacher:
      view.hooks("before_teacher_context")  # a source's preparation (e.g. reflections)
      algo, tok = self.step_fn.algo_config, self.tokenizer
      counts = algos.compose_teacher_contexts(view.episodes, algo, tok.encode, tok.decode)
      keys = sorted(counts)
      summed = multihost.sum_over_processes([counts[k] for k in keys])
      metrics.update(algos.context_metrics(dict(zip(keys, summed))))
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
        sum(  # (with mixed views a turn's teacher prompt may be the shorter one)
          abs(len(s.teacher_prompt_ids) - len(s.prompt_ids))
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
      distill_weights=self.step_fn.algo_config.reads_distill_weight,
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
    teacher_params = self.teacher_weights()
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
    view.metrics.update(  # the teacher–student gap of each context source's turn-samples
      context_gap_metrics(
        view.batches,
        view.samples,
        algo.context_names,
        self.with_teacher,
        self.config.train.minibatch_order,
      )
    )

  def teacher_weights(self):
    """The weights the teacher branch runs now (algo.teacher_weights: the params, the frozen
    initial policy, the EMA, or a teacher read from a folder)."""
    algo = self.step_fn.algo_config
    return algos.TEACHER_WEIGHTS.get(algo.teacher_weights)(
      self.state.params,
      self.ref_params,
      getattr(self.state, "ema_params", None),
      teacher_params=self.teacher_params,
    )

  def _update_teacher_params(self):
    """The teacher's weights the updates are handed (`algo.passes_teacher_params`, scored inside
    the update): the teacher read from a folder, else a copy of the params made now, before the
    iteration's first update (θ_old); None when the update reads no such weights."""
    algo = self.step_fn.algo_config
    if not (algo.passes_teacher_params and algo.teacher_source == "step"):
      return None
    if self.teacher_params is not None:
      return self.teacher_params
    with self.device_turn():
      return jax.block_until_ready(jax.tree.map(jnp.copy, self.state.params))

  def _update_phase(self, view: Iteration) -> None:
    """One compiled update per mini-batch; skipped ones counted (train.max_skipped_updates)."""
    it = view.iteration
    teacher_params = self._update_teacher_params()
    for b in view.batches:
      with self.device_turn():  # the rollout thread may generate between mini-batches
        self.state, m = self.step_fn(
          self.state, b, self.ref_params, iteration=it + 1, teacher_params=teacher_params
        )
        m = jax.device_get(m)
      view.per_batch.append((m, multihost.total(b.response_mask)))
      self.guards.count_skipped(
        self.loop_state, m, it + 1, len(view.per_batch), len(view.batches), self._latest_checkpoint
      )

  def _iteration_metrics(self, view: Iteration) -> dict[str, float]:
    """The iteration's metrics row: the updates' means, the diagnostics' histogram files, the
    perf/* timings, and the compilation counts."""
    metrics, it = view.metrics, view.iteration
    # takes the gap / gate histogram counts out of per_batch (files in <workdir>/diagnostics/)
    train = self.config.train  # the figure is drawn at evaluations and the end, at least
    final = _due(it + 1, train.eval_every if self.validations else 0, train.iterations)
    gate_histograms.record_update_histograms(
      view.per_batch, it + 1, self.workdir, self.logger, self.figures.due("histograms", final)
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
    """Trains up to `train.iterations` iterations (resuming from the latest checkpoint) and returns
    the last metrics row; an eval-only Trainer evaluates once instead."""
    if self.eval_only:
      return self._evaluate_once()
    cfg = self.config
    total = cfg.train.iterations
    resumed = self.maybe_restore()
    last = self.validate_first(resumed)
    progress = Progress(total)
    started = self.loop_state.iteration
    if self.loop_state.iteration < total:
      log.info(
        "training iterations %d..%d of %d (the first one compiles the sampler and the update)",
        self.loop_state.iteration + 1,
        total,
        total,
      )
    stop = StopRequest()
    with stop:
      last = self._train_loop(total, progress, last, stop)
    if stop.signum is not None:  # rollouts and workers stopped, the checkpoint written, then raise
      self._stop_rollouts()
      self.ckpt.wait_until_finished()
      raise preempted(stop.signum, self.ckpt, self.loop_state.iteration, total)
    self._stop_rollouts()  # idle by now: no rollout is queued past the last iteration
    self.ckpt.wait_until_finished()
    self.guards.check_trained(self.loop_state.iteration - started)
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

  def _train_loop(
    self, total: int, progress: Progress, last: dict[str, float], stop: StopRequest
  ) -> dict[str, float]:
    """Iterations until `total`, or until `stop` is requested at a safe point (the last finished
    iteration then saved); returns the last metrics row logged."""
    cfg = self.config
    while self.loop_state.iteration < total:
      metrics = self.train_iteration(stop)
      if metrics is None:  # stopped during the rollout: nothing of this iteration is kept
        break
      self.loop_state.iteration += 1
      it = self.loop_state.iteration
      due = bool(self.validations and cfg.train.eval_every) and _due(
        it, cfg.train.eval_every, total
      )
      # after a stop request the resumed run plays the validation (`validate_first`)
      evaluated = due and not stop.requested()
      self.loop_state.validation_due = due and not evaluated
      if evaluated:
        with self.device_turn():  # the rollout thread keeps stepping its envs meanwhile
          metrics.update(self.evaluate())
        RunView(self, it, metrics).hooks("at_evaluation", metrics, False)
      RunView(self, it, metrics).hooks("at_iteration_end")
      duration = progress.tick()
      log.info("%s | %s", progress.line(it, duration), self.logger.summary(metrics))
      if due or _due(it, cfg.logging.every, total):
        last = self.logger.log(it, metrics, echo=False)
        self.figures.draw_metrics(self.logger.path, force=evaluated or it == total)
      if _due(it, cfg.checkpoint.every, total):
        self.save(force=True)
      if stop.requested():
        break
    if stop.signum is not None and self.ckpt.latest_step() != self.loop_state.iteration:
      self.save(force=True)
    return last

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
