"""configs/paper.py's WebShop and Search-QA rows at small shapes: every row of the two environments,
as the table defines it (method, skill rules, validation modes, trained or not), shrunk to the tiny
model with random initialisation asked for explicitly, passes validation; Search-QA's Skill-GRPO
row runs one training iteration and both its validations through the real trainer, on the offline
data (generated fact world) over 8 fake CPU devices. WebShop's SDAR row trains in
tests/integration/test_envs_training.py (one end-to-end run per environment)."""

from __future__ import annotations

import json
import os

import pytest

from configs import common, paper
from sdar_jax.run.config_validation import ConfigError, validate
from tests.helpers import SMALL_MODEL, small_run_overrides

ENVS = ("webshop", "search_qa")
# The row's experiment at the smallest shapes the host loop runs: the tiny model (random weights,
# asked for explicitly: a real preset without model.path is refused), one GRPO group of 2 two-turn
# episodes, one iteration, 2 validation tasks, no warm start.
SMALL = {**SMALL_MODEL, **small_run_overrides(), "train.eval_every": 1}


def _rows(env: str) -> list[str]:
  return [r for r in paper.rows() if r.endswith(f",env={env}")]


def _small(row_arg: str):
  """The paper row `row_arg` (its real-size config) at small shapes: at most one iteration."""
  config = paper.get_config(row_arg)
  steps = min(config.train.iterations, 1)  # the untrained rows keep 0: validation only
  return common.override(config, {**SMALL, "train.iterations": steps})


@pytest.mark.parametrize("env", ENVS)
def test_every_row_validates_at_small_shapes(env):
  rows = _rows(env)
  assert len(rows) == len(paper.ROWS) * len(paper.MODELS) == 30
  for row_arg in rows:
    real = paper.get_config(row_arg)
    if env == "search_qa":  # the whole test split, in batches, as the authors validate
      assert (real.eval.num_tasks, real.eval.batch_size) == (-1, 512)
    small = _small(row_arg)
    model = validate(small, num_devices=8)
    assert model.name == "tiny" and small.model.random_init
    # What makes the row that row is kept: the method, the skill rules, the validation modes,
    # trained or not, what the table reads.
    for key in ("algo", "env.skills", "eval.skills", "env.name", "paper"):
      section_real, section_small = real, small
      for part in key.split("."):
        section_real, section_small = section_real[part], section_small[part]
      assert section_small == section_real, (row_arg, key)
    assert (small.train.iterations == 0) == (real.train.iterations == 0)
  # The real-size row with the real preset and no weights is refused until random weights are
  # asked for.
  refused = common.override(paper.get_config(rows[0]), {"model.random_init": False})
  with pytest.raises(ConfigError, match="model.random_init=True"):
    validate(refused, num_devices=8)


def _train_one_iteration(row_arg: str, workdir: str) -> list[dict]:
  from sdar_jax.run.trainer import Trainer

  config = _small(row_arg)
  config.train.eval_before_train = False
  trainer = Trainer(config, workdir)
  try:
    trainer.run()
  finally:
    trainer.close()
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
def test_search_qa_skill_grpo_row_trains_one_iteration(tmp_path):
  # Skill-GRPO: skills in the student prompt, validated without ("skill_grpo") and with
  # ("skill_grpo_star") skills.
  rows = _train_one_iteration(
    "row=skill_grpo,model=qwen2.5-7b,env=search_qa", str(tmp_path / "run")
  )
  assert [r["step"] for r in rows] == [1]
  (row,) = rows
  assert row["episode/env_failures"] == 0 and "train/loss" in row
  assert {"val/em", "val_with_skill/em"} <= set(row)
