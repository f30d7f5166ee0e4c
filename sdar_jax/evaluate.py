r"""Evaluation entry point: validation episodes only, no training.

  # A training run's latest checkpoint (or --step=N): results in runs/sdar-3b/eval/step_<N>/
  python -m sdar_jax.evaluate --config=configs/alfworld.py:model=qwen2.5-3b \
      --config.model.path=/data/Qwen2.5-3B-Instruct --config.env.data_dir=/data/alfworld \
      --config.eval.split=valid_unseen --config.eval.skills=both --workdir=runs/sdar-3b --step=40
  # Any Hugging Face directory (e.g. a run's hf_export): results in the fresh --workdir
  python -m sdar_jax.evaluate --config=configs/default.py \
      --config.model.path=runs/demo/hf_export --workdir=runs/demo-eval

The same config files and overrides as `sdar_jax.train` (pass the config the run was trained with:
the checkpoint's architecture must match it; eval.* and rollout.val_temperature may differ). What
is evaluated:

* `--workdir` holds checkpoints (`<workdir>/checkpoints`, or checkpoint.dir): the parameters of
  checkpoint `--step` (default: the latest), restored alone (no optimizer state, no KL reference,
  no training environments). Results go to `<workdir>/eval/step_<N>/` (or `--output`); the run's
  own files (config.json, metrics.jsonl, checkpoints) are only read, and a training run still
  going on in the workdir is not disturbed (its lock is not needed).
* otherwise: the config's weights (model.path, or random init), results in `--workdir` itself (or
  `--output`). A directory holding a training run's config.json is refused as the output.

The results directory gets its own config.json, metrics.jsonl (one row at the evaluated step:
val/success_rate, per task type, valid-format ratio, env failures), metrics.png and
evaluation.json (what was evaluated); evaluating again replaces them. The episodes are those the
training run's own evaluation at that step plays (same seeds, same rollout keys). `--dry_run`
validates and prints what would be evaluated, writing nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sdar_jax import paths, train

if TYPE_CHECKING:
  from sdar_jax.trainer import Trainer

log = logging.getLogger("sdar_jax.evaluate")  # not __name__: it is "__main__" under python -m

EVAL_RECORD = "evaluation.json"  # written by an evaluation into its output directory

# Applied to the config (and so to the evaluation's config.json): nothing trains, nothing exports.
EVAL_ONLY = (
  "--config.train.total_steps=0",
  "--config.train.eval_before_train=True",
  "--config.warm_start.steps=0",
  "--config.checkpoint.export_hf=False",
)


class EvaluationError(ValueError):
  """The workdir / step / output combination cannot be evaluated; the message says the fix."""


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
  config, workdir: str, step: int | None = None, output: str | None = None
) -> EvalPlan:
  """Resolves the checkpoint (`step`, default the latest of the workdir's checkpoints) and the
  results directory; reads the checkpoint directory's listing only."""
  from sdar_jax.checkpoint import CheckpointManager

  if config.eval.num_tasks < 1:
    raise EvaluationError(
      f"eval.num_tasks={config.eval.num_tasks}: no validation episode to play. Fix: pass "
      "--config.eval.num_tasks=N (N >= 1)."
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
    out = paths.resolve(output or paths.join(workdir, "eval", f"step_{step}"))
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
    params_from = None
    out = paths.resolve(output or workdir)
  if paths.isfile(paths.join(out, "config.json")) and not paths.isfile(
    paths.join(out, EVAL_RECORD)
  ):
    raise EvaluationError(
      f"{out} holds a training run (its config.json) and no checkpoint to evaluate there; an "
      "evaluation never writes into a run's files. Fix: pass --output=<a directory for the "
      "results>, or evaluate the run once it has saved a checkpoint."
    )
  return EvalPlan(output=out, params_from=params_from)


# ------------------------------------------------------------------------------------ running
def run_evaluation(
  config, out_dir: str, params_from: tuple[str, int] | None = None
) -> dict[str, float]:
  """Evaluates checkpoint `params_from` = (checkpoint directory, step) (None: the config's weights)
  into `out_dir` with an eval-only Trainer and returns the metrics row (see `evaluate_once`)."""
  from sdar_jax.trainer import Trainer

  trainer = Trainer(config, out_dir, eval_only=True, params_from=params_from)
  try:
    return trainer.run()
  finally:
    trainer.close()


def evaluate_once(trainer: Trainer) -> dict[str, float]:
  """What an eval-only Trainer runs: one evaluation of its parameters (validation episodes of every
  eval mode), a metrics row at the evaluated step, metrics.png and evaluation.json (what was
  evaluated) in its directory."""
  t0 = time.perf_counter()
  metrics = trainer.evaluate()
  metrics["val/seconds"] = time.perf_counter() - t0
  row = trainer.logger.log(trainer.loop_state.iteration, metrics)
  trainer.plot_metrics()
  source = evaluated_source(trainer.config, trainer.params_from)
  _write_eval_record(trainer.workdir, source, finished=_now(), metrics=row)
  log.info("evaluation results in %s", trainer.workdir)
  return row


def evaluated_source(config, params_from: tuple[str, int] | None) -> dict[str, Any]:
  """What an evaluation plays, as its evaluation.json records it."""
  if params_from is not None:
    return {"checkpoint_dir": params_from[0], "step": params_from[1]}
  return {"model_path": config.model.get("path"), "step": 0}


def start_eval_record(out_dir: str, source: dict[str, Any]) -> None:
  """Marks `out_dir` as an evaluation's (before anything else is written there) and removes the
  results of a previous evaluation in it: evaluating again replaces them. Only the primary
  process writes (`sdar_jax.paths`); `out_dir` may be remote."""
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
  _write_eval_record(out_dir, source, started=_now())


def _write_eval_record(out_dir: str, source: dict[str, Any], **fields: Any) -> None:
  if paths.is_primary_process():
    record = json.dumps({"evaluated": source, **fields}, indent=2)
    paths.write_text(paths.join(out_dir, EVAL_RECORD), record)


def _now() -> str:
  return time.strftime("%Y-%m-%d %H:%M:%S %z")


# ------------------------------------------------------------------------------------ CLI
def _define_flags() -> None:
  from absl import flags

  train._define_flags()  # --config, --workdir, --distributed, --dry_run
  flags.DEFINE_integer(
    "step", None, "Checkpoint step of --workdir to evaluate. Default: the latest checkpoint."
  )
  flags.DEFINE_string(
    "output",
    None,
    "Results directory. Default: <workdir>/eval/step_<N> for a checkpoint, else --workdir.",
  )


def main(argv: Sequence[str]) -> None:
  from absl import app, flags

  from sdar_jax.config_validation import ConfigError, validate
  from sdar_jax.progress import configure_logging

  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  configure_logging()
  FLAGS = flags.FLAGS
  if FLAGS.distributed:  # every process plays its share of the episodes (sdar_jax.multihost)
    from sdar_jax import multihost

    multihost.initialize()
  config = FLAGS.config
  try:
    validate(config)
  except ConfigError as e:
    sys.exit(f"Invalid config: {e}")
  print(config)
  if FLAGS.workdir is None:
    if FLAGS.dry_run:
      print("dry run: config valid; pass --workdir to see what would be evaluated.")
      return
    raise app.UsageError(
      "--workdir is required: a training run whose checkpoints to evaluate, or a directory for the "
      "results of evaluating model.path."
    )
  try:
    plan = plan_evaluation(config, FLAGS.workdir, FLAGS.step, FLAGS.output)
  except EvaluationError as e:
    sys.exit(f"Cannot evaluate: {e}")
  log.info("%s", plan.describe())
  if FLAGS.dry_run:
    print(f"dry run: {plan.describe()}; nothing evaluated.")
    return
  if config.train.get("xla_cache_dir"):
    train.use_xla_cache(config.train.xla_cache_dir)
  row = run_evaluation(config, plan.output, plan.params_from)
  shown = "  ".join(f"{k}={v:.4g}" for k, v in row.items() if k.endswith("success_rate"))
  print(f"evaluation done: {shown}; results in {plan.output}")


def cli(argv: Sequence[str] | None = None) -> None:
  from absl import app

  # config_flags reads the `--config.*` overrides from sys.argv itself, so extend that.
  argv = list(sys.argv if argv is None else argv) + list(EVAL_ONLY)
  sys.argv = argv
  train._check_overrides(argv)
  _define_flags()
  app.run(main, argv=argv)


if __name__ == "__main__":
  cli()
