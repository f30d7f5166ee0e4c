"""Multi-process training (sdar_jax.infra.multihost): two processes of 4 CPU devices run the same
iterations as one process of 8 (the same episodes, metrics and updates), resume together from
their checkpoint, and launch/local.sh -n starts, labels and stops such processes.

The run (tests/multihost_run.py): SDAR on the dummy say-the-word env, a tiny random-weight model
on a (data 1, fsdp 8, tensor 1) mesh, so with two processes the parameters are sharded across
the processes and each holds half of every batch; 4 tasks x 2 episodes of up to 2 turns per
iteration (the two processes end up with different numbers of turn-samples), 2 mini-batches of
8, teacher log-probs scored at θ_old, validation at iteration 2.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.multihost_run import write_skills

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FP32_EPS = float(np.finfo(np.float32).eps)
VOCAB = 1664  # tests/multihost_run.py's model
MAX_RESPONSE_TOKENS = 16 * 8  # turn-samples per iteration x new tokens
LR = 1e-3
# Host-side numbers of the same episodes (counts, rates, lengths, schedules): equal exactly.
EXACT = ("episode/", "val/", "rollout/turn_samples", "rollout/generated_tokens", "train/tokens")
EXACT += ("train/skipped_update", "train/lr", "sdar/coef", "actor/pg_clipfrac")
# Timings and compile counts describe each process, not the run.
SKIP = ("perf/", "rollout/seconds", "train/update_seconds", "train/compilations")
SKIP += ("rollout/sampler_compilations",)
# The update's metrics are token-weighted means over at most MAX_RESPONSE_TOKENS response tokens
# of per-token terms no larger than ~ln V (log-probs and entropies of a near-uniform random model,
# their gaps, the gate in [0, 1]). Two placements of the same arrays sum them in a different
# order: at most (n - 1) eps max|term| apart, n = MAX_RESPONSE_TOKENS.
METRIC_TOL = MAX_RESPONSE_TOKENS * FP32_EPS * math.log(VOCAB)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _start(workdir, steps: int, skills: str, processes: int, devices: int, logs, *args) -> list:
  """`processes` processes of tests/multihost_run.py with `devices` CPU devices each; their
  compiled programs are kept in <logs>/compiled.<processes> for a later run of the same layout."""
  env = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
    "JAX_COMPILATION_CACHE_DIR": str(logs / f"compiled.{processes}"),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
  }
  command = [sys.executable, "-m", "tests.multihost_run", f"--workdir={workdir}"]
  command += [f"--steps={steps}", f"--skills_dir={skills}", *args]
  if processes > 1:
    command += [f"--coordinator_address=localhost:{_free_port()}", f"--num_processes={processes}"]
  started = []
  for i in range(processes):
    log = open(logs / f"{os.path.basename(workdir)}.{steps}.{i}.log", "w")  # noqa: SIM115 (_finish)
    which = [f"--process_id={i}"] if processes > 1 else []
    started.append(
      (subprocess.Popen(command + which, cwd=REPO, env=env, stdout=log, stderr=log), log)
    )
  return started


def _finish(started, timeout: float = 300) -> None:
  for proc, log in started:
    try:
      code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      proc.kill()
      code = "timeout"
    log.close()
    if code != 0:
      with open(log.name) as f:
        tail = f.read()[-4000:]
      for other, _ in started:
        other.kill()
      pytest.fail(f"{log.name}: exit {code}\n{tail}")


def _rows(workdir) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _params(workdir, step: int):
  """The parameters of checkpoint `step` on the host (any topology) and the update count."""
  from sdar_jax.models import ModelConfig
  from sdar_jax.run.checkpoint import CheckpointManager

  with CheckpointManager(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
    meta = ckpt.restore_meta(step)
    params, _ = ckpt.restore_params(ModelConfig(**meta["model_config"]), step=step)
  return params, meta


# Heavy (~80 s under make test): three training processes, two sharing one mesh and one reference,
# each compiling its own programs; nothing smaller shows two processes training as one.
@pytest.mark.slow
def test_two_processes_train_as_one_and_resume(tmp_path):
  import jax

  skills = write_skills(str(tmp_path / "skills"))
  one, two = tmp_path / "one", tmp_path / "two"
  runs = _start(two, 2, skills, 2, 4, tmp_path) + _start(one, 2, skills, 1, 8, tmp_path)
  _finish(runs)

  # The same logged rows: every process computed them from all processes' episodes and batches.
  rows_one, rows_two = _rows(one), _rows(two)
  assert [r["step"] for r in rows_two] == [r["step"] for r in rows_one] == [1, 2]
  for mine, theirs in zip(rows_two, rows_one):
    assert set(mine) == set(theirs)
    assert mine["rollout/turn_samples"] > 8  # two mini-batches per iteration
    assert mine["actor/pg_loss"] != 0  # rewards differ within groups: advantages are not 0
    for key, value in theirs.items():
      if key.startswith(SKIP):
        continue
      if key.startswith(EXACT):
        assert mine[key] == value, key
      else:
        assert abs(mine[key] - value) <= METRIC_TOL, (key, mine[key], value)
  assert "val/success_rate" in rows_two[-1]

  # The same updates. Adam divides each gradient coordinate by its own RMS, so a coordinate whose
  # gradient is within rounding of zero may move by up to a step (lr) in one run and not in the
  # other: at most 1 in 10^4 such coordinates, every other within 5% of a step (wrong or missing
  # samples move most coordinates by a whole step).
  params_two, meta_two = _params(two, 2)
  params_one, _ = _params(one, 2)
  diffs = np.concatenate(
    [
      np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).ravel()
      for a, b in zip(jax.tree.leaves(params_two), jax.tree.leaves(params_one))
    ]
  )
  assert np.mean(diffs > 0.05 * LR) <= 1e-4, np.sort(diffs)[-5:]
  assert meta_two["extra"]["loop"]["iteration"] == 2

  # Resume: both processes restore iteration 2 and train one more; the first rows stay as they were.
  _finish(_start(two, 3, skills, 2, 4, tmp_path, "--eval_every=0"))
  for i in range(2):
    with open(tmp_path / f"two.3.{i}.log") as f:
      assert "at iteration 2" in f.read()  # "resumed from <checkpoints> at iteration 2"
  rows = _rows(two)
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert rows[:2] == rows_two
  assert rows[2]["rollout/turn_samples"] > 0 and np.isfinite(rows[2]["train/loss"])
  params_three, meta_three = _params(two, 3)
  assert meta_three["extra"]["loop"]["iteration"] == 3
  moved = [
    np.abs(np.asarray(a) - np.asarray(b)).max()
    for a, b in zip(jax.tree.leaves(params_three), jax.tree.leaves(params_two))
  ]
  assert max(moved) > 0  # iteration 3 trained


# ------------------------------------------------------------------------------ pieces, one process
@pytest.mark.parametrize(
  "processes, groups, group_size", [(2, 4, 2), (3, 4, 2), (4, 2, 3), (1, 5, 8)]
)
def test_episode_shares_are_whole_groups_in_process_order(
  monkeypatch, processes, groups, group_size
):
  """The shares of all processes, in process order, are the episodes 0..n-1 once each; no group
  is split; the busiest share is max_share_size (a process may get none when groups < processes)."""
  import jax

  from sdar_jax.infra import multihost

  n = groups * group_size
  monkeypatch.setattr(jax, "process_count", lambda: processes)
  shares = []
  for p in range(processes):
    monkeypatch.setattr(jax, "process_index", lambda p=p: p)
    shares.append(list(range(n))[multihost.episode_share(n, group_size)])
  assert [e for share in shares for e in share] == list(range(n))
  for share in shares:
    assert len(share) % group_size == 0 and all(e % group_size == 0 for e in share[::group_size])
  assert max(len(share) for share in shares) == multihost.max_share_size(n, group_size)
  with pytest.raises(ValueError, match="whole groups of 3"):
    multihost.episode_share(7, 3)


def _sample(rng, group: int, with_teacher: bool):
  from sdar_jax.core.batch import TurnSample

  prompt = rng.integers(1, 50, int(rng.integers(1, 40))).tolist()
  response = rng.integers(1, 50, int(rng.integers(1, 30))).tolist()
  return TurnSample(
    prompt_ids=prompt,
    response_ids=response,
    logprobs=rng.normal(size=len(response)).tolist(),
    score=0.0,
    advantage=float(rng.normal()),
    group_id=group,
    policy_version=0,
    valid=True,
    teacher_prompt_ids=rng.integers(1, 50, 5).tolist() + prompt if with_teacher else None,
  )


@pytest.mark.parametrize("with_teacher", [True, False])
def test_a_mini_batch_gathered_from_a_wide_block_is_the_one_pack_batch_makes(with_teacher):
  """What several processes do with their samples, checked on one: samples packed at the widest
  lengths of the iteration (here 5 of them, in rows 3..7 of a 10-row block, the other rows empty)
  and gathered back by the jitted selection equal pack_batch's mini-batch of the same samples,
  array for array (a mini-batch of 4: 3 samples and a padding row)."""
  import jax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from sdar_jax.core.batch import new_tokens_bucket, prompt_bucket
  from sdar_jax.rollout import global_batches, pack_batch

  rng = np.random.default_rng(0)
  samples = [_sample(rng, k, with_teacher) for k in range(5)]
  samples[4].prompt_ids = samples[4].prompt_ids + list(range(1, 60))  # the widest prompt
  packed = pack_batch(samples, 5, with_teacher, pad_id=7)
  Ps, R = prompt_bucket(max(len(s.prompt_ids) for s in samples)), 64  # R wider than needed
  Pt = prompt_bucket(max(len(s.teacher_prompt_ids) for s in samples)) if with_teacher else 0
  wide = global_batches._widen(packed, 5, Ps, R, Pt, pad_id=7)
  block = jax.tree.map(
    lambda x: np.concatenate(
      [np.zeros((3,) + x.shape[1:], x.dtype), x, np.zeros((2,) + x.shape[1:], x.dtype)]
    ),
    wide,
  )
  chunk = samples[1:4]  # not the widest one: its own buckets are narrower than the block's
  index = np.asarray([4, 5, 6, -1], np.int32)  # block rows of samples 1..3, then padding
  ps = prompt_bucket(max(len(s.prompt_ids) for s in chunk))
  r = new_tokens_bucket(max(len(s.response_ids) for s in chunk))
  pt = prompt_bucket(max(len(s.teacher_prompt_ids) for s in chunk)) if with_teacher else 0
  assert ps < Ps and r < R
  one_device = NamedSharding(Mesh(np.asarray(jax.devices()[:1]), ("batch",)), PartitionSpec())
  got = global_batches._select_fn(one_device)(
    block, index, Ps_block=Ps, Ps=ps, R=r, Pt_block=Pt, Pt=pt, pad_id=7
  )
  want = pack_batch(chunk, 4, with_teacher, pad_id=7)
  for name in ("student_tokens", "student_mask", "response_mask", "old_logp", "advantages"):
    np.testing.assert_array_equal(np.asarray(getattr(got, name)), getattr(want, name), name)
  for name in ("teacher_tokens", "teacher_mask"):
    if with_teacher:
      np.testing.assert_array_equal(np.asarray(getattr(got, name)), getattr(want, name), name)
    else:
      assert getattr(got, name) is None


# ------------------------------------------------------------------------------ launch/local.sh
def _local_sh(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
  return subprocess.run(
    ["bash", "launch/local.sh", *args],
    cwd=REPO,
    env={k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "PYTHON")},
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )


def test_local_sh_dry_run_prints_one_command_per_process():
  proc = _local_sh(
    "-n", "2", "-d", "4", "--dry-run", "--", "--config=configs/default.py", "--a=1 2"
  )
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert lines[0] == "JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=4"
  port = lines[1].split("--coordinator_address=localhost:")[1].split()[0]
  # the launcher's rule (launch/python.sh; PYTHON is unset here): .venv's python, else python3
  python = (
    ".venv/bin/python" if os.access(os.path.join(REPO, ".venv/bin/python"), os.X_OK) else "python3"
  )
  for i, line in enumerate(lines[1:]):
    assert shlex.split(line) == [
      python,
      "-m",
      "sdar_jax.train",
      "--config=configs/default.py",
      "--a=1 2",
      "--distributed",
      f"--coordinator_address=localhost:{port}",
      "--num_processes=2",
      f"--process_id={i}",
    ]
  assert len(lines) == 3
  assert _local_sh("-n", "0", "--", "--dry_run").returncode == 2


@pytest.mark.slow
def test_local_sh_runs_processes_together_and_fails_when_one_fails():
  """Two real processes through the training command (a dry run: config, mesh over both
  processes' devices, the train state's size): each line labelled with its process."""
  proc = _local_sh("-n", "2", "-d", "2", "--", "--config=configs/default.py", "--dry_run")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  for i in range(2):
    assert f"[process {i}] mesh: {{'data': 4, 'fsdp': 1, 'tensor': 1}} over 4 device(s)" in (
      proc.stdout
    )
    assert f"[process {i}] dry run: config valid, nothing trained." in proc.stdout
  proc = _local_sh("-n", "2", "-d", "2", "--", "--config=configs/default.py", "--config.bad=1")
  assert proc.returncode != 0
  # Whichever process fails first is reported; local.sh then stops the other, which may not have
  # printed its own error yet.
  assert re.search(r"^\[process [01]\] Unknown config key\(s\)", proc.stdout, re.M), proc.stdout
