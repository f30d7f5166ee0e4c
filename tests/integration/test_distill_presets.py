"""The whole-distribution distillation settings through the real trainer: the top-k preset
(`sdar_topk`) and an EMA teacher (`sdar_vocab` with algo.teacher_weights='ema') each train one
iteration on the suite's shared tiny run config (`tiny_run_config`); the EMA run's checkpoint holds
the EMA beside the params, one update behind them."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from tests.helpers import ONE_ITERATION, tiny_run_config

pytestmark = pytest.mark.slow


def _train_one_iteration(algo: str, workdir: str, **overrides) -> dict:
  from sdar_jax.run import trainer

  trainer.run(tiny_run_config(1, algo, **ONE_ITERATION, **overrides), workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    (row,) = [r for r in map(json.loads, f) if "train/loss" in r]
  assert row["step"] == 1 and row["train/skipped_update"] == 0.0
  assert math.isfinite(row["sdar/loss"]) and row["sdar/loss"] != 0.0
  return row


def test_sdar_topk_trains_one_iteration(tmp_path):
  row = _train_one_iteration("sdar_topk", str(tmp_path / "topk"), **{"algo.top_k": 4})
  assert 0.0 <= row["sdar/gate_mean"] <= 1.0


def test_an_ema_teacher_trains_one_iteration_and_checkpoints_its_ema(tmp_path):
  from sdar_jax.run.checkpoint import CheckpointManager

  workdir = str(tmp_path / "ema")
  _train_one_iteration(
    "sdar_vocab",
    workdir,
    **{"algo.teacher_weights": "ema", "algo.ema.decay": 0.5, "algo.kl_coef": 0.0},
  )
  with CheckpointManager(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
    state, _ = ckpt.restore()
  params, ema = state["params"], state["ema_params"]
  assert set(ema) == set(params)
  # one update from the initial params p0 to p1: ema = (p0 + p1) / 2, strictly between them
  assert not np.array_equal(np.asarray(ema["embed"]), np.asarray(params["embed"]))
