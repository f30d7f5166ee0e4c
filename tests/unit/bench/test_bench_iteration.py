"""bench/iteration.py without training: the command lines of its modes and its summary of a run."""

from __future__ import annotations

import sys

import pytest

from configs import common, default
from sdar_jax import train
from sdar_jax.run import config_validation
from tests.helpers import load_script


@pytest.fixture(scope="module")
def bench():
  yield load_script("bench/iteration.py", "bench_iteration")
  del sys.modules["bench_iteration"]


@pytest.mark.parametrize("mode", ["serial", "halves", "async", "async_halves"])
def test_mode_command_names_real_keys_and_a_valid_config(bench, mode):
  """Every --config.<key> of a mode's command line is a key of the demo config (the trainer's own
  check of its command line), and the config with those values passes the trainer's validation."""
  cmd = bench.mode_command("configs/default.py", "/tmp/x", 5, bench.MODES[mode])
  assert cmd[1:4] == ["-m", "sdar_jax.train", "--config=configs/default.py"]
  config = default.get_config()
  assert train.unknown_override_keys(config, cmd) == []
  overrides = dict(a[len("--config.") :].split("=", 1) for a in cmd if a.startswith("--config."))
  assert overrides["train.iterations"] == "5" and overrides["train.eval_every"] == "0"
  common.override(config, {k: common._literal(v) for k, v in overrides.items()})
  config_validation.validate(config)
  assert config.rollout.overlap == bench.MODES[mode]["rollout.overlap"]
  assert config.train.max_staleness == bench.MODES[mode]["train.max_staleness"]


def test_summary_drops_the_compiling_iteration(bench):
  rows = [
    {"step": 0, "val/success_rate": 0.2},
    {
      "step": 1,
      "perf/iteration_seconds": 90.0,
      "perf/env_wait_share": 0.2,
      "perf/compile_share": 0.6,
    },
    {
      "step": 3,
      "perf/iteration_seconds": 30.0,
      "perf/env_wait_share": 0.5,
      "perf/compile_share": 0.0,
    },
    {
      "step": 2,
      "perf/iteration_seconds": 20.0,
      "perf/env_wait_share": 0.7,
      "perf/compile_share": 0.1,
    },
    {
      "step": 4,
      "perf/iteration_seconds": 26.0,
      "perf/env_wait_share": 0.6,
      "perf/compile_share": 0.2,
    },
  ]
  summary = bench.summarize(rows)
  assert summary["iterations"] == 3
  assert summary["median_s"] == 26.0  # of 20, 30, 26: step 1's 90 s is dropped
  assert summary["env_wait"] == pytest.approx(0.6)
  assert summary["compile"] == pytest.approx(0.1)


def test_summary_needs_two_iterations(bench):
  with pytest.raises(ValueError, match="--iterations >= 2"):
    bench.summarize([{"step": 1, "perf/iteration_seconds": 9.0}])
