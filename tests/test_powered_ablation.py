"""bench/powered_ablation.py without training: the learning-rate rule fixed before any run, the
plan it derives from what finished (fake run folders), and that every step runs at the lowest
CPU priority."""

from __future__ import annotations

import os
import sys

import pytest

from tests.helpers import load_script
from tests.test_ablation import fake_run


@pytest.fixture(scope="module")
def powered():
  yield load_script("bench/powered_ablation.py", "powered_ablation")
  del sys.modules["powered_ablation"]


def test_the_rate_rule_final_success_then_auc_then_the_demo_rate(powered):
  # final valid_seen success decides
  assert powered.choose_rate({2.5e-4: [(0.3, 0.1)] * 2, 5e-4: [(0.2, 0.9)] * 2}) == 2.5e-4
  # a tie on it: the higher AUC
  tie = {2.5e-4: [(0.3, 0.2), (0.1, 0.2)], 1e-3: [(0.2, 0.4), (0.2, 0.4)], 5e-4: [(0.2, 0.1)] * 2}
  assert powered.choose_rate(tie) == 1e-3
  # a tie on both: the demo's 5e-4
  assert powered.choose_rate({r: [(0.2, 0.3)] * 2 for r in powered.RATES}) == 5e-4


def test_the_plan_grows_as_the_search_finishes(powered, tmp_path):
  out = str(tmp_path)
  steps = powered.plan(out, python="py")
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
      fake_run(powered.run_dir(out, "grpo", rate, seed), "grpo", seed, [(0, 0.1), (16, final)], 16)
  steps = powered.plan(out, python="py")
  assert powered.chosen_rates(out) == {"grpo": 1e-3}
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
  done = [s for s in steps if powered.step_done(s)]
  assert len(done) == 6 and all(s.kind == "train" and s.arm == "grpo" for s in done)


def _outcomes(folder, successes, prefix="val", step=16):
  """An outcomes_<prefix>.csv with one row per game (task ids 0..n-1)."""
  from sdar_jax.observe.transcripts import OUTCOME_COLUMNS

  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, f"outcomes_{prefix}.csv"), "w") as f:
    f.write(",".join(OUTCOME_COLUMNS) + "\n")
    for task, won in enumerate(successes):
      f.write(f"a,0,{step},s,0,{task},g{task},t,{won},{10 * won}\n")


def test_the_report_pairs_seeds_and_games_and_corrects_across_comparisons(powered, tmp_path):
  """Two arms, seeds 0 and 1 at the chosen rate 5e-4, 4 held-out games a panel: the table's
  means and the paired differences worked by hand."""
  out, dest = str(tmp_path / "runs"), str(tmp_path / "report")
  for arm in ("grpo", "sdar_vocab"):
    for rate in powered.RATES:
      for seed in (0, 1):
        final = 0.5 if rate == 5e-4 else 0.1
        run = powered.run_dir(out, arm, rate, seed)
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
        _outcomes(held, [0, 0, 0, 1], prefix="val_heldout_unseen")
        with open(os.path.join(held, "evaluation.json"), "w") as f:
          f.write("{}")
  path = powered.report(out, dest, resamples=500)
  text = open(path).read()
  rows = {
    r["arm"]: r for r in __import__("csv").DictReader(open(os.path.join(dest, "summary.csv")))
  }
  assert float(rows["grpo"]["heldout_seen"]) == pytest.approx(0.375)  # (1/4 + 2/4) / 2
  assert float(rows["sdar_vocab"]["heldout_seen"]) == pytest.approx(0.625)
  assert float(rows["grpo"]["heldout_unseen"]) == pytest.approx(0.25)
  # per-game AUC over steps 0 and 16 is the mean of the two outcomes: grpo 3/8, sdar_vocab 4/8
  assert float(rows["sdar_vocab"]["valid_seen_auc"]) - float(rows["grpo"]["valid_seen_auc"]) == (
    pytest.approx(0.125)
  )
  assert float(rows["grpo"]["wall_min"]) == pytest.approx(5.0)  # 300 s; no held-out record
  # sdar_vocab - grpo: +0.25 on heldout_seen (2 seeds x 4 games), 0 on heldout_unseen
  assert "| sdar_vocab - grpo | final heldout_seen | 2 x 4 | +0.250 |" in text
  assert "| sdar_vocab - grpo | final heldout_unseen | 2 x 4 | +0.000 |" in text
  assert "Holm-corrected across the 3 comparisons shown" in text
  assert os.path.isfile(os.path.join(dest, "sdar_vocab/seed1/heldout/outcomes_val.csv"))
  assert os.path.isfile(os.path.join(dest, "grpo/seed0/eval/step_16/outcomes_val.csv"))
  assert os.path.isfile(os.path.join(dest, "curves.png"))
  # a report from a folder without the runs refuses to replace this one
  with pytest.raises(powered.collect.ReportShrinkError, match="holds 4 finished"):
    powered.report(str(tmp_path / "empty"), dest)
