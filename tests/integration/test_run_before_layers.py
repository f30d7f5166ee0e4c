"""A run folder written by the flat layout (before sdar_jax/ was split into infra/, text/, core/,
rollout/, observe/, run/) still evaluates and resumes.

tests/data/run_before_layers/ was written at commit 6c4d717 by `trainer.run` with
`tiny_run_config(2, **RUN)` (below): its config.json, its metrics rows 0-1 and checkpoint 1 (the
TrainState with AdamW's moments, the model config, the loop state with the task sampler's
state). Nothing in it names a module: checkpoints hold arrays and JSON, so the moves must leave
them readable; this test is what says so.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.helpers import tiny_run_config

pytestmark = pytest.mark.slow

_DATA = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "run_before_layers"
)
RUN = {"train.eval_every": 2, "checkpoint.every": 1, "logging.every": 1, "checkpoint.keep": 5}


def test_a_flat_layout_run_evaluates_then_resumes(tmp_path):
  from sdar_jax.run import evaluation, trainer
  from sdar_jax.run.checkpoint import CheckpointManager

  workdir = str(tmp_path / "run")
  shutil.copytree(_DATA, workdir)
  config = tiny_run_config(2, **RUN)

  plan = evaluation.plan_evaluation(config, workdir)  # the latest checkpoint: 1
  assert plan.params_from == (os.path.join(workdir, "checkpoints"), 1)
  row = trainer.run_evaluation(config, plan.output, plan.params_from)
  assert row["step"] == 1 and 0.0 <= row["val/success_rate"] <= 1.0
  with open(os.path.join(plan.output, evaluation.EVAL_RECORD)) as f:
    assert json.load(f)["evaluated"]["step"] == 1

  trainer.run(config, workdir)  # resumes at iteration 1, trains iteration 2
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows] == [0, 1, 2]
  assert "train/loss" in rows[2] and "val/success_rate" in rows[2]
  with CheckpointManager(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
    assert ckpt.all_steps() == [1, 2]
