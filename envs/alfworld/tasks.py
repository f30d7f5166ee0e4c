"""ALFWorld's six task types: canonical names, short names for metrics, and how to tell a game's type."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable

from envs import common

__all__ = [
  "TASK_TYPES",
  "SHORT_NAMES",
  "task_type_from_path",
  "task_type_of_game",
  "extract_task",
  "success_rates",
]

# The names ALFRED/ALFWorld use in `traj_data.json["task_type"]` and in game directory names.
TASK_TYPES = (
  "pick_and_place_simple",
  "look_at_obj_in_light",
  "pick_clean_then_place_in_recep",
  "pick_heat_then_place_in_recep",
  "pick_cool_then_place_in_recep",
  "pick_two_obj_and_place",
)

# Column names of the paper's table (Pick / Look / Clean / Heat / Cool / Pick2), for metric keys.
SHORT_NAMES = {
  "pick_and_place_simple": "pick",
  "look_at_obj_in_light": "look",
  "pick_clean_then_place_in_recep": "clean",
  "pick_heat_then_place_in_recep": "heat",
  "pick_cool_then_place_in_recep": "cool",
  "pick_two_obj_and_place": "pick2",
}

_TASK_LINE = re.compile(r"Your task is to:\s*(.*)", re.DOTALL)


def task_type_from_path(path: str) -> str | None:
  """The task type named by a game path (ALFWorld directories start with it), or None."""
  for part in reversed(os.path.normpath(path).split(os.sep)):
    for task_type in TASK_TYPES:
      if part.startswith(task_type):
        return task_type
  return None


def task_type_of_game(gamefile: str) -> str:
  """The task type of a `.tw-pddl` game: from its path, else `traj_data.json` beside it, else its own json."""
  found = task_type_from_path(gamefile)
  if found:
    return found
  traj_path = os.path.join(os.path.dirname(gamefile), "traj_data.json")
  for path, key in ((traj_path, "task_type"), (gamefile, "task_type")):
    if os.path.exists(path):
      try:
        with open(path) as f:
          value = json.load(f).get(key)
      except (OSError, ValueError):
        continue
      if value in TASK_TYPES:
        return value
  return "unknown"


def extract_task(initial_observation: str) -> str:
  """The task sentence from a game's first observation ("... Your task is to: put a mug in cabinet.")."""
  match = _TASK_LINE.search(initial_observation)
  return match.group(1).strip() if match else ""


def success_rates(episodes: Iterable[tuple[str, bool]]) -> dict[str, float]:
  """Success rates from (task_type, won) per episode, keyed like the reference's validation metrics.

  "success_rate" is over all episodes (the table's "Avg", not a mean of the columns); one
  "<short>_success_rate" per task type that occurred (pick, look, clean, heat, cool, pick2).
  """
  return common.success_rates((SHORT_NAMES.get(t, t), won) for t, won in episodes)
