"""The launchers' dry runs (launch/gpu.sh, launch/tpu_pod.sh: what they would run, run through
bash) and launch/sweep.py's one-job-per-run output for SLURM and TPU pods."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "launch"))
import sweep  # noqa: E402  (launch/sweep.py, on the path just above)

SLURM = {"SLURM_NNODES": "2", "SLURM_GPUS_ON_NODE": "4"}
TPU = {"TPU_NAME": "pod", "ZONE": "us-east5-a"}
CLEAN = (
  "SLURM_JOB_ID",
  "SLURM_NNODES",
  "SLURM_GPUS_ON_NODE",
  "GPUS_PER_NODE",
  "XLA_FLAGS",
  "PYTHON",
)
CLEAN += ("TPU_NAME", "ZONE", "ACCELERATOR", "SPOT", "PROJECT", "REPO", "RETRIES")


def _bash(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
  base = {k: v for k, v in os.environ.items() if k not in CLEAN}
  return subprocess.run(
    ["bash", os.path.join("launch", script), *args],
    cwd=REPO,
    env={**base, **env},
    capture_output=True,
    text=True,
    timeout=60,
    check=False,
  )


def _command(line: str) -> list[str]:
  """The words of a printed command line, environment assignments dropped."""
  words = shlex.split(line)
  return [w for w in words if not (w.split("=", 1)[0].isupper() and "=" in w)]


# ----------------------------------------------------------------------------------- gpu.sh
def test_gpu_dry_run_prints_the_one_host_command_of_the_existing_usage():
  proc = _bash("gpu.sh", "--dry-run", "configs/alfworld.py:algo=sdar", "runs/x", "--config.a=1 2")
  assert proc.returncode == 0, proc.stderr
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION='0.9'" in proc.stdout
  assert "XLA_FLAGS='--xla_gpu_enable_latency_hiding_scheduler=true'" in proc.stdout
  assert _command(proc.stdout) == [
    ".venv/bin/python",
    "-m",
    "sdar_jax.train",
    "--config=configs/alfworld.py:algo=sdar",
    "--workdir=runs/x",
    "--config.a=1 2",
  ]


def test_gpu_slurm_dry_run_gives_each_node_process_all_its_gpus():
  proc = _bash("gpu.sh", "--dry-run", "--slurm", "configs/alfworld.py", "/shared/r", **SLURM)
  assert proc.returncode == 0, proc.stderr
  assert "JAX_LOCAL_DEVICE_IDS='0,1,2,3'" in proc.stdout
  words = _command(proc.stdout)
  assert words[:4] == ["srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
  assert words[4:] == [
    ".venv/bin/python",
    "-m",
    "sdar_jax.train",
    "--config=configs/alfworld.py",
    "--workdir=/shared/r",
    "--distributed",
  ]
  proc = _bash("gpu.sh", "--dry-run", "--slurm", "c", "w", GPUS_PER_NODE="2", **SLURM)
  assert "JAX_LOCAL_DEVICE_IDS='0,1'" in proc.stdout  # GPUS_PER_NODE wins over SLURM's count


def test_gpu_slurm_outside_an_allocation_is_refused_with_the_fix():
  proc = _bash("gpu.sh", "--slurm", "configs/alfworld.py", "runs/x")
  assert proc.returncode == 2
  assert "SLURM_JOB_ID is unset" in proc.stderr and "Fix:" in proc.stderr


def test_gpu_dry_run_command_is_a_valid_training_command():
  # The printed command, run with the trainer's own --dry_run: it validates and exits.
  proc = _bash("gpu.sh", "--dry-run", "configs/default.py", "runs/launcher-check", "--dry_run")
  assert proc.returncode == 0, proc.stderr
  run = subprocess.run(
    ["bash", "-c", proc.stdout],
    cwd=REPO,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert "train state:" in run.stdout + run.stderr
  assert not os.path.exists(os.path.join(REPO, "runs/launcher-check"))  # a dry run writes nothing


# ------------------------------------------------------------------------------- tpu_pod.sh
def _lines(proc) -> list[str]:
  return [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")]


def test_tpu_dry_run_of_the_existing_usage_runs_train_on_every_worker():
  proc = _bash(
    "tpu_pod.sh", "--dry-run", "configs/alfworld.py", "gs://b/r", "--config.x=a b", **TPU
  )
  assert proc.returncode == 0, proc.stderr
  lines = _lines(proc)
  assert not any(" create " in line for line in lines)  # no ACCELERATOR: the slice must exist
  ssh = shlex.split(lines[0])
  assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod"]
  assert "--zone=us-east5-a" in ssh and "--worker=all" in ssh
  remote = ssh[ssh.index("--command") + 1]
  assert remote.startswith("cd ~/sdar-jax && set -o pipefail && ")
  train, _, log = remote.split(" && ")[-1].partition(" 2>&1 | ")
  assert shlex.split(train) == [
    ".venv/bin/python",
    "-m",
    "sdar_jax.train",
    "--distributed",
    "--config=configs/alfworld.py",
    "--workdir=gs://b/r",
    "--config.x=a b",
  ]
  assert log == "tee -a tpu_run.log"
  assert lines[-1] == "gcloud compute tpus tpu-vm delete pod --zone=us-east5-a --quiet"


def test_tpu_dry_run_creates_installs_and_recovers_with_an_accelerator():
  env = dict(TPU, ACCELERATOR="v5litepod-16", SPOT="1", PROJECT="proj")
  proc = _bash("tpu_pod.sh", "--dry-run", "configs/alfworld.py", "gs://b/r", **env)
  assert proc.returncode == 0, proc.stderr
  lines = _lines(proc)
  assert lines[0] == (
    "gcloud compute tpus tpu-vm create pod --zone=us-east5-a --project=proj "
    "--accelerator-type=v5litepod-16 --version=v2-alpha-tpuv5-lite --spot"
  )
  assert lines[1].startswith("git ls-files -z --cached --others --exclude-standard | tar czf ")
  assert " scp /tmp/sdar-jax-pod.tgz pod:/tmp/sdar-jax.tgz " in lines[2]
  install = shlex.split(lines[3])[-1]
  assert "python3.11 -m venv .venv" in install and "'jax[tpu]==0.10.2'" in install
  assert "--distributed" in lines[4]
  assert "up to RETRIES=3 times" in proc.stdout


def test_tpu_without_a_slice_name_is_refused():
  proc = _bash("tpu_pod.sh", "--dry-run", "c", "w", ZONE="z")
  assert proc.returncode != 0 and "set TPU_NAME" in proc.stderr


# --------------------------------------------------------------------------------- sweep.py
def _sweep_commands():
  return sweep.commands(
    "configs/alfworld.py:local=True", "runs/sw", ["algo.gate=gap", "algo.beta=2.5"], False, []
  )


def test_sweep_runs_each_distinct_setting_once():
  """The gate grid: no two runs are the same run. The constant gate ignores β, so it runs once
  per λ and its command sets no β; keys a setting makes inert are dropped, repeats run once."""
  cmds = sweep.commands("configs/alfworld.py:local=True", "runs/sw", [], False, [])
  runs = []
  for cmd in cmds:
    over = dict(a[len("--config.") :].split("=", 1) for a in cmd if a.startswith("--config."))
    if over["algo.gate"] == "constant":
      assert "algo.beta" not in over
    runs.append(tuple(sorted(over.items())))
  assert len(set(runs)) == len(runs) == 3 * 4 * 3 + 3  # 3 β-gates x 4 β x 3 λ, constant x 3 λ
  assert len({sweep.workdir_of(c) for c in cmds}) == len(cmds)
  points = [
    {"algo.gate": "constant", "algo.beta": 1.0},
    {"algo.gate": "constant", "algo.beta": 2.0},
    {"algo.lam": 0.0, "algo.gate": "gap", "algo.beta": 1.0},
    {"algo.lam": 0.0, "algo.gate": "entropy", "algo.beta": 5.0},
    {"algo.distill": "none", "algo.form": "reverse_kl"},
    {"algo.gate": "gap", "algo.beta": 1.0},
  ]
  assert sweep.distinct_points(points) == [
    {"algo.gate": "constant"},
    {"algo.lam": 0.0},
    {"algo.distill": "none"},
    {"algo.gate": "gap", "algo.beta": 1.0},
  ]


def test_sweep_emits_one_slurm_job_per_run_that_launches_the_same_training():
  cmds = _sweep_commands()
  assert len(cmds) == 3
  lines = sweep.emit_jobs(cmds, "slurm", "--nodes=2 --gpus-per-node=4")
  assert len(lines) == 3
  for i, (cmd, line) in enumerate(zip(cmds, lines)):
    mkdir, _, submit = line.partition(" && ")
    workdir = sweep.workdir_of(cmd)
    assert shlex.split(mkdir) == ["mkdir", "-p", workdir]
    words = shlex.split(submit)
    assert words[:5] == [
      "sbatch",
      f"--job-name=sdar-{i}",
      f"--output={workdir}/slurm-%j.log",
      "--nodes=2",
      "--gpus-per-node=4",
    ]
    wrapped = shlex.split(words[5].removeprefix("--wrap="))
    # What that job runs (gpu.sh's dry run): the sweep's own training command, distributed.
    proc = _bash("gpu.sh", "--dry-run", *wrapped[1:], **SLURM)
    assert proc.returncode == 0, proc.stderr
    srun_train = _command(proc.stdout)[4:]
    assert srun_train[1:] == [*cmd[1:3], *_as_launched(cmd[3:])]


def _as_launched(train_args: list[str]) -> list[str]:
  """A sweep command's trainer arguments as `gpu.sh --slurm` passes them: config, workdir,
  --distributed, then the overrides."""
  head = [a for a in train_args if a.startswith("--config=")]
  head += [a for a in train_args if a.startswith("--workdir=")]
  rest = [a for a in train_args if not a.startswith(("--config=", "--workdir="))]
  return [*head, "--distributed", *rest]


def test_sweep_emits_one_tpu_pod_launch_per_run():
  cmds = _sweep_commands()
  lines = sweep.emit_jobs(cmds, "tpu")
  for i, (cmd, line) in enumerate(zip(cmds, lines)):
    words = shlex.split(line)
    assert words[0] == f"TPU_NAME=$TPU_NAME-r{i}"
    config, workdir, *rest = [a for a in _as_launched(cmd[3:]) if a != "--distributed"]
    assert words[1:] == [
      "launch/tpu_pod.sh",
      config.removeprefix("--config="),
      workdir.removeprefix("--workdir="),
      *rest,
    ]


def test_sweep_refuses_emit_with_run():
  with pytest.raises(SystemExit, match="--emit prints jobs"):
    sweep.main(["--config=configs/alfworld.py:local=True", "--emit=slurm", "--run"])


def test_sweep_rows_keep_the_config_argument_and_refuse_one_the_rows_set():
  """--rows runs one job per paper-table row; a config argument the rows leave open (local=True)
  goes into every row's --config, one they set (model=...) is refused with the --only fix."""
  cmds = sweep.commands("configs/paper.py:local=True", "runs/p", ["env=alfworld"], True, [])
  configs = [a for cmd in cmds for a in cmd if a.startswith("--config=")]
  assert configs and all(c.endswith(",local=True") for c in configs)
  assert "--config=configs/paper.py:row=sdar,model=qwen2.5-3b,env=alfworld,local=True" in configs
  with pytest.raises(SystemExit, match=r"model is set by every table row. Fix: .*--only model="):
    sweep.commands("configs/paper.py:model=qwen3-1.7b", "runs/p", [], True, [])


# ------------------------------------------------------------------------------ interpreter
def test_launchers_take_the_users_python_else_venv_else_python3(tmp_path):
  """$PYTHON wins; a checkout without .venv (a cluster venv with the project installed) runs
  python3 from PATH; a PYTHON that does not exist is refused with the fix."""
  proc = _bash("gpu.sh", "--dry-run", "configs/default.py", "runs/x", PYTHON="python3")
  assert _command(proc.stdout)[0] == "python3"
  bare = tmp_path / "checkout"
  (bare / "launch").mkdir(parents=True)
  for name in ("gpu.sh", "local.sh", "python.sh"):
    shutil.copy(os.path.join(REPO, "launch", name), bare / "launch" / name)
  proc = subprocess.run(
    ["bash", str(bare / "launch/local.sh"), "-n", "2", "--dry-run", "--", "--dry_run"],
    capture_output=True, text=True, check=False, env={**os.environ, "PYTHON": ""},
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr
  assert all(line.startswith("python3 -m sdar_jax.train") for line in proc.stdout.splitlines()[1:])
  proc = _bash("gpu.sh", "--dry-run", "configs/default.py", "runs/x", PYTHON="/no/python")
  assert proc.returncode == 2 and "Fix: set PYTHON=" in proc.stderr


def test_a_local_coordinator_listens_on_the_loopback_address_only():
  from sdar_jax.infra.multihost import loopback_bind_address

  assert loopback_bind_address("localhost:1234") == "127.0.0.1:1234"
  assert loopback_bind_address("127.0.0.1:99") == "127.0.0.1:99"
  assert loopback_bind_address("[::1]:99") == "[::1]:99"
  assert loopback_bind_address("10.0.0.2:1234") is None and loopback_bind_address(None) is None
