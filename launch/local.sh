#!/usr/bin/env bash
# One training run on this machine (CPU, or the local GPUs/TPU that jax sees).
#   launch/local.sh configs/alfworld.py:model=qwen2.5-3b,algo=sdar runs/sdar \
#       --config.model.path=/data/Qwen2.5-3B-Instruct --config.env.data_dir=/data/alfworld
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:?usage: launch/local.sh CONFIG[:ARG] WORKDIR [--config.key=value ...]}
workdir=${2:?usage: launch/local.sh CONFIG[:ARG] WORKDIR [--config.key=value ...]}
shift 2
exec .venv/bin/python -m sdar_jax.train --config="$config" --workdir="$workdir" "$@"
