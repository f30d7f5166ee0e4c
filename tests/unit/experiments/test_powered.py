"""experiments.powered without training: the learning-rate rule fixed before any run, the plan it
derives from what finished (fake run folders), that every step runs at the lowest CPU priority,
and that finished steps reach the tidy tables and come back from them."""

from __future__ import annotations

import csv
import json
import os

import pytest

import experiments.powered.__main__ as cli
from experiments import driver, records, report, tables_view
from experiments.powered import plan
from experiments.powered import run as runner_mod
from tests.unit.experiments.test_ablation import fake_run


def test_the_rate_rule_final_success_then_auc_then_the_demo_rate():
  # final valid_seen success decides
  assert plan.choose_rate({2.5e-4: [(0.3, 0.1)] * 2, 5e-4: [(0.2, 0.9)] * 2}) == 2.5e-4
  # a tie on it: the higher AUC
  tie = {2.5e-4: [(0.3, 0.2), (0.1, 0.2)], 1e-3: [(0.2, 0.4), (0.2, 0.4)], 5e-4: [(0.2, 0.1)] * 2}
  assert plan.choose_rate(tie) == 1e-3
  # a tie on both: the demo's 5e-4
  assert plan.choose_rate({r: [(0.2, 0.3)] * 2 for r in plan.RATES}) == 5e-4


def test_the_plan_grows_as_the_search_finishes(tmp_path):
  out = str(tmp_path)
  steps = plan.plan(out, python="py")
  # the search: 3 arms x 3 rates x 2 seeds, then the initial policy's held-out evaluation
  assert len(steps) == 19 and steps[-1].arm == "initial" and steps[-1].kind == "heldout"
  assert all(s.command[:3] == ("nice", "-n", "19") for s in steps)
  noskills = [s for s in steps if s.arm == "sdar_vocab_noskills"]
  assert all("--config.env.skills.strategy=none" in s.command for s in noskills)
  assert all("--config=configs/default.py:algo=sdar_vocab" in s.command for s in noskills)
  # grpo's search finishes: 1e-3 wins on final success (0.5 vs 0.3 / 0.2)
  finals = {2.5e-4: 0.2, 5e-4: 0.3, 1e-3: 0.5}
  for rate, final in finals.items():
    for seed in (0, 1):
      fake_run(plan.run_dir(out, "grpo", rate, seed), "grpo", seed, [(0, 0.1), (16, final)], 16)
  steps = plan.plan(out, python="py")
  assert plan.chosen_rates(out) == {"grpo": 1e-3}
  assert os.path.isfile(os.path.join(out, "chosen_rates.json"))
  added = steps[19:]
  # seeds 0 and 1 are reused (held-out evaluation only); seeds 2-7 train first
  assert [(s.kind, s.seed) for s in added[:4]] == [
    ("heldout", 0),
    ("heldout", 1),
    ("train", 2),
    ("heldout", 2),
  ]
  assert len(added) == 2 + 6 * 2 and {s.rate for s in added} == {1e-3}
  held = added[0]
  assert f"--output={os.path.join(held.workdir, 'heldout')}" in held.command
  assert "--config.eval.split=heldout_seen" in held.command
  assert "--config.env.offline.num_heldout=128" in held.command
  done = [s for s in steps if plan.step_done(s)]
  assert len(done) == 6 and all(s.kind == "train" and s.arm == "grpo" for s in done)


def _outcomes(folder, successes, prefix="val", step=16):
  """An outcomes_<prefix>.csv with one row per game (task ids 0..n-1, game files g0..), its split
  the one the file holds: valid_seen during training, heldout_seen / heldout_unseen after."""
  from sdar_jax.observe.transcripts import OUTCOME_COLUMNS

  held = os.path.basename(folder).startswith("heldout")
  split = "heldout_unseen" if prefix.endswith("heldout_unseen") else "valid_seen"
  split = "heldout_seen" if held and split == "valid_seen" else split
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, f"outcomes_{prefix}.csv"), "w") as f:
    f.write(",".join(OUTCOME_COLUMNS) + "\n")
    for task, won in enumerate(successes):
      f.write(f"a,0,{step},{split},0,{task},g{task},t,{won},{10 * won},3\n")


def _evaluated(folder, finished=True):
  """The evaluation.json a `sdar_jax.evaluate` run leaves: `started` when it begins, `finished`
  added at its end."""
  from sdar_jax.run.evaluation import write_eval_record

  times = {"started": "2026-12-04 21:00:00 +0000"}
  if finished:
    times["finished"] = "2026-12-04 21:02:30 +0000"
  write_eval_record(folder, {"checkpoint_dir": folder, "step": 16}, **times)


def test_a_killed_evaluation_is_not_done(tmp_path):
  """An evaluation killed after its start left its evaluation.json without `finished`: its step
  is still to do (and is played again), as is one whose record was cut off mid-write."""
  out = str(tmp_path)
  step = plan.heldout_step(out, "grpo", 5e-4, 0, "py")
  os.makedirs(step.results)
  assert not plan.step_done(step)
  _evaluated(step.results, finished=False)
  assert not plan.step_done(step)
  with open(os.path.join(step.results, "evaluation.json"), "w") as f:
    f.write('{"evaluated": {"ste')
  assert not plan.step_done(step)
  _evaluated(step.results)
  assert plan.step_done(step)


def test_steps_are_counted_under_the_commits_that_ran_them(tmp_path):
  out = str(tmp_path)
  first, second, old = (plan.heldout_step(out, "grpo", 5e-4, s, "py") for s in (0, 1, 2))
  for step, commits in ((first, ["aaa"]), (second, ["aaa", "bbb"]), (old, [None])):
    os.makedirs(step.results)
    attempts = [{"started": 0.0, "returncode": 0} | ({"commit": c} if c else {}) for c in commits]
    with open(os.path.join(step.results, "run_status.json"), "w") as f:
      json.dump({"attempts": attempts, "finished": True}, f)
  found = runner_mod.step_commits([first, second, old])
  assert found == {"aaa": [first.label, second.label], "bbb": [second.label],
                   "not recorded": [old.label]}  # fmt: skip
  assert runner_mod._commit_lines(found) == [
    "code at aaa: 2 step(s)", "code at bbb: 1 step(s)", "code at not recorded: 1 step(s)"
  ]  # fmt: skip


def _report(out, tmp_path, stage):
  """Appends the finished steps of this stage and those before it to tables in tmp_path (stage 2
  reuses stage 1's runs) and writes the stage's report from them."""
  tables = records.Tables(str(tmp_path / "tables"))
  for earlier in range(1, stage + 1):
    runner_mod.record(out, tables, earlier, python="py")
  dest = str(tmp_path / f"report{stage}")
  return report.report(tables, cli.spec(stage, dest), resamples=500), dest


def test_the_report_pairs_seeds_and_games_from_the_tables(tmp_path):
  """Two arms, seeds 0 and 1 at the chosen rate 5e-4, 4 held-out games a panel: the table's
  means and the paired differences worked by hand, from the tables alone."""
  out = str(tmp_path / "runs")
  for arm in ("grpo", "sdar_vocab"):
    for rate in plan.RATES:
      for seed in (0, 1):
        final = 0.5 if rate == 5e-4 else 0.1
        run = plan.run_dir(out, arm, rate, seed)
        fake_run(run, arm, seed, [(0, 0.25), (16, final)], 16, seconds=300.0)
        if rate != 5e-4:
          continue
        # valid_seen: 4 games at steps 0 and 16
        _outcomes(os.path.join(run, "eval/step_0"), [0, 1, 0, 0], step=0)
        _outcomes(
          os.path.join(run, "eval/step_16"), [1, 1, 0, 0] if arm == "grpo" else [1, 1, 1, 0]
        )
        held = os.path.join(run, "heldout")
        seen = {"grpo": [[1, 0, 0, 0], [1, 1, 0, 0]], "sdar_vocab": [[1, 1, 0, 0], [1, 1, 1, 0]]}
        _outcomes(held, seen[arm][seed])
        # sdar_vocab seed 1 scored 3 of the 4 unseen games (one episode lost)
        _outcomes(held, [0, 0, 0, 1][: 3 if (arm, seed) == ("sdar_vocab", 1) else 4],
                  prefix="val_heldout_unseen")  # fmt: skip
        _evaluated(held)
  # a search run whose evaluation at iteration 8 lost 3 episodes to env failures
  with open(os.path.join(plan.run_dir(out, "grpo", 1e-3, 0), "metrics.jsonl"), "a") as f:
    f.write(json.dumps({"step": 8, "val/success_rate": 0.2, "val/env_failures": 3.0}) + "\n")
  lost = (
    "episodes lost to env failures: train grpo lr1.0e-03 seed 0, iteration 8: val/env_failures=3"
  )
  assert lost in runner_mod.status(out)
  path, dest = _report(out, tmp_path, 1)
  text = open(path).read()
  rows = {r["arm"]: r for r in csv.DictReader(open(os.path.join(dest, "summary.csv")))}
  assert float(rows["grpo"]["heldout_seen"]) == pytest.approx(0.375)  # (1/4 + 2/4) / 2
  assert float(rows["sdar_vocab"]["heldout_seen"]) == pytest.approx(0.625)
  assert float(rows["grpo"]["heldout_unseen"]) == pytest.approx(0.25)
  # per-game AUC over steps 0 and 16 is the mean of the two outcomes: grpo 3/8, sdar_vocab 4/8
  assert float(rows["sdar_vocab"]["valid_seen_auc"]) - float(rows["grpo"]["valid_seen_auc"]) == (
    pytest.approx(0.125)
  )
  assert float(rows["grpo"]["wall_min"]) == pytest.approx(5.0)  # 300 s; no held-out record
  # sdar_vocab - grpo: +0.25 on heldout_seen (2 seeds x 4 games); on heldout_unseen only the 3
  # games every policy of both arms played are paired: 0 difference
  assert "| sdar_vocab - grpo | final heldout_seen | 2 x 4 | +0.250 |" in text
  assert "| sdar_vocab - grpo | final heldout_unseen | 2 x 3 | +0.000 |" in text
  assert "one family of 3 rows" in text and "level 1 - 0.05/3" in text
  assert "sdar_vocab/lr5.0e-04/seed1 heldout heldout_unseen: 3 of 4" in text
  assert os.path.isfile(os.path.join(dest, "curves.png"))
  # the same steps are appended once
  tables = records.Tables(str(tmp_path / "tables"))
  assert runner_mod.record(out, tables, 1, python="py") == 0


# ------------------------------------------------------------------------------- second stage
def _search(out, arm, chosen, seeds=(0, 1)):
  """An arm's finished search whose rule picks `chosen` (final 0.5 there, 0.1 elsewhere)."""
  for rate in plan.RATES:
    for seed in seeds if rate == chosen else (0, 1):
      final = 0.5 if rate == chosen else 0.1
      fake_run(plan.run_dir(out, arm, rate, seed), arm, seed, [(0, 0.25), (16, final)], 16)


def test_stage_two_plans_its_arms_and_reuses_stage_one(tmp_path, monkeypatch):
  from sdar_jax.algos import ALGO_PRESETS

  out = str(tmp_path)
  # every stage-2 arm runs an existing preset; AgentOPSD's reads the teacher from the rollout
  assert {preset for preset, _ in plan.STAGE2_ARMS.values()} <= set(ALGO_PRESETS)
  assert ALGO_PRESETS["agent_opsd_rms"].teacher_source == "rollout"
  steps = plan.plan(out, python="py", stage=2)
  # the search: 6 arms x 3 rates x 2 seeds, arm-major, then the initial policy with skills
  assert len(steps) == 37 and all(s.kind == "train" for s in steps[:36])
  assert list(dict.fromkeys(s.arm for s in steps[:36])) == list(plan.STAGE2_ARMS)
  ungated = [s for s in steps if s.arm == "sdar_vocab_ungated"]
  assert all("--config=configs/default.py:algo=sdar_vocab" in s.command for s in ungated)
  assert all("--config.algo.beta=0.0" in s.command for s in ungated)
  assert "--config=configs/default.py:algo=agent_opsd_rms" in steps[30].command
  initial = steps[36]
  assert (initial.kind, initial.arm) == ("heldout_skills", "initial")
  assert "--config.eval.skills=with" in initial.command
  assert f"--output={os.path.join(out, 'initial', 'heldout_skills')}" in initial.command
  assert all(s.command[:3] == ("nice", "-n", "19") for s in steps)
  # stage 1: grpo chose 5e-4 and trained seeds 0-3 there; sdar_vocab's search is unfinished
  _search(out, "grpo", 5e-4, seeds=(0, 1, 2, 3))
  fake_run(plan.run_dir(out, "sdar_vocab", 5e-4, 0), "sdar_vocab", 0, [(0, 0.2), (16, 0.3)], 16)
  _search(out, "sdar", 1e-3)  # stage 2's sdar chose 1e-3
  steps = plan.plan(out, python="py", stage=2)
  added = [(s.kind, s.arm, s.seed) for s in steps[37:]]
  # first grpo's seed-0 run once more, by this commit, into commit_check/
  assert added.pop(0) == ("train", "grpo_commit_check", 0)
  check = steps[37]
  assert check.workdir == os.path.join(out, "commit_check", "grpo", "lr5.0e-04", "seed0")
  assert "--config=configs/default.py:algo=grpo" in check.command
  assert "--config.optim.lr=0.0005" in check.command and "--config.train.seed=0" in check.command
  assert added[:4] == [
    ("heldout_skills", "grpo", 0),  # a reused run: evaluated with skills only
    ("heldout", "sdar", 0),
    ("heldout_skills", "sdar", 0),
    ("heldout_skills", "grpo", 1),
  ]
  # grpo's seed 4 is not trained yet: not planned; sdar trains seeds 2-4 itself
  assert ("heldout_skills", "grpo", 4) not in added and ("train", "sdar", 4) in added
  assert len(added) == 4 + 5 * 2 + 3
  # stage 2 never trains (nor plans the training of) a stage-1 arm
  assert not [s for s in steps if s.kind == "train" and s.arm in plan.ARMS]
  # its rates go to their own file; stage 1's is left to stage 1
  assert not os.path.exists(os.path.join(out, "chosen_rates.json"))
  record = json.load(open(os.path.join(out, "chosen_rates_stage2.json")))
  assert {a: r["chosen"] for a, r in record.items()} == {"grpo": 5e-4, "sdar": 1e-3}
  # the with-skills evaluation gives every arm the same skills: the control's strategy=none goes
  held = plan.heldout_step(out, "sdar_vocab_noskills", 5e-4, 0, "py", skills=True)
  assert "--config.env.skills.strategy=none" not in held.command
  assert "--config.eval.skills=with" in held.command and held.results.endswith("heldout_skills")
  assert "--config.env.skills.strategy=none" in (
    plan.heldout_step(out, "sdar_vocab_noskills", 5e-4, 0, "py").command
  )
  assert "131 in all" in runner_mod.status(out, python="py", stage=2)
  # stage 2 waits for stage 1 (61 steps; 9 done: grpo's search and its seeds 2, 3, and one run
  # of sdar_vocab's search)
  assert plan.steps_left(out, 1) == 61 - 9
  started = []
  monkeypatch.setattr(runner_mod, "run", lambda out, **kw: started.append(kw["stage"]) or 0)
  assert cli.main(["run", "--stage", "2", "--out", out]) == 2 and not started
  assert cli.main(["run", "--stage", "2", "--out", out, "--before-stage-1-ends"]) == 0
  assert started == [2]
  with open(driver.AUTOGROUP) as f:  # the session it ran in went to the lowest priority (conftest:
    assert f.read() == "19"  # a file of the test's, not the suite's own session)


def _metrics(run, rows):
  """Appends training rows {step: {key: value}} to a fake run's metrics.jsonl."""
  with open(os.path.join(run, "metrics.jsonl"), "a") as f:
    for step, row in sorted(rows.items()):
      f.write(json.dumps({"step": step, **row}) + "\n")


def test_stage_two_report_internalisation_dynamics_and_retirement(tmp_path):
  """grpo (stage 1) and sdar, grpo_opsd, retire_opd (stage 2) at 5e-4, seeds 0 and 1, 4 held-out
  games a panel; the with-minus-without difference worked by hand."""
  out, dest = str(tmp_path / "runs"), str(tmp_path / "report")
  without = {"grpo": [[1, 0, 0, 0], [1, 1, 0, 0]], "sdar": [[0, 0, 1, 1], [0, 1, 1, 0]]}
  with_ = {"grpo": [[1, 1, 0, 0], [1, 1, 1, 1]], "sdar": [[0, 0, 1, 0], None]}
  for arm in ("grpo", "sdar", "grpo_opsd", "retire_opd"):
    _search(out, arm, 5e-4)
    for seed in (0, 1):
      run = plan.run_dir(out, arm, 5e-4, seed)
      for step, won in ((0, [0, 1, 0, 0]), (16, [1, 1, 0, 0])):
        _outcomes(os.path.join(run, f"eval/step_{step}"), won, step=step)
      held = os.path.join(run, "heldout")
      _outcomes(held, without.get(arm, [[1, 0, 1, 0]] * 2)[seed])
      _outcomes(held, [0, 0, 0, 1], prefix="val_heldout_unseen")
      _evaluated(held)
      if with_.get(arm, [None, None])[seed]:
        skills = os.path.join(run, "heldout_skills")
        _outcomes(skills, with_[arm][seed])
        _outcomes(skills, [0, 0, 0, 1], prefix="val_heldout_unseen")
        _evaluated(skills)
      if arm in ("sdar", "grpo_opsd"):  # the gap: sdar -0.1 (seed 0) and -0.3 (seed 1)
        gap = -0.1 - 0.2 * seed if arm == "sdar" else 0.05
        rows = {s: {"sdar/teacher_gap_mean": gap, "sdar/positive_gap_share": 0.4} for s in (1, 2)}
        _metrics(run, rows)
      if arm == "retire_opd":
        retired = {"retire/retired_at": 8.0} if seed == 0 else {}
        _metrics(run, {8: {"retire/competence": 0.95, **retired}, 16: {"retire/competence": 1.0}})
  path, dest = _report(out, tmp_path, 2)
  text = open(path).read()
  assert text.startswith("# The powered ablation, second stage: report")
  # every arm against grpo and the gate on the reference form: one family of 12 rows
  assert "| sdar - grpo_opsd | final heldout_seen | 2 x 4 |" in text
  assert "| retire_opd - grpo | valid_seen AUC | 2 x 4 |" in text
  assert "one family of 12 rows" in text
  # internalisation: grpo gains (0+1+0+0 + 0+0+1+1) / 8 = +0.375 on heldout_seen (0.375 -> 0.75);
  # sdar was evaluated with skills on seed 0 alone: [0,0,1,0] - [0,0,1,1] = -0.25
  rows = {(r["arm"], r["measure"]): r for r in csv.DictReader(open(f"{dest}/internalisation.csv"))}
  grpo = rows[("grpo", "final heldout_seen")]
  assert (float(grpo["without"]), float(grpo["with"])) == pytest.approx((0.375, 0.75))
  assert float(grpo["difference"]) == pytest.approx(0.375) and grpo["seeds"] == "2"
  assert float(rows[("sdar", "final heldout_seen")]["difference"]) == pytest.approx(-0.25)
  assert rows[("sdar", "final heldout_seen")]["seeds"] == "1"
  assert float(rows[("grpo", "final heldout_unseen")]["difference"]) == 0.0
  assert "a family of its own (4 rows)" in text and "level 1 - 0.05/4" in text
  assert "| `grpo` | heldout_seen | 2 x 4 | 0.375 | 0.750 | +0.375 |" in text
  # the dynamics: sdar's gap mean -0.2 with the band [-0.3, -0.1]; grpo has no such metric
  dyn = list(csv.DictReader(open(os.path.join(dest, "dynamics.csv"))))
  sdar = [r for r in dyn if r["arm"] == "sdar" and r["metric"] == "sdar/teacher_gap_mean"]
  assert [int(r["iteration"]) for r in sdar] == [1, 2]
  assert [float(sdar[0][k]) for k in ("mean", "min", "max")] == pytest.approx([-0.2, -0.3, -0.1])
  assert {r["arm"] for r in dyn} == {"sdar", "grpo_opsd"}
  assert os.path.getsize(os.path.join(dest, "dynamics.png")) > 0
  # the retirement table: seed 0 retired after iteration 8, seed 1 did not
  assert "| 0 | iteration 8 | - | 1.000 | - |" in text and "| 1 | not retired |" in text


def test_the_commit_check_counts_the_valid_seen_outcomes_that_differ(tmp_path):
  out = str(tmp_path)
  tables = records.Tables(str(tmp_path / "tables"))
  first = plan.run_dir(out, "grpo", 5e-4, 0)
  again = plan.commit_check_step(out, 5e-4, "py").workdir
  for run, final in ((first, [1, 0, 1, 0]), (again, [1, 1, 1, 0])):
    fake_run(run, "grpo", 0, [(0, 0.25), (16, 0.5)], 16, seconds=60.0)
    _outcomes(os.path.join(run, "eval/step_0"), [0, 1, 0, 0], step=0)
    _outcomes(os.path.join(run, "eval/step_16"), final)
    key = {"experiment": "powered", "stage": 1, "arm": "grpo", "seed": 0, "lr": 5e-4}
    tables.add(*records.step_rows(run, run=os.path.relpath(run, out), kind="train", **key))
  view = tables_view.View(tables, "powered", 1, ("grpo",), (0,))
  assert view.runs == {"grpo": {0: "grpo/lr5.0e-04/seed0"}}  # the check is not an arm's run
  # 2 evaluations x 4 games; one game's final outcome differs
  (line,) = [x for x in tables_view.commit_check_lines(view) if x]
  assert "different in 1 of 8 (games x the 2 evaluations both logged)" in line


def _adopted_file(tmp_path, rates):
  path = tmp_path / "adopted.json"
  record = {
    arm: {
      "chosen": rate,
      "source": "search at commit abc",
      "search": {"lr5.0e-04": {"final": [0.3, 0.3]}},
    }
    for arm, rate in rates.items()
  }
  path.write_text(json.dumps(record))
  return str(path)


def test_adopted_rates_skip_the_search_and_train_every_seed(tmp_path):
  out = str(tmp_path / "out")
  adopted = _adopted_file(
    tmp_path, {"grpo": 5e-4, "sdar_vocab": 1e-3, "sdar_vocab_noskills": 2.5e-4}
  )
  assert plan.adopt(out, adopted) == {
    "grpo": 5e-4,
    "sdar_vocab": 1e-3,
    "sdar_vocab_noskills": 2.5e-4,
  }
  steps = plan.plan(out, python="py")
  # no search: the initial policy's evaluation, then per seed every arm's training and evaluation
  assert steps[0].arm == "initial"
  assert len(steps) == plan.STAGES[1].total_with(("grpo", "sdar_vocab", "sdar_vocab_noskills"))
  assert len(steps) == 1 + 8 * 3 * 2 == 49
  assert [(s.kind, s.arm, s.seed) for s in steps[1:5]] == [
    ("train", "grpo", 0), ("heldout", "grpo", 0), ("train", "sdar_vocab", 0),
    ("heldout", "sdar_vocab", 0),
  ]  # fmt: skip
  assert {s.rate for s in steps if s.arm == "sdar_vocab"} == {1e-3}
  record = json.load(open(os.path.join(out, "chosen_rates.json")))
  assert record["grpo"]["adopted"] and record["grpo"]["source"] == "search at commit abc"
  assert plan.steps_left(out, 1) == 49
  # the same file again is fine; other rates are refused, as is an arm with a search of its own
  plan.adopt(out, adopted)
  with pytest.raises(ValueError, match="already adopts other rates"):
    plan.adopt(out, _adopted_file(tmp_path, {"grpo": 1e-3}))
  fresh = str(tmp_path / "fresh")
  fake_run(plan.run_dir(fresh, "grpo", 1e-3, 0), "grpo", 0, [(0, 0.1), (16, 0.2)], 16)
  with pytest.raises(ValueError, match="search runs of 'grpo'"):
    plan.adopt(fresh, _adopted_file(tmp_path, {"grpo": 5e-4}))
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"grpo": {"chosen": 3e-4, "source": "x"}}))
  with pytest.raises(ValueError, match="'chosen'"):
    plan.adopt(fresh, str(bad))


def test_the_tables_restore_a_lost_machine_and_a_lost_run_trains_again(tmp_path, monkeypatch):
  """The tables keep the finished steps' records without weights; restored on a fresh machine,
  the finished steps stay done, and an evaluation whose run lost its weights trains the run again
  first, then gets back the evaluations that had finished."""
  out, fresh = str(tmp_path / "out"), str(tmp_path / "fresh")
  tables = records.Tables(str(tmp_path / "tables"))
  rates = {"grpo": 5e-4, "sdar_vocab": 1e-3, "sdar_vocab_noskills": 2.5e-4}
  plan.adopt(out, _adopted_file(tmp_path, rates))
  run0, run1 = plan.run_dir(out, "grpo", 5e-4, 0), plan.run_dir(out, "sdar_vocab", 1e-3, 0)
  for run in (run0, run1):
    fake_run(run, "grpo", 0, [(0, 0.1), (8, 0.2), (16, 0.3)], 16, seconds=400.0)
    os.makedirs(os.path.join(run, "checkpoints", "16"))
  _evaluated(os.path.join(run0, "heldout"))
  _outcomes(os.path.join(run0, "heldout"), [1, 0, 1])
  _evaluated(os.path.join(run1, "heldout"), finished=False)  # killed in flight
  # two training runs and one finished evaluation; the killed one is not a finished step
  assert runner_mod.record(out, tables, 1, python="py") == 3
  kinds = sorted((r["run"], r["kind"]) for r in tables.read("runs"))
  assert kinds == [("grpo/lr5.0e-04/seed0", "heldout"), ("grpo/lr5.0e-04/seed0", "train"),
                   ("sdar_vocab/lr1.0e-03/seed0", "train")]  # fmt: skip
  metrics = tables.read("metrics", run="grpo/lr5.0e-04/seed0", metric="val/success_rate")
  assert [(r["iteration"], r["value"]) for r in metrics] == [(0, 0.1), (8, 0.2), (16, 0.3)]
  written = runner_mod.restore(tables, fresh)
  assert written > 0 and runner_mod.restore(tables, fresh) == 0  # nothing written over
  plan.adopt(fresh, _adopted_file(tmp_path, rates))  # the same --adopt file as the first machine
  kept = records.Tables(str(tmp_path / "again"))
  runner_mod.record(fresh, kept, 1, python="py")
  outcomes = [(r["game"], r["success"]) for r in kept.read("outcomes", kind="heldout")]
  assert outcomes == [("g0", 1), ("g1", 0), ("g2", 1)]  # the restored records read back alike

  # the fresh machine: the runs' weights are gone; grpo's evaluation is done, sdar_vocab's not
  monkeypatch.setattr(
    runner_mod,
    "has_final_checkpoint",
    lambda run: os.path.isdir(os.path.join(run, "checkpoints")),
  )
  played = []

  def runner(cmd, stdout=None, stderr=None, cwd=None, **_):
    played.append(cmd)
    workdir = next(a.split("=", 1)[1] for a in cmd if a.startswith("--workdir="))
    if "sdar_jax.train" in cmd:
      fake_run(workdir, "grpo", 0, [(0, 0.1), (8, 0.2), (16, 0.3)], 16)
      os.makedirs(os.path.join(workdir, "checkpoints", "16"))
    else:
      _evaluated(next(a.split("=", 1)[1] for a in cmd if a.startswith("--output=")))

    class Done:
      returncode = 0

    return Done()

  lines = []
  assert runner_mod.run(fresh, python="py", runner=runner, echo=lines.append, max_steps=3) == 0
  kinds = [
    ("sdar_jax.train" in c, next(a for a in c if a.startswith("--workdir="))) for c in played
  ]
  seed1 = plan.run_dir(fresh, "sdar_vocab", 1e-3, 0)
  # the initial policy, then sdar_vocab's run trained again before its evaluation
  assert kinds[1:] == [(True, f"--workdir={seed1}"), (False, f"--workdir={seed1}")]
  assert any("final weights are gone" in line for line in lines)
  assert any("valid_seen outcomes differ from the records" in line for line in lines)
  assert os.path.isdir(seed1 + ".restored")
  # grpo's finished evaluation was not played again
  assert not any(f"--workdir={plan.run_dir(fresh, 'grpo', 5e-4, 0)}" in c for c in played)
