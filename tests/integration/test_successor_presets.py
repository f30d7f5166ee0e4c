"""SDAR's successors through the real trainer on the suite's shared tiny run config
(`tiny_run_config`): AgentOPSD and GRSD each train one iteration with their rewritten turn
advantages; UCOB trains one iteration with distillation rows among its PPO rows; RetireOPD trains
its teacher (stage 1, `skill_grpo`) and one iteration distilled from that teacher's checkpoint
(stage 2), is resumed from its checkpoints (the finished stage 1 is not trained again), retires at
the iteration the restored rule state makes due, trains without the distillation term, and its
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


def test_ucob_trains_one_iteration_with_distillation_rows(tmp_path, monkeypatch):
  """Half of the group plays with the skills in its prompt; the tiny random policy neither wins nor
  writes a valid action, so every return is 0 and no pair would form: the returns are made
  distinct and the turns valid here, and each state's best turn is distilled into the other
  view of the others (rows with weights, out of the PPO term). The memory starts with three
  policy-written task skills (hand-made, with their writer's tokens; their text matches every
  ALFWorld goal), so the good view reads them and, with no warm-up, UCOB's reflection training
  trains their tokens after the update (`skill_memory_train/*`)."""
  import dataclasses

  import numpy as np

  from sdar_jax.algos import skill_memory_source, ucob
  from sdar_jax.run import trainer

  start = skill_memory_source.SkillMemoryHooks.at_run_start

  def with_skills(self, view):  # before the first rollout: the written skills, their utilities
    task = "put clean cool heat hot two look examine desklamp"
    for k, utility in enumerate((0.5, -0.5, 0.25)):
      skill = {"title": f"skill {k}", "principle": f"principle {k} ...", "when_to_apply": "always"}
      tokens = (list(range(10 + k, 40 + k)), list(range(100 + k, 112 + k)))
      self.memory.add("task", task, "", skill, 0, "policy", tokens)
      self.memory.entries[-1]["utility"] = utility
    start(self, view)

  monkeypatch.setattr(skill_memory_source.SkillMemoryHooks, "at_run_start", with_skills)

  real_pairs = ucob.ucob_pairs
  monkeypatch.setattr(
    ucob, "discounted_returns", lambda samples, gamma: -np.arange(len(samples), dtype=float)
  )
  monkeypatch.setattr(
    ucob,
    "ucob_pairs",
    lambda samples, returns, **kw: real_pairs(
      [dataclasses.replace(s, valid=True) for s in samples], returns, **kw
    ),
  )
  workdir = str(tmp_path / "ucob")
  # one mini-batch for the PPO rows and the distillation rows: one compiled update
  one_batch = {"algo.top_k": 4, "train.mini_batch_size": 8}
  oracle = {"algo.skill_memory.reflector": "oracle"}  # the memory's writer without sampling
  oracle["algo.skill_memory.train_warmup"] = 0  # the reflection training from the first iteration
  trainer.run(tiny_run_config(1, "ucob", **ONE_ITERATION, **one_batch, **oracle), workdir)
  row = _rows(workdir)[1]
  assert row["train/skipped_update"] == 0.0 and math.isfinite(row["train/loss"])
  assert row["ucob/pairs"] >= 1 and row["train/distill_tokens"] > 0
  assert math.isfinite(row["ucob/loss"]) and row["ucob/loss"] > 0.0
  assert row["ucob/coef"] == pytest.approx(0.1)
  assert row["ucob/skills_to_plain"] + row["ucob/plain_to_skills"] == row["ucob/pairs"]
  assert row["ucob/skills_share"] == 0.5  # one episode of the group of two played with them
  # the iteration's update, then the reflection pass at its own shapes
  assert row["train/compilations"] == 2.0
  # its skill memory: read by the good view (its two turns, the three skills each), a skill
  # written from the group's failure after the rollout, saved in the workdir
  assert row["skill_memory/turns_given"] == 2.0 and row["skill_memory/task_updates"] == 3.0
  assert row["skill_memory/written"] >= 1.0
  with open(os.path.join(workdir, "skill_memory.json")) as f:
    assert "prompt_ids" not in f.read()  # the writer's tokens only in the checkpoint
  # UCOB's reflection training: the three used skills (utilities 0.4, -0.4, 0.2 after the
  # round: nobody won), one optimizer step on their tokens
  assert row["skill_memory_train/rows"] == 3.0 and row["skill_memory_train/task_rows"] == 3.0
  assert row["skill_memory_train/uses_mean"] == row["skill_memory/turns_given"]  # every turn
  assert row["skill_memory_train/skipped_update"] == 0.0
  assert math.isfinite(row["skill_memory_train/loss"])


# About 60 s cold on 2 cores (50 s for the one-stage test it replaced): two runs' builds and
# compilations (the teacher's and the student's), a resume and an evaluation-only run.
def test_retire_opd_in_two_stages_retires_across_a_resume(tmp_path):
  """Stage 1 trains the teacher (`skill_grpo`, one iteration) in <workdir>/teacher; stage 2 reads
  its checkpoint as the frozen teacher, whose with-skills success is the competence reference.
  W = 1 with thresholds that always hold: the rule needs two windows of reverse KL, so a run
  stopped after iteration 1 cannot retire; resumed, it retires at the validation after iteration
  2 only if the checkpoint kept iteration 1's value, then trains iteration 3 without the
  distillation term or the teacher; the checkpoint keeps the rule's state."""
  import jax
  import numpy as np

  from sdar_jax.run import stages, trainer
  from sdar_jax.run.checkpoint import CheckpointManager
  from sdar_jax.run.setup import load_teacher, model_config_from

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
    "algo.teacher_stage.iterations": 1,
  }
  stages.run(tiny_run_config(1, "retire_opd", **settings), workdir)
  teacher_dir = os.path.join(workdir, "teacher")
  with open(os.path.join(teacher_dir, "config.json")) as f:
    first = json.load(f)["algo"]
  assert first["name"] == "skill_grpo" and first["skills_in_student"] and first["distill"] == "none"
  assert first["retire"]["window"] == 0 and first["teacher_stage"]["preset"] == ""
  assert first["kl_coef"] == 0.01  # a shared setting: the run's
  with open(os.path.join(workdir, "config.json")) as f:
    second = json.load(f)["algo"]
  assert second["teacher_path"] == os.path.join(teacher_dir, "checkpoints")
  # stage 2's frozen teacher is stage 1's last checkpoint, not the student's starting policy
  config = tiny_run_config(1, "retire_opd", **settings)
  config.algo.teacher_path = second["teacher_path"]
  with CheckpointManager(second["teacher_path"], read_only=True) as ckpt:
    trained, _ = ckpt.restore_params(model_config_from(config))
  with CheckpointManager(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
    start, _ = ckpt.restore_params(model_config_from(config), step=1)
  teacher = load_teacher(config, model_config_from(config), None)
  same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), teacher, trained)
  assert all(jax.tree.leaves(same))
  assert not all(jax.tree.leaves(jax.tree.map(lambda a, b: np.array_equal(a, b), teacher, start)))

  rows = _rows(workdir)
  assert 0.0 <= rows[0]["retire/teacher_success"] <= 1.0  # the frozen teacher, with its skills
  assert rows[0]["retire/teacher_success"] == rows[0]["val_with_skill/success_rate"]
  assert "val_with_skill/success_rate" not in rows[1]  # the teacher's mode: at the start only
  assert rows[1]["retire/active"] == 1.0 and "retire/progress" not in rows[1]
  assert math.isfinite(rows[1]["sdar/loss"]) and rows[1]["retire/lam"] == 0.01

  # resumed to iteration 3: stage 1 is done; stage 2 retires at the validation after iteration 2
  # (the restored rule state holds iteration 1's value), and iteration 3 trains without the term
  stages.run(tiny_run_config(3, "retire_opd", **settings), workdir)
  assert sorted(_rows(teacher_dir)) == [0, 1]  # the teacher was not trained again
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
  assert step == 3 and state["retired_at"] == 2 and state["iterations"] == 2

  # the trained policy evaluated alone, without the skills (the default eval.skills): the
  # teacher's start-only mode belongs to training, so no skill retriever is needed
  out = str(tmp_path / "retire_eval")
  row = trainer.run_evaluation(
    tiny_run_config(3, "retire_opd", **settings), out, (os.path.join(workdir, "checkpoints"), 3)
  )
  assert 0.0 <= row["val/success_rate"] <= 1.0 and "val_with_skill/success_rate" not in row
