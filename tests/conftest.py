"""Test-wide setup: 8 fake CPU devices so sharding tests run on one host, fp32 matmuls."""

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
