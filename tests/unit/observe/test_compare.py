"""`python -m sdar_jax.compare` on run folders written here in the trainer's formats: a run beside
its paper row under each environment's averaging rule, and two arms paired on their seeds."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from sdar_jax.observe import pairing, paper_table, stats
from sdar_jax.observe.transcripts import write_outcomes
from sdar_jax.rollout.trajectory import Episode


def _write_run(
  root, name, *, env="alfworld", arm="sdar", seed=0, rows=(), paper=None, evals=None, label=None,
  games="g",
):  # fmt: skip
  run = os.path.join(root, name)
  os.makedirs(run)
  config = {
    "model": {"preset": "tiny", "path": None},
    "env": {"name": env, "data_dir": None, "skills": {"dir": None, "rules_version": "pre_fix"}},
    "train": {"seed": seed, "total_steps": 16},
    "eval": {"split": "valid_seen", "num_tasks": 64, "skills": "without"},
    "rollout": {"val_temperature": 0.4},
    "algo": {"name": arm},
  }
  if label is not None:
    config["run"] = {"arm": label}
  if paper is not None:
    config["paper"] = paper
  with open(os.path.join(run, "config.json"), "w") as f:
    json.dump(config, f)
  with open(os.path.join(run, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  for step, outcomes in (evals or {}).items():
    episodes = [Episode(k, task_id=k, group_id=k, won=bool(w)) for k, w in enumerate(outcomes)]
    for k, ep in enumerate(episodes):  # a game's identity: its file below the cache's sdar_jax/
      ep.gamefile = f"/home/u/.cache/sdar_jax/set/valid_seen/{games}{k}/game.tw-pddl"
    out = os.path.join(run, "eval", f"step_{step}")
    write_outcomes(out, "val", episodes, arm=arm, seed=seed, step=step, split="valid_seen")
  return run


def test_search_qa_run_beside_its_paper_row_uses_the_macro_mean(tmp_path):
  reported = {"nq": 40.0, "hotpotqa": 30.0, "avg": 35.0}
  row = {"step": 16, "val/success_rate": 0.5, "val/macro_success_rate": 0.45}
  row |= {"val/nq_success_rate": 0.6, "val/hotpotqa_success_rate": 0.3}
  paper = {"row": "sdar", "model": "qwen2.5-3b", "env": "search_qa", "reads": "without"}
  run = _write_run(
    str(tmp_path),
    "run",
    env="search_qa",
    rows=[{"step": 0}, row],
    paper={**paper, "reported": reported},
  )
  result = paper_table.run_vs_paper(run)
  assert result.step == 16 and result.row == "sdar"
  assert result.columns["avg"] == pytest.approx((45.0, 35.0))  # the macro mean, not 50
  assert result.columns["nq"] == pytest.approx((60.0, 40.0))
  text = result.markdown()
  assert "| avg | 45.0 | 35.0 | +10.0 |" in text and "macro mean" in text
  assert any(line.startswith("model: tiny (the paper: qwen2.5-3b)") for line in result.differences)


def test_alfworld_avg_is_the_overall_rate_and_a_run_without_a_paper_row_still_shows():
  row = {"step": 8, "val/success_rate": 0.25, "val/pick_and_place_simple_success_rate": 0.5}
  assert paper_table.our_columns("alfworld", row, "val")["avg"] == 25.0
  assert paper_table.our_columns("alfworld", row, "val")["pick"] == 50.0
  assert paper_table.our_columns("alfworld", row, "val")["heat"] is None


def test_two_arms_are_paired_on_seeds_and_games(tmp_path):
  """Arm "sdar" beats "grpo" on game 0 of both seeds at the final step, loses game 3 of seed 1,
  ties elsewhere: the difference is (2 - 1) / 8; the seeds' mean differences are 1/4 and 0, so
  both sign assignments reach |1/8|: the seed-level sign-flip p is 1."""
  root = str(tmp_path)
  runs = [
    _write_run(root, "a0", arm="sdar", seed=0, evals={0: [0, 0, 1, 1], 8: [1, 0, 1, 1]}),
    _write_run(root, "a1", arm="sdar", seed=1, evals={0: [0, 0, 1, 1], 8: [1, 1, 0, 0]}),
    _write_run(root, "b0", arm="grpo", seed=0, evals={0: [0, 0, 1, 1], 8: [0, 0, 1, 1]}),
    _write_run(root, "b1", arm="grpo", seed=1, evals={0: [0, 0, 1, 1], 8: [0, 1, 0, 1]}),
  ]
  result = pairing.paired_arms(runs, resamples=2000, rng_seed=3)
  assert (result.arm_a, result.arm_b, result.seeds) == ("sdar", "grpo", [0, 1])
  final = result.final  # sdar - grpo: the arm of the first run given first
  assert (final.seeds, final.games) == (2, 4)
  assert final.difference == pytest.approx(1 / 8)
  assert final.sign_flip_p == pytest.approx(1.0)
  assert final.ci_low <= final.difference <= final.ci_high
  # AUC over steps 0 and 8: each game's (first + last) / 2; differences only where final differs.
  assert result.auc.difference == pytest.approx(1 / 16)
  want = stats.paired_comparison(
    np.array([[1, 0, 1, 1], [1, 1, 0, 0]]), np.array([[0, 0, 1, 1], [0, 1, 0, 1]]), 2000, 3
  )
  assert final == want
  assert "95% CI" in pairing.compare_runs(runs, resamples=200)
  from sdar_jax.observe import collect  # a sweep's table pairs its two arms the same way

  md = open(collect.collect_sweep(root, str(tmp_path / "table"))["md"]).read()
  assert "### sdar - grpo, paired on seeds [0, 1]" in md and "+0.125, 95% CI [" in md


def test_arms_are_labels_games_are_files_and_ambiguity_is_refused(tmp_path):
  """Two forms of one preset pair by their run.arm labels; games pair by file, so two runs of
  other game sets share none; one label and seed twice, or three arms, is refused."""
  root = str(tmp_path)
  a = _write_run(root, "a", arm="sdar_vocab", evals={8: [1, 1, 0, 0]})
  b = _write_run(root, "b", arm="sdar_vocab", label="sdar_vocab_noskills", evals={8: [0, 1, 0, 0]})
  result = pairing.paired_arms([a, b], resamples=200)
  assert (result.arm_a, result.arm_b) == ("sdar_vocab", "sdar_vocab_noskills")
  assert result.final.difference == pytest.approx(1 / 4)
  twin = _write_run(root, "twin", arm="sdar_vocab", evals={8: [0, 0, 0, 0]})
  with pytest.raises(pairing.CompareError, match=r"a and .*twin are both arm 'sdar_vocab', seed 0"):
    pairing.paired_arms([a, twin])
  # a run from before run.arm: its arm given on the command line (an experiment's runs.csv has it)
  from sdar_jax.compare import main

  assert main([a, twin, "--arm", f"{twin}=old_twin", "--resamples", "200"]) == 0
  third = _write_run(root, "c", arm="grpo", evals={8: [0, 0, 0, 0]})
  with pytest.raises(pairing.CompareError, match="3 arms"):
    pairing.paired_arms([a, b, third])
  other = _write_run(root, "o", arm="grpo", evals={8: [1, 1, 1, 1]}, games="h")
  with pytest.raises(pairing.CompareError, match="share no validation game"):
    pairing.paired_arms([a, other])
  blind = _write_run(root, "blind", arm="grpo")  # no outcome files: not silently left out
  with pytest.raises(pairing.CompareError, match=r"blind: no per-game outcomes"):
    pairing.paired_arms([a, blind])


def test_cli_refuses_a_missing_folder_naming_the_fix(tmp_path, capsys):
  from sdar_jax.compare import main

  with pytest.raises(SystemExit) as exit_info:  # a user error: one message, status 2
    main([str(tmp_path / "nowhere")])
  assert exit_info.value.code == 2
  assert "Cannot compare: " in (err := capsys.readouterr().err) and "Traceback" not in err
  assert "Fix: pass existing run folders" in err
  os.makedirs(tmp_path / "empty")
  with pytest.raises(SystemExit) as exit_info:
    main([str(tmp_path / "empty")])
  assert exit_info.value.code == 2
  assert "no config.json and metrics.jsonl" in capsys.readouterr().err
