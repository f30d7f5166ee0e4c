"""experiments/ablation.py without training: the commands it plans, which runs it skips or resumes, and
the table and figure it builds from fake run logs (numbers worked by hand)."""

from __future__ import annotations

import csv
import json
import os

import numpy as np
import pytest

from sdar_jax.observe import collect

_REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


@pytest.fixture(scope="module")
def ablation():
  import experiments.ablation

  return experiments.ablation


def fake_run(path, algo, seed, curve, total=20, seconds=None, num_tasks=48):
  """A run directory: config.json, metrics.jsonl with val/success_rate at the curve's steps (and
  a training row between), and a run record of one attempt of `seconds` when given."""
  os.makedirs(path, exist_ok=True)
  config = {
    "algo": {"name": algo, "gate": "gap", "beta": 5.0, "lam": 0.01},
    "train": {"seed": seed, "total_steps": total, "eval_every": 10},
    "env": {"tasks_per_step": 2, "group_size": 4},
    "eval": {"num_tasks": num_tasks},
  }
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    for step, value in curve:
      if step > 0:
        f.write(json.dumps({"step": step - 1, "train/loss": 0.1}) + "\n")
      f.write(json.dumps({"step": step, "val/success_rate": value}) + "\n")
  if seconds is not None:
    attempt = {"started": 0.0, "ended": seconds, "seconds": seconds, "returncode": 0}
    with open(os.path.join(path, collect.RUN_STATUS), "w") as f:
      json.dump({"finished": True, "attempts": [attempt]}, f)
  return str(path)


@pytest.fixture
def runs_dir(tmp_path):
  out = tmp_path / "ablation"
  fake_run(out / "grpo/seed0", "grpo", 0, [(0, 0.0), (10, 0.2), (20, 0.4)], seconds=600.0)
  fake_run(out / "grpo/seed1", "grpo", 1, [(0, 0.1), (10, 0.1), (20, 0.1)], seconds=660.0)
  fake_run(out / "grpo/seed2", "grpo", 2, [(0, 0.0), (10, 0.3), (20, 0.7)], seconds=540.0)
  fake_run(out / "sdar/seed0", "sdar", 0, [(0, 0.0), (20, 0.5)])
  fake_run(out / "sdar/seed1", "sdar", 1, [(0, 0.0), (10, 0.4)])  # interrupted at step 10
  return str(out)


def test_plan_runs_commands(ablation):
  runs = ablation.plan_runs(
    ["grpo", "sdar"], [0, 2], "runs/abl", overrides=["train.eval_every=5"], python="py"
  )
  assert [(r.arm, r.seed, r.workdir) for r in runs] == [
    ("grpo", 0, "runs/abl/grpo/seed0"),
    ("grpo", 2, "runs/abl/grpo/seed2"),
    ("sdar", 0, "runs/abl/sdar/seed0"),
    ("sdar", 2, "runs/abl/sdar/seed2"),
  ]
  assert runs[1].command == (
    "py",
    "-m",
    "sdar_jax.train",
    "--config=configs/default.py:algo=grpo",
    "--config.train.seed=2",
    "--config.train.eval_every=5",
    "--workdir=runs/abl/grpo/seed2",
  )
  (run,) = ablation.plan_runs(["sdar"], [0], "o", "configs/alfworld.py:model=tiny,local=True")
  assert run.command[3] == "--config=configs/alfworld.py:model=tiny,local=True,algo=sdar"


def test_arguments_are_checked(ablation):
  args = ablation.parse_args(["--arms", "grpo,sdar_soft_or", "--seeds", "3,4"])
  assert args.arms == ["grpo", "sdar_soft_or"] and args.seeds == [3, 4]
  assert ablation.parse_args([]).arms == ["grpo", "grpo_opsd", "sdar"]
  for bad in (
    ["--arms", "grpo,sdr"],
    ["--seeds", "0,x"],
    ["--set", "train.seed=3"],
    ["--set", "x"],
  ):
    with pytest.raises(SystemExit):
      ablation.parse_args(bad)


def test_finished_runs_are_skipped_and_interrupted_ones_resumed(ablation, runs_dir, tmp_path):
  runs = ablation.plan_runs(["grpo", "sdar"], [0, 1], runs_dir, python="py")
  runs += ablation.plan_runs(["grpo_opsd"], [0], runs_dir, python="py")
  started, lines = [], []

  def runner(cmd, cwd=None, stdout=None, stderr=None, check=False):
    workdir = cmd[-1].split("=", 1)[1]
    started.append(os.path.relpath(workdir, runs_dir))
    return type("Done", (), {"returncode": 0})()

  outcome = ablation.run_all(runs, runner=runner, cwd="/", echo=lines.append)
  # grpo seeds 0, 1 and sdar seed 0 reached total_steps; sdar seed 1 stopped at 10; grpo_opsd new
  assert started == ["sdar/seed1", "grpo_opsd/seed0"]
  assert outcome == {
    ("grpo", 0): "skipped",
    ("grpo", 1): "skipped",
    ("sdar", 0): "skipped",
    ("sdar", 1): "ok",
    ("grpo_opsd", 0): "ok",
  }
  assert lines[0] == f"[1/5] grpo seed 0: finished, skipped ({runs_dir}/grpo/seed0)"
  assert lines[3].startswith("[4/5] sdar seed 1: resuming, elapsed ")
  assert lines[4].startswith("[5/5] grpo_opsd seed 0: starting, elapsed ") and "ETA" in lines[4]
  assert collect.read_status(os.path.join(runs_dir, "sdar/seed1"))["finished"] is True
  # a second pass finds everything finished
  started.clear()
  ablation.run_all(runs, runner=runner, cwd="/", echo=lines.append)
  assert started == []


def test_a_failed_run_is_reported_and_the_rest_go_on(ablation, tmp_path):
  runs = ablation.plan_runs(["grpo"], [0, 1], str(tmp_path), python="py")
  lines = []

  def runner(cmd, cwd=None, stdout=None, stderr=None, check=False):
    return type("Done", (), {"returncode": 2 if cmd[-1].endswith("seed0") else 0})()

  outcome = ablation.run_all(runs, runner=runner, cwd="/", echo=lines.append)
  assert outcome == {("grpo", 0): "failed (exit 2)", ("grpo", 1): "ok"}
  assert any("failed with exit code 2" in line for line in lines)
  assert collect.run_state(str(tmp_path / "grpo/seed0")) == "partial"


def test_table_by_hand(ablation, runs_dir):
  arms = ablation.read_arms(runs_dir, ["grpo", "sdar", "grpo_opsd"], [0, 1, 2])
  rows = {r["arm"]: r for r in ablation.table_rows(arms, 3)}
  grpo = rows["GRPO"]
  # final 0.4, 0.1, 0.7: mean 0.4, sample std sqrt((0 + 0.09 + 0.09) / 2) = 0.3
  assert grpo["final val success"] == "0.400 ± 0.300"
  # AUC, trapezoid / span 20: seed 0 (0.1·10 + 0.3·10) / 20 = 0.2, seed 1 0.1, seed 2
  # (0.15·10 + 0.5·10) / 20 = 0.325; mean 0.625 / 3, sample std sqrt(0.0254167 / 2) = 0.1127312
  assert grpo["auc_mean"] == pytest.approx(0.625 / 3)
  assert grpo["auc_std"] == pytest.approx(0.1127312, abs=1e-7)
  assert grpo["val success AUC"] == "0.208 ± 0.113"
  assert grpo["val success before"] == "0.033 ± 0.058"
  assert grpo["finished runs"] == "3/3" and grpo["iterations"] == "20"
  assert grpo["train episodes / run"] == "160"  # 20 iterations x 2 tasks x 4 episodes
  assert grpo["wall time / run (min)"] == pytest.approx(10.0)  # (600 + 660 + 540) / 3 s
  sdar = rows["SDAR (gap gate)"]
  assert sdar["finished runs"] == "1/3"  # seed 1 stopped at step 10 of 20, seed 2 never ran
  # statistics over finished runs only: seed 0 (final 0.5, AUC 0.25), no std of one run
  assert sdar["final val success"] == "0.500" and sdar["val success AUC"] == "0.250"
  assert np.isnan(sdar["final_std"]) and sdar["wall time / run (min)"] is None
  assert rows["GRPO+OPSD"]["final val success"] == "n/a"

  steps, mean, low, high = ablation.curves(arms[0])
  np.testing.assert_allclose(steps, [0, 10, 20])
  np.testing.assert_allclose(mean, [0.1 / 3, 0.2, 0.4])
  np.testing.assert_allclose(low, [0.0, 0.1, 0.1])
  np.testing.assert_allclose(high, [0.1, 0.3, 0.7])
  steps, mean, _, _ = ablation.curves(arms[1])  # the finished run alone
  np.testing.assert_allclose(steps, [0, 20])
  np.testing.assert_allclose(mean, [0.0, 0.5])


def test_report_files(ablation, runs_dir, tmp_path):
  md, png = tmp_path / "docs/ablation.md", tmp_path / "docs/ablation.png"
  args = ["--arms", "grpo,sdar", "--out", runs_dir, "--md", str(md), "--png", str(png)]
  args += ["--collect-only", "--results", ""]
  code = ablation.main(args)
  assert code == 0 and png.stat().st_size > 0
  page = md.read_text()
  assert "`python experiments/ablation.py --arms grpo,sdar --out " in page
  assert (
    "| GRPO | 3/3 | 0.400 ± 0.300 | 0.208 ± 0.113 | 0.033 ± 0.058 | 20 | 160 | 10.000 |" in page
  )
  assert "| SDAR (gap gate) | 1 | 10/20 | 0.000 | 0.400 | 0.200 | n/a |" in page  # per seed
  assert "![validation success per arm](ablation.png)" in page
  assert "do not share one budget" not in page
  table = list(csv.DictReader(open(tmp_path / "docs/ablation.csv")))
  assert [r["arm"] for r in table] == ["GRPO", "SDAR (gap gate)"]
  assert float(table[0]["final_mean"]) == pytest.approx(0.4)
  assert float(table[0]["final_std"]) == pytest.approx(0.3)
  assert table[0]["train episodes / run"] == "160" and table[1]["wall time / run (min)"] == ""
  # a run with another validation budget is called out
  fake_run(os.path.join(runs_dir, "sdar/seed2"), "sdar", 2, [(0, 0.0), (20, 0.1)], num_tasks=12)
  ablation.main(args)
  assert (
    "do not share one budget:** validation episodes (eval.num_tasks): ['12', '48']"
    in md.read_text()
  )


def test_a_report_is_not_replaced_by_one_from_fewer_runs(ablation, runs_dir, tmp_path):
  """--collect-only where the runs are not (a fresh clone) keeps the committed report."""
  md = tmp_path / "docs/ablation.md"
  args = ["--arms", "grpo,sdar", "--md", str(md), "--png", str(tmp_path / "docs/a.png")]
  args += ["--collect-only", "--results", ""]
  assert ablation.main([*args, "--out", runs_dir]) == 0
  before = md.read_text()
  assert ablation.main([*args, "--out", str(tmp_path / "no_runs")]) == 2
  assert md.read_text() == before  # nothing written
  assert ablation.main([*args, "--out", str(tmp_path / "no_runs"), "--overwrite"]) == 0
  assert "| GRPO | 0/3 |" in md.read_text()


def _outcomes(run, step, wins):
  from sdar_jax.observe.transcripts import write_outcomes
  from sdar_jax.rollout.trajectory import Episode

  episodes = [Episode(k, task_id=k, group_id=k, won=bool(w)) for k, w in enumerate(wins)]
  write_outcomes(os.path.join(run, "eval", f"step_{step}"), "val", episodes, arm="", seed=0,
                 step=step, split="valid_seen")  # fmt: skip


def test_report_pairs_the_arms_and_records_their_outcomes(ablation, runs_dir, tmp_path):
  """Seed 0 finished in both arms (SDAR's seed 1 did not): SDAR minus GRPO on its 4 games at
  step 20 is +0.5; the finished runs' rows land in the tidy tables beside the report."""
  for arm, wins in (("grpo", [0, 0, 1, 1]), ("sdar", [1, 1, 1, 1])):
    run = os.path.join(runs_dir, arm, "seed0")
    _outcomes(run, 0, [0, 0, 1, 1])
    _outcomes(run, 20, wins)
  md = tmp_path / "docs/ablation.md"
  ablation.main(["--arms", "sdar,grpo", "--out", runs_dir, "--md", str(md),
                 "--png", str(tmp_path / "docs/ablation.png"), "--collect-only",
                 "--results", str(tmp_path / "docs/results")])  # fmt: skip
  page = md.read_text()
  assert "### SDAR (gap gate) - GRPO, paired on seeds [0]" in page
  assert "final validation success: +0.500, 95% CI [" in page
  assert "seed-level sign-flip p = 1 (exact; floor 1 at 1 seeds)" in page  # one seed: no test
  from experiments import records

  tables = records.Tables(str(tmp_path / "docs/results"))
  runs = sorted(r["run"] for r in tables.read("runs", experiment="demo_ablation"))
  assert runs == ["grpo/seed0", "grpo/seed1", "grpo/seed2", "sdar/seed0"]  # finished runs only
  final = tables.read("outcomes", run="sdar/seed0", eval_iteration=20)
  assert [r["success"] for r in final] == [1, 1, 1, 1]
