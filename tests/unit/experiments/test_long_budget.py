"""The long-budget stage (experiments.long_budget): its plan's order and budget, the collapse rule,
the measures read from the metrics, and the report on a tiny synthetic table (one seed an arm)."""

import json
import os
import time
import types

import pytest

from experiments import records, status_lines
from experiments.long_budget import plan as plan_mod
from experiments.long_budget import report as report_mod
from experiments.long_budget import run as run_mod


def _flag(step, key):
  return next(c.split("=", 1)[1] for c in step.command if c.startswith(f"--config.{key}="))


def test_the_plan_is_seed_major_with_the_fixed_budget(tmp_path):
  steps = plan_mod.plan(plan_mod.FULL, str(tmp_path), python="python")
  assert [s.kind for s in steps[:2]] == ["panels", "heldout"] and steps[1].arm == "initial"
  trains = [(s.seed, s.arm) for s in steps if s.kind == "train"]
  assert trains == [(s, a) for s in (0, 1, 2) for a in ("grpo", "grpo_opsd", "sdar", "retire_opd")]
  for s in steps[2:]:
    assert s.command[:3] == ("nice", "-n", "19")
    assert _flag(s, "optim.lr") == "0.0005" and _flag(s, "train.iterations") == "96"
    assert _flag(s, "train.eval_every") == ("4" if s.arm == "retire_opd" else "8")
    if s.kind == "heldout":
      assert _flag(s, "env.offline.num_heldout") == "640"
      assert _flag(s, "env.offline.heldout_seed") == "2"
  assert not any(plan_mod.step_done(s) for s in steps)
  assert sum(n * h for _, n, h in plan_mod.cost_table()) == pytest.approx(11.5, abs=1.0)


def test_collapse_is_two_consecutive_validations_0_2_below_the_best_so_far():
  assert report_mod.collapsed({0: 0.3, 8: 0.5, 16: 0.3, 24: 0.29}) == 24
  assert report_mod.collapsed({0: 0.3, 8: 0.5, 16: 0.3, 24: 0.4, 32: 0.3}) is None  # not in a row
  assert report_mod.collapsed({0: 0.1, 8: 0.2, 16: 0.5, 24: 0.6}) is None  # a later best: no
  assert report_mod.collapsed({0: 0.5, 8: 0.2, 16: 0.31}) is None  # 0.19 below: no
  assert report_mod.collapsed({}) is None


def test_the_measures_of_a_metrics_row():
  got = report_mod.measure_values(
    {
      "rollout/teacher_old_gap_mean": -0.3,
      "rollout/teacher_old_gap_rms": 0.5,
      "actor/kl_loss": 0.02,
      "episode/valid_action_ratio": 0.9,
      "train/grad_norm": 1.5,
    }
  )
  assert got["gap sd"] == pytest.approx(0.4) and got["invalid actions"] == pytest.approx(0.1)
  assert got["kl from initial"] == 0.02 and "entropy" not in got


def test_problem_key_ignores_the_problem_name(tmp_path):
  a, b = tmp_path / "a.tw-pddl", tmp_path / "b.tw-pddl"
  a.write_text(
    json.dumps({"pddl_problem": "(define (problem trial_x_1)\n (:init (at apple_bar_1 b)))"})
  )
  b.write_text(
    json.dumps({"pddl_problem": "(define (problem trial_y_2) (:init (at apple_bar_2 b)))"})
  )
  c = tmp_path / "c.tw-pddl"
  c.write_text(json.dumps({"pddl_problem": "(define (problem p) (:init (at apple_bar_1 c)))"}))
  assert run_mod.problem_key(str(a)) != run_mod.problem_key(str(c))
  assert run_mod.problem_key(str(a)) == run_mod.problem_key(str(b))


def _synthetic(folder):
  """One seed of grpo (stable), sdar (collapses at 24) and retire_opd (retires at 20)."""
  games = [f"g{i}" for i in range(8)]
  outcomes, metrics, runs = [], [], []
  curves = {
    "grpo": {0: 2, 8: 3, 16: 4, 24: 4, 32: 4},
    "sdar": {0: 2, 8: 5, 16: 3, 24: 3, 32: 2},
    "retire_opd": {0: 2, 8: 3, 16: 4, 24: 5, 32: 5},
  }
  held = {"grpo": 3, "sdar": 2, "retire_opd": 4, "initial": 2}
  for arm, curve in curves.items():
    key = {
      "experiment": "long_budget",
      "stage": 3,
      "run": f"{arm}/lr5.0e-04/seed0",
      "arm": arm,
      "seed": 0,
    }
    key["lr"] = 5e-4
    runs += [dict(key, kind=kind, finished=1, wall_seconds=60.0) for kind in ("train", "heldout")]
    for it, wins in curve.items():
      for i, g in enumerate(games):
        outcomes.append(
          dict(key, kind="train", panel="valid_seen", prompt="plain", eval_iteration=it)
          | {"game": g, "success": int(i < wins), "task_id": i, "repeat": 0}
        )
    for it in range(1, 33):
      row = {"actor/kl_loss": 0.001 * it, "actor/entropy": 0.5, "train/grad_norm": 1.0}
      row["episode/valid_action_ratio"] = 0.9
      if arm != "grpo":
        row |= {"rollout/teacher_old_gap_mean": -0.1, "rollout/teacher_old_gap_rms": 0.2}
      if arm == "retire_opd":
        row |= {"retire/teacher_success": 0.5, "retire/competence": 0.8, "retire/progress": 0.1}
        row |= {"retire/kl": 0.05} | ({"retire/retired_at": 20.0} if it >= 20 else {})
      metrics += [dict(key, iteration=it, metric=m, value=v) for m, v in row.items()]
  for arm, wins in held.items():
    run = "initial" if arm == "initial" else f"{arm}/lr5.0e-04/seed0"
    seed, lr = (None, None) if arm == "initial" else (0, 5e-4)
    key = {"experiment": "long_budget", "stage": 3, "run": run, "arm": arm, "seed": seed, "lr": lr}
    if arm == "initial":
      runs.append(dict(key, kind="heldout", finished=1))
    for panel in ("heldout_seen", "heldout_unseen"):
      for i, g in enumerate(games):
        outcomes.append(
          dict(key, kind="heldout", panel=panel, prompt="plain", eval_iteration=32)
          | {"game": f"{panel}/{g}", "success": int(i < wins), "task_id": i, "repeat": 0}
        )
  tables = records.Tables(str(folder))
  records.append(tables.outcomes, outcomes, records.OUTCOME_COLUMNS)
  records.append(tables.metrics, metrics, records.METRIC_COLUMNS)
  records.append(tables.runs, runs, records.RUN_COLUMNS)
  return tables


def test_the_report_on_one_seed_an_arm(tmp_path):
  tables = _synthetic(tmp_path / "tables")
  dest = str(tmp_path / "report")
  text = report_mod.report(tables, dest, resamples=200)
  assert "| `sdar` | 1 | 1 | seed 0: 24 |" in text and "| `grpo` | 1 | 0 | - |" in text
  assert "| 0 | iteration 20 |" in text  # retire_opd seed 0
  assert "`grpo_opsd`" in text.split("arms with none:")[1].split("\n")[0]
  assert "not (yet) trained: `grpo` [1, 2]; `grpo_opsd` [0, 1, 2];" in text
  assert "| `initial` | 1 | 0.250 | 0.250 |" in text
  for name in ("report.md", "curves.png", "dynamics.csv", "collapse.csv", "retirement.csv"):
    assert os.path.getsize(os.path.join(dest, name)) > 0
  paired = records.read(os.path.join(dest, "paired.csv"))
  assert {r["comparison"] for r in paired} == {"sdar - grpo", "retire_opd - grpo"}
  row = next(r for r in paired if r["comparison"] == "sdar - grpo")
  assert float(row["difference"]) == pytest.approx(-0.125)
  dynamics = records.read(os.path.join(dest, "dynamics.csv"))
  measures = {r["measure"] for r in dynamics}
  assert {"kl from initial", "gap sd", "invalid actions", "valid_seen success"} <= measures
  assert not any(r["arm"] == "grpo" and r["measure"] == "gap mean" for r in dynamics)


def test_the_driver_lowers_its_sessions_priority_where_the_kernel_groups_by_session(tmp_path):
  from experiments import driver

  group = tmp_path / "autogroup"
  group.write_text("/autogroup-7 nice 0\n")
  assert driver.lowest_priority(str(group)) and group.read_text() == "19"
  assert not driver.lowest_priority(str(tmp_path / "no" / "autogroup"))  # no autogroup: False


def test_status_sets_the_measured_pace_beside_the_plan(tmp_path):
  """Finished steps' wall time against their planned hours, per kind; the steps left at those
  ratios (a kind not measured yet at the ratio of all)."""
  from experiments import driver

  def step(kind, name, seconds=None, lost=None):
    s = driver.Step(kind, name, 5e-4, 0, str(tmp_path / name), ("true",))
    if seconds is not None:
      os.makedirs(s.results, exist_ok=True)
      attempts = [{"started": 0.0, "seconds": seconds, "returncode": 0}]
      if lost:  # an earlier attempt killed after `lost` seconds (no seconds recorded, alive then)
        attempts.insert(0, {"started": -1e4, "seconds": None, "alive": -1e4 + lost})
      with open(os.path.join(s.results, "run_status.json"), "w") as f:
        json.dump({"attempts": attempts}, f)
    return s

  planned = {"train": 0.5, "heldout": 0.25}
  done = [step("train", "a", 3600), step("train", "b", 5400), step("heldout", "a", 1800, 900)]
  done.append(step("panels", "q", 2))  # found made elsewhere: not a measure of the pace
  left = [step("train", "c"), step("heldout", "b"), step("panels", "p")]
  hours = lambda s: planned.get(s.kind, 1.0)
  line = status_lines.pace_line(done, left, hours)
  # train: 2.5 h for 1.0 planned (2.5x); heldout 0.5 h for 0.25 (2.0x); all: 3.0 for 1.25 (2.4x)
  assert "heldout 0.50 h for 0.25 planned (2.0x), train 2.50 h for 1.00 planned (2.5x)" in line
  assert "about 4 h of wall time" in line  # 0.5 x 2.5 + 0.25 x 2.0 + 1.0 x 2.4 = 4.15
  assert "0.2 h lost to attempts that had to start over" in line  # the evaluation's first 900 s
  assert (
    status_lines.pace_line([], left, hours) == "" == status_lines.pace_line(done[3:], left, hours)
  )
  # the last 3 of each kind to finish: three more trainings, at 1x, finishing later
  faster = []
  for i, name in enumerate("def"):
    faster.append(step("train", name, 1800))
    with open(os.path.join(faster[-1].results, "run_status.json"), "w") as f:
      json.dump({"attempts": [{"started": 1e5 + i, "seconds": 1800, "returncode": 0}]}, f)
  line = status_lines.pace_line(done + faster, left, hours)
  # all trainings: 4.0 h for 2.5 planned (1.6x): 0.5 x 1.6 + 0.25 x 2.0 + 1.0 x 4.5 / 2.75 = 2.94
  assert "train 4.00 h for 2.50 planned (1.6x)" in line and "about 3 h of wall time" in line
  # the last three: train 1.0x, heldout 2.0x, all 2.0 for 1.75: 0.5 + 0.5 + 1.14 = 2.14
  assert "at the last 3 of each kind's: about 2 h" in line


def test_status_names_episodes_an_evaluation_lost(tmp_path):
  """A finished held-out evaluation whose metrics count env failures is named by `status` (on
  2026-12-06 a full disk cost two evaluations their unseen panels and `status` said none)."""
  from sdar_jax.run.evaluation import write_eval_record

  out = str(tmp_path / "runs")
  held = next(s for s in plan_mod.plan(plan_mod.FULL, out, "python") if s.kind == "heldout")
  os.makedirs(held.results)
  write_eval_record(held.results, {"model_path": "p", "step": 0}, finished="2026-12-06 23:22")
  with open(os.path.join(held.results, "metrics.jsonl"), "w") as f:
    row = {"step": 0, "val/env_failures": 0.0, "val_heldout_unseen/env_failures": 78.0}
    f.write(json.dumps(row) + "\n")
  assert (
    f"episodes lost to env failures: {held.label}, iteration 0: val_heldout_unseen/env_failures=78"
  ) in run_mod.status(out=out)


def test_an_arm_keeps_its_colour_in_a_panel_other_arms_did_not_log():
  """The teacher-student gap is logged by the teacher arms only: `grpo_opsd` is drawn in the
  colour it has in the success panel (its place among the arms), not in the first colour."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from experiments import tables_view

  fig, (left, right) = plt.subplots(1, 2)
  arms = ("grpo", "grpo_opsd", "sdar")
  curve = {0: {1: 0.1, 2: 0.2}, 1: {1: 0.3, 2: 0.0}}
  assert tables_view.draw_curves(left, {a: curve for a in arms}, "success", arms) == 3
  assert tables_view.draw_curves(right, {"grpo_opsd": curve}, "gap", arms) == 1
  assert matplotlib.colors.same_color(right.lines[0].get_color(), left.lines[1].get_color())
  assert right.lines[0].get_ydata().tolist() == pytest.approx([0.2, 0.1])  # mean over seeds
  plt.close(fig)


def test_drivers_side_by_side_play_one_held_out_evaluation_at_a_time(tmp_path):
  """Two 1,280-game evaluations at once exhausted this machine's memory: an evaluation step
  holds the lock beside the stages' folders while it plays, a training does not, a driver that
  finds it held says whom it waits for and plays once it is released, and a driver whose next
  step is an evaluation while the lock is held plays a training still to do first."""
  import fcntl
  import threading

  from envs.common import lock_held
  from experiments import driver

  lock = driver.evaluations_lock(str(tmp_path / "runs" / "contexts"))
  assert lock == str(tmp_path / "runs" / driver.EVALUATIONS_LOCK)
  assert lock == driver.evaluations_lock(str(tmp_path / "runs" / "long_budget"))

  def held() -> bool:
    return lock_held(lock)

  steps = [
    driver.Step(kind, "grpo", 5e-4, 0, str(tmp_path / "runs" / "long_budget" / "grpo"), ("x",))
    for kind in ("train", "heldout")
  ]
  finished, seen = set(), {}

  def runner(cmd, **_):
    seen[steps[len(finished)].kind] = held()
    finished.add(steps[len(finished)].label)
    return types.SimpleNamespace(returncode=0)

  said: list[str] = []
  failed = driver.play(
    lambda: steps,
    done=lambda s: s.label in finished,
    runner=runner,
    echo=said.append,
    evaluations=lock,
  )
  assert failed == 0 and seen == {"train": False, "heldout": True} and not held()

  other = open(lock, "a+")  # another driver's evaluation holds it
  fcntl.flock(other, fcntl.LOCK_EX)
  other.truncate(0)
  other.write("heldout sdar lr5.0e-04 seed 0 (pid 7)\n")
  other.flush()
  inside = threading.Event()

  def second() -> None:
    with driver.one_at_a_time(lock, "heldout grpo seed 1", said.append):
      inside.set()

  waiting = threading.Thread(target=second)
  waiting.start()
  for _ in range(200):
    if said[-1].startswith("heldout grpo seed 1: waiting"):
      break
    time.sleep(0.01)
  assert "waiting for heldout sdar lr5.0e-04 seed 0 (pid 7) to finish" in said[-1]
  assert not inside.is_set()
  fcntl.flock(other, fcntl.LOCK_UN)
  waiting.join(timeout=10)
  assert inside.is_set() and not held()

  # while another driver's evaluation holds it, a training still to do is played first
  fcntl.flock(other, fcntl.LOCK_EX)
  steps = [
    driver.Step(kind, arm, 5e-4, 1, str(tmp_path / "runs" / "long_budget" / arm), ("x",))
    for kind, arm in (("heldout", "grpo"), ("train", "sdar"))
  ]
  finished, order = set(), []

  def runner_in_order(cmd, **_):
    step = next(
      s for s in steps if s.label not in finished and s.kind == ("heldout" if order else "train")
    )
    order.append((step.kind, held()))
    finished.add(step.label)
    fcntl.flock(other, fcntl.LOCK_UN)  # the other evaluation ends during the training
    return types.SimpleNamespace(returncode=0)

  said.clear()
  driver.play(
    lambda: steps,
    done=lambda s: s.label in finished,
    runner=runner_in_order,
    echo=said.append,
    evaluations=lock,
  )
  assert order == [("train", True), ("heldout", True)]
  assert "heldout grpo lr5.0e-04 seed 1: another driver's evaluation holds" in said[0]
  assert said[0].endswith("train sdar lr5.0e-04 seed 1 first")

  # ... but not a training of a later seed: the driver waits for the lock instead
  fcntl.flock(other, fcntl.LOCK_EX)
  steps[1] = driver.Step("train", "sdar", 5e-4, 2, steps[1].workdir, ("x",))
  finished, order = set(), []

  def runner_seed_major(cmd, **_):
    step = next(s for s in steps if s.label not in finished)
    order.append((step.kind, held()))
    finished.add(step.label)
    return types.SimpleNamespace(returncode=0)

  def say(line: str) -> None:  # the other evaluation ends once the driver waits for it
    said.append(line)
    if ": waiting for " in line:
      fcntl.flock(other, fcntl.LOCK_UN)

  said.clear()
  driver.play(
    lambda: steps,
    done=lambda s: s.label in finished,
    runner=runner_seed_major,
    echo=say,
    evaluations=lock,
  )
  assert order == [("heldout", True), ("train", False)]
  assert not any(x.endswith(" first") for x in said)
  assert any("heldout grpo lr5.0e-04 seed 1: waiting for" in x for x in said)
  other.close()


def test_a_run_trained_again_is_compared_with_its_records(tmp_path, monkeypatch):
  """A fresh machine: the held-out evaluation of a run restored without weights moves the run
  aside and trains it again; once trained, every recorded value the two share is compared (the
  machine's timings and compilation counts left out, NaN equal to NaN)."""
  run = tmp_path / "grpo" / "lr5.0e-04" / "seed1"

  def metrics(folder, rows):
    os.makedirs(folder, exist_ok=True)
    with open(folder / "metrics.jsonl", "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)

  recorded = [{"step": 0, "val/success_rate": 0.25, "train/loss": float("nan")},
              {"step": 1, "train/loss": 0.5, "perf/iteration_seconds": 30.0, "train/compilations": 4}]  # fmt: skip
  metrics(run, recorded)
  step = plan_mod.plan(plan_mod.FULL, str(tmp_path), python="python")[1]
  step = step.__class__("heldout", "grpo", 5e-4, 1, str(run), step.command)
  monkeypatch.setattr(run_mod, "has_final_checkpoint", lambda run: False)
  trained = step.__class__("train", "grpo", 5e-4, 1, str(run), ())
  again = run_mod.lost_weights(step, lambda: trained)
  assert again.step is trained and "final weights are gone" in again.note
  assert os.path.isdir(f"{run}.restored") and not os.path.exists(run)
  same = [dict(r) for r in recorded]
  same[1].update({"perf/iteration_seconds": 12.0, "train/compilations": 2})  # the machine's
  metrics(run, same)
  assert again.after() == f"retrained {run}: 0 of 3 recorded metric values differ"
  same[1]["train/loss"] = 0.5 + 2**-20
  metrics(run, same)
  assert again.after() == (
    f"retrained {run}: 1 of 3 recorded metric values differ (first: train/loss at iteration 1, "
    f"0.5 -> {0.5 + 2**-20!r}; largest finite difference 9.54e-07)"
  )
  same[0]["train/loss"] = 1.0  # a NaN recorded, a number now: counted, but no finite difference
  metrics(run, same)
  assert again.after().startswith(f"retrained {run}: 2 of 3 recorded metric values differ (first: ")
  assert again.after().endswith("largest finite difference 9.54e-07)")
