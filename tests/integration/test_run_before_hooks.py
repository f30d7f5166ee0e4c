"""A run written before methods became hooks and before the algorithm's settings were nested still
resumes, its method's state carried over and its saved config translated: tests/data/
run_before_hooks/ was written at commit 603af67 by `trainer.run` with `tiny_run_config(1,
"retire_opd", **RUN)` (RUN's keys then flat: algo.retire_window, ...): config.json, metrics rows
0-1 and checkpoint 1, whose loop state keeps RetireOPD's rule under the key "retirement" (since
then each hook's state is under "hooks"). W = 1 with thresholds that always hold, so the rule needs
the reverse KL of two iterations: resumed, the run retires at the validation after iteration 2 only
if the old checkpoint's iteration-1 value reached the hook. The preset has since become RetireOPD's
two stages (2026-12-07); the run resumes as it was written: one stage, the frozen initial policy
as the teacher with the block in front of the prompt, the sliding windows."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.helpers import tiny_run_config

pytestmark = pytest.mark.slow

_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
RUN = {
  "train.eval_every": 1,
  "eval.num_tasks": 1,
  "checkpoint.every": 1,
  "logging.every": 1,
  "checkpoint.export_hf": False,
  "checkpoint.keep": 5,
  "algo.retire.window": 1,
  "algo.retire.progress": 1e9,
  "algo.retire.competence": 0.0,
  # the single-stage rule the run was written with
  "algo.teacher_weights": "initial",
  "algo.teacher_context": "block",
  "algo.teacher_stage.preset": "",
  "algo.retire.windows": "sliding",
}


def test_its_saved_flat_config_is_read_at_the_new_keys():
  from sdar_jax.algos import AlgoConfig, Retire
  from sdar_jax.observe.collect import config_value, read_run

  path = os.path.join(_DATA, "run_before_hooks")
  with open(os.path.join(path, "config.json")) as f:
    saved = json.load(f)
  assert saved["algo"]["retire_window"] == 1 and "retire" not in saved["algo"]  # the old layout
  assert AlgoConfig.from_config(saved["algo"]).retire == Retire(1, 1e9, 0.0)
  run = read_run(path)
  config = run.config
  assert config_value(config, "algo.retire.window") == 1
  assert config_value(config, "rollout.shaping.invalid_penalty") == 0.1
  # "step" renamed: iterations and updates (the saved keys: train.total_steps, ...)
  assert saved["train"]["total_steps"] == 1 and "iterations" not in saved["train"]
  assert config_value(config, "train.iterations") == 1 == run.iterations
  assert config_value(config, "env.tasks_per_iteration") == 1
  assert config_value(config, "optim.warmup_iterations") == 0
  assert config_value(config, "algo.rlsd.warmdown_iterations") == 100
  assert run.get("train.total_steps") == 1  # an old name is read at its new place


def test_a_run_from_before_hooks_resumes_with_its_rule_state(tmp_path):
  from sdar_jax.run import trainer
  from sdar_jax.run.checkpoint import CheckpointManager

  workdir = str(tmp_path / "run")
  shutil.copytree(os.path.join(_DATA, "run_before_hooks"), workdir)
  with CheckpointManager(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
    loop = ckpt.restore_meta(1)["extra"]["loop"]
  assert "hooks" not in loop and len(loop["retirement"]["kl"]) == 1  # the old layout

  trainer.run(tiny_run_config(2, "retire_opd", **RUN), workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = {r["step"]: r for r in map(json.loads, f)}
  assert sorted(rows) == [0, 1, 2]
  assert rows[2]["retire/active"] == 0.0 and rows[2]["retire/retired_at"] == 2.0
  with CheckpointManager(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
    loop = ckpt.restore_meta(2)["extra"]["loop"]
  assert (
    loop["hooks"]["retirement"]["retired_at"] == 2 and len(loop["hooks"]["retirement"]["kl"]) == 2
  )
