r"""The evaluation command: validation episodes only, no training.

  # A training run's latest checkpoint (or --step=N): results in runs/sdar-3b/evaluations/step_<N>/
  python -m sdar_jax.evaluate --config=configs/alfworld.py:model=qwen2.5-3b \
      --config.model.path=/data/Qwen2.5-3B-Instruct --config.env.data_dir=/data/alfworld \
      --config.eval.split=valid_unseen --config.eval.skills=both --workdir=runs/sdar-3b --step=40
  # Any Hugging Face directory (e.g. a run's hf_export): results in the fresh --workdir
  python -m sdar_jax.evaluate --config=configs/default.py \
      --config.model.path=runs/demo/hf_export --workdir=runs/demo-eval

Flags: the config and overrides of `sdar_jax.train`, --workdir, --step, --output,
--initial_policy, --dry_run. Plans what to evaluate (`run.evaluation.plan_evaluation`) and runs an
evaluation-only Trainer; the results folder gets its own config.json, metrics.jsonl, metrics.png
and evaluation.json, and a training run's files are only read. What is evaluated and where the
results go: docs/running.md, "Evaluation only".
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from envs.errors import EnvInputError
from sdar_jax import train
from sdar_jax.infra import paths, plugins
from sdar_jax.infra.errors import exit_on_user_error
from sdar_jax.run.evaluation import plan_evaluation

log = logging.getLogger("sdar_jax.evaluate")  # not __name__: it is "__main__" under python -m

# Applied to the config (and so to the evaluation's config.json): nothing trains, nothing exports.
EVAL_ONLY = (
  "--config.train.iterations=0",
  "--config.train.eval_before_train=True",
  "--config.warm_start.steps=0",
  "--config.checkpoint.export_hf=False",
)


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
    "Results directory. Default: <workdir>/evaluations/step_<N> for a checkpoint, else --workdir.",
  )
  flags.DEFINE_bool(
    "initial_policy",
    False,
    "Evaluate the config's own starting weights (its warm-start policy or model.path) when "
    "--workdir holds no run.",
  )


@exit_on_user_error(extra_types=(EnvInputError,))
def main(argv: Sequence[str]) -> None:
  from absl import app, flags

  from sdar_jax.observe.progress import configure_logging
  from sdar_jax.run.config_validation import validate
  from sdar_jax.run.trainer import run_evaluation

  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  configure_logging()
  FLAGS = flags.FLAGS
  if FLAGS.distributed:  # every process plays its share of the episodes (sdar_jax.infra.multihost)
    from sdar_jax.infra import multihost

    multihost.initialize()
  config = FLAGS.config
  model_config = validate(config)  # a ConfigError: one message, exit status 2
  print(config)
  if FLAGS.workdir is None:
    if FLAGS.dry_run:
      print("dry run: config valid; pass --workdir to see what would be evaluated.")
      return
    raise app.UsageError(
      "--workdir is required: a training run whose checkpoints to evaluate, or a directory for the "
      "results of evaluating model.path."
    )
  named = FLAGS.initial_policy or any(a.startswith("--config.model.path") for a in sys.argv)
  plan = plan_evaluation(config, FLAGS.workdir, FLAGS.step, FLAGS.output, weights_named=named)
  paths.check_writable_folder(plan.output, "--output" if FLAGS.output else "--workdir")
  log.info("%s", plan.describe())
  if FLAGS.dry_run:
    from sdar_jax.run.setup import dry_run_prompt_check

    dry_run_prompt_check(config, model_config, eval_only=True)  # truncation='error': too long?
    print(f"dry run: {plan.describe()}; nothing evaluated.")
    return
  if config.train.get("xla_cache_dir"):
    train.use_xla_cache(config.train.xla_cache_dir)
  row = run_evaluation(config, plan.output, plan.params_from, validated=True)
  shown = "  ".join(f"{k}={v:.4g}" for k, v in row.items() if k.endswith("success_rate"))
  print(f"evaluation done: {shown}; results in {plan.output}")


@exit_on_user_error(extra_types=(EnvInputError,))
def cli(argv: Sequence[str] | None = None) -> None:
  from absl import app

  # config_flags reads the `--config.*` overrides from sys.argv itself, so extend that.
  argv = list(sys.argv if argv is None else argv) + list(EVAL_ONLY)
  sys.argv = argv
  plugins.load_from_argv(argv)  # the user's registrations, before the config names them
  train._check_overrides(argv)
  _define_flags()
  app.run(main, argv=argv)


if __name__ == "__main__":
  cli()
