#!/usr/bin/env bash
# One-GPU check (bench/gpu_check.py): the parity tests on the device, the bf16 SDAR update at
# Qwen2.5-3B shapes (tokens/s, MFU against the H200's 989 TFLOP/s dense bf16 peak) and the
# sampler's tokens/s, as one table, in under 8 minutes.
#
#   bench/gpu_check.sh                    # on a GPU host, .venv with jax[cuda12] + requirements-dev
#   bench/gpu_check.sh --dry-run          # print the plan, then run every step on CPU, tiny sizes
#   bench/gpu_check.sh --peak-tflops 312  # another GPU's bf16 peak (an A100 here)
#
# PYTHON=/path/to/python (or a name on PATH, e.g. python3) overrides the interpreter (default: the repository's .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
if ! PYTHON="$(command -v "$PYTHON")"; then
  echo "gpu_check: no interpreter at $PYTHON. Fix: run 'make test' once (builds .venv), or set" \
    "PYTHON=/path/to/python." >&2
  exit 2
fi
exec "$PYTHON" bench/gpu_check.py "$@"
