"""Weights & Biases logging (sdar_jax.observe.wandb_log) without a training run: the settings'
checks, the message when the package is missing (a Trainer and `python -m sdar_jax.train
--dry_run`), a row and a gate histogram read back from an offline run's file. The whole run,
its config and its resume are in test_trainer_run.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import (
  REPO,
  tiny_run_config,
  wandb_history,
  wandb_offline_env,
  wandb_offline_runs,
  wandb_run_record,
)

_FIX = "pip install -e '.[wandb]'"


def _logging(**settings):
  from configs.common import base

  config = base("tiny").logging
  config.update(settings)
  return config


def test_settings_checks_name_each_bad_key():
  from sdar_jax.observe.wandb_log import setting_problems

  assert setting_problems(_logging()) == []  # off: the names are not read
  assert setting_problems(_logging(wandb=True, wandb_tags="sdar," + "a" * 64)) == []
  bad = _logging(
    wandb=True,
    wandb_project="team/project",
    wandb_entity="",
    wandb_tags="ok,," + "b" * 65,
    wandb_mode="off",
  )
  problems = setting_problems(bad)
  assert [p.split("=", 1)[0] for p in problems] == [
    "logging.wandb_project",
    "logging.wandb_entity",
    "logging.wandb_tags",
    "logging.wandb_mode",
  ]
  assert all("Fix: " in p for p in problems)
  assert "['', '" + "b" * 65 + "']" in problems[2]
  assert "'online', 'offline', 'disabled'" in problems[3]
  (line,) = setting_problems({"wandb": "yes"})
  assert line.startswith("logging.wandb='yes': must be True or False")


def test_missing_package_stops_a_trainer_before_it_writes(tmp_path, monkeypatch):
  from sdar_jax.infra.errors import UserError
  from sdar_jax.observe.wandb_log import WandbNotInstalledError
  from sdar_jax.run import trainer

  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
  workdir = tmp_path / "run"
  with pytest.raises(WandbNotInstalledError) as e:
    trainer.Trainer(tiny_run_config(1, **{"logging.wandb": True}), str(workdir))
  assert isinstance(e.value, UserError)
  assert str(e.value).startswith("logging.wandb=True but the wandb package cannot be imported")
  assert _FIX in str(e.value) and "wandb==0.31.0" in str(e.value)
  assert "--config.logging.wandb=False" in str(e.value)
  assert not workdir.exists()  # refused before the lock, config.json or anything compiled


def test_missing_package_fails_the_dry_run_with_one_message(tmp_path):
  """`python -m sdar_jax.train --dry_run` with the package hidden: exit 2, the message alone on
  stderr (no traceback), nothing printed on stdout (it stops before the config is printed)."""
  hide = (
    "import runpy, sys; sys.modules['wandb'] = None; "
    "runpy.run_module('sdar_jax.train', run_name='__main__', alter_sys=True)"
  )
  args = [
    "--config=configs/alfworld.py:model=tiny,local=True",
    "--config.model.random_init=True",
    "--config.logging.wandb=True",
    "--dry_run",
  ]
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
  done = subprocess.run(
    [sys.executable, "-c", hide, *args], cwd=REPO, env=env, capture_output=True, text=True
  )
  assert done.returncode == 2, done.stderr
  assert done.stdout == ""
  (line,) = done.stderr.strip().splitlines()
  assert line.startswith("error: logging.wandb=True but the wandb package cannot be imported")
  assert _FIX in line


def test_offline_row_and_histogram_read_back(tmp_path, monkeypatch):
  from sdar_jax.observe.gate_histograms import Histogram
  from sdar_jax.observe.metrics import MetricsLogger
  from sdar_jax.observe.wandb_log import RUN_ID_FILE, WandbRun

  wandb_dir = wandb_offline_env(monkeypatch, tmp_path)
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  settings = _logging(wandb=True, wandb_project="p", wandb_name="n", wandb_tags="t1, t2")
  run = WandbRun.start(settings, {"algo": {"beta": 5.0}, "tags": [1, 2]}, workdir)
  logger = MetricsLogger(workdir, wandb_run=run)
  row = logger.log(3, {"train/loss": np.float32(0.25), "val/success_rate": 0.5, "skip": "x"})
  edges = np.linspace(-1.0, 1.0, 5)
  hist = Histogram("gate", edges, np.array([1, 0, 4, 2]), below=3, above=1)
  logger.log_histogram("diagnostics/gate", 3, **hist.tensorboard_fields())
  run.finish()
  run.finish()  # a second finish does nothing

  with open(os.path.join(workdir, RUN_ID_FILE)) as f:
    assert f.read().strip() == run.id
  (records,) = wandb_offline_runs(wandb_dir, run.id)
  meta = wandb_run_record(records)
  assert (meta.run_id, meta.project, meta.display_name) == (run.id, "p", "n")
  assert list(meta.tags) == ["t1", "t2"]
  config = {i.key: json.loads(i.value_json) for i in meta.config.update if i.key != "_wandb"}
  assert config == {"algo": {"beta": 5.0}, "tags": [1, 2]}
  rows = wandb_history(records)
  assert rows[0] == row == {"step": 3, "train/loss": 0.25, "val/success_rate": 0.5}
  # the in-range bins (the under- and over-range counts stay in histograms.jsonl)
  assert rows[1] == {
    "step": 3,
    "diagnostics/gate._type": "histogram",
    "diagnostics/gate.values": [1, 0, 4, 2],
    "diagnostics/gate.bins": [-1.0, -0.5, 0.0, 0.5, 1.0],
  }


def test_only_the_writing_process_logs_to_wandb(tmp_path):
  """A process that writes no files (not process 0) sends nothing to W&B either."""
  from sdar_jax.observe.metrics import MetricsLogger

  class Recorder:
    def __init__(self):
      self.calls = []

    def log(self, row):
      self.calls.append(row)

    def log_histogram(self, *args):
      self.calls.append(args)

  fields = {"bucket_limits": [0.0, 1.0, 2.0], "bucket_counts": [0.0, 1.0, 0.0]}
  for write, expected in ((False, 0), (True, 2)):
    run = Recorder()
    logger = MetricsLogger(str(tmp_path / str(write)), write=write, wandb_run=run)
    assert logger.log(1, {"train/loss": 0.5}) == {"step": 1, "train/loss": 0.5}
    logger.log_histogram("diagnostics/gate", 1, **fields)
    assert len(run.calls) == expected
