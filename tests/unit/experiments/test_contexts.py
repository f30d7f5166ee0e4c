"""The contexts stage (experiments.contexts): its plan's order and settings, the rate rule decided
once, the vocab arm's rule, the power it prints, and the report on a tiny synthetic table."""

import json
import os

import pytest

from experiments import driver, power, records, report
from experiments.contexts import plan as plan_mod
from experiments.contexts import report as report_mod
from experiments.long_budget import plan as long_budget
from tests.unit.experiments.test_ablation import fake_run


def _flag(step, key):
  return next(c.split("=", 1)[1] for c in step.command if c.startswith(f"--config.{key}="))


def test_the_pilot_comes_first_then_seed_major_at_one_rate(tmp_path):
  out = str(tmp_path)
  steps = plan_mod.plan(plan_mod.FULL, out, python="python", vocab="hindsight")
  assert [s.kind for s in steps[:2]] == ["panels", "heldout"] and steps[1].arm == "initial"
  assert steps[0].command[5:8] == ("experiments.long_budget", "panels", f"--out={out}")
  pilot = [(s.seed, s.arm, s.rate) for s in steps[2:]]
  assert pilot == [
    (s, a, r) for s in (0, 1) for a in ("grpo", "sdar_sibling") for r in (5e-4, 1e-3)
  ]
  assert len(steps) == 10  # nothing past the pilot until the rate is decided
  steps = plan_mod.plan(plan_mod.FULL, out, python="python", rate=1e-3, vocab="hindsight")
  assert len(steps) == plan_mod.total_steps() == 102
  after = steps[10:]
  assert {s.rate for s in after} == {1e-3}  # every arm, every contrast at the chosen rate
  trains = [(s.seed, s.arm) for s in after if s.kind == "train"]
  pilots = {(s, a) for s in (0, 1) for a in plan_mod.PILOT_ARMS}
  assert trains == [(s, a) for s in range(8) for a in plan_mod.ARMS if (s, a) not in pilots]
  assert [(s.seed, s.arm) for s in after if s.kind == "heldout"] == [
    (s, a) for s in range(8) for a in plan_mod.ARMS
  ]
  for s in steps[1:]:
    assert s.command[:3] == ("nice", "-n", "19")
    assert _flag(s, "model.path") == plan_mod.CONTEXT_POLICY
    assert _flag(s, "eval.streams") == "task"
    if s.kind == "train":
      assert _flag(s, "train.iterations") == "16" and _flag(s, "train.eval_every") == "8"
    else:
      assert _flag(s, "env.offline.num_heldout") == str(long_budget.FULL.num_heldout) == "640"
      assert _flag(s, "env.offline.heldout_seed") == str(long_budget.FULL.heldout_seed) == "2"
    if s.arm == "sdar_vocab":
      assert _flag(s, "algo.context") == "hindsight"
    if s.arm == "sdar_sibling":
      assert _flag(s, "algo.context") == "sibling"
  assert (plan_mod.SMOKE.num_heldout, plan_mod.SMOKE.heldout_seed) == (
    long_budget.SMOKE.num_heldout,
    long_budget.SMOKE.heldout_seed,
  )
  assert sum(n * h for _, n, h in plan_mod.cost_table()) == pytest.approx(14.6, abs=0.5)


def test_the_rate_rule_and_its_single_decision(tmp_path, monkeypatch):
  low, high = 5e-4, 1e-3
  both = {
    "grpo": {low: [0.3, 0.4], high: [0.4, 0.4]},
    "sdar_sibling": {low: [0.2, 0.2], high: [0.3, 0.2]},
  }
  assert plan_mod.rate_rule(both) == high
  one = {**both, "grpo": {low: [0.4, 0.4], high: [0.5, 0.3]}}  # a tie for grpo: the demo's rate
  assert plan_mod.rate_rule(one) == low
  finals = {}
  monkeypatch.setattr(plan_mod, "final_success", lambda run: finals.get(run))
  out = str(tmp_path)
  assert plan_mod.decide_rate(out) is None and plan_mod.rate_decision(out) is None
  for arm, by in both.items():
    for rate, values in by.items():
      for seed, v in enumerate(values):
        finals[plan_mod.pilot_dir(out, arm, rate, seed)] = (v, 0.0)
  assert plan_mod.decide_rate(out) == high
  record = plan_mod.rate_decision(out)
  assert record["chosen"] == high and record["pilot"]["grpo"]["lr1.0e-03"]["final"] == [0.4, 0.4]
  assert record["pilot"]["sdar_sibling"]["higher_at_pilot_rate"] is True
  finals.clear()  # decided once: the file holds, whatever the runs say later
  assert plan_mod.decide_rate(out) == high
  assert len(plan_mod.plan(plan_mod.FULL, out, python="python", vocab="sibling")) == 102


def test_a_fresh_machine_decides_the_rate_from_the_restored_pilot(tmp_path):
  """The pilot's runs kept in the tables and restored without weights or config.json (a machine
  that lost runs/) give the rate their finished runs gave: nothing past the pilot waits again."""
  finals = {"grpo": {5e-4: [0.5, 0.4], 1e-3: [0.3, 0.3]},
            "sdar_sibling": {5e-4: [0.4, 0.4], 1e-3: [0.3, 0.3]}}  # fmt: skip
  out, fresh = str(tmp_path / "out"), str(tmp_path / "fresh")
  tables = records.Tables(str(tmp_path / "tables"))
  for arm, by in finals.items():
    for rate, values in by.items():
      for seed, v in enumerate(values):
        run = plan_mod.pilot_dir(out, arm, rate, seed)
        fake_run(run, "grpo", seed, [(0, 0.2), (8, 0.3), (16, v)], 16, seconds=60.0)
        key = {"experiment": plan_mod.EXPERIMENT, "stage": plan_mod.STAGE, "arm": arm,
               "run": os.path.relpath(run, out), "kind": "train", "seed": seed, "lr": rate}  # fmt: skip
        tables.add(*records.step_rows(run, **key))
  assert plan_mod.decide_rate(out) == 5e-4  # 0.45 and 0.4 at 5e-4, 0.3 at 1e-3
  assert driver.restore(tables, fresh, plan_mod.EXPERIMENT) > 0
  assert not os.path.exists(os.path.join(plan_mod.pilot_dir(fresh, "grpo", 5e-4, 0), "config.json"))
  assert plan_mod.decide_rate(fresh) == 5e-4
  assert plan_mod.rate_decision(fresh)["pilot"]["grpo"]["lr5.0e-04"]["final"] == [0.5, 0.4]


def test_the_vocab_arm_takes_the_larger_gap(tmp_path):
  policy = tmp_path / "policy"
  with pytest.raises(FileNotFoundError, match="warm_start_metrics.json is missing"):
    plan_mod.vocab_context(str(policy))
  assert plan_mod.planned_vocab_context(str(tmp_path / "out"), str(policy)) == plan_mod.UNDECIDED
  policy.mkdir()
  path = policy / "warm_start_metrics.json"
  path.write_text(json.dumps({"warm_start/sibling_gap_on_expert": 0.2}))
  with pytest.raises(ValueError, match="hindsight_gap_on_expert"):
    plan_mod.vocab_context(str(policy))
  gaps = {"warm_start/sibling_gap_on_expert": 0.2, "warm_start/hindsight_gap_on_expert": 0.3}
  path.write_text(json.dumps(gaps))
  assert plan_mod.vocab_context(str(policy)) == ("hindsight", {"sibling": 0.2, "hindsight": 0.3})
  path.write_text(json.dumps({**gaps, "warm_start/hindsight_gap_on_expert": 0.2}))
  assert plan_mod.vocab_context(str(policy))[0] == "sibling"  # a tie: the primary's context
  path.write_text(json.dumps(gaps))
  out = str(tmp_path / "out")
  assert plan_mod.decide_vocab_context(out, str(policy)) == "hindsight"
  path.write_text(json.dumps({**gaps, "warm_start/sibling_gap_on_expert": 0.9}))
  assert plan_mod.decide_vocab_context(out, str(policy)) == "hindsight"  # recorded before any run


def test_the_power_printed_in_the_plan():
  parts = plan_mod.COMPONENTS
  d = power.detectable(parts, 8, 640)
  assert d == pytest.approx(0.050, abs=0.001)
  assert power.power_at(parts, 8, 640, d) == pytest.approx(0.8, abs=1e-9)
  # the issue quotes the components' square roots (standard deviations)
  assert [round(x**0.5, 3) for x in (parts.seed, parts.game, parts.residual)] == [
    0.028,
    0.34,
    0.486,
  ]
  assert len(plan_mod.family("sibling")) == 17
  assert "power at +0.05 0.79" in "\n".join(plan_mod.power_lines())


def _synthetic(folder):
  """The pilot (1e-3 higher for both arms), then seeds 0 and 1 of every arm at 1e-3 evaluated on
  8-game panels: sdar_sibling wins 6 of 8 held-out games, grpo 3, the others 4."""
  games = [f"g{i}" for i in range(8)]
  outcomes, runs = [], []

  def add(arm, rate, seed, valid, held=None, config=""):
    run = f"{arm}/lr{rate:.1e}/seed{seed}"
    key = {"experiment": "contexts", "stage": 3, "run": run, "arm": arm, "seed": seed, "lr": rate}
    runs.append(dict(key, kind="train", finished=1, config=config))
    for it, wins in ((0, 2), (16, valid)):
      for i, g in enumerate(games):
        outcomes.append(
          dict(key, kind="train", panel="valid_seen", prompt="plain", eval_iteration=it)
          | {"game": g, "success": int(i < wins), "task_id": i, "repeat": 0}
        )
    if held is not None:
      runs.append(dict(key, kind="heldout", finished=1))
      for panel in ("heldout_seen", "heldout_unseen"):
        for i, g in enumerate(games):
          outcomes.append(
            dict(key, kind="heldout", panel=panel, prompt="plain", eval_iteration=16)
            | {"game": f"{panel}/{g}", "success": int(i < held + seed % 2), "task_id": i}
            | {"repeat": 0}
          )

  for arm in plan_mod.PILOT_ARMS:
    for seed in (0, 1):
      add(arm, 5e-4, seed, 3)
  held = {"grpo": 3, "sdar_sibling": 6}
  for seed in (0, 1):
    for arm in plan_mod.ARMS:
      config = (
        "configs/default.py:algo=sdar_vocab algo.context=hindsight" if arm == "sdar_vocab" else ""
      )
      add(arm, 1e-3, seed, 5, held.get(arm, 4), config)
  tables = records.Tables(str(folder))
  records.append(tables.outcomes, outcomes, records.OUTCOME_COLUMNS)
  records.append(tables.runs, runs, records.RUN_COLUMNS)
  return tables


def test_the_report_on_a_synthetic_table(tmp_path):
  tables = _synthetic(tmp_path / "tables")
  dest = str(tmp_path / "report")
  text = report_mod.report(tables, dest, resamples=200, seeds=(0, 1), pilot_seeds=(0, 1))
  assert "The rate: 0.001" in text and "context: hindsight" in text
  assert "| `grpo` | lr5.0e-04 | 0.375 | 0.375 | 0.375 |" in text
  primary = records.read(os.path.join(dest, "primary.csv"))
  assert len(primary) == 1 and primary[0]["comparison"] == "sdar_sibling - grpo"
  assert float(primary[0]["difference"]) == pytest.approx(3 / 8)
  assert (primary[0]["seeds"], primary[0]["games"]) == ("2", "8")
  paired = records.read(os.path.join(dest, "paired.csv"))
  assert len(paired) == 17
  assert ("sdar_vocab - sdar_hindsight", "final heldout_unseen") in {
    (r["comparison"], r["measure"]) for r in paired
  }
  assert ("sdar_sibling - grpo", "final heldout_seen") not in {
    (r["comparison"], r["measure"]) for r in paired
  }
  for name in ("report.md", "curves.png", "pilot.csv", "heldout.csv"):
    assert os.path.getsize(os.path.join(dest, name)) > 0
  # every compared row read in words: the primary with its own interval, the family's with theirs
  assert text.count("\nReading: ") == 1 and "own interval [" in text
  family, questions = text.split("## The questions")
  assert sum(line.startswith("* `") for line in family.splitlines()) == 17
  # the four questions' rows on both panels, the primary one with its own interval
  assert sum(line.startswith("* `") for line in questions.splitlines()) == 10
  (primary_line,) = [x for x in questions.splitlines() if "grpo`, final heldout_seen" in x][:1]
  assert "sdar_sibling - grpo" in primary_line and ": +0.375, own interval [" in primary_line
  assert "* `sdar_vocab - sdar_hindsight`, final heldout_unseen: not detected" in questions


def test_readings_say_only_what_the_interval_supports():
  row = dict(difference=0.02, ci_low=-0.01, ci_high=0.05, sim_low=-0.04, sim_high=0.08)
  assert report.reading({**row, "mark": "kept"}) == (
    "not detected: +0.020, simultaneous interval [-0.040, +0.080]; it leaves open a loss of up "
    "to 0.040 and a gain of up to 0.080"
  )
  assert report.reading({**row, "mark": "kept"}, "own").startswith(
    "not detected: +0.020, own interval [-0.010, +0.050]"
  )
  assert report.reading({**row, "mark": "rejected"}) == (
    "detected, above 0: +0.020, simultaneous interval [-0.040, +0.080] (the interval still holds 0)"
  )
  below = dict(difference=-0.1, ci_low=-0.15, ci_high=-0.05, sim_low=-0.2, sim_high=-0.01)
  assert report.reading({**below, "mark": "rejected"}).startswith("detected, below 0: -0.100")
  assert report.reading({**below, "mark": "kept"}).startswith(
    "not detected by the test, though the interval excludes 0"
  )
  assert report.reading({**row, "mark": "undecided"}).startswith("undecided")


def test_the_driver_announces_the_rate_once_whoever_decided_it(tmp_path, monkeypatch):
  from experiments import driver
  from experiments.contexts import run as run_mod

  out, lines, plans = str(tmp_path), [], []
  monkeypatch.setattr(plan_mod, "decide_vocab_context", lambda out, policy: "sibling")
  monkeypatch.setattr(plan_mod, "plan", lambda *a, **k: [])
  monkeypatch.setattr(driver, "play", lambda plan, **kw: plans.append(plan) or 0)
  assert run_mod.run(out=out, echo=lines.append) == 0
  (steps,) = plans
  steps()
  assert not any(line.startswith("rate decided") for line in lines)
  decision = {"chosen": 1e-3, "recorded": "2026-12-06T23:00:00", "pilot": {}}
  (tmp_path / plan_mod.RATE_FILE).write_text(json.dumps(decision))  # as `record` writes it
  steps()
  steps()
  assert [line for line in lines if line.startswith("rate decided")] == [
    "rate decided: the rate: 0.001 (the rule on the pilot's final successes: )"
  ]
