"""bench/gpu_check.sh as far as a CPU allows: its dry run (the plan printed, every step run on CPU
at tiny sizes, one table) and the MFU peak it reports against."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import load_script

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _gpu_check_module():
  return load_script("bench/gpu_check.py", "gpu_check")


def test_plan_names_the_qwen2_5_3b_shapes_and_the_peak():
  gpu_check = _gpu_check_module()
  plan = "\n".join(gpu_check.describe(gpu_check.FULL, 989.0))
  assert "qwen2.5-3b random weights, bf16 compute" in plan
  assert "16 turn-samples, student 512+512, teacher 1024+512, micro-batch 2" in plan
  assert "64 prompts x 512 tokens, 256 new tokens each" in plan
  assert "MFU against 989 TFLOP/s" in plan
  assert "top operations by time" in plan and "two iterations of python -m sdar_jax.train" in plan
  assert sum(gpu_check.FULL.seconds) < 15 * 60  # the step limits keep the check under 15 minutes


def test_peak_is_the_h200_figure_unless_told_otherwise(monkeypatch):
  # peak_for puts bench/ on sys.path; undone after the test, so that later tests, and the worker
  # processes they spawn with this sys.path, import from bench/ only what they ask for.
  monkeypatch.setattr(sys, "path", list(sys.path))
  gpu_check = _gpu_check_module()
  assert gpu_check.peak_for("NVIDIA H200", None) == 989.0
  assert gpu_check.peak_for("NVIDIA H100 80GB HBM3", None) == 989.0
  assert gpu_check.peak_for("NVIDIA A100-SXM4-80GB", None) == 312.0  # bench/train_step.py's table
  assert gpu_check.peak_for("NVIDIA H200", 500.0) == 500.0


@pytest.mark.slow
def test_dry_run_runs_every_step_on_cpu_and_prints_one_table():
  proc = subprocess.run(
    # the profile and trainer-iteration steps (minutes on CPU) are left out of the suite
    ["bash", "bench/gpu_check.sh", "--dry-run", "--skip=profile,iteration"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  out = proc.stdout
  assert "On a GPU this check runs (JAX_PLATFORMS=cuda):" in out
  assert "Dry run: the same steps on CPU at tiny sizes:" in out
  table = out[out.index("| step | result | detail | wall s |") :].splitlines()
  rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in table[2:5]}
  assert rows["parity tests"] == "ok"
  assert rows["update tiny bf16"].endswith("%") and "tokens/s; MFU" in rows["update tiny bf16"]
  assert rows["sampler tiny bf16"].endswith("ms/step") and "tokens/s" in rows["sampler tiny bf16"]
  assert "of bound" in out
  assert "MFU against 989 TFLOP/s (dense bf16 peak)" in out
