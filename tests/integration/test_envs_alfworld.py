"""ALFWorld on the real engine: generated games of every type are won by their walkthroughs, the env's
rules (reward 10·won, 50-step limit, no-op on malformed output), data-dir loading, the pool, and
the generator's determinism, splits and variety."""

import json
import os
import random
import re
from collections import Counter

import pytest

import envs
from envs.alfworld import AlfworldEnv, collect_game_files, generator, project_action
from envs.alfworld.catalog import LAMPS, ROOMS, scene_numbers
from envs.alfworld.engine import GameFileError
from envs.alfworld.problem import pddl_problem
from envs.alfworld.tasks import TASK_TYPES, extract_task, success_rates, task_type_from_path
from tests.helpers import copy_alfworld_games

# Every test here generates games or plays them on the real PDDL engine.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data_dir(alfworld_games, tmp_path_factory):
  """One checked game per task type in train, and two valid_unseen games (real engine + planner):
  the run-wide game set's splits."""
  out = str(tmp_path_factory.mktemp("alfworld"))
  return copy_alfworld_games(alfworld_games, out, ("train", "valid_unseen"))


@pytest.fixture(scope="module")
def train_games(data_dir):
  return collect_game_files(data_dir, "train")


def _walkthrough(gamefile):
  with open(gamefile) as f:
    return json.load(f)["walkthrough"]


def test_every_task_type_is_generated_once(train_games):
  assert sorted(task_type_from_path(g) for g in train_games) == sorted(TASK_TYPES)


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_walkthrough_wins_on_the_real_engine(train_games, task_type):
  (gamefile,) = [g for g in train_games if task_type_from_path(g) == task_type]
  env = AlfworldEnv.from_game_files([gamefile])
  obs, info = env.reset(0)
  assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
  assert info["task_type"] == task_type and info["gamefile"] == gamefile and not info["won"]
  assert info["task"] == extract_task(obs) and info["task"]
  actions = _walkthrough(gamefile)
  for n, action in enumerate(actions, 1):
    assert action in info["admissible_commands"]
    obs, reward, done, info = env.step(action)
    assert obs != "Nothing happens."
    if n < len(actions):
      assert (reward, done, info["won"]) == (0.0, False, False)
  assert (reward, done, info["won"]) == (10.0, True, True)
  # A finished episode stays finished and pays nothing more.
  assert env.step("look")[1:3] == (0.0, True)
  env.close()


def test_walkthrough_file_matches_the_games(data_dir, train_games):
  with open(os.path.join(data_dir, "walkthroughs", "train.jsonl")) as f:
    records = [json.loads(line) for line in f]
  assert sorted(r["task_type"] for r in records) == sorted(TASK_TYPES)
  for record in records:
    gamefile = os.path.join(data_dir, record["gamefile"])
    assert record["actions"] == _walkthrough(gamefile) == [s["action"] for s in record["steps"]]
    with open(os.path.join(os.path.dirname(gamefile), "traj_data.json")) as f:
      traj = json.load(f)
    assert traj["task_type"] == record["task_type"] and traj["walkthrough"] == record["actions"]
  # The recorded first step is what the engine shows at reset (checked on two games).
  env = AlfworldEnv.from_game_files(train_games)
  for record in records[:2]:
    obs, info = env.reset(train_games.index(os.path.join(data_dir, record["gamefile"])))
    assert record["steps"][0]["observation"] == obs
    assert record["steps"][0]["admissible_commands"] == info["admissible_commands"]
    assert record["task"] == info["task"] and record["task_type"] == info["task_type"]
  env.close()


def test_malformed_and_inadmissible_outputs(train_games):
  env = AlfworldEnv.from_game_files(train_games[:1])
  obs0, info = env.reset(0)
  # No action tags: the env gets the output's last 30 characters, a no-op; the step still counts.
  command, valid = project_action("I think I should go to the fridge now, really.")
  assert not valid and command == " go to the fridge now, really."
  obs, reward, done, info = env.step(command)
  assert (obs, reward, done, info["steps"]) == ("Nothing happens.", 0.0, False, 1)
  # Well-formed but not admissible: format-valid, and the engine answers with a no-op.
  command, valid = project_action("<think>fly</think><action>fly to the moon</action>")
  assert valid and command == "fly to the moon" and command not in info["admissible_commands"]
  obs, reward, done, info = env.step(command)
  assert (obs, reward, done) == ("Nothing happens.", 0.0, False)
  assert env.reset(0)[0] == obs0
  env.close()


def test_episode_ends_after_50_steps_without_a_win(train_games):
  env = AlfworldEnv.from_game_files(train_games[:1])
  env.reset(0)
  for n in range(1, 51):
    obs, reward, done, info = env.step("inventory")
    assert done == (n == 50) and reward == 0.0 and not info["won"]
  env.close()


def test_data_dir_splits_and_filters(data_dir):
  unseen = collect_game_files(data_dir, "valid_unseen")
  assert len(unseen) == 2
  heat = collect_game_files(data_dir, "train", task_types=["pick_heat_then_place_in_recep"])
  assert len(heat) == 1 and "pick_heat_then_place_in_recep" in heat[0]
  with pytest.raises(FileNotFoundError, match="valid_seen"):
    collect_game_files(data_dir, "valid_seen")
  assert envs.make("alfworld", data_dir=data_dir, split="train").num_tasks == len(TASK_TYPES)
  # reset() without a task walks a seeded shuffle of all games: every game once per pass.
  two_types = ["look_at_obj_in_light", "pick_two_obj_and_place"]
  env = envs.make("alfworld", data_dir=data_dir, split="train", task_types=two_types, seed=1)
  seen = [env.reset()[1]["task_type"] for _ in range(2)]
  assert sorted(seen) == sorted(two_types)
  again = envs.make("alfworld", data_dir=data_dir, split="train", task_types=two_types, seed=1)
  assert [again.reset()[1]["task_type"] for _ in range(2)] == seen
  env.close(), again.close()


def _broken_copy(gamefile, root, content):
  """A copy of `gamefile`'s folder under `root` whose game.tw-pddl holds `content` (bytes)."""
  task_folder, trial = os.path.normpath(os.path.dirname(gamefile)).split(os.sep)[-2:]
  folder = os.path.join(root, "train", task_folder, trial)
  os.makedirs(folder)
  path = os.path.join(folder, "game.tw-pddl")
  with open(path, "wb") as f:
    f.write(content)
  return path


def test_truncated_or_corrupted_game_files_are_named(train_games, tmp_path):
  with open(train_games[0], "rb") as f:
    good = f.read()
  truncated = _broken_copy(train_games[0], str(tmp_path / "cut"), good[: len(good) // 2])
  # Loading the data folder reads every game: the error names the file and says the fix.
  with pytest.raises(GameFileError, match=re.escape(truncated)) as err:
    collect_game_files(str(tmp_path / "cut"), "train")
  assert "not valid JSON" in str(err.value) and "envs.alfworld.generator" in str(err.value)
  # Playing an explicit list skips that read: the engine's load fails, named the same way.
  env = AlfworldEnv.from_game_files([train_games[0], truncated])
  with pytest.raises(GameFileError, match=rf"task 1: .*{re.escape(truncated)}"):
    env.reset(1)
  assert env.reset(0)[1]["gamefile"] == train_games[0]  # the env still plays good games
  env.close()
  # Valid JSON without the game's fields.
  hollow = _broken_copy(train_games[0], str(tmp_path / "hollow"), b'{"solvable": true}')
  with pytest.raises(GameFileError, match=rf"{re.escape(hollow)}.*pddl_domain"):
    collect_game_files(str(tmp_path / "hollow"), "train")


def test_make_without_data_explains_how_to_get_games():
  with pytest.raises(ValueError, match="envs.alfworld.generator"):
    envs.make("alfworld")


def test_pool_plays_group_copies_of_the_same_game(train_games):
  with envs.EnvPool(
    "alfworld", 4, env_kwargs={"game_files": train_games}, num_workers=2, timeout_s=120
  ) as pool:
    results = pool.reset(tasks=[2, 2, 4, 4])
    assert results[0].observation == results[1].observation
    assert (
      results[0].info["gamefile"] == train_games[2]
      and results[2].info["gamefile"] == train_games[4]
    )
    walkthrough = _walkthrough(train_games[2])
    # Copy 0 plays the walkthrough, copy 1 says something malformed: same game, different fates.
    for action in walkthrough:
      results = pool.step([action, "no tags here"], indices=[0, 1])
    assert results[0].info["won"] and results[0].reward == 10.0
    assert not results[1].info["won"] and results[1].observation == "Nothing happens."


# -- the generator without the engine (fast) ---------------------------------------------------


def _specs(task_type, split, n, seed=0):
  specs = []
  for i in range(n):
    rng = random.Random(f"{seed}:{split}:{task_type}:{i}")
    spec = None
    while spec is None:
      spec = generator.sample_spec(task_type, split, rng)
    specs.append(spec)
  return specs


def test_generation_is_deterministic_by_seed():
  a = [pddl_problem(s) for s in _specs("pick_two_obj_and_place", "train", 5, seed=1)]
  b = [pddl_problem(s) for s in _specs("pick_two_obj_and_place", "train", 5, seed=1)]
  c = [pddl_problem(s) for s in _specs("pick_two_obj_and_place", "train", 5, seed=2)]
  assert a == b and a != c


def test_valid_unseen_uses_held_out_scenes_only():
  unseen = {n for room in ROOMS.values() for n in scene_numbers(room, unseen=True)}
  seen = {n for room in ROOMS.values() for n in scene_numbers(room, unseen=False)}
  assert unseen and not unseen & seen
  for task_type in TASK_TYPES:
    assert all(s.scene in unseen for s in _specs(task_type, "valid_unseen", 10))
    assert all(s.scene in seen for s in _specs(task_type, "train", 10))


def test_generated_games_are_varied_and_sensible():
  rooms, objects, targets, receptacles = Counter(), Counter(), Counter(), set()
  for task_type in TASK_TYPES:
    for spec in _specs(task_type, "train", 30):
      rooms[spec.room] += 1
      objects[spec.object_target] += 1
      targets[spec.parent_target or spec.toggle_target] += 1
      receptacles |= {r.type for r in spec.receptacles}
      types = {r.id: r.type for r in spec.receptacles}
      goal_things = [t for t in spec.things if t.type == spec.object_target]
      assert len(goal_things) >= (2 if task_type == "pick_two_obj_and_place" else 1)
      if spec.parent_target:  # the task must not be done before the agent acts
        assert all(types[t.receptacle] != spec.parent_target for t in goal_things)
      assert len({t.type for t in spec.things}) >= 4  # goal type plus distractors
      if task_type == "pick_heat_then_place_in_recep":
        assert "Microwave" in types.values() and spec.parent_target != "Microwave"
      if task_type == "look_at_obj_in_light":
        assert any(t.type == spec.toggle_target for t in spec.things)
  assert set(rooms) == set(ROOMS)
  assert len(objects) >= 25 and len(targets) >= 12 and len(receptacles) >= 25


def test_small_rooms_keep_one_receptacle_per_class_and_stay_solvable(tmp_path):
  """rooms="small": at most one receptacle of each class (so 'go to' lists are short), a few
  distractor kinds, and every generated game still won by its planner-checked walkthrough."""
  sizes = {"full": [], "small": []}
  for rooms in sizes:
    for task_type in TASK_TYPES:
      for i in range(10):
        rng = random.Random(f"0:train:{task_type}:{i}")
        spec = None
        while spec is None:
          spec = generator.sample_spec(task_type, "train", rng, rooms)
        sizes[rooms].append(len(spec.receptacles))
        if rooms == "small":
          per_class = Counter(r.type for r in spec.receptacles)
          assert max(per_class.values()) == 1, per_class
          kinds = {t.type for t in spec.things} - {spec.object_target, *LAMPS}
          assert 2 <= len(kinds) <= 4, kinds
  assert max(sizes["small"]) <= 13 < max(sizes["full"])
  assert sum(sizes["small"]) < 0.6 * sum(sizes["full"])
  with pytest.raises(ValueError, match=r"rooms='tiny'.*full.*small"):
    generator.scene_layout("kitchen", 1, rooms="tiny")
  (game,) = generator.generate_split(
    str(tmp_path), "train", 1, 0, ["pick_and_place_simple"], progress=False, rooms="small"
  )
  env = AlfworldEnv.from_game_files([game.gamefile])
  obs, info = env.reset(0)
  for action in game.actions:
    assert action in info["admissible_commands"]
    obs, reward, done, info = env.step(action)
  assert (reward, done, info["won"]) == (10.0, True, True)
  env.close()


def test_success_rates_per_task_type_and_overall():
  episodes = [
    ("pick_heat_then_place_in_recep", True),
    ("pick_heat_then_place_in_recep", False),
    ("pick_two_obj_and_place", True),
    ("look_at_obj_in_light", False),
  ]
  assert success_rates(episodes) == {
    "heat_success_rate": 0.5,
    "pick2_success_rate": 1.0,
    "look_success_rate": 0.0,
    "success_rate": 0.5,
  }
  assert success_rates([]) == {}


def test_fast_text_plays_every_game_as_stock_textworld(alfworld_games, monkeypatch):
  """envs.alfworld.fast_text (cached parses, rules and translations, shallow contexts and symbol
  copies) against stock TextWorld on the same engine: every other game of the run-wide set's three
  splits (five, to keep the stock run short) played twice, by seeded random admissible actions and
  by its walkthrough (wins included), gives the same observations, admissible commands, rewards
  and win flags."""
  from envs.alfworld import fast_text

  games = sorted(
    g
    for split in ("train", "valid_seen", "valid_unseen")
    for g in collect_game_files(alfworld_games, split)
  )[::2]

  def play() -> list:
    env, rng, trace = AlfworldEnv.from_game_files(games, max_steps=12), random.Random(0), []
    for task, game in enumerate(games):
      for plan in ([], list(_walkthrough(game))):
        obs, info = env.reset(task)
        trace.append((obs, info["admissible_commands"], info["won"]))
        done = False
        while not done:
          action = plan.pop(0) if plan else rng.choice(info["admissible_commands"])
          obs, reward, done, info = env.step(action)
          trace.append((obs, info["admissible_commands"], info["won"], reward))
    env.close()
    return trace

  fast_text.uninstall()
  # start_engine installs the fast paths unless told not to
  with monkeypatch.context() as stock_only:
    stock_only.setenv(fast_text.ENV_FLAG, "1")
    stock = play()
    assert not fast_text.installed()
  assert fast_text.install() and fast_text.installed()
  fast = play()
  assert len(games) >= 5 and sum(step[2] for step in stock) >= len(games)  # every walkthrough won
  assert fast == stock


def test_engines_load_the_lean_planner_library(tmp_path):
  """envs.alfworld.planner_lib: the copy every engine loads is the shipped Fast Downward library
  cut to what its program headers map (the DWARF sections dropped: ~1 MB of ~34), byte for byte
  the shipped one up to there except the cleared section-header fields; start_engine loads it
  (every other test here plays on it) and ctypes loads it; a file that is not ELF is left alone."""
  import ctypes
  import struct

  from fast_downward import interface

  from envs.alfworld import engine, planner_lib

  engine.release_engine(engine.start_engine())
  lean = planner_lib.loaded_path()
  assert lean is not None and interface.DOWNWARD_LIB_PATH == lean and lean.endswith("-lean.so")
  shipped = os.path.join(os.path.dirname(interface.__file__), "libdownward.so")
  with open(shipped, "rb") as f:
    full = f.read()
  with open(lean, "rb") as f:
    cut = f.read()
  phoff, (phentsize, phnum) = (
    struct.unpack_from("<Q", full, 0x20)[0],
    struct.unpack_from("<HH", full, 0x36),
  )
  ends = [  # p_offset + p_filesz of every program header
    o + s
    for o, s in (struct.unpack_from("<8xQ16xQ", full, phoff + i * phentsize) for i in range(phnum))
  ]
  assert len(cut) == max(ends) < len(full) // 10
  assert cut[:0x28] == full[:0x28] and cut[0x30:0x3A] == full[0x30:0x3A]
  assert cut[0x40:] == full[0x40 : len(cut)]
  assert cut[0x28:0x30] == bytes(8) and cut[0x3A:0x40] == bytes(6)  # no section headers
  assert ctypes.CDLL(lean).get_state_size is not None  # the engine's exported symbols resolve
  not_elf = tmp_path / "lib.so"
  not_elf.write_bytes(b"#!/bin/sh\n" * 10)
  assert planner_lib.lean_copy(str(not_elf), str(tmp_path / "out")) is None
