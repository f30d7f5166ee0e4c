"""Test-wide setup (8 fake CPU devices so sharding tests run on one host, fp32 matmuls) and the
shared fixtures: a tiny model config, its parameters and a turn batch (builders in helpers.py)."""

import os

# Appended, not set by default: a run that restricts XLA (e.g. XLA_FLAGS=--xla_cpu_max_isa=SSE4_2,
# to check tolerances on an older CPU) keeps its 8 fake devices.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

import pytest

from tests.helpers import TINY_CONFIG, make_turn_batch


@pytest.fixture(scope="session")
def tiny_config():
  """The tiny Qwen3-architecture `ModelConfig` shared by the update-step tests."""
  return TINY_CONFIG


@pytest.fixture(scope="session")
def tiny_params(tiny_config):
  """Random parameters for `tiny_config` (std 0.1, key 0); jax arrays are immutable, so one set
  serves the whole session."""
  from sdar_jax.models import init_params

  return init_params(tiny_config, jax.random.key(0), std=0.1)


@pytest.fixture
def tiny_batch(tiny_params):
  """A ragged 8-row `TurnBatch` for `tiny_config` with exact old log-probs (seed 0)."""
  return make_turn_batch(tiny_params, seed=0)
