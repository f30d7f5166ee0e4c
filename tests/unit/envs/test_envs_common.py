"""envs.common: the text helpers the environments share (hand-worked expected strings and numbers)
and the lock that guards a shared data cache."""

import os

import pytest

from envs.alfworld.projection import project_action as alfworld_project
from envs.common import (
  file_lock,
  format_history,
  project_each,
  project_tagged_action,
  steps_taken,
  success_rates,
)
from envs.skills.data_source_rules import DataSourceSkillRetriever
from envs.webshop.projection import project_action as webshop_project


def test_tagged_action_is_lowercased_and_stripped_between_the_tags():
  text = "<think>the fridge</think> <Action> Go To Fridge 1 </ACTION> trailing"
  assert project_tagged_action(text, 30) == ("go to fridge 1", True)


@pytest.mark.parametrize(
  "text",
  [
    "no think tags <action>open drawer 1</action>",  # <think> missing
    "<think>中</think><action>open drawer 1</action>",  # CJK character
  ],
)
def test_tagged_action_well_placed_but_invalid_format(text):
  assert project_tagged_action(text, 30) == ("open drawer 1", False)


def test_without_both_tags_the_env_gets_the_lowercased_tail():
  assert project_tagged_action("<think>x</think> ABCDEFGHIJ", 4) == ("ghij", False)
  # "</action>" only before "<action>": treated as missing tags, not an empty valid action.
  assert project_tagged_action("</action> <action>ABCDEF", 3) == ("def", False)


def test_alfworld_and_webshop_differ_only_in_the_tail_length():
  untagged = "0123456789abcdefghijklmnopqrstuvwxyzABCD"  # 40 characters
  assert alfworld_project(untagged) == ("abcdefghijklmnopqrstuvwxyzabcd", False)
  assert webshop_project(untagged) == ("klmnopqrstuvwxyzabcd", False)
  tagged = "<think>t</think><action>Click[Buy Now]</action>"
  assert alfworld_project(tagged) == webshop_project(tagged) == ("click[buy now]", True)


def test_project_each_keeps_the_batch_order():
  actions, valid = project_each(lambda t: (t.upper(), t == "b"), ["a", "b", "c"])
  assert actions == ["A", "B", "C"] and valid == [False, True, False]


def test_history_records_are_numbered_up_to_the_step_count():
  history = [("you see a mug", "take mug 1"), ("you hold a mug", "go to sink 1")]
  assert format_history(history, 5) == (
    "[Observation 4: 'you see a mug', Action 4: 'take mug 1']\n"
    "[Observation 5: 'you hold a mug', Action 5: 'go to sink 1']"
  )
  assert format_history([], 3) == ""


def test_steps_taken_defaults_to_the_history_length_and_rejects_a_smaller_step():
  assert steps_taken([("o", "a")] * 3, None) == 3
  assert steps_taken([("o", "a")] * 3, 7) == 7  # only the last records were passed
  with pytest.raises(ValueError, match="step=2 is smaller than the 3 history records"):
    steps_taken([("o", "a")] * 3, 2)


def test_success_rates_per_group_sorted_then_overall():
  rates = success_rates([("b", True), ("a", True), ("a", False), ("b", True), ("a", False)])
  assert list(rates) == ["a_success_rate", "b_success_rate", "success_rate"]
  assert rates["a_success_rate"] == pytest.approx(1 / 3)
  assert rates["b_success_rate"] == 1.0
  assert rates["success_rate"] == pytest.approx(3 / 5)
  assert success_rates([]) == {}


def test_data_source_retriever_replaces_only_the_rules_strategy():
  assert DataSourceSkillRetriever(strategy="none").privileged_block(task_type="popqa") == ""
  rules = DataSourceSkillRetriever(strategy="rules")
  general_only = rules.skill_text(task_type="unknown_source")
  with_lookup = rules.skill_text(task_type="popqa")
  assert with_lookup.startswith(general_only + "\n\n") and len(with_lookup) > len(general_only)


def test_file_lock_excludes_another_holder_until_released(tmp_path):
  """Another open of the lock file (as another process would) cannot take it while it is held."""
  import fcntl

  path = str(tmp_path / "cache" / "entry.lock")

  def try_take() -> bool:
    with open(path, "w") as other:
      try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        return False
      fcntl.flock(other, fcntl.LOCK_UN)
      return True

  with file_lock(path):
    assert not try_take()
  assert try_take()


def test_runs_started_together_generate_each_offline_split_once(tmp_path, monkeypatch):
  """Two runs asking for the same offline ALFWorld cache at once: one generates each split, the
  other waits and finds it complete (before the lock, the second rewrote games the first was
  already reading, and one run validated on 47 of its 48 games)."""
  import threading
  import time

  import ml_collections

  from envs.alfworld import data, generator

  calls = []

  def slow_generate(out, split, n, seed, types, workers=1, rooms="full"):
    calls.append(split)
    time.sleep(0.3)  # long enough for the other run to arrive while this one generates
    os.makedirs(os.path.join(out, split), exist_ok=True)
    for i in range(n):
      open(os.path.join(out, split, f"game-{i}"), "w").close()

  monkeypatch.setattr(generator, "generate_split", slow_generate)
  monkeypatch.setenv("SDAR_DATA_CACHE", str(tmp_path))
  env = ml_collections.ConfigDict(
    {
      "task_types": "look_at_obj_in_light",
      "offline": {"num_train": 3, "num_eval": 2, "seed": 0, "rooms": "small"},
    }
  )
  found = []

  def run():
    out = data.offline_dir(env, "train")
    found.append(sorted(os.listdir(os.path.join(out, "train"))))

  threads = [threading.Thread(target=run) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert calls == ["train"]
  assert found == [["game-0", "game-1", "game-2"]] * 2


def test_heldout_panels_have_their_own_games_and_leave_the_other_splits_alone(
  monkeypatch, tmp_path
):
  """heldout_seen / heldout_unseen draw env.offline.num_heldout games per task type from the
  valid_seen / valid_unseen distributions with env.offline.heldout_seed, in a folder of their
  own: valid_seen's folder (and so its draw) is the one it is without them."""
  import ml_collections

  from envs.alfworld import data, generator
  from envs.errors import EnvInputError

  calls = []

  def fake_generate(out, split, n, seed, types, workers=1, rooms="full"):
    calls.append((os.path.basename(out), split, n, seed, rooms))
    folder = os.path.join(out, split, "look_at_obj_in_light-x", f"trial_{split}_s{seed}")
    for i in range(n):
      os.makedirs(f"{folder}_{i}", exist_ok=True)
      with open(os.path.join(f"{folder}_{i}", "game.tw-pddl"), "w") as f:
        f.write('{"solvable": true}')

  monkeypatch.setattr(generator, "generate_split", fake_generate)
  monkeypatch.setattr(data, "collect_game_files", lambda folder, split, types: (folder, split))
  monkeypatch.setenv("SDAR_DATA_CACHE", str(tmp_path))
  offline = {"num_train": 3, "num_eval": 2, "seed": 0, "rooms": "small"}
  env = ml_collections.ConfigDict({"task_types": "look_at_obj_in_light", "offline": offline})
  seen_before = data.offline_dir(env, "valid_seen")
  env.offline.num_heldout = 4
  env.offline.heldout_seed = 7
  assert data.offline_dir(env, "valid_seen") == seen_before
  folder, split = data.game_files(env, "heldout_unseen")
  assert split == "valid_unseen" and folder != seen_before
  assert data.game_files(env, "heldout_seen") == (folder, "valid_seen")
  assert calls == [
    ("alfworld_offline_n3_e2_s0_small_look", "valid_seen", 2, 0, "small"),
    ("alfworld_heldout_n4_s7_small_look", "valid_unseen", 4, 7, "small"),
    ("alfworld_heldout_n4_s7_small_look", "valid_seen", 4, 7, "small"),
  ]
  env.offline.heldout_seed = 0
  with pytest.raises(EnvInputError, match="heldout_seed=0 equals env.offline.seed"):
    data.offline_dir(env, "heldout_seen")
  env.offline.num_heldout = 0
  with pytest.raises(EnvInputError, match="num_heldout > 0"):
    data.offline_dir(env, "heldout_seen")
  env.data_dir = str(tmp_path)
  env.offline.num_heldout = 4
  env.offline.heldout_seed = 7
  with pytest.raises(EnvInputError, match="panel of the offline generated games"):
    data.game_files(env, "heldout_seen")
