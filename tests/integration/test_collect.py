"""Collecting runs (sdar_jax/observe/collect.py, `launch/sweep.py collect`): fake run directories
with hand-computed tables, the run records a launcher keeps, and which runs a launcher skips."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shutil
import subprocess
import threading

import pytest

from sdar_jax.observe import collect
from tests.helpers import load_script

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_run(
  path, *, gate="gap", beta=5.0, lam=0.01, seed=0, total=4, rows=(), algo="sdar", tail=""
):
  """A run directory as the trainer leaves it: config.json and metrics.jsonl (+ a raw tail)."""
  os.makedirs(path, exist_ok=True)
  config = {
    "algo": {"name": algo, "gate": gate, "beta": beta, "lam": lam},
    "train": {"seed": seed, "iterations": total},
    "env": {"tasks_per_iteration": 2, "group_size": 4},
    "eval": {"num_tasks": 8},
  }
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
    f.write(tail)
  return str(path)


def load_sweep():
  return load_script("launch/sweep.py", "sweep_cli")


@pytest.fixture
def sweep_root(tmp_path):
  """Four runs (one cut off mid-line, one with a step logged twice) and an evaluation directory
  inside a run, which is not a run."""
  root = tmp_path / "sweep"
  v = "val/success_rate"
  write_run(
    root / "beta=1.0,lam=0.01,gate=gap",
    beta=1.0,
    rows=[
      {"step": 0, v: 0.0},
      {"step": 1, "train/loss": 0.3},
      {"step": 2, v: 0.5},
      {"step": 4, v: 0.25},
    ],
  )
  a = write_run(
    root / "beta=5.0,lam=0.01,gate=gap", rows=[{"step": 0, v: 0.25}, {"step": 4, v: 0.75}]
  )
  with open(os.path.join(a, collect.RUN_STATUS), "w") as f:
    json.dump(
      {
        "finished": True,
        "attempts": [
          {"started": 100.0, "ended": 220.0, "seconds": 120.0, "returncode": 1},
          {"started": 400.0, "ended": 460.0, "seconds": 60.0, "returncode": 0},
        ],
      },
      f,
    )
  write_run(
    root / "beta=5.0,lam=0.1,gate=entropy",
    gate="entropy",
    lam=0.1,
    rows=[{"step": 0, v: 0.0}, {"step": 2, v: 0.5}],
    tail='{"step": 3, "val/succ',  # killed mid-write
  )
  write_run(
    root / "beta=5.0,lam=0.1,gate=gap",
    lam=0.1,
    rows=[{"step": 0, v: 0.5}, {"step": 4, v: 0.5}, {"step": 4, v: 1.0}],  # step 4 logged again
  )
  ev = write_run(
    root / "beta=1.0,lam=0.01,gate=gap" / "eval" / "step_4", rows=[{"step": 4, v: 1.0}]
  )
  open(os.path.join(ev, "evaluation.json"), "w").write("{}")
  return str(root)


# ----------------------------------------------------------------------------- reading runs
def test_success_auc_by_hand():
  assert collect.success_auc([(0, 0.0), (2, 0.5), (4, 0.25)]) == pytest.approx((0.5 + 0.75) / 4)
  assert collect.success_auc([(0, 0.2), (10, 0.6)]) == pytest.approx(0.4)
  assert collect.success_auc([(5, 0.3)]) == 0.3
  assert math.isnan(collect.success_auc([]))


def test_find_and_read_runs(sweep_root):
  paths = collect.find_runs(sweep_root)
  assert [os.path.relpath(p, sweep_root) for p in paths] == [
    "beta=1.0,lam=0.01,gate=gap",
    "beta=5.0,lam=0.01,gate=gap",
    "beta=5.0,lam=0.1,gate=entropy",
    "beta=5.0,lam=0.1,gate=gap",
  ]  # the evaluation inside the first run is not a run
  runs = {os.path.basename(p): collect.read_run(p, sweep_root) for p in paths}
  cut = runs["beta=5.0,lam=0.1,gate=entropy"]
  assert cut.curve() == [(0, 0.0), (2, 0.5)] and not cut.finished and cut.last_step == 2
  again = runs["beta=5.0,lam=0.1,gate=gap"]
  assert again.final_success == 1.0 and again.auc == pytest.approx(0.75)
  assert runs["beta=5.0,lam=0.01,gate=gap"].wall_seconds == 180.0
  assert runs["beta=1.0,lam=0.01,gate=gap"].wall_seconds is None
  with pytest.raises(FileNotFoundError, match="no config.json"):
    collect.read_run(os.path.join(sweep_root, "nothing"))


def test_sweep_table_by_hand(sweep_root):
  runs = [collect.read_run(p, sweep_root) for p in collect.find_runs(sweep_root)]
  rows = collect.sweep_rows(runs)
  got = [
    (
      r["gate"],
      r["beta"],
      r["lambda"],
      r["steps"],
      r["val_success_before"],
      r["val_success_final"],
      round(r["val_success_auc"], 6),
      r["finished"],
      r["wall_minutes"],
    )
    for r in rows
  ]
  assert got == [
    ("entropy", "5.0", "0.1", "2/4", 0.0, 0.5, 0.25, "no", None),
    ("gap", "1.0", "0.01", "4/4", 0.0, 0.25, 0.3125, "yes", None),
    ("gap", "5.0", "0.01", "4/4", 0.25, 0.75, 0.5, "yes", 3.0),
    ("gap", "5.0", "0.1", "4/4", 0.5, 1.0, 0.75, "yes", None),
  ]
  # final success per gate against beta and lambda: mean, min, max over the runs at each value
  assert collect.grouped_success(runs, "algo.beta") == {
    "entropy": [(5.0, 0.5, 0.5, 0.5)],
    "gap": [(1.0, 0.25, 0.25, 0.25), (5.0, 0.875, 0.75, 1.0)],
  }
  assert collect.grouped_success(runs, "algo.lam") == {
    "entropy": [(0.1, 0.5, 0.5, 0.5)],
    "gap": [(0.01, 0.5, 0.25, 0.75), (0.1, 1.0, 1.0, 1.0)],
  }


def test_collect_sweep_writes_csv_markdown_and_plot(sweep_root, tmp_path):
  out = tmp_path / "table"
  load_sweep().main(["collect", f"--root={sweep_root}", f"--out={out}"])
  rows = list(csv.DictReader(io.StringIO((out / "sweep.csv").read_text())))
  assert [r["run"] for r in rows] == [
    "beta=5.0,lam=0.1,gate=entropy",
    "beta=1.0,lam=0.01,gate=gap",
    "beta=5.0,lam=0.01,gate=gap",
    "beta=5.0,lam=0.1,gate=gap",
  ]
  assert rows[1]["val_success_auc"] == "0.3125" and rows[0]["wall_minutes"] == ""
  md = (out / "sweep.md").read_text()
  assert (
    "| beta=5.0,lam=0.01,gate=gap | sdar | gap | 5.0 | 0.01 | 0 | 4/4 | 0.250 | 0.750 | 0.500 | yes | 3.000 |"
    in md
  )
  assert "![final success against beta and lambda](sweep.png)" in md
  assert (out / "sweep.png").stat().st_size > 0
  with pytest.raises(SystemExit, match="no runs under"):
    load_sweep().main(["collect", f"--root={tmp_path / 'empty'}"])
  # a table with 3 finished runs is not replaced by one from a root holding fewer
  fewer = tmp_path / "fewer"
  shutil.copytree(os.path.join(sweep_root, "beta=5.0,lam=0.1,gate=entropy"), fewer / "one")
  with pytest.raises(SystemExit, match="holds 3 finished run"):
    load_sweep().main(["collect", f"--root={fewer}", f"--out={out}"])
  assert "beta=1.0,lam=0.01,gate=gap" in (out / "sweep.csv").read_text()
  load_sweep().main(["collect", f"--root={fewer}", f"--out={out}", "--overwrite"])
  assert "beta=1.0,lam=0.01,gate=gap" not in (out / "sweep.csv").read_text()


def test_markdown_and_csv_cells():
  rows = [{"a": 0.12345, "b": math.nan, "c": "x|y"}, {"a": None, "b": 2, "c": 1.0}]
  assert collect.markdown_table(rows, ["a", "b", "c"]).splitlines() == [
    "| a | b | c |",
    "|---|---|---|",
    "| 0.123 | n/a | x\\|y |",
    "| n/a | 2 | 1.000 |",
  ]
  assert collect.csv_text(rows, ["a", "b"]) == "a,b\n0.12345,\n,2\n"
  assert collect.mean_std([0.5, 0.25, math.nan, 0.75])[:2] == (0.5, 0.25)
  assert collect.pm(0.5, 0.25) == "0.500 ± 0.250" and collect.pm(0.5, math.nan) == "0.500"


# ----------------------------------------------------------------------------- run records
def test_run_state(tmp_path, sweep_root):
  assert collect.run_state(str(tmp_path / "absent")) == "new"
  (tmp_path / "empty").mkdir()
  assert collect.run_state(str(tmp_path / "empty")) == "new"
  assert collect.run_state(os.path.join(sweep_root, "beta=5.0,lam=0.1,gate=entropy")) == "partial"
  assert collect.run_state(os.path.join(sweep_root, "beta=1.0,lam=0.01,gate=gap")) == "finished"
  ckpt_only = tmp_path / "ckpt_only" / "checkpoints"
  ckpt_only.mkdir(parents=True)
  assert collect.run_state(str(ckpt_only.parent)) == "partial"
  # the run record decides when it says finished, whatever the metrics reached
  marked = write_run(tmp_path / "marked", rows=[{"step": 0}])
  with open(os.path.join(marked, collect.RUN_STATUS), "w") as f:
    json.dump({"finished": True, "attempts": []}, f)
  assert collect.run_state(marked) == "finished"


class FakeClock:
  def __init__(self, start=1000.0):
    self.now = start

  def __call__(self):
    return self.now


def test_run_and_record_keeps_attempts(tmp_path):
  clock = FakeClock()
  calls = []

  def runner(cmd, cwd=None, stdout=None, stderr=None, check=False):
    calls.append((cmd, cwd))
    stdout.write("trained\n")
    clock.now += 42.0
    return type("Done", (), {"returncode": 3 if len(calls) == 1 else 0})()

  run = str(tmp_path / "run")
  log = os.path.join(run, "train.log")
  os.makedirs(run)
  assert (
    collect.run_and_record(["train"], run, cwd="/repo", log_path=log, runner=runner, clock=clock)
    == 3
  )
  status = collect.read_status(run)
  assert status["finished"] is False and status["attempts"][0]["returncode"] == 3
  clock.now += 100.0
  assert collect.run_and_record(["train"], run, log_path=log, runner=runner, clock=clock) == 0
  status = collect.read_status(run)
  assert status["finished"] is True and [a["seconds"] for a in status["attempts"]] == [42.0, 42.0]
  assert collect.wall_seconds(run) == 84.0 and collect.run_state(run) == "finished"
  assert open(log).read() == "trained\ntrained\n" and calls[0] == (["train"], "/repo")


def test_an_attempt_keeps_the_commit_of_the_code_that_ran_it(tmp_path):
  """The attempt records `git rev-parse HEAD` of the folder the command runs in, marked when a
  tracked file differs from it; nothing outside a git work tree."""
  repo = tmp_path / "repo"
  repo.mkdir()
  (repo / "train.py").write_text("lr = 1e-3\n")
  git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
  for args in (["init", "-q"], ["add", "train.py"], ["commit", "-q", "-m", "first"]):
    subprocess.run([*git, *args], check=True)
  head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
  run = str(tmp_path / "run")
  os.makedirs(run)
  done = lambda *a, **k: 0  # noqa: E731
  collect.run_and_record(["train"], run, cwd=str(repo), runner=done)
  (repo / "train.py").write_text("lr = 5e-4\n")
  (repo / "notes.txt").write_text("untracked: not a change of the code\n")
  collect.run_and_record(["train"], run, cwd=str(repo), runner=done)
  collect.run_and_record(["train"], run, cwd=str(tmp_path), runner=done)
  commits = [a["commit"] for a in collect.read_status(run)["attempts"]]
  assert commits == [head[:12], head[:12] + "+modified", None]


def test_wall_time_of_a_killed_attempt(tmp_path):
  """A killed attempt counts until its last metrics write, or until the next attempt started."""
  run = write_run(tmp_path / "run", rows=[{"step": 0}])
  os.utime(os.path.join(run, "metrics.jsonl"), (1050.0, 1050.0))
  killed = {"started": 1000.0, "ended": None, "seconds": None, "returncode": None}
  assert collect.wall_seconds(run, {"attempts": [killed]}) == 50.0
  after = {"started": 1030.0, "ended": 1100.0, "seconds": 70.0, "returncode": 0}
  assert collect.wall_seconds(run, {"attempts": [killed, after]}) == 30.0 + 70.0
  # The next attempt rewrote metrics.jsonl long after the first was killed: its heartbeat tells.
  os.utime(os.path.join(run, "metrics.jsonl"), (9000.0, 9000.0))
  later = {**after, "started": 8000.0, "ended": 8070.0}
  assert collect.wall_seconds(run, {"attempts": [killed, later]}) == 7000.0 + 70.0
  beat = {**killed, "alive": 1020.0}
  assert collect.wall_seconds(run, {"attempts": [beat, later]}) == 20.0 + 70.0
  assert collect.wall_seconds(run, {"attempts": [beat]}) == 20.0


def test_a_running_attempt_writes_its_heartbeat(tmp_path):
  """While the command runs, the run record's attempt gains `alive` (what a killed attempt's wall
  time ends at), between its start and its end. A counting clock: its first call is the start,
  the beats follow; at the second beat the first one's record is written."""
  run = str(tmp_path / "run")
  os.makedirs(run)
  ticks, second_beat, seen = [], threading.Event(), []

  def clock():
    ticks.append(1000.0 + len(ticks))
    if len(ticks) == 3:
      second_beat.set()
    return ticks[-1]

  def runner(cmd, cwd=None, check=False):
    assert second_beat.wait(60.0), "no heartbeat while the command ran"
    seen.append(collect.read_status(run)["attempts"][-1].get("alive"))
    return 0

  assert collect.run_and_record(["train"], run, runner=runner, clock=clock, heartbeat=0.001) == 0
  attempt = collect.read_status(run)["attempts"][-1]
  assert seen[0] is not None
  assert attempt["started"] == 1000.0 < seen[0] <= attempt["alive"] < attempt["ended"]


def test_sweep_run_skips_finished_runs_and_goes_on_after_a_failure(tmp_path):
  sweep = load_sweep()
  done = write_run(tmp_path / "done", rows=[{"step": 4}])
  cmds = [
    ["python", "-m", "sdar_jax.train", f"--workdir={done}"],
    ["python", "-m", "sdar_jax.train", f"--workdir={tmp_path / 'fails'}"],
    ["python", "-m", "sdar_jax.train", f"--workdir={tmp_path / 'new'}"],
  ]
  ran = []

  def runner(cmd, cwd=None, stdout=None, stderr=None, check=False):
    ran.append(cmd[-1])
    return type("Done", (), {"returncode": 1 if "fails" in cmd[-1] else 0})()

  results = sweep.run_sequentially(cmds, runner=runner)
  assert ran == [cmds[1][-1], cmds[2][-1]]
  assert [code for _, code in results] == ["skipped", 1, 0]
  assert collect.read_status(str(tmp_path / "new"))["finished"] is True
  assert collect.read_status(str(tmp_path / "fails"))["finished"] is False
