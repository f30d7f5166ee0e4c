#!/usr/bin/env bash
# The same run on every worker of a Cloud TPU VM pod slice: create the slice or reuse it, install
# this checkout on every worker, run the training command on all of them (their output streams
# here, and into $REPO/tpu_run.log on each worker), and after a preemption recreate the slice and
# run again: the run resumes from its latest checkpoint in WORKDIR, which must be shared storage
# (gs://...).
#
#   TPU_NAME=my-v5p-64 ZONE=us-east5-a launch/tpu_pod.sh configs/alfworld.py:model=qwen2.5-7b \
#       gs://bucket/runs/sdar --config.model.path=/mnt/models/Qwen2.5-7B-Instruct
#   TPU_NAME=... ZONE=... ACCELERATOR=v5p-64 SPOT=1 launch/tpu_pod.sh --install CONFIG WORKDIR
#   TPU_NAME=... ZONE=... launch/tpu_pod.sh --dry-run CONFIG WORKDIR [...]   # print, run nothing
#
# Environment: TPU_NAME and ZONE (required); ACCELERATOR (e.g. v5p-64, v5litepod-16, v6e-8: create
# the slice when it does not exist and recreate it after a preemption; without it the slice must
# exist); RUNTIME_VERSION (default: the TPU VM image for ACCELERATOR); SPOT=1 (a spot slice);
# PROJECT; REPO (the checkout on the workers, default ~/sdar-jax); RETRIES (how many times to
# recreate the slice and rerun after a preemption, default 3).
# --install copies this checkout (tracked and untracked, not ignored files) to every worker and
# builds .venv there with jax[tpu] (README, "Installing on GPU / TPU"); a created slice is always
# installed. Every process calls jax.distributed.initialize() (train --distributed), which finds
# the slice's workers from the TPU metadata by itself.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: TPU_NAME=... ZONE=... launch/tpu_pod.sh [--dry-run] [--install] CONFIG[:ARG] WORKDIR [--config.key=value ...]"
dry_run=0
install=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry_run=1; shift ;;
    --install) install=1; shift ;;
    --help|-h) echo "$usage"; exit 0 ;;
    *) break ;;
  esac
done
: "${TPU_NAME:?set TPU_NAME, the name of the slice}" "${ZONE:?set ZONE (e.g. us-east5-a)}"
REPO=${REPO:-'~/sdar-jax'}
RETRIES=${RETRIES:-3}
ACCELERATOR=${ACCELERATOR:-}
config=${1:?$usage}
workdir=${2:?$usage}
shift 2

if [[ -z "${RUNTIME_VERSION:-}" ]]; then
  case "$ACCELERATOR" in
    v5p-*) RUNTIME_VERSION=v2-alpha-tpuv5 ;;
    v5litepod-*|v5e-*) RUNTIME_VERSION=v2-alpha-tpuv5-lite ;;
    v6e-*) RUNTIME_VERSION=v2-alpha-tpuv6e ;;
    *) RUNTIME_VERSION=tpu-ubuntu2204-base ;;
  esac
fi
tpu=(gcloud compute tpus tpu-vm)
where=(--zone="$ZONE")
if [[ -n "${PROJECT:-}" ]]; then
  where+=(--project="$PROJECT")
fi

run() {  # prints the command (arguments that need it single-quoted); runs it unless --dry-run
  printf '+'
  local arg
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
      printf ' %s' "$arg"
    else
      printf ' %s' "${arg@Q}"
    fi
  done
  printf '\n'
  if [[ $dry_run == 0 ]]; then
    "$@"
  fi
}

slice_state() {  # READY, PREEMPTED, ... or empty when there is no such slice
  if [[ $dry_run == 1 ]]; then
    return 0
  fi
  "${tpu[@]}" describe "$TPU_NAME" "${where[@]}" --format='value(state)' 2>/dev/null || true
}

on_workers() {  # the same shell command on every worker
  run "${tpu[@]}" ssh "$TPU_NAME" "${where[@]}" --worker=all --command "$1"
}

create_slice() {
  if [[ -z "$ACCELERATOR" ]]; then
    echo "launch/tpu_pod.sh: no usable slice $TPU_NAME in $ZONE. Fix: create it, or set" \
      "ACCELERATOR (e.g. v5p-64) so that this script creates it." >&2
    exit 2
  fi
  local spot=()
  if [[ "${SPOT:-0}" == 1 ]]; then
    spot=(--spot)
  fi
  run "${tpu[@]}" create "$TPU_NAME" "${where[@]}" --accelerator-type="$ACCELERATOR" \
    --version="$RUNTIME_VERSION" "${spot[@]}"
}

install_checkout() {
  local tarball=/tmp/sdar-jax-$TPU_NAME.tgz
  printf '+ git ls-files -z --cached --others --exclude-standard | tar czf %q --null -T -\n' \
    "$tarball"
  if [[ $dry_run == 0 ]]; then
    git ls-files -z --cached --others --exclude-standard |
      tar czf "$tarball" --null --ignore-failed-read -T -
  fi
  run "${tpu[@]}" scp "$tarball" "$TPU_NAME:/tmp/sdar-jax.tgz" "${where[@]}" --worker=all
  on_workers "set -e; mkdir -p $REPO && tar xzf /tmp/sdar-jax.tgz -C $REPO && cd $REPO && \
(command -v python3.11 >/dev/null || (sudo apt-get update -q && sudo apt-get install -y -q \
python3.11 python3.11-venv)) && python3.11 -m venv .venv && .venv/bin/pip install -q -U pip && \
.venv/bin/pip install -q -r requirements.txt 'jax[tpu]==0.10.2' \
'gcsfs==2026.10.1' 'google-cloud-storage==3.17.1' && .venv/bin/pip install -q --no-deps -e ."
}

train="cd $REPO && set -o pipefail && .venv/bin/python -m sdar_jax.train --distributed"
train+=" --config=$(printf %q "$config") --workdir=$(printf %q "$workdir")"
if [[ $# -gt 0 ]]; then
  train+="$(printf ' %q' "$@")"
fi
train+=" 2>&1 | tee -a tpu_run.log"

state=$(slice_state)
if [[ $dry_run == 1 ]]; then
  echo "# dry run: the slice's state is not queried. Were $TPU_NAME absent (and ACCELERATOR set):"
  if [[ -n "$ACCELERATOR" ]]; then
    create_slice
    install_checkout
  else
    echo "#   (ACCELERATOR is unset: the slice must exist)"
  fi
  if [[ $install == 1 ]]; then
    echo "# --install on an existing slice:"
    install_checkout
  fi
  echo "# the run, on every worker:"
  on_workers "$train"
  echo "# after a preemption (state PREEMPTED or the slice gone; ACCELERATOR set): delete, create,"
  echo "# install and run again, up to RETRIES=$RETRIES times:"
  run "${tpu[@]}" delete "$TPU_NAME" "${where[@]}" --quiet
  exit 0
fi

case "$state" in
  READY)
    if [[ $install == 1 ]]; then
      install_checkout
    fi
    ;;
  "")
    create_slice
    install_checkout
    ;;
  PREEMPTED|TERMINATED|STOPPED)
    echo "launch/tpu_pod.sh: slice $TPU_NAME is $state; recreating it." >&2
    run "${tpu[@]}" delete "$TPU_NAME" "${where[@]}" --quiet
    create_slice
    install_checkout
    ;;
  *)
    echo "launch/tpu_pod.sh: slice $TPU_NAME is $state. Fix: wait until it is READY, then rerun." >&2
    exit 2
    ;;
esac

attempt=0
until on_workers "$train"; do
  state=$(slice_state)
  if [[ "$state" == READY ]]; then
    echo "launch/tpu_pod.sh: the run failed on a READY slice (not a preemption); see" \
      "$REPO/tpu_run.log on the workers." >&2
    exit 1
  fi
  if [[ -z "$ACCELERATOR" || $attempt -ge $RETRIES ]]; then
    echo "launch/tpu_pod.sh: slice $TPU_NAME is '${state:-gone}' after $attempt recreation(s)." \
      "Fix: set ACCELERATOR to let this script recreate it, or raise RETRIES." >&2
    exit 1
  fi
  attempt=$((attempt + 1))
  echo "launch/tpu_pod.sh: slice $TPU_NAME is '${state:-gone}' (preempted): recreating it and" \
    "resuming from the latest checkpoint (attempt $attempt of $RETRIES)." >&2
  if [[ -n "$state" ]]; then
    run "${tpu[@]}" delete "$TPU_NAME" "${where[@]}" --quiet
  fi
  create_slice
  install_checkout
done
