#!/usr/bin/env bash
# One run on the GPUs of this host, or on every node of a SLURM allocation.
#
#   launch/gpu.sh CONFIG[:ARG] WORKDIR [--config.key=value ...]            # this host's GPUs
#   launch/gpu.sh --slurm CONFIG[:ARG] WORKDIR [--config.key=value ...]    # inside sbatch / salloc
#   launch/gpu.sh --dry-run [--slurm] CONFIG[:ARG] WORKDIR [...]           # print, run nothing
#
# jax must be the CUDA build (once per venv): .venv/bin/pip install "jax[cuda12]==0.10.2"; the
# interpreter is $PYTHON, else .venv/bin/python, else python3 (launch/python.sh). Without a GPU
# the run starts anyway, after a warning naming the devices jax found.
# The mesh comes from the config (default: every device on the data axis); e.g. for 8 GPUs with
# 2-way tensor parallelism: --config.mesh.data=4 --config.mesh.tensor=2.
#
# --slurm: one process per node (srun --ntasks-per-node=1), each owning all its node's GPUs,
# all calling jax.distributed.initialize() (train --distributed). JAX reads the allocation from
# SLURM's variables: SLURM_JOB_ID (the coordinator port), SLURM_STEP_NODELIST (the coordinator is
# the first node), SLURM_NTASKS (processes), SLURM_PROCID (this process). This script sets
# JAX_LOCAL_DEVICE_IDS to all GPUs of the node (GPUS_PER_NODE, else SLURM_GPUS_ON_NODE, else
# nvidia-smi's count), since JAX would otherwise give each process only GPU SLURM_LOCALID. The
# workdir must be on storage every node sees. An sbatch script for 2 nodes of 8 GPUs:
#   #SBATCH --nodes=2 --ntasks-per-node=1 --gpus-per-node=8 --exclusive
#   launch/gpu.sh --slurm configs/alfworld.py:model=qwen2.5-7b,algo=sdar /shared/runs/sdar-7b \
#       --config.model.path=/shared/models/Qwen2.5-7B-Instruct
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: launch/gpu.sh [--dry-run] [--slurm] CONFIG[:ARG] WORKDIR [--config.key=value ...]"
dry_run=0
slurm=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry_run=1; shift ;;
    --slurm) slurm=1; shift ;;
    --help|-h) echo "$usage"; exit 0 ;;
    *) break ;;
  esac
done
config=${1:?$usage}
workdir=${2:?$usage}
shift 2
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_enable_latency_hiding_scheduler=true"
source launch/python.sh  # PY: $PYTHON, else .venv/bin/python, else python3
train=("$PY" -m sdar_jax.train --config="$config" --workdir="$workdir")

if [[ $slurm == 1 ]]; then
  if [[ $dry_run == 0 && -z "${SLURM_JOB_ID:-}" ]]; then
    echo "launch/gpu.sh --slurm: no SLURM allocation (SLURM_JOB_ID is unset). Fix: run it from" \
      "an sbatch script or an salloc shell, or drop --slurm for this host alone." >&2
    exit 2
  fi
  gpus=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-}}
  if [[ -z "$gpus" ]]; then
    gpus=$(nvidia-smi -L 2>/dev/null | wc -l || true)
  fi
  if [[ -z "$gpus" || "$gpus" == 0 ]]; then
    echo "launch/gpu.sh --slurm: cannot tell how many GPUs a node has. Fix: set GPUS_PER_NODE" \
      "(or request them with --gpus-per-node)." >&2
    exit 2
  fi
  JAX_LOCAL_DEVICE_IDS=$(seq -s, 0 $((gpus - 1)))
  export JAX_LOCAL_DEVICE_IDS
  cmd=(srun --nodes="${SLURM_NNODES:-1}" --ntasks-per-node=1 --kill-on-bad-exit=1
    "${train[@]}" --distributed "$@")
  shown_env=(XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS JAX_LOCAL_DEVICE_IDS)
else
  cmd=("${train[@]}" "$@")
  shown_env=(XLA_PYTHON_CLIENT_MEM_FRACTION XLA_FLAGS)
fi

if [[ $dry_run == 1 ]]; then
  for name in "${shown_env[@]}"; do
    printf '%s=%s ' "$name" "${!name@Q}"
  done
  printf '%q ' "${cmd[@]}"
  printf '\n'
  exit 0
fi
if [[ $slurm == 0 ]]; then  # this host: say so when jax finds no GPU (it would train on the CPU)
  found=$("$PY" -c 'import jax; print(jax.default_backend(), jax.devices())' 2>/dev/null || true)
  if [[ "$found" != gpu* ]]; then
    echo "launch/gpu.sh: warning: jax finds no GPU on this host (${found:-jax did not start});" \
      "the run uses what it found. Fix: install the CUDA build of jax into this venv (jax[cuda12])" \
      "or use launch/local.sh for a CPU run." >&2
  fi
fi
exec "${cmd[@]}"
