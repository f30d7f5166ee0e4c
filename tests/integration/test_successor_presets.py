"""SDAR's successors through the real trainer on the suite's shared tiny run config
(`tiny_run_config`): AgentOPSD and GRSD each train one iteration with their rewritten turn
advantages; RetireOPD trains one iteration, is resumed from its checkpoint, retires at the
iteration the restored rule state makes due, trains without the distillation term, and its
checkpoint is then evaluated alone (without the skills)."""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.helpers import ONE_ITERATION, tiny_run_config

pytestmark = pytest.mark.slow


def _rows(workdir: str) -> dict[int, dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["step"]: r for r in map(json.loads, f)}


@pytest.mark.parametrize("algo", ["agent_opsd", "grsd"])
def test_turn_advantage_presets_train_one_iteration(tmp_path, algo):
  from sdar_jax.run import trainer

  workdir = str(tmp_path / algo)
  trainer.run(tiny_run_config(1, algo, **ONE_ITERATION), workdir)
  row = _rows(workdir)[1]
  assert row["train/skipped_update"] == 0.0 and math.isfinite(row["train/loss"])
  assert math.isfinite(row["turn_adv/abs_mean"]) and 0.0 <= row["turn_adv/sign_flips"] <= 1.0
  assert "sdar/loss" not in row  # an advantage estimator, no distillation term


def test_retire_opd_retires_across_a_resume(tmp_path):
  """W = 1 with thresholds that always hold: the rule needs 2W = 2 iterations of reverse KL, so a
  run stopped after iteration 1 cannot retire; resumed, it retires at the validation after
  iteration 2 only if the checkpoint kept iteration 1's value, then trains iteration 3 without the
  distillation term or the teacher; the checkpoint keeps the rule's state."""
  from sdar_jax.run import trainer
  from sdar_jax.run.checkpoint import CheckpointManager

  workdir = str(tmp_path / "retire")
  settings = {
    "train.eval_every": 1,
    "eval.num_tasks": 1,
    "checkpoint.every": 1,
    "logging.every": 1,
    "checkpoint.export_hf": False,
    "algo.retire.window": 1,
    "algo.retire.progress": 1e9,
    "algo.retire.competence": 0.0,
  }
  trainer.run(tiny_run_config(1, "retire_opd", **settings), workdir)
  rows = _rows(workdir)
  assert 0.0 <= rows[0]["retire/teacher_success"] <= 1.0  # the frozen teacher, with its skills
  assert rows[0]["retire/teacher_success"] == rows[0]["val_with_skill/success_rate"]
  assert "val_with_skill/success_rate" not in rows[1]  # the teacher's mode: at the start only
  assert rows[1]["retire/active"] == 1.0 and "retire/progress" not in rows[1]
  assert math.isfinite(rows[1]["sdar/loss"]) and rows[1]["retire/lam"] == 0.01

  # resumed to iteration 3: it retires at the validation after iteration 2 (the restored rule
  # state holds iteration 1's value), and iteration 3 trains without the term or the teacher
  trainer.run(tiny_run_config(3, "retire_opd", **settings), workdir)
  rows = _rows(workdir)
  assert math.isfinite(rows[2]["sdar/loss"]) and rows[2]["retire/lam"] == 0.01  # still distilled
  assert rows[2]["retire/active"] == 0.0 and rows[2]["retire/retired_at"] == 2.0  # retired
  third = rows[3]
  assert third["retire/active"] == 0.0 and third["retire/lam"] == 0.0
  assert third["retire/retired_at"] == 2.0 and third["train/skipped_update"] == 0.0
  assert "sdar/loss" not in third and "rollout/teacher_old_gap_mean" not in third
  with CheckpointManager(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
    step = ckpt.latest_step()
    meta = ckpt.restore_meta(step)
  state = meta["extra"]["loop"]["hooks"]["retirement"]
  assert step == 3 and state["retired_at"] == 2 and len(state["kl"]) == 2

  # the trained policy evaluated alone, without the skills (the default eval.skills): the
  # teacher's start-only mode belongs to training, so no skill retriever is needed
  out = str(tmp_path / "retire_eval")
  row = trainer.run_evaluation(
    tiny_run_config(3, "retire_opd", **settings), out, (os.path.join(workdir, "checkpoints"), 3)
  )
  assert 0.0 <= row["val/success_rate"] <= 1.0 and "val_with_skill/success_rate" not in row
