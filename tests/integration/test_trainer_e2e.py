"""End to end: the host loop on the real ALFWorld engine with a tiny model on a (2, 1, 4) mesh of
fake CPU devices: rollout -> GRPO -> SDAR update -> eval -> checkpoint -> HF export -> resume. The
run is the paper's ALFWorld SDAR row (its method and skill rules) at small shapes, with the
teacher's skills read from a folder in the authors' layout."""

import json
import os

import numpy as np
import pytest

from tests.helpers import tiny_run_config, write_skills_folder

pytestmark = pytest.mark.slow


def _config(iterations: int, skills: str):
  """Warm start, evaluation every 2 iterations, a checkpoint every iteration, asynchronous saves,
  the HF export and TensorBoard on; the paper's ALFWorld SDAR row's skill rules and validation
  mode (configs/paper.py), the skills from `skills` (the authors' layout, the demo's brief general
  skills in it)."""
  from configs import paper

  row = paper.get_config("row=sdar,model=qwen2.5-3b,env=alfworld")
  overrides = {
    "env.skills.dir": skills,
    "env.skills.rules_version": row.env.skills.rules_version,
    "eval.skills": row.eval.skills,
    "train.eval_every": 2,
    "checkpoint.every": 1,
    "warm_start.steps": 2,
    "warm_start.batch_size": 4,
    "checkpoint.async_save": True,
    "checkpoint.export_hf": True,
    "logging.tensorboard": True,
  }
  return tiny_run_config(iterations, **overrides)


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_train_checkpoint_export_resume(tmp_path, monkeypatch):
  from configs import paper
  from envs.skills import skills_dir
  from sdar_jax.run import trainer
  from sdar_jax.run.checkpoint import CheckpointManager
  from sdar_jax.run.config_validation import validate

  with open(os.path.join(skills_dir("alfworld_brief"), "general_skills.md")) as f:
    skills = write_skills_folder(tmp_path / "skills", "authors", general=f.read())
  workdir = str(tmp_path / "run")
  config = _config(iterations=2, skills=skills)
  validate(config)
  assert config.algo == paper.get_config("row=sdar,model=qwen2.5-3b,env=alfworld").algo
  last = trainer.run(config, workdir)

  rows = _rows(workdir)
  assert [r["step"] for r in rows] == [0, 1, 2]
  assert "val/success_rate" in rows[0] and "val/success_rate" in rows[2]
  assert rows[0]["warm_start/expert_samples"] > 0  # one sample per walkthrough step
  assert os.path.exists(os.path.join(workdir, "warm_start_policy", "model.safetensors"))
  for r in rows[1:]:
    # Each iteration: 2 episodes of <= 2 turns were played, scored, and trained on.
    assert 1 <= r["rollout/turn_samples"] <= 4
    assert r["train/skipped_update"] == 0
    assert 0.0 < r["sdar/gate_mean"] < 1.0
    assert r["rollout/skill_block_tokens"] > 0  # the general skills under "general_skills"
    assert np.isfinite(r["train/loss"])
    assert r["episode/env_failures"] == 0
  assert last["step"] == 2
  assert os.path.exists(os.path.join(workdir, "metrics.png"))
  ckpt = CheckpointManager(os.path.join(workdir, "checkpoints"))
  assert ckpt.all_steps() == [1, 2]
  meta = ckpt.restore_meta()
  assert meta["extra"]["loop"]["iteration"] == 2
  ckpt.close()

  # The export is a Hugging Face directory transformers can read.
  import transformers

  export = os.path.join(workdir, "hf_export")
  hf = transformers.AutoModelForCausalLM.from_pretrained(export)
  assert hf.config.num_hidden_layers == 2
  assert os.path.exists(os.path.join(export, "tokenizer.json"))

  # Resume: the same workdir with one more step continues at iteration 2 -> 3.
  trainer.run(_config(iterations=3, skills=skills), workdir)
  rows = _rows(workdir)
  assert [r["step"] for r in rows] == [0, 1, 2, 3]
  ckpt = CheckpointManager(os.path.join(workdir, "checkpoints"))
  assert ckpt.latest_step() == 3
  ckpt.close()

  # ... and is the same run: an uninterrupted 3-step run logs the same step-3 numbers (rollout
  # keys depend on (seed, iteration) only; the restored state is bit-identical).
  straight = str(tmp_path / "straight")
  trainer.run(_config(iterations=3, skills=skills), straight)
  resumed_row, straight_row = rows[3], _rows(straight)[3]
  timings = ("seconds", "compilations", "perf/")  # wall-clock figures differ between two runs
  compared = [k for k in straight_row if not any(t in k for t in timings)]
  assert "train/loss" in compared and "episode/valid_action_ratio" in compared
  for key in compared:
    assert resumed_row[key] == straight_row[key], key
