"""ALFWorld on an alfworld_games tfds dataset (envs.datasets): `envs.make("alfworld", data_dir=...)`
and a run's splits read the game list from the dataset (filtered by task type), the game files and
the walkthroughs from the folder it was built from; on generated games played by the real engine."""

from __future__ import annotations

import os
import shutil

import ml_collections
import pytest

import envs
from envs import datasets
from envs.alfworld import collect_game_files, data
from tests.helpers import copy_alfworld_games

# The games (the run-wide game set) are played on the real engine.
pytestmark = pytest.mark.slow

HEAT, LOOK = "pick_heat_then_place_in_recep", "look_at_obj_in_light"


@pytest.fixture(scope="module")
def built(alfworld_games, tmp_path_factory):
  """(ALFWorld folder: one train game per task type, valid_seen games of two types; the tfds
  output folder of its alfworld_games dataset)."""
  root = copy_alfworld_games(
    alfworld_games, str(tmp_path_factory.mktemp("alfworld")), ("train", "valid_seen")
  )
  out = str(tmp_path_factory.mktemp("tfds"))
  datasets.build("alfworld", out, root)
  # A game added after the build: the dataset does not list it, a directory walk would.
  train = collect_game_files(root, "train")
  extra = os.path.join(root, "train", "zz_added_later", "trial_1")
  shutil.copytree(os.path.dirname(train[0]), extra)
  assert os.path.join(extra, "game.tw-pddl") in collect_game_files(root, "train")
  return root, out, train


def _env_cfg(data_dir: str, task_types: str = "all") -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
    {
      "data_dir": data_dir,
      "task_types": task_types,
      "offline": {"num_train": 1, "num_eval": 1, "seed": 0},
    }
  )


def test_make_reads_the_game_list_of_a_dataset(built):
  _, out, train = built
  folder = os.path.join(out, "alfworld_games", datasets.VERSION)
  for data_dir in (out, folder):  # the tfds output folder or the dataset's own folder
    env = envs.make("alfworld", data_dir=data_dir, split="train")
    assert env.game_files == train  # the six built-from games, not the one added later
  on_files = envs.make("alfworld", game_files=train)
  assert env.reset(task=3) == on_files.reset(task=3)  # the same game, played on the engine
  heat = envs.make("alfworld", data_dir=out, split="valid_seen", task_types=[HEAT])
  assert len(heat.game_files) == 1 and f"/valid_seen/{HEAT}-" in heat.game_files[0]


def test_run_splits_and_walkthroughs_come_from_the_dataset(built, monkeypatch):
  root, out, train = built

  def no_generation(*args, **kwargs):
    raise AssertionError("a dataset run must not generate offline games")

  monkeypatch.setattr(data, "offline_dir", no_generation)
  family = envs.env_family("alfworld")
  split = family.split(_env_cfg(out), "train")
  assert split.env_kwargs == {"game_files": train} and split.task_names == train
  valid = family.split(_env_cfg(out, f"{LOOK},pick_and_place_simple"), "valid_seen")
  assert [f"/valid_seen/{LOOK}-" in g for g in valid.task_names] == [True]
  assert data.data_dir(_env_cfg(out)) == root  # the folder the dataset was built from
  records = data.walkthrough_records(_env_cfg(out), "train")
  assert sorted(os.path.join(root, r["gamefile"]) for r in records) == train
  assert data.dataset_dir(_env_cfg(root)) is None  # a plain folder is still walked
  assert len(family.split(_env_cfg(root), "train").task_names) == 7


def test_dataset_errors_name_the_fix(built, tmp_path):
  root, out, _ = built
  with pytest.raises(FileNotFoundError, match="lists no 'valid_seen' games of types"):
    data.split(_env_cfg(out, "pick_two_obj_and_place"), "valid_seen")
  with pytest.raises(ValueError, match="not 'valid_unseen'"):
    envs.make("alfworld", data_dir=out, split="valid_unseen")
  # A dataset whose ALFWorld folder was moved after the build.
  copy, moved_out = str(tmp_path / "copy"), str(tmp_path / "tfds")
  shutil.copytree(root, copy)
  datasets.build("alfworld", moved_out, copy)
  os.rename(copy, str(tmp_path / "moved"))
  with pytest.raises(FileNotFoundError, match="folder moved.*python -m envs.datasets alfworld"):
    envs.make("alfworld", data_dir=moved_out, split="train")
  with pytest.raises(FileNotFoundError, match="folder moved"):
    data.split(_env_cfg(moved_out), "train")
