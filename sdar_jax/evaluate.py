r"""Evaluation entry point: validation episodes only, no training.

  python -m sdar_jax.evaluate --config=configs/alfworld.py:model=qwen2.5-3b \
      --config.model.path=runs/sdar-3b/hf_export --config.env.data_dir=/data/alfworld \
      --config.eval.split=valid_unseen --config.eval.skills=both --workdir=runs/eval-3b

The same config files and overrides as `sdar_jax.train`; this sets train.total_steps=0,
eval_before_train=True, warm_start.steps=0 and no export, so the run plays `eval.num_tasks`
validation episodes (group size 1, rollout.val_temperature) with the given weights and writes
their metrics (val/success_rate, per task type, valid-format ratio) to <workdir>/metrics.jsonl.
"""

from __future__ import annotations

import sys
from typing import Sequence

from sdar_jax import train

EVAL_ONLY = (
  "--config.train.total_steps=0",
  "--config.train.eval_before_train=True",
  "--config.warm_start.steps=0",
  "--config.checkpoint.export_hf=False",
)


def cli(argv: Sequence[str] | None = None) -> None:
  # config_flags reads the `--config.*` overrides from sys.argv itself, so extend that.
  sys.argv = list(sys.argv if argv is None else argv) + list(EVAL_ONLY)
  train.cli()


if __name__ == "__main__":
  cli()
