"""Source `skill_memory` in the real host loop: `sdar` with the oracle writer trains one iteration
on the suite's tiny run config (the hook's round in it: nothing to retrieve yet, a task skill
written about the group's failure), writes <workdir>/skill_memory.json at the iteration's end, and
a trainer resumed on the workdir restores the same memory from the checkpoint; the evaluation's
token view composes the teacher's contexts from the memory without a round. Retrieval and the
utility update over later iterations: tests/unit/algos/test_skill_memory.py."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers import ONE_ITERATION, tiny_run_config

OVERRIDES = {
  **ONE_ITERATION,
  "algo.context": "skill_memory",
  "algo.skill_memory.reflector": "oracle",  # no endpoint in the suite, no sampling cost
  "train.eval_every": 1,  # the token view composes the memory's contexts for the validation
}


@pytest.mark.slow
def test_skill_memory_in_the_trainer_is_written_and_survives_a_resume(tmp_path):
  from sdar_jax.run import trainer

  workdir = str(tmp_path / "skill_memory")
  config = tiny_run_config(1, "sdar", **OVERRIDES)
  trainer.run(config, workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    (row,) = [r for r in map(json.loads, f) if "train/loss" in r]
  assert row["step"] == 1 and row["train/skipped_update"] == 0.0
  # the first round: an empty memory gives no context, one group's failure is written about
  assert row["skill_memory/turns_given"] == 0.0 and row["context/skill_memory/share"] == 0.0
  assert row["skill_memory/asked"] >= 1.0 and row["skill_memory/failed"] == 0.0
  written = row["skill_memory/written"]
  assert written >= 1.0 and row["skill_memory/size"] == written
  assert row["perf/skill_memory_seconds"] >= 0.0
  with open(os.path.join(workdir, "skill_memory.json")) as f:
    saved = f.read()
  memory = json.loads(saved)
  assert len(memory["skills"]) == written
  assert all(s["source"] == "oracle" and s["written_at"] == 0 for s in memory["skills"])
  # the evaluation after the iteration: its token view read the memory (no hook round ran)
  page = open(os.path.join(workdir, "eval", "step_1", "tokens.html"), encoding="utf-8").read()
  assert "Token view, iteration 1" in page

  resumed = trainer.Trainer(config, workdir)  # builds, restores nothing until asked
  try:
    assert resumed.hooks["skill_memory"].memory.to_json() != saved  # empty before the restore
    assert resumed.maybe_restore() and resumed.loop_state.iteration == 1
    assert resumed.hooks["skill_memory"].memory.to_json() == saved
  finally:
    resumed.close()
