"""ALFWorld on the real engine, offline: the env, the ALFRED-style game generator, prompts and action projection.

    import envs
    env = envs.make("alfworld", data_dir="data/alfworld_offline", split="train", seed=0)
    obs, info = env.reset(task=0)

`data_dir` is a real ALFWorld data folder (json_2.1.1/...) or one written by
`python -m envs.alfworld.generator --out DIR`; `game_files` plays an explicit list of `.tw-pddl` files.
"""

from __future__ import annotations

from typing import Sequence

from envs.alfworld.env import MAX_STEPS, WIN_REWARD, AlfworldEnv, collect_game_files
from envs.alfworld.projection import project_action, project_actions
from envs.alfworld.prompts import build_prompt
from envs.alfworld.tasks import SHORT_NAMES, TASK_TYPES, extract_task, success_rates
from envs.base import register

__all__ = [
  "AlfworldEnv",
  "collect_game_files",
  "make_alfworld",
  "build_prompt",
  "project_action",
  "project_actions",
  "extract_task",
  "success_rates",
  "TASK_TYPES",
  "SHORT_NAMES",
  "MAX_STEPS",
  "WIN_REWARD",
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
    game_files = collect_game_files(data_dir, split, task_types)
  return AlfworldEnv(game_files, seed=seed, max_steps=max_steps, with_expert_plan=with_expert_plan)
