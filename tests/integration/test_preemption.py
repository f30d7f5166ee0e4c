"""A real run, played as an experiment driver's step, stopped by a real SIGTERM sent to the
driver's whole process group (the driver, the trainer and its env worker, as a scheduler or
`kill -TERM -- -PGID` does), then run again; and a latest checkpoint with a truncated data file,
which the run sets aside to resume from the one before it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO

TOTAL = 4
CONFIG = """
from tests.helpers import tiny_run_config


def get_config():
  return tiny_run_config({total}, algo="grpo", **{{
    "env.num_workers": 1,  # a real env worker process, which gets the signal too
    "train.eval_before_train": False,
    "train.eval_every": 0,
    "logging.every": 1,
    "checkpoint.every": 100,  # only what the stop saves (and the end)
    "checkpoint.keep": 5,
  }})
"""


# An experiment driver (experiments.driver) playing two steps: the training, then one that
# must not start once the driver has been stopped.
DRIVER = """
import sys
from experiments import driver
driver.AUTOGROUP = "/dev/null"  # the test's own session keeps its priority
train = driver.Step("train", "grpo", 1e-3, 0, sys.argv[1], tuple(sys.argv[3:]))
then = driver.Step("train", "grpo", 1e-3, 1, sys.argv[2], ("true",))
sys.exit(driver.run_command(lambda: driver.play(lambda: [train, then])))
"""


def _train(tmp_path, workdir: str, total: int, through: str | None = None) -> subprocess.Popen:
  """The training of `total` iterations into `workdir`; `through`: played as the first step of a
  driver whose second step's folder is `through`."""
  config = tmp_path / f"config_{total}.py"
  config.write_text(CONFIG.format(total=total))
  cmd = [sys.executable, "-m", "sdar_jax.train", f"--config={config}", f"--workdir={workdir}"]
  if through is not None:
    cmd = [sys.executable, "-c", DRIVER, workdir, through, *cmd]
  return subprocess.Popen(
    cmd,
    cwd=REPO,
    env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=REPO),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    start_new_session=True,  # its own process group, signalled as a whole
  )


def _rows(workdir: str) -> list[int]:
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line)["step"] for line in f if line.strip()]


def _steps(workdir: str) -> list[int]:
  folder = os.path.join(workdir, "checkpoints")
  return sorted(int(d) for d in os.listdir(folder) if d.isdigit()) if os.path.isdir(folder) else []


@pytest.mark.slow
def test_sigterm_saves_the_last_iteration_and_a_rerun_resumes_without_duplicates(tmp_path):
  workdir, then = str(tmp_path / "run"), tmp_path / "then"
  proc = _train(tmp_path, workdir, TOTAL, through=str(then))
  log = os.path.join(workdir, "train.log")  # the step's output, as the driver keeps it
  deadline = time.time() + 240
  while not _rows(workdir) and proc.poll() is None and time.time() < deadline:
    time.sleep(0.2)  # until iteration 1 is logged
  assert proc.poll() is None, proc.communicate()[1][-3000:]
  os.killpg(proc.pid, signal.SIGTERM)
  out, driver_err = proc.communicate(timeout=120)
  with open(log) as f:
    err = f.read()
  # the driver waited for the trainer's save, then stopped without starting its next step
  assert proc.returncode == 128 + signal.SIGTERM, (driver_err + err)[-3000:]
  assert "stopped by SIGTERM (exit code 143)" in out, out
  assert not then.exists()
  assert "Traceback" not in err + driver_err, (driver_err + err)[-3000:]
  (saved,) = _steps(workdir)
  assert 1 <= saved < TOTAL
  assert (
    f"stopped by SIGTERM after {saved} of {TOTAL} iterations: iteration {saved} is saved" in err
  )
  assert _rows(workdir) == list(range(1, saved + 1))  # every finished iteration, none after

  # A newer checkpoint whose largest data file is cut in half (a copy of the saved one, so its
  # files are real): the rerun names it, sets it aside and resumes from the saved one.
  ckpts = os.path.join(workdir, "checkpoints")
  broken = os.path.join(ckpts, str(saved + 1))
  shutil.copytree(os.path.join(ckpts, str(saved)), broken)
  files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(broken, "state")) for f in fs]
  big = max(files, key=os.path.getsize)
  with open(big, "r+b") as f:
    f.truncate(os.path.getsize(big) // 2)
  again = _train(tmp_path, workdir, TOTAL)
  out, err = again.communicate(timeout=300)
  assert again.returncode == 0, err[-3000:]
  assert f"checkpoint {ckpts}/{saved + 1} cannot be read (" in err, err[-3000:]
  assert f"moved aside to {ckpts}.unreadable/{saved + 1}" in err
  assert os.path.isdir(f"{ckpts}.unreadable/{saved + 1}")
  assert f"resumed from {ckpts} at iteration {saved}" in err
  assert _rows(workdir) == list(range(1, TOTAL + 1))  # no iteration lost, none logged twice
  assert _steps(workdir) == sorted({saved, TOTAL})


def test_an_unreadable_latest_checkpoint_is_set_aside_and_the_one_before_restored(tmp_path):
  """Real checkpoint files (steps 1 and 2 of a tiny state); step 2's largest data file cut in
  half: the resume names it, moves it to checkpoints.unreadable/2 and restores step 1; with
  step 1 cut too, one message names both."""
  import jax

  from sdar_jax.core.sharding import make_mesh
  from sdar_jax.core.train_state import create_train_state, make_optimizer
  from sdar_jax.models import ModelConfig, init_params
  from sdar_jax.run.checkpoint import (
    CheckpointManager,
    CheckpointUnreadableError,
    abstract_train_state,
    unreadable_reason,
  )

  config = ModelConfig.tiny(vocab_size=256, num_layers=1)
  mesh = make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
  optimizer = make_optimizer(lr=1e-3)
  state = create_train_state(init_params(config, jax.random.key(0)), optimizer)
  folder = str(tmp_path / "checkpoints")
  with CheckpointManager(folder, keep=5) as ckpt:
    ckpt.save(1, state, config, force=True)
    ckpt.save(2, state, config, force=True)

  def cut(step):
    files = [os.path.join(r, f) for r, _, fs in os.walk(f"{folder}/{step}/state") for f in fs]
    big = max(files, key=os.path.getsize)
    with open(big, "r+b") as f:
      f.truncate(os.path.getsize(big) // 2)

  target = abstract_train_state(config, optimizer, mesh)
  cut(2)
  with CheckpointManager(folder, keep=5) as ckpt:
    with pytest.raises(Exception) as info:
      ckpt.restore(2, target=target, model_config=config)
    assert "OUT_OF_RANGE" in unreadable_reason(info.value) or "Truncated" in unreadable_reason(
      info.value
    )
    assert ckpt.set_aside(2) == f"{folder}.unreadable/2" and ckpt.all_steps() == [1]
    restored, _ = ckpt.restore(1, target=target, model_config=config)
  assert os.path.isdir(f"{folder}.unreadable/2")  # kept, not deleted
  # a checkpoint of another model is not "unreadable": that error keeps its own message
  other = ModelConfig.tiny(vocab_size=128, num_layers=1)
  with CheckpointManager(folder, keep=5) as ckpt:
    with pytest.raises(ValueError) as info:
      ckpt.restore(1, target=abstract_train_state(other, optimizer, mesh), model_config=other)
    assert unreadable_reason(info.value) is None
  assert CheckpointUnreadableError.heading == "Unreadable checkpoint"
