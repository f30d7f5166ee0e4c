"""Where ALFWorld games come from in a run: the offline game cache, a split's game files, and
the planner's walkthroughs (the warm start's default expert data).

``env.data_dir`` is a real or generated ALFWorld data folder, or an alfworld_games tfds dataset
(`python -m envs.datasets alfworld --out DIR --data_dir ALFWORLD_DIR`): then a split's game list
(filtered by ``env.task_types``) is read from the dataset, and the game files and walkthroughs
from the folder it was built from. Unset: the offline game cache.

The offline games have two more panels for a final measure on games never used while choosing
settings: ``heldout_seen`` (fresh games of the valid_seen distribution, the scenes train games use)
and ``heldout_unseen`` (scenes no train game uses), each ``env.offline.num_heldout`` games per task
type, drawn with ``env.offline.heldout_seed``. They live in their own cache folder, so asking for
them changes no other split's games."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import Any

from envs import datasets
from envs.alfworld.env import collect_game_files
from envs.alfworld.tasks import SHORT_NAMES, TASK_TYPES
from envs.base import EnvSplit
from envs.common import file_lock
from envs.errors import EnvFileNotFoundError, EnvInputError

__all__ = [
  "data_dir",
  "dataset_dir",
  "game_files",
  "offline_dir",
  "offline_games_ready",
  "read_walkthroughs",
  "split",
  "walkthrough_records",
]

log = logging.getLogger(__name__)

# Held-out panel -> the generator's split whose distribution it draws from.
HELDOUT_SPLITS = {"heldout_seen": "valid_seen", "heldout_unseen": "valid_unseen"}


def task_types(env_cfg: Any) -> tuple[str, ...]:
  """``env.task_types``: the ALFWorld task types a run plays, comma-separated ("all" or unset:
  the six), checked."""
  raw = env_cfg.get("task_types") or "all"
  chosen = TASK_TYPES if raw == "all" else tuple(t.strip() for t in raw.split(",") if t.strip())
  unknown = sorted(set(chosen) - set(TASK_TYPES))
  if unknown or not chosen:
    raise ValueError(
      f'env.task_types={raw!r}: unknown task types {unknown}. Fix: "all" or a comma-separated '
      f"subset of {','.join(TASK_TYPES)}."
    )
  return tuple(t for t in TASK_TYPES if t in chosen)  # canonical order: one cache folder per set


def _cache_root_and_suffix(env_cfg: Any) -> tuple[str, str]:
  """The game cache's root folder and the folder-name suffix of the rooms and task types."""
  off, types = env_cfg.offline, task_types(env_cfg)
  root = os.environ.get(
    "SDAR_DATA_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "sdar_jax")
  )
  rooms = off.get("rooms", "full")
  suffix = ("" if rooms == "full" else f"_{rooms}") + (
    "" if types == TASK_TYPES else "_" + "-".join(SHORT_NAMES[t] for t in types)
  )
  return root, suffix


def offline_games_ready(env_cfg: Any, split_names: Sequence[str]) -> bool:
  """Whether the offline games of `split_names` (held-out panels included) are generated
  already, so that `offline_dir` would only read them."""
  off = env_cfg.offline
  root, suffix = _cache_root_and_suffix(env_cfg)
  for split_name in split_names:
    if split_name in HELDOUT_SPLITS:
      num, seed = int(off.get("num_heldout", 0) or 0), int(off.get("heldout_seed", 1))
      out = os.path.join(root, f"alfworld_heldout_n{num}_s{seed}{suffix}")
      markers = [f"COMPLETE_{HELDOUT_SPLITS[split_name]}"]
    else:
      out = os.path.join(
        root, f"alfworld_offline_n{off.num_train}_e{off.num_eval}_s{off.seed}{suffix}"
      )
      markers = [f"COMPLETE_{split_name}", "COMPLETE"]  # COMPLETE: all three, older versions
    if not any(os.path.exists(os.path.join(out, m)) for m in markers):
      return False
  return True


def offline_dir(env_cfg: Any, split_name: str | None = None) -> str:
  """The folder of generated ALFWorld games for the ``env.offline`` settings and
  ``env.task_types``, under ``$SDAR_DATA_CACHE`` (default ~/.cache/sdar_jax). Each split is
  generated (planner-checked) the first time it is asked for, and reused; `split_name` None asks
  for all three (train, valid_seen, valid_unseen). A split's games do not depend on the others.
  A held-out panel (HELDOUT_SPLITS) has a folder of its own."""
  off = env_cfg.offline
  types = task_types(env_cfg)
  rooms = off.get("rooms", "full")
  root, suffix = _cache_root_and_suffix(env_cfg)
  if split_name in HELDOUT_SPLITS:
    return _heldout_dir(off, split_name, types, root, suffix)
  out = os.path.join(root, f"alfworld_offline_n{off.num_train}_e{off.num_eval}_s{off.seed}{suffix}")
  sizes = {"train": off.num_train, "valid_seen": off.num_eval, "valid_unseen": off.num_eval}
  if split_name is not None and split_name not in sizes:
    raise ValueError(
      f"unknown ALFWorld split {split_name!r}; the offline games have "
      f"{list(sizes) + list(HELDOUT_SPLITS)}"
    )
  _generate_missing(out, sizes, [split_name] if split_name else list(sizes), off.seed, types, rooms)
  return out


def _heldout_dir(off: Any, split_name: str, types: tuple[str, ...], root: str, suffix: str) -> str:
  """The cache folder of a held-out panel (both panels of one size and seed share it)."""
  num = int(off.get("num_heldout", 0) or 0)
  seed = int(off.get("heldout_seed", 1))
  if num <= 0:
    raise EnvInputError(
      f"eval split {split_name!r} needs env.offline.num_heldout > 0 (games per task type; it is "
      f"{num}). Fix: --config.env.offline.num_heldout=128"
    )
  if seed == off.seed:
    raise EnvInputError(
      f"env.offline.heldout_seed={seed} equals env.offline.seed: the held-out panels must be drawn "
      "with another generator seed. Fix: --config.env.offline.heldout_seed=<another seed>"
    )
  out = os.path.join(root, f"alfworld_heldout_n{num}_s{seed}{suffix}")
  generator_split = HELDOUT_SPLITS[split_name]
  _generate_missing(
    out, {generator_split: num}, [generator_split], seed, types, off.get("rooms", "full")
  )
  return out


def _generate_missing(
  out: str,
  sizes: dict[str, int],
  wanted: list[str],
  seed: int,
  types: tuple[str, ...],
  rooms: str,
) -> None:
  """Generates (planner-checked) each split of `wanted` not yet complete in `out`."""
  from envs.alfworld import generator

  legacy_marker = os.path.join(out, "COMPLETE")  # all three splits, written by earlier versions
  for split_ in wanted:
    marker = os.path.join(out, f"COMPLETE_{split_}")
    if os.path.exists(marker) or os.path.exists(legacy_marker):
      continue
    # Runs started together (a sweep, seeds side by side) share the cache: one generates a
    # split while the others wait, then find its marker (a reader never sees a split half written).
    with file_lock(out + ".lock"):
      if os.path.exists(marker) or os.path.exists(legacy_marker):
        continue
      log.info(
        "generating offline ALFWorld %s games into %s (planner-checked, cached) ...", split_, out
      )
      generator.generate_split(
        out, split_, sizes[split_], seed, types, workers=min(2, os.cpu_count() or 1), rooms=rooms
      )
      with open(marker, "w") as f:
        f.write("ok\n")


def dataset_dir(env_cfg: Any) -> str | None:
  """The alfworld_games tfds dataset ``env.data_dir`` points at, or None when it is a data folder
  (or unset)."""
  return datasets.find_dataset(env_cfg.get("data_dir"), datasets.ALFWORLD)


def data_dir(env_cfg: Any, split_name: str | None = None) -> str:
  """The ALFWorld data folder of a run: ``env.data_dir`` (a real or generated ALFWorld data
  folder; for an alfworld_games dataset, the folder it was built from), else the offline game
  cache (with `split_name`'s games generated)."""
  dataset = dataset_dir(env_cfg)
  if dataset is not None:
    return datasets.alfworld_source_dir(dataset)
  return env_cfg.get("data_dir") or offline_dir(env_cfg, split_name)


def game_files(env_cfg: Any, split_name: str) -> list[str]:
  """The playable game files of `split_name` of the ``env.task_types``: the dataset's list when
  ``env.data_dir`` is an alfworld_games dataset, else those collected from the data folder."""
  dataset = dataset_dir(env_cfg)
  if split_name in HELDOUT_SPLITS and (dataset is not None or env_cfg.get("data_dir")):
    raise EnvInputError(
      f"eval split {split_name!r} is a panel of the offline generated games, and env.data_dir is "
      f"set ({env_cfg.get('data_dir')!r}). Fix: evaluate that data's own valid_seen / valid_unseen "
      "splits, or unset env.data_dir"
    )
  if dataset is not None:
    return datasets.alfworld_game_files(dataset, split_name, task_types=task_types(env_cfg))
  folder = data_dir(env_cfg, split_name)
  return collect_game_files(folder, HELDOUT_SPLITS.get(split_name, split_name), task_types(env_cfg))


def split(env_cfg: Any, split_name: str) -> EnvSplit:
  """The game files of `split_name`, collected once and passed to every env of the pool (so all
  envs agree on task ids); each task is named by its game file."""
  games = game_files(env_cfg, split_name)
  return EnvSplit(env_kwargs={"game_files": games}, task_names=games)


def read_walkthroughs(path: str) -> list[dict[str, Any]]:
  """The expert records of a walkthrough file (`python -m envs.alfworld.generator` writes them)."""
  if not os.path.exists(path):
    raise EnvFileNotFoundError(
      f"No expert walkthroughs at {path!r}: generate games with `python -m envs.alfworld.generator "
      f"--out DIR` (it writes DIR/walkthroughs/<split>.jsonl) or set warm_start.steps=0."
    )
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def walkthrough_records(env_cfg: Any, split_name: str) -> list[dict[str, Any]]:
  """The planner's walkthroughs of `split_name` in the run's data folder."""
  folder = data_dir(env_cfg, split_name)
  return read_walkthroughs(os.path.join(folder, "walkthroughs", f"{split_name}.jsonl"))
