"""A frozen teacher read from `algo.teacher_path` (sdar_jax.run.setup.load_teacher): a Hugging
Face folder, a checkpoint folder or a run's workdir give the same weights; an empty path, a
missing folder and a folder holding neither are refused with a message naming the fix. And the
first stage's config (sdar_jax.run.stages): the stage preset's method settings, the run's
shared ones."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from tests.helpers import tiny_run_config


def _same(a, b) -> bool:
  return all(jax.tree.leaves(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b)))


def test_a_teacher_from_a_hugging_face_folder_or_a_checkpoint(tmp_path):
  from sdar_jax.core.train_state import create_train_state, make_optimizer
  from sdar_jax.models import init_params
  from sdar_jax.run.checkpoint import CheckpointManager, export_hf
  from sdar_jax.run.setup import ConfigError, load_teacher, model_config_from

  config = tiny_run_config(1, "sdar", **{"algo.teacher_weights": "frozen"})
  model_config = model_config_from(config)
  params = init_params(model_config, jax.random.key(3))
  export_hf(model_config, params, str(tmp_path / "hf"))
  state = create_train_state(params, make_optimizer(**config.optim))
  with CheckpointManager(str(tmp_path / "run" / "checkpoints"), async_save=False) as ckpt:
    ckpt.save(1, state, model_config, force=True)
  for path in (tmp_path / "hf", tmp_path / "run" / "checkpoints", tmp_path / "run"):
    config.algo.teacher_path = str(path)
    assert _same(load_teacher(config, model_config, None), params), path
  for path, message in (
    ("", "teacher_path, which is empty"),
    (str(tmp_path / "nowhere"), "no such folder"),
    (str(tmp_path), "neither a checkpoint nor a Hugging Face model"),
  ):
    config.algo.teacher_path = path
    with pytest.raises(ConfigError, match=message):
      load_teacher(config, model_config, None)


def test_the_first_stage_takes_the_stage_presets_method_and_the_runs_shared_settings(tmp_path):
  from sdar_jax.run import stages

  config = tiny_run_config(
    4, "retire_opd", **{"algo.kl_coef": 0.02, "checkpoint.dir": str(tmp_path / "elsewhere")}
  )
  (first, first_dir), (second, second_dir) = stages.plan(config, str(tmp_path / "run"))
  assert first_dir == os.path.join(str(tmp_path / "run"), "teacher")
  assert second_dir == str(tmp_path / "run")
  assert second.algo.teacher_path == os.path.join(first_dir, "checkpoints")
  assert first.algo.name == "skill_grpo" and first.algo.skills_in_student
  assert first.algo.distill == "none" and first.algo.lam == 0.0
  assert first.algo.teacher_weights == "current" and first.algo.teacher_stage.preset == ""
  assert first.algo.retire.window == 0 and first.algo.teacher_context == "block"
  assert first.algo.kl_coef == 0.02  # shared by both presets: the run's override
  assert first.train.iterations == 4 and first.checkpoint.dir is None
  config.algo.teacher_stage.iterations = 2
  assert stages.plan(config, str(tmp_path / "run"))[0][0].train.iterations == 2
  config.algo.teacher_stage.preset = "retire_opd"
  with pytest.raises(ValueError, match="not a preset that trains in one stage"):
    stages.plan(config, str(tmp_path / "run"))
