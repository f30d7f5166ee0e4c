"""Evaluations: what to evaluate and where its results go (`plan_evaluation`), the Trainer's
evaluation (`EvaluationMixin`: the validation splits played per eval mode, at the same sampling
keys every time, into metrics, transcripts, per-game outcomes and the token view), and the record
an evaluation leaves in its results directory (`evaluation.json`: what was evaluated, when, and
its metrics row). An evaluation-only run is an eval-only `sdar_jax.run.trainer.Trainer`
(`run_evaluation` there); the command is `python -m sdar_jax.evaluate`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from typing import Any

import jax
import numpy as np

from sdar_jax import algos
from sdar_jax.algos import AlgoConfig
from sdar_jax.infra import multihost, paths
from sdar_jax.infra.errors import UserError
from sdar_jax.observe import token_view, transcripts
from sdar_jax.observe.metrics import rollout_metrics, search_error_count
from sdar_jax.rollout.trajectory import Episode, episode_summaries
from sdar_jax.run import guards
from sdar_jax.run.checkpoint import CheckpointManager
from sdar_jax.run.setup import build_retriever

log = logging.getLogger(__name__)
_UNSET = object()

EVAL_RECORD = "evaluation.json"  # written by an evaluation into its output directory
# An evaluation-only run's eval modes played to the end so far, with their metrics: a rerun of
# the same evaluation after a kill plays only the others (removed once the evaluation finishes).
FINISHED_PARTS = "finished_parts.json"
EVALUATIONS = "evaluations"  # <workdir>/evaluations/step_<N>: a checkpoint's evaluation results


class EvaluationError(UserError, ValueError):
  """The workdir / step / output combination cannot be evaluated; the message says the fix."""

  heading = "Cannot evaluate"


@dataclasses.dataclass(frozen=True)
class EvalPlan:
  """What one evaluation reads and where it writes."""

  output: str  # the results directory
  params_from: tuple[str, int] | None  # (checkpoint directory, step); None = the config's weights

  def describe(self) -> str:
    if self.params_from is None:
      what = "the config's weights (model.path, or random init)"
    else:
      what = f"checkpoint step {self.params_from[1]} of {self.params_from[0]}"
    return f"evaluating {what} into {self.output}"


def plan_evaluation(
  config,
  workdir: str,
  step: int | None = None,
  output: str | None = None,
  weights_named: bool = True,
) -> EvalPlan:
  """Resolves the checkpoint (`step`, default the latest of the workdir's checkpoints) and the
  results directory; reads the checkpoint directory's listing only. A checkpoint's results go to
  <workdir>/evaluations/step_<N>/, beside (never into) the training's own eval/step_<N>/.
  `weights_named`: the user named the weights to evaluate without a run (model.path, or the
  config's starting policy on purpose); without it a workdir holding no run is refused."""
  if config.eval.num_tasks == 0:  # -1: the whole split
    raise EvaluationError(
      "eval.num_tasks=0: no validation episode to play. Fix: pass --config.eval.num_tasks=N "
      "(N >= 1, or -1 for every task of the split)."
    )
  for what, where in (("--workdir", workdir), ("--output", output)):
    try:
      if where:
        paths.check_remote_workdir(where, what)  # gs:// without gcsfs: the package to install
    except (ValueError, ImportError) as e:
      raise EvaluationError(str(e)) from None
  workdir = paths.resolve(workdir)
  ckpt_dir = paths.resolve(config.checkpoint.get("dir") or paths.join(workdir, "checkpoints"))
  steps: list[int] = []
  if paths.isdir(ckpt_dir):
    with CheckpointManager(ckpt_dir, read_only=True) as ckpt:
      steps = ckpt.all_steps()
  if steps:
    if step is None:
      step = steps[-1]
    elif step not in steps:
      raise EvaluationError(
        f"--step={step}: {ckpt_dir} has no checkpoint of that step; its steps are {steps}. Fix: "
        "pass one of them, or leave --step out for the latest."
      )
    params_from: tuple[str, int] | None = (ckpt_dir, int(step))
    out = paths.resolve(output or paths.join(workdir, EVALUATIONS, f"step_{step}"))
    if out == workdir:
      raise EvaluationError(
        f"--output={output}: that is the training run itself; an evaluation never writes into a "
        "run's files. Fix: leave --output out (results go to <workdir>/eval/step_<N>/) or pass "
        "another directory."
      )
  else:
    if step is not None:
      raise EvaluationError(
        f"--step={step}: {ckpt_dir} holds no checkpoint. Fix: point --workdir (or "
        "--config.checkpoint.dir) at a training run with checkpoints, or leave --step out to "
        "evaluate the config's weights (model.path)."
      )
    if not weights_named and not paths.isdir(workdir):
      raise EvaluationError(
        f"--workdir={workdir}: no such run, so there is no checkpoint to evaluate; without one "
        "the config's own weights (its starting policy) would be evaluated. Fix: point --workdir "
        "at a training run, pass --config.model.path=<a model folder>, or pass "
        "--initial_policy to evaluate the config's starting policy on purpose."
      )
    params_from = None
    out = paths.resolve(output or workdir)
  if _written_by_training(out):
    raise EvaluationError(
      f"--output={output or out}: that folder holds files a training run wrote (its own "
      "evaluation's outcomes) and no evaluation record; an evaluation never writes over them. "
      f"Fix: leave --output out (results go to <workdir>/{EVALUATIONS}/step_<N>/) or pass "
      "another directory."
    )
  if paths.isfile(paths.join(out, "config.json")) and not paths.isfile(
    paths.join(out, EVAL_RECORD)
  ):
    raise EvaluationError(
      f"{out} holds a training run (its config.json) and no checkpoint to evaluate there; an "
      "evaluation never writes into a run's files. Fix: pass --output=<a directory for the "
      "results>, or evaluate the run once it has saved a checkpoint."
    )
  return EvalPlan(output=out, params_from=params_from)


def _written_by_training(folder: str) -> bool:
  """A training run's own evaluation folder (eval/step_<N>: outcomes or transcripts, and no
  evaluation record)."""
  if not paths.isdir(folder) or paths.isfile(paths.join(folder, EVAL_RECORD)):
    return False
  names = paths.listdir(folder)
  return any(n.startswith(("outcomes_", "episodes_")) for n in names)


def evaluated_source(config, params_from: tuple[str, int] | None) -> dict[str, Any]:
  """What an evaluation plays, as its evaluation.json records it."""
  if params_from is not None:
    return {"checkpoint_dir": params_from[0], "step": params_from[1]}
  return {"model_path": config.model.get("path"), "step": 0}


def start_eval_record(out_dir: str, source: dict[str, Any]) -> None:
  """Marks `out_dir` as an evaluation's (before anything else is written there) and removes the
  results of a previous evaluation in it: evaluating again replaces them. Only the primary
  process writes (`sdar_jax.infra.paths`); `out_dir` may be remote."""
  config_json = paths.join(out_dir, "config.json")
  if paths.exists(config_json) and not paths.exists(paths.join(out_dir, EVAL_RECORD)):
    raise FileExistsError(
      f"{out_dir} holds a training run (its config.json); an evaluation never writes into "
      "a run's files. Fix: evaluate into another directory (e.g. <workdir>/eval/step_<N>)."
    )
  if not paths.is_primary_process():
    return
  for name in ("metrics.jsonl", "metrics.png"):
    paths.remove(paths.join(out_dir, name))
  write_eval_record(out_dir, source, started=now())


def eval_finished(out_dir: str) -> bool:
  """Whether an evaluation into `out_dir` finished: its evaluation.json, written when it starts,
  holds the `finished` time only once it has written everything (a killed evaluation's, or one
  cut off mid-write, does not)."""
  path = paths.join(out_dir, EVAL_RECORD)
  if not paths.exists(path):
    return False
  try:
    return bool(json.loads(paths.read_text(path)).get("finished"))
  except json.JSONDecodeError:
    return False


def write_eval_record(out_dir: str, source: dict[str, Any], **fields: Any) -> None:
  if paths.is_primary_process():
    record = json.dumps({"evaluated": source, **fields}, indent=2)
    paths.write_text(paths.join(out_dir, EVAL_RECORD), record)


def now() -> str:
  return time.strftime("%Y-%m-%d %H:%M:%S %z")


class EvaluationMixin:
  """The Trainer's evaluations (`sdar_jax.run.trainer.Trainer`: they read the validations, the
  policy, the logger and the loop state it builds): the validation splits played per eval mode,
  their metrics, transcripts and per-game outcomes, and the token view of one episode."""

  def evaluate(self, start: bool = False) -> dict[str, float]:
    """Validation episodes (group size 1, one per task of each validation split, eval.repeats
    times) per eval mode. Their sampling keys depend on `eval.seed`, the split, the mode, the
    repeat and the batch only, not on the iteration or `train.seed`: every evaluation of a run
    draws the same random numbers (per episode and turn), so an unchanged policy plays the same
    episodes and a before/after difference is not blurred by fresh sampling noise. Every rate is
    over all of a mode's episodes (batches, repeats and processes together). A mode a
    validation marks start-only (a method hook's `start_eval_modes`) is played only when
    `start` (the evaluation before training), and then with the teacher's weights when the hook
    asks (`start_eval_weights`, `Validation.teacher_modes`). An evaluation-only run records
    each mode it finishes (FINISHED_PARTS) and, run again after a kill, reads those back instead
    of playing them again: the same config and weights play the same episodes."""
    params = self.eval_params if self.state is None else self.state.params
    out_dir = self.eval_output_dir()
    repeats = int(self.config.eval.get("repeats", 1))
    metrics = {}
    # (an evaluation-only run's modes finished before a kill: `_evaluate_once` reads them, and
    # only the evaluation that follows uses them)
    finished, self._resumed_parts = getattr(self, "_resumed_parts", {}), {}
    for v, validation in enumerate(self.validations):
      for mode, (prefix, loop) in enumerate(validation.loops):
        if prefix in validation.start_only and not start:
          continue
        if prefix in finished:
          metrics.update(finished[prefix])
          log.info(
            "%s: played to the end by an earlier run of this evaluation (killed before it "
            "finished); its metrics read from %s, its files kept",
            prefix,
            paths.join(out_dir, FINISHED_PARTS),
          )
          continue
        first = v == 0 and mode == 0
        if first:  # the token view's episode needs its teacher prompts (observe.token_view)
          loop = token_view.with_teacher_prompts(loop, self._view_retriever(loop))
        key = jax.random.fold_in(self.eval_rng, mode)
        key = jax.random.fold_in(key, 1000 + v) if v else key  # another split: other keys
        players = self.teacher_weights() if start and prefix in validation.teacher_modes else params
        episodes, everyone, repeat_of, rates = [], [], [], []
        for r in range(repeats):
          played = self._play_validation(
            loop, validation.tasks, players, jax.random.fold_in(key, 2000 + r) if r else key, prefix
          )
          summary = episode_summaries(played)  # every process's, for the metrics
          episodes += played
          everyone += summary
          repeat_of += [r] * len(summary)
          rates.append(rollout_metrics(summary, prefix).get(f"{prefix}/success_rate", 0.0))
        self.guards.report_env_failures(episodes, validation.games, prefix)
        metrics.update(rollout_metrics(everyone, prefix, self.env_family.episode_metrics))
        self.guards.report_search_errors(episodes, prefix)
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
          algo = self._view_algo()
          if algo.context_beyond_skills:  # the teacher's context as training composes it
            for hooks in (self.hooks or algos.build_hooks(algo)).values():
              hooks.before_evaluation_contexts(algo, episodes)  # e.g. the skill memory's retrieval
            algos.compose_teacher_contexts(
              episodes, algo, self.tokenizer.encode, self.tokenizer.decode
            )
          token_view.write_token_view(
            token_view.token_view_candidates(episodes),
            paths.join(out_dir, token_view.TOKEN_VIEW_FILE),
            token_view.TokenViewSource(
              self.model_config,
              params,
              algo,
              self.tokenizer,
              self.pad_id,
              initial_params=self.ref_params,
            ),
            step=self.loop_state.iteration,
            run=self.workdir,
          )
        transcripts.write_transcripts(out_dir, prefix, episodes, self.tokenizer.decode)
        if self.eval_only:  # every file of the mode written: a rerun need not play it again ...
          if prefix in self._lost_too_many(metrics):  # ... unless it lost episodes
            continue
          finished[prefix] = {k: v for k, v in metrics.items() if k.startswith(prefix + "/")}
          self._record_finished_parts(out_dir, finished)
    return metrics

  def _lost_too_many(self, metrics: dict[str, float]) -> dict[str, int]:
    """The eval modes of `metrics` (prefix -> episodes lost) that lost more episodes to env
    failures than eval.max_env_failures (-1: none do): an evaluation-only run does not finish
    them."""
    allowed = int(self.config.eval.get("max_env_failures", 0))
    lost = {
      key.removesuffix("/env_failures"): int(value)
      for key, value in metrics.items()
      if key.endswith("/env_failures")
    }
    return {prefix: n for prefix, n in lost.items() if 0 <= allowed < n}

  def _parts_key(self) -> str:
    """What an earlier run's finished parts must share with this evaluation: its config and the
    weights it evaluates."""
    what = {
      "config": self.config.to_dict(),
      "source": evaluated_source(self.config, self.params_from),
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()

  def _finished_parts(self, out_dir: str) -> dict[str, dict[str, float]]:
    """The eval modes (prefix -> metrics) an earlier, killed run of this same evaluation-only
    run finished; none for a training run's evaluations or from another evaluation's record."""
    path = paths.join(out_dir, FINISHED_PARTS)
    if not self.eval_only or not paths.exists(path):
      return {}
    try:
      record = json.loads(paths.read_text(path))
    except json.JSONDecodeError:  # cut off mid-write: play everything
      return {}
    return dict(record["parts"]) if record.get("key") == self._parts_key() else {}

  def _record_finished_parts(self, out_dir: str, parts: dict[str, dict[str, float]]) -> None:
    if paths.is_primary_process():
      record = {"key": self._parts_key(), "parts": parts, "written": now()}
      paths.write_text(paths.join(out_dir, FINISHED_PARTS), json.dumps(record, indent=1))

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

  def _view_algo(self):
    """The algorithm the token view scores with: the run's, or the config's (evaluation only)."""
    return self.step_fn.algo_config if self.step_fn else AlgoConfig.from_config(self.config.algo)

  def _view_retriever(self, loop):
    """The skill retriever the token view's teacher prompts use when `loop` has none: the
    training loop's or another evaluation loop's, else one built from env.skills (None, with a
    warning, when that fails). Built once."""
    if loop.with_teacher or loop.retriever is not None:
      return None
    if getattr(self, "_fallback_retriever", _UNSET) is _UNSET:  # not looked for yet
      loops = [self.loop, *(loop for v in self.validations for _, loop in v.loops)]
      found = [x.retriever for x in loops if x is not None and x.retriever is not None]
      if found:
        self._fallback_retriever = found[0]
      else:
        try:
          self._fallback_retriever = build_retriever(self.config)
        except Exception as e:  # noqa: BLE001 (the view goes on without a gate)
          log.warning("token view: no skill retriever (%s); tokens are shown without a gate", e)
          self._fallback_retriever = None
    return self._fallback_retriever

  def _evaluate_once(self) -> dict[str, float]:
    """What an eval-only Trainer runs: one evaluation of its parameters (validation episodes of
    every eval mode), a metrics row at the evaluated step, metrics.png and evaluation.json (what
    was evaluated) in its directory."""
    t0 = time.perf_counter()
    self._resumed_parts = self._finished_parts(self.eval_output_dir())
    metrics = self.evaluate()
    unfinished = self._lost_too_many(metrics)
    if unfinished:
      raise guards.EvalEnvFailureError(
        "episodes lost to env failures: "
        + ", ".join(f"{p} {n} of its panel" for p, n in unfinished.items())
        + f" (eval.max_env_failures={self.config.eval.get('max_env_failures', 0)}; the first "
        "failure of each kind is in the log above). Those modes are not recorded as finished and "
        f"{self.workdir} holds no finished evaluation. Fix: remove the cause (a full disk, a "
        "dead server), then run the same command again: it plays only the modes not finished; "
        "or accept lost episodes with --config.eval.max_env_failures=N (-1: any)."
      )
    metrics["val/seconds"] = time.perf_counter() - t0
    row = self.logger.log(self.loop_state.iteration, metrics)
    self.figures.draw_metrics(self.logger.path)
    source = evaluated_source(self.config, self.params_from)
    write_eval_record(self.workdir, source, finished=now(), metrics=row)
    if paths.is_primary_process():
      paths.remove(paths.join(self.workdir, FINISHED_PARTS))  # finished: a rerun plays it all
    log.info("evaluation results in %s", self.workdir)
    return row
