#!/usr/bin/env bash
# The same run on every worker of a Cloud TPU VM pod slice. Each worker must have this checkout at
# $REPO with .venv built against jax[tpu] (README, "Installing on GPU / TPU"); the workdir should be
# shared storage (e.g. gs://...).
#   TPU_NAME=my-v5p-64 ZONE=us-east5-a launch/tpu_pod.sh configs/alfworld.py:model=qwen2.5-7b \
#       gs://bucket/runs/sdar --config.model.path=/mnt/models/Qwen2.5-7B-Instruct
# --distributed makes every process call jax.distributed.initialize() before building the mesh.
# Limitation: the host loop does not yet split the env batch across hosts (every process plays
# the whole batch); see README, "Status and limits".
set -euo pipefail
: "${TPU_NAME:?set TPU_NAME}" "${ZONE:?set ZONE}"
REPO=${REPO:-~/sdar-jax}
config=${1:?usage: launch/tpu_pod.sh CONFIG[:ARG] WORKDIR [--config.key=value ...]}
workdir=${2:?usage: launch/tpu_pod.sh CONFIG[:ARG] WORKDIR [--config.key=value ...]}
shift 2
extra=$(printf ' %q' "$@")
gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" --worker=all --command \
  "cd $REPO && .venv/bin/python -m sdar_jax.train --distributed --config=$config --workdir=$workdir$extra"
