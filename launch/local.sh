#!/usr/bin/env bash
# One training run on this machine (CPU, or the local GPUs/TPU that jax sees).
#   launch/local.sh configs/alfworld.py:model=qwen2.5-3b,algo=sdar runs/sdar \
#       --config.model.path=/data/Qwen2.5-3B-Instruct --config.env.data_dir=/data/alfworld
#
# Several processes on this machine, as the hosts of a pod would run (JAX's multi-controller
# runtime on CPU, gloo collectives, a coordinator on a free port of the loopback address):
#   launch/local.sh -n 2 [-d 4] [--dry-run] -- --config=configs/default.py --workdir=runs/mh
# starts N processes of `python -m sdar_jax.train <train args> --distributed
# --coordinator_address=localhost:PORT --num_processes=N --process_id=I` with JAX_PLATFORMS=cpu
# (unless set) and, with -d D, D CPU devices each (XLA_FLAGS). Each plays its share of every
# iteration's tasks (sdar_jax.infra.multihost); process 0 writes metrics, plots and exports, all of
# them the checkpoints. Output lines are prefixed "[process I]"; when one process fails the
# others are stopped and the script exits with its status. --dry-run prints the commands.
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/python.sh  # PY: $PYTHON, else .venv/bin/python, else python3
if [[ "${1:-}" == -n || "${1:-}" == --dry-run ]]; then
  usage="usage: launch/local.sh -n N [-d DEVICES_PER_PROCESS] [--dry-run] -- <train args>"
  processes=""
  devices=""
  dry_run=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      -n) processes=${2:?$usage}; shift 2 ;;
      -d) devices=${2:?$usage}; shift 2 ;;
      --dry-run) dry_run=1; shift ;;
      --) shift; break ;;
      *) echo "$usage" >&2; exit 2 ;;
    esac
  done
  if ! [[ "$processes" =~ ^[1-9][0-9]*$ ]]; then
    echo "launch/local.sh: -n '$processes' is not a number of processes >= 1. $usage" >&2
    exit 2
  fi
  if [[ -n "$devices" ]] && ! [[ "$devices" =~ ^[1-9][0-9]*$ ]]; then
    echo "launch/local.sh: -d '$devices' is not a number of devices >= 1. $usage" >&2
    exit 2
  fi
  export JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}
  if [[ -n "$devices" ]]; then
    export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_force_host_platform_device_count=$devices"
  fi
  free_port='import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])'
  port=$("$PY" -c "$free_port")
  commands=()
  for ((i = 0; i < processes; i++)); do
    commands+=("$(printf '%q ' "$PY" -m sdar_jax.train "$@" --distributed \
      --coordinator_address="localhost:$port" --num_processes="$processes" --process_id="$i")")
  done
  if [[ $dry_run == 1 ]]; then
    echo "JAX_PLATFORMS=$JAX_PLATFORMS XLA_FLAGS=${XLA_FLAGS:-}"
    printf '%s\n' "${commands[@]}"
    exit 0
  fi
  set -m  # each process (with its prefixing sed) in its own process group, to stop it whole
  pids=()
  for ((i = 0; i < processes; i++)); do
    (
      set +e -o pipefail
      eval "${commands[$i]}" 2>&1 | sed -u "s/^/[process $i] /"
    ) &
    pids+=($!)
  done
  stop_all() {
    for pid in "${pids[@]}"; do
      kill -TERM -- "-$pid" 2>/dev/null || true
    done
  }
  trap 'stop_all; exit 130' INT TERM
  status=0
  for ((left = processes; left > 0; left--)); do
    code=0
    wait -n || code=$?
    if [[ $code != 0 && $status == 0 ]]; then
      status=$code
      echo "launch/local.sh: a process exited with status $code; stopping the others" >&2
      stop_all
    fi
  done
  exit "$status"
fi
config=${1:?usage: launch/local.sh CONFIG[:ARG] WORKDIR [--config.key=value ...]}
workdir=${2:?usage: launch/local.sh CONFIG[:ARG] WORKDIR [--config.key=value ...]}
shift 2
exec "$PY" -m sdar_jax.train --config="$config" --workdir="$workdir" "$@"
