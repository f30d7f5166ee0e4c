"""Preset `grsd_reflect` trains one iteration on the suite's tiny run config: the policy writes a
reflection per episode through the in-process sampler (its tokens and seconds in perf/), the
oracle judge scores them, the teacher reads the prior where a group has one, and the reflection
tokens get the α-weighted extra update pass (reflection/* metrics)."""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.helpers import ONE_ITERATION, tiny_run_config


@pytest.mark.slow
def test_grsd_reflect_trains_one_iteration_with_the_policy_reflecting(tmp_path):
  from sdar_jax.run import trainer

  workdir = str(tmp_path / "grsd_reflect")
  overrides = {
    **ONE_ITERATION,
    "algo.reflection.judge": "oracle",  # no endpoint in the suite
    "algo.reflection.tokens": 8,
  }
  trainer.run(tiny_run_config(1, "grsd_reflect", **overrides), workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    (row,) = [r for r in map(json.loads, f) if "train/loss" in r]
  assert row["step"] == 1 and row["train/skipped_update"] == 0.0
  assert row["reflection/episodes"] == 2.0 and row["reflection/failed"] == 0.0
  assert row["reflection/groups"] == 1.0 and row["reflection/oracle"] == 1.0
  with_prior = row["reflection/groups_with_prior"]
  assert with_prior + row["reflection/groups_without_prior"] == 1.0
  assert row["context/with_context_share"] == with_prior  # one group: all turns or none
  assert 0 < row["perf/reflection_tokens"] <= 2 * 8 + 8 * with_prior
  assert row["perf/reflection_seconds"] > 0
  # the reflection-training pass: both reflections, one more update
  assert row["reflection/train_rows"] == 2.0
  assert math.isfinite(row["reflection/loss"]) and row["reflection/skipped_update"] == 0.0
