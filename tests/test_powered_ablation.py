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
