"""ALFWorld on the real engine, offline: the env, the ALFRED-style game generator, prompts and action projection.

    import envs
    env = envs.make("alfworld", data_dir="data/alfworld_offline", split="train", seed=0)
    obs, info = env.reset(task=0)

`data_dir` is a real ALFWorld data folder (json_2.1.1/...), one written by
`python -m envs.alfworld.generator --out DIR`, or an alfworld_games tfds dataset built from either
(`python -m envs.datasets alfworld --out DIR --data_dir ALFWORLD_DIR`: the split's game list comes
from the dataset, the game files from the folder it lists them in); `game_files` plays an explicit
list of `.tw-pddl` files.

Importing this package registers the env factory and its `EnvFamily`
(`envs.env_family("alfworld")`): splits from `envs.alfworld.data`, the adapter of
`envs.alfworld.adapter`, the skills of envs/skills/alfworld, the walkthroughs and the search
expert (`envs.alfworld.expert`) as warm-start data.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from envs import datasets
from envs.alfworld import data, expert
from envs.alfworld.adapter import AlfworldAdapter
from envs.alfworld.env import MAX_STEPS, WIN_REWARD, AlfworldEnv, collect_game_files
from envs.alfworld.projection import project_action, project_actions
from envs.alfworld.prompts import build_prompt
from envs.alfworld.tasks import SHORT_NAMES, TASK_TYPES, extract_task, success_rates
from envs.base import EnvFamily, register, register_family
from envs.errors import EnvInputError

__all__ = [
  "ALFWORLD_FAMILY",
  "MAX_STEPS",
  "SHORT_NAMES",
  "TASK_TYPES",
  "WIN_REWARD",
  "AlfworldAdapter",
  "AlfworldEnv",
  "build_prompt",
  "collect_game_files",
  "extract_task",
  "make_alfworld",
  "project_action",
  "project_actions",
  "success_rates",
]


@register("alfworld")
def make_alfworld(
  data_dir: str | None = None,
  split: str = "train",
  game_files: Sequence[str] | None = None,
  task_types: Sequence[str] = TASK_TYPES,
  seed: int = 0,
  max_steps: int = MAX_STEPS,
  with_expert_plan: bool = False,
) -> AlfworldEnv:
  """Builds an AlfworldEnv from `game_files`, or from the `split` of `data_dir`.

  For a pool, collect the files once (`collect_game_files`) and pass `game_files`: every worker
  then skips the directory walk and all envs agree on task ids.
  """
  if game_files is None:
    if data_dir is None:
      raise ValueError(
        "alfworld needs data_dir (an ALFWorld or generated data folder) or game_files; "
        "generate offline games with: python -m envs.alfworld.generator --out DIR"
      )
    if datasets.find_dataset(data_dir, datasets.ALFWORLD):  # a tfds dataset (envs.datasets)
      game_files = datasets.alfworld_game_files(data_dir, split, task_types=task_types)
    else:
      game_files = collect_game_files(data_dir, split, task_types)
  return AlfworldEnv(game_files, seed=seed, max_steps=max_steps, with_expert_plan=with_expert_plan)


def config_problems(section: Any) -> list[str]:
  """ALFWorld's own keys of a run config's ``env`` section (`EnvFamily.config_problems`)."""
  from envs.alfworld.catalog import ROOM_SIZES

  rooms = (section.get("offline") or {}).get("rooms", "full")
  if rooms not in ROOM_SIZES:
    return [
      f"env.offline.rooms={rooms!r}: unknown room size. Fix: use 'full' (the catalog's rooms) or "
      "'small' (one receptacle of each class)"
    ]
  return []


def start_check(section: Any) -> None:
  """The folders ALFWorld and the offline games write to can be written: the alfworld package
  creates its cache (ALFWORLD_DATA, default ~/.cache/alfworld) when imported, in every env worker,
  and the generated games go to SDAR_DATA_CACHE (default ~/.cache/sdar_jax). Raises
  EnvInputError naming HOME, the variable and the fix; writes only an empty probe file."""
  home = os.path.expanduser("~")
  folders = [
    ("ALFWORLD_DATA", os.environ.get("ALFWORLD_DATA") or os.path.join(home, ".cache", "alfworld"))
  ]
  if not section.get("data_dir"):
    default = os.path.join(home, ".cache", "sdar_jax")
    folders.append(("SDAR_DATA_CACHE", os.environ.get("SDAR_DATA_CACHE") or default))
  for variable, folder in folders:
    try:
      os.makedirs(folder, exist_ok=True)
      probe = os.path.join(folder, f".write_probe_{os.getpid()}")
      with open(probe, "w"):
        pass
      os.remove(probe)
    except OSError as e:
      raise EnvInputError(
        f"{variable}={folder!r} (HOME={home!r}) cannot be written: {e.strerror or e}. ALFWorld "
        "writes its cache there when imported and the offline games are generated there, so every "
        f"environment would fail to start. Fix: point HOME at a writable folder, or set {variable} "
        "(and ALFWORLD_DATA / SDAR_DATA_CACHE alike) to writable folders."
      ) from None


ALFWORLD_FAMILY = register_family(
  EnvFamily(
    name="alfworld",
    split=data.split,
    adapter=AlfworldAdapter,
    skills="alfworld",
    expert_records=data.walkthrough_records,
    expert_modes=expert.MODES,
    play_expert=expert.play_episodes,
    config_problems=config_problems,
    start_check=start_check,
  )
)
