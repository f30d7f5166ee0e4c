#!/usr/bin/env bash
# One run on the GPUs of this host. jax must be the CUDA build (once per venv):
#   .venv/bin/pip install "jax[cuda12]==0.10.2"
# The mesh comes from the config (default: every device on the data axis); e.g. for 8 GPUs with
# 2-way tensor parallelism: --config.mesh.data=4 --config.mesh.tensor=2.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:?usage: launch/gpu.sh CONFIG[:ARG] WORKDIR [--config.key=value ...]}
workdir=${2:?usage: launch/gpu.sh CONFIG[:ARG] WORKDIR [--config.key=value ...]}
shift 2
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
exec .venv/bin/python -m sdar_jax.train --config="$config" --workdir="$workdir" "$@"
