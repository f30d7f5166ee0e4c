"""Preset `opid` trains one iteration on the suite's tiny run config: the oracle analyses each
finished episode (no endpoint in the suite), the teacher reads the hindsight skill blocks at θ_old,
and the update runs on GRPO's advantage plus the weighted teacher shift (opid/* metrics)."""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.helpers import ONE_ITERATION, tiny_run_config


@pytest.mark.slow
def test_opid_trains_one_iteration_with_hindsight_skills(tmp_path):
  from sdar_jax.run import trainer

  workdir = str(tmp_path / "opid")
  trainer.run(
    tiny_run_config(1, "opid", **ONE_ITERATION, **{"algo.opid.reflector": "oracle"}), workdir
  )
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    (row,) = [r for r in map(json.loads, f) if "train/loss" in r]
  assert row["step"] == 1 and row["train/skipped_update"] == 0.0
  assert row["opid/episodes"] == 2.0 and row["opid/failed"] == 0.0
  assert row["opid/lambda"] == pytest.approx(0.001)
  assert row["context/opid/share"] == 1.0  # every turn reads a skill
  assert row["perf/opid_seconds"] >= 0.0 and math.isfinite(row["train/loss"])
