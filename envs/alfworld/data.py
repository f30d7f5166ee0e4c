"""Where ALFWorld games come from in a run: the offline game cache, a split's game files, and
the planner's walkthroughs (the warm start's default expert data)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from envs.alfworld.env import collect_game_files
from envs.base import EnvSplit

__all__ = ["data_dir", "offline_dir", "read_walkthroughs", "split", "walkthrough_records"]

log = logging.getLogger(__name__)


def offline_dir(env_cfg: Any) -> str:
  """Generated ALFWorld games (train / valid_seen / valid_unseen) for the ``env.offline``
  settings, generated once into ``$SDAR_DATA_CACHE`` (default ~/.cache/sdar_jax) and reused."""
  from envs.alfworld import generator

  off = env_cfg.offline
  root = os.environ.get(
    "SDAR_DATA_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "sdar_jax")
  )
  out = os.path.join(root, f"alfworld_offline_n{off.num_train}_e{off.num_eval}_s{off.seed}")
  marker = os.path.join(out, "COMPLETE")
  if not os.path.exists(marker):
    log.info("generating offline ALFWorld games into %s (planner-checked, cached) ...", out)
    generator.generate(out, off.num_train, off.num_eval, seed=off.seed)
    with open(marker, "w") as f:
      f.write("ok\n")
  return out


def data_dir(env_cfg: Any) -> str:
  """``env.data_dir`` (a real or generated ALFWorld data folder), else the offline game cache."""
  return env_cfg.get("data_dir") or offline_dir(env_cfg)


def split(env_cfg: Any, split_name: str) -> EnvSplit:
  """The game files of `split_name`, collected once and passed to every env of the pool (so all
  envs agree on task ids); each task is named by its game file."""
  games = collect_game_files(data_dir(env_cfg), split_name)
  return EnvSplit(env_kwargs={"game_files": games}, task_names=games)


def read_walkthroughs(path: str) -> list[dict[str, Any]]:
  """The expert records of a walkthrough file (`python -m envs.alfworld.generator` writes them)."""
  if not os.path.exists(path):
    raise FileNotFoundError(
      f"No expert walkthroughs at {path!r}: generate games with `python -m envs.alfworld.generator "
      f"--out DIR` (it writes DIR/walkthroughs/<split>.jsonl) or set warm_start.steps=0."
    )
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def walkthrough_records(env_cfg: Any, split_name: str) -> list[dict[str, Any]]:
  """The planner's walkthroughs of `split_name` in the run's data folder."""
  return read_walkthroughs(os.path.join(data_dir(env_cfg), "walkthroughs", f"{split_name}.jsonl"))
