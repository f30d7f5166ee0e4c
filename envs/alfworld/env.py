"""AlfworldEnv: ALFWorld text games played on the real engine (TextWorld PDDL + alfworld's ALFRED domain).

Plays either a real ALFWorld data directory (json_2.1.1/{train,valid_seen,valid_unseen}/.../game.tw-pddl
beside traj_data.json), a directory written by `envs.alfworld.generator` (same layout), or any list
of `.tw-pddl` files. Behaviour follows the reference setup: reward 10 when the task is won, the
episode ends on a win or after `max_steps` (50) steps, a command the engine does not know is
answered "Nothing happens." and still counts as a step.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

from envs.alfworld import engine as engine_lib
from envs.alfworld.tasks import TASK_TYPES, extract_task, task_type_from_path, task_type_of_game
from envs.errors import EnvFileNotFoundError

__all__ = ["AlfworldEnv", "collect_game_files", "split_dir", "WIN_REWARD", "MAX_STEPS"]

WIN_REWARD = 10.0
MAX_STEPS = 50
SPLIT_ALIASES = {"eval_in_distribution": "valid_seen", "eval_out_of_distribution": "valid_unseen"}


def split_dir(data_dir: str, split: str) -> str:
  """The folder holding `split` under `data_dir` (accepts the data root, its json_2.1.1, or the split itself)."""
  split = SPLIT_ALIASES.get(split, split)
  data_dir = os.path.expanduser(os.path.expandvars(data_dir))
  for candidate in (os.path.join(data_dir, "json_2.1.1", split), os.path.join(data_dir, split)):
    if os.path.isdir(candidate):
      return candidate
  if os.path.basename(os.path.normpath(data_dir)) == split and os.path.isdir(data_dir):
    return data_dir
  raise EnvFileNotFoundError(
    f"no {split!r} split under {data_dir!r} (looked for json_2.1.1/{split} and {split}). Point data_dir at an "
    "ALFWorld data folder, or generate offline games: python -m envs.alfworld.generator --out DIR"
  )


def collect_game_files(
  data_dir: str,
  split: str = "train",
  task_types: Sequence[str] = TASK_TYPES,
  check_solvable: bool = True,
) -> list[str]:
  """Sorted playable game files of a split, filtered like alfworld's loader.

  Skips 'movable' and 'Sliced' trials, other task types, folders without game.tw-pddl, and (with
  `check_solvable`, which reads every game file once) games not marked solvable.
  """
  unknown = set(task_types) - set(TASK_TYPES)
  if unknown:
    raise ValueError(f"unknown task types {sorted(unknown)}; expected a subset of {TASK_TYPES}")
  root = split_dir(data_dir, split)
  files = []
  for folder, _, names in os.walk(root):
    if "game.tw-pddl" not in names or "movable" in folder or "Sliced" in folder:
      continue
    gamefile = os.path.join(folder, "game.tw-pddl")
    if task_type_of_game(gamefile) not in task_types:
      continue
    if check_solvable and not engine_lib.read_game_file(gamefile).get("solvable", False):
      continue
    files.append(gamefile)
  if not files:
    raise EnvFileNotFoundError(f"no playable games of types {list(task_types)} under {root!r}")
  return sorted(files)


class AlfworldEnv:
  """One ALFWorld game at a time; `reset(task=i)` plays game_files[i], `reset()` the next of a seeded shuffle."""

  def __init__(
    self,
    game_files: Sequence[str],
    seed: int = 0,
    max_steps: int = MAX_STEPS,
    with_expert_plan: bool = False,
  ):
    if not game_files:
      raise ValueError("AlfworldEnv needs at least one game file")
    missing = [f for f in game_files if not os.path.isfile(f)]
    if missing:
      raise EnvFileNotFoundError(f"{len(missing)} game files do not exist, e.g. {missing[0]!r}")
    self.game_files = list(game_files)
    self.max_steps = max_steps
    self.with_expert_plan = with_expert_plan
    self._rng = random.Random(seed)
    self._order: list[int] = []
    self._engine: Any = None
    self._loaded: str | None = None
    self._task_types: dict[str, str] = {}
    self._gamefile = ""
    self._task = ""
    self._task_type = "unknown"
    self._steps = 0
    self._done = True
    self._last: tuple[str, dict[str, Any]] = ("", {})

  @classmethod
  def from_data_dir(
    cls, data_dir: str, split: str = "train", task_types: Sequence[str] = TASK_TYPES, **kwargs: Any
  ) -> AlfworldEnv:
    """Plays the games of `split` in an ALFWorld (or generated) data directory."""
    return cls(collect_game_files(data_dir, split, task_types), **kwargs)

  @classmethod
  def from_game_files(cls, game_files: Sequence[str], **kwargs: Any) -> AlfworldEnv:
    """Plays the given `.tw-pddl` files."""
    return cls(game_files, **kwargs)

  @property
  def num_tasks(self) -> int:
    return len(self.game_files)

  def _next_task(self) -> int:
    if not self._order:  # a fresh shuffled pass over all games, like TextWorld's game cycle
      self._order = list(range(len(self.game_files)))
      self._rng.shuffle(self._order)
    return self._order.pop()

  def _task_type_of(self, gamefile: str) -> str:
    if gamefile not in self._task_types:
      self._task_types[gamefile] = task_type_from_path(gamefile) or task_type_of_game(gamefile)
    return self._task_types[gamefile]

  def _info(self, state: Any, won: bool) -> dict[str, Any]:
    info = {
      "won": won,
      "admissible_commands": list(state["admissible_commands"]),
      "task_type": self._task_type,
      "gamefile": self._gamefile,
      "task": self._task,
      "steps": self._steps,
    }
    if self.with_expert_plan:
      info["expert_plan"] = list(state["policy_commands"] or [])
    return info

  def reset(self, task: int | None = None) -> tuple[str, dict[str, Any]]:
    index = self._next_task() if task is None else int(task)
    if not 0 <= index < len(self.game_files):
      raise IndexError(f"task {index} out of range: this env has {len(self.game_files)} games")
    if self._engine is None:
      self._engine = engine_lib.start_engine(policy_commands=self.with_expert_plan)
    gamefile = self.game_files[index]
    if gamefile != self._loaded:
      self._loaded = None
      try:
        self._engine.load(gamefile)
      except Exception as err:
        # A bad file fails deep in TextWorld (a bare JSONDecodeError or KeyError): name it.
        try:
          engine_lib.read_game_file(gamefile)
        except engine_lib.GameFileError as bad_file:
          raise engine_lib.GameFileError(f"task {index}: {bad_file}") from err
        raise
      self._loaded = gamefile
    state = self._engine.reset()
    self._gamefile = gamefile
    self._task_type = self._task_type_of(gamefile)
    self._task = extract_task(state.feedback)
    self._steps = 0
    self._done = False
    self._last = (state.feedback, self._info(state, bool(state["won"])))
    return self._last

  def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
    if self._engine is None or self._loaded is None:
      raise RuntimeError("step() before reset(); call reset() first")
    if self._done:  # stepping a finished episode changes nothing
      return self._last[0], 0.0, True, dict(self._last[1])
    state, _, _ = self._engine.step(action)
    self._steps += 1
    won = bool(state["won"])
    self._done = won or self._steps >= self.max_steps
    self._last = (state.feedback, self._info(state, won))
    return state.feedback, WIN_REWARD if won else 0.0, self._done, self._last[1]

  def close(self) -> None:
    if self._engine is not None:
      self._engine.close()
      engine_lib.release_engine(self._engine)
    self._engine = None
    self._loaded = None
