"""Offline generator of ALFRED-style ALFWorld games for the six task types, checked by the planner.

    python -m envs.alfworld.generator --out data/alfworld_offline --n-per-type 50 --n-eval-per-type 24 --seed 0 \
        --workers 8

Writes, per split (train / valid_seen / valid_unseen), the ALFWorld data layout
``<out>/<split>/<task_type>-<Object>-None-<Receptacle>-<scene>/trial_<split>_s<seed>_<n>/``
with ``game.tw-pddl`` (domain, grammar with the task sentence, problem, walkthrough) and
``traj_data.json`` (task type, ALFRED-style pddl_params, scene), so `AlfworldEnv.from_data_dir`
plays these exactly like a real ALFWorld data directory. The expert walkthroughs (every step's
observation, admissible commands and the planner's action) go to ``<out>/walkthroughs/<split>.jsonl``
for warm starts.

Rooms are kitchens, living rooms, bedrooms and bathrooms; each room type has 30 scenes whose
receptacle layout is fixed by the scene number (like ALFRED floor plans), the last 4 of each are
held out: valid_unseen games are played in scenes no train game uses. Objects, distractors, the
goal and the task sentence are drawn per game from a seed derived from (seed, split, task type,
index), so the output is deterministic. Every game is kept only if Fast Downward finds a plan
that, replayed through the real engine, wins.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from envs.alfworld import engine as engine_lib
from envs.alfworld.catalog import (
  LAMPS,
  OBJECTS,
  ROOM_SIZES,
  ROOMS,
  STATE_RECEPTACLE,
  ObjectKind,
  RoomKind,
  receptacle_id_stem,
  scene_numbers,
)
from envs.alfworld.problem import GameSpec, Receptacle, Thing, pddl_problem
from envs.alfworld.tasks import TASK_TYPES, extract_task
from envs.errors import add_verbosity_argument, exit_on_env_error

__all__ = [
  "SPLITS",
  "ROOM_SIZES",
  "GeneratedGame",
  "scene_layout",
  "sample_spec",
  "solve_in_engine",
  "generate_game",
  "generate_split",
  "generate",
  "main",
]

SPLITS = ("train", "valid_seen", "valid_unseen")
MAX_PLAN_STEPS = 40  # keep games well inside the 50-step episode limit
MAX_ATTEMPTS = 50  # samples tried per game before giving up (each rejected sample is re-drawn)

# How each task type is phrased (ALFWorld's goal sentences), and which appliance it needs.
_TEMPLATES = {
  "pick_and_place_simple": ("put a {obj} in {recep}", "put some {obj} on {recep}"),
  "look_at_obj_in_light": ("look at {obj} under the {lamp}", "examine the {obj} with the {lamp}"),
  "pick_clean_then_place_in_recep": (
    "put a clean {obj} in {recep}",
    "clean some {obj} and put it in {recep}",
  ),
  "pick_heat_then_place_in_recep": (
    "put a hot {obj} in {recep}",
    "heat some {obj} and put it in {recep}",
  ),
  "pick_cool_then_place_in_recep": (
    "put a cool {obj} in {recep}",
    "cool some {obj} and put it in {recep}",
  ),
  "pick_two_obj_and_place": ("put two {obj} in {recep}", "find two {obj} and put them in {recep}"),
}
_STATE_OF_TASK = {
  "pick_clean_then_place_in_recep": "clean",
  "pick_heat_then_place_in_recep": "heat",
  "pick_cool_then_place_in_recep": "cool",
}


@dataclasses.dataclass
class Layout:
  """A scene's fixed furniture: receptacles, and the lamp with the receptacle it stands on."""

  room: RoomKind
  scene: int
  receptacles: tuple[Receptacle, ...]
  lamp_type: str | None
  lamp_receptacle: str | None

  def types(self) -> set[str]:
    return {r.type for r in self.receptacles}


@dataclasses.dataclass
class GeneratedGame:
  split: str
  gamefile: str
  task_type: str
  task: str
  steps: list[dict[str, Any]]

  @property
  def actions(self) -> list[str]:
    return [s["action"] for s in self.steps]


def _check_rooms(rooms: str) -> None:
  if rooms not in ROOM_SIZES:
    raise ValueError(f"rooms={rooms!r}: expected one of {ROOM_SIZES} (env.offline.rooms)")


def scene_layout(room_name: str, scene: int, rooms: str = "full") -> Layout:
  """The receptacles of scene `scene` of `room_name` (a function of the scene alone, like a floor
  plan); `rooms="small"` keeps at most one receptacle of each class."""
  _check_rooms(rooms)
  room = ROOMS[room_name]
  rng = random.Random(f"layout:{room_name}:{scene}")
  receptacles: list[Receptacle] = []
  for rtype, (low, high) in room.receptacles.items():
    prefix, suffix = receptacle_id_stem(rtype)
    count = rng.randint(low, high)
    if rooms == "small":
      count = min(count, 1)
    for n in range(1, count + 1):
      receptacles.append(
        Receptacle(f"{prefix}_bar_{n}{suffix}", rtype, f"loc_bar_{len(receptacles) + 1}")
      )
  lamp_type = lamp_receptacle = None
  holders = [r for r in receptacles if r.type in room.lamp_holders]
  if holders:
    lamp_type = "DeskLamp" if room_name == "bedroom" else rng.choice(LAMPS)
    lamp_receptacle = rng.choice(holders).id
  return Layout(room, scene, tuple(receptacles), lamp_type, lamp_receptacle)


def _rooms_for(task_type: str) -> list[str]:
  if task_type == "look_at_obj_in_light":
    return [name for name, room in ROOMS.items() if room.lamp_holders]
  state = _STATE_OF_TASK.get(task_type)
  if state:
    needed = STATE_RECEPTACLE[state]
    return [name for name, room in ROOMS.items() if room.receptacles.get(needed, (0, 0))[0] >= 1]
  return list(ROOMS)


def _goal_candidates(task_type: str, room: RoomKind) -> list[ObjectKind]:
  kinds = [OBJECTS[name] for name in room.objects]
  if task_type == "look_at_obj_in_light":
    return [k for k in kinds if k.lookable]
  state = _STATE_OF_TASK.get(task_type)
  if state:
    return [
      k
      for k in kinds
      if getattr(k, {"clean": "cleanable", "heat": "heatable", "cool": "coolable"}[state])
    ]
  return kinds


def _name(type_name: str) -> str:
  return type_name.lower()


def sample_spec(
  task_type: str, split: str, rng: random.Random, rooms: str = "full"
) -> GameSpec | None:
  """Draws one game of `task_type` for `split` in a room of size `rooms` (ROOM_SIZES); None when
  the draw is not feasible (the caller redraws)."""
  if task_type not in TASK_TYPES:
    raise ValueError(f"unknown task type {task_type!r}; expected one of {TASK_TYPES}")
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
  room_name = rng.choice(_rooms_for(task_type))
  room = ROOMS[room_name]
  scene = rng.choice(scene_numbers(room, unseen=(split == "valid_unseen")))
  layout = scene_layout(room_name, scene, rooms)
  present = layout.types()
  by_type: dict[str, list[Receptacle]] = {}
  for r in layout.receptacles:
    by_type.setdefault(r.type, []).append(r)

  goal_kind = rng.choice(_goal_candidates(task_type, room))
  is_look = task_type == "look_at_obj_in_light"
  target = ""
  if is_look:
    if layout.lamp_type is None:
      return None
    start_types = [t for t in goal_kind.places if t in present]
  else:
    excluded = (
      {STATE_RECEPTACLE[_STATE_OF_TASK[task_type]]} if task_type in _STATE_OF_TASK else set()
    )
    targets = [t for t in goal_kind.places if t in present and t not in excluded]
    if not targets:
      return None
    target = rng.choice(targets)
    # Goal objects never start in the target's receptacle class (the task must not be done already).
    start_types = [t for t in goal_kind.places if t in present and t != target]
  if not start_types:
    return None

  things: list[Thing] = []
  counts: dict[str, int] = {}

  def place(kind_name: str, receptacle_types: Sequence[str]) -> None:
    counts[kind_name] = counts.get(kind_name, 0) + 1
    receptacle = rng.choice(by_type[rng.choice(list(receptacle_types))])
    things.append(Thing(f"{kind_name}_bar_{counts[kind_name]}", kind_name, receptacle.id))

  n_goal = rng.choice((2, 2, 3, 4) if task_type == "pick_two_obj_and_place" else (1, 1, 2, 3))
  for _ in range(n_goal):
    place(goal_kind.name, start_types)

  distractor_kinds = [OBJECTS[n] for n in room.objects if n != goal_kind.name]
  distractor_kinds = [k for k in distractor_kinds if any(t in present for t in k.places)]
  low, high = (2, 4) if rooms == "small" else (4, 12)
  for kind in rng.sample(
    distractor_kinds, rng.randint(min(low, len(distractor_kinds)), min(high, len(distractor_kinds)))
  ):
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
      place(kind.name, [t for t in kind.places if t in present])

  if layout.lamp_type is not None:
    things.append(Thing(f"{layout.lamp_type}_bar_1", layout.lamp_type, layout.lamp_receptacle))

  template = rng.choice(_TEMPLATES[task_type])
  task_desc = template.format(
    obj=_name(goal_kind.name), recep=_name(target), lamp=_name(layout.lamp_type or "")
  )
  return GameSpec(
    task_type=task_type,
    room=room_name,
    scene=scene,
    object_target=goal_kind.name,
    parent_target=target,
    toggle_target=layout.lamp_type if is_look else "",
    task_desc=task_desc,
    receptacles=layout.receptacles,
    things=tuple(things),
  )


def solve_in_engine(engine: Any, gamefile: str) -> list[dict[str, Any]] | None:
  """Plans with Fast Downward at the start of `gamefile`, replays the plan through the engine.

  Returns the expert steps (observation before the action, admissible commands, action) when the
  plan is at most MAX_PLAN_STEPS long and wins; None otherwise.
  """
  engine.request_infos.policy_commands = True  # plan at the start only: planning every step is slow
  engine.load(gamefile)
  state = engine.reset()
  engine.request_infos.policy_commands = False
  plan = list(state["policy_commands"] or [])
  if state["won"] or not plan or len(plan) > MAX_PLAN_STEPS:
    return None
  steps = []
  for command in plan:
    if command not in state["admissible_commands"]:
      return None
    steps.append(
      {
        "observation": state.feedback,
        "admissible_commands": list(state["admissible_commands"]),
        "action": command,
      }
    )
    state, _, _ = engine.step(command)
  return steps if state["won"] else None


def _traj_data(
  spec: GameSpec, split: str, trial: str, seed: int, index: int, walkthrough: list[str]
) -> dict[str, Any]:
  return {
    "task_type": spec.task_type,
    "task_id": trial,
    "split": split,
    "scene": {
      "floor_plan": f"FloorPlan{spec.scene}",
      "scene_num": spec.scene,
      "room_type": spec.room,
    },
    "pddl_params": {
      "object_target": spec.object_target,
      "parent_target": spec.parent_target,
      "toggle_target": spec.toggle_target,
      "mrecep_target": "",
      "object_sliced": False,
    },
    "task_desc": spec.task_desc,
    "turk_annotations": {"anns": [{"task_desc": spec.task_desc}]},
    "generator": {"seed": seed, "index": index, "source": "sdar-jax envs.alfworld.generator"},
    "walkthrough": walkthrough,
  }


def _game_dir(out_dir: str, split: str, spec: GameSpec, trial: str) -> str:
  target = spec.toggle_target or spec.parent_target
  return os.path.join(
    out_dir, split, f"{spec.task_type}-{spec.object_target}-None-{target}-{spec.scene}", trial
  )


def generate_game(
  out_dir: str,
  split: str,
  task_type: str,
  index: int,
  seed: int = 0,
  engine: Any = None,
  rooms: str = "full",
) -> GeneratedGame:
  """Draws game `index` of `task_type` for `split` until the planner solves it; writes and returns it."""
  _check_rooms(rooms)
  engine = engine or _worker_engine()
  # Full rooms keep the seed string of earlier versions, so their games are unchanged.
  rng = random.Random(
    f"{seed}:{split}:{task_type}:{index}" + ("" if rooms == "full" else f":{rooms}")
  )
  trial = f"trial_{split}_s{seed}_{index:05d}"
  for _ in range(MAX_ATTEMPTS):
    spec = sample_spec(task_type, split, rng, rooms)
    if spec is None:
      continue
    game_dir = _game_dir(out_dir, split, spec, trial)
    gamefile = os.path.join(game_dir, "game.tw-pddl")
    problem = pddl_problem(spec, name=f"{trial}_{task_type}")
    engine_lib.write_game_file(gamefile, engine_lib.game_json(problem, spec.task_desc))
    steps = solve_in_engine(engine, gamefile)
    if steps is None:
      os.remove(gamefile)
      os.rmdir(game_dir)
      continue
    actions = [s["action"] for s in steps]
    engine_lib.write_game_file(
      gamefile,
      engine_lib.game_json(
        problem, spec.task_desc, walkthrough=actions, extra={"task_type": task_type}
      ),
    )
    with open(os.path.join(game_dir, "traj_data.json"), "w") as f:
      json.dump(_traj_data(spec, split, trial, seed, index, actions), f, indent=1)
    return GeneratedGame(split, gamefile, task_type, extract_task(steps[0]["observation"]), steps)
  raise RuntimeError(
    f"no solvable {task_type} game for {split} index {index} after {MAX_ATTEMPTS} "
    f"draws (seed {seed}); the catalog cannot host this task type"
  )


_ENGINE: Any = None


def _worker_engine() -> Any:
  global _ENGINE
  if _ENGINE is None:
    _ENGINE = engine_lib.start_engine()
  return _ENGINE


def _generate_job(job: tuple[str, str, str, int, int, str]) -> GeneratedGame:
  out_dir, split, task_type, index, seed, rooms = job
  return generate_game(out_dir, split, task_type, index, seed, rooms=rooms)


def generate_split(
  out_dir: str,
  split: str,
  n_per_type: int,
  seed: int = 0,
  task_types: Iterable[str] = TASK_TYPES,
  engine: Any = None,
  progress: bool = True,
  workers: int = 1,
  rooms: str = "full",
) -> list[GeneratedGame]:
  """Generates and checks `n_per_type` games of each task type for `split`; writes them under `out_dir`.

  `workers` > 1 spreads the games over that many processes; the output does not depend on it.
  `rooms`: "full" or "small" (ROOM_SIZES).
  """
  from tqdm import tqdm

  _check_rooms(rooms)
  jobs = [(out_dir, split, t, i, seed, rooms) for t in task_types for i in range(n_per_type)]
  # A bar only on a terminal: in a log file its redraws would be carriage-return frames.
  on_terminal = progress and sys.stderr.isatty()
  bar = tqdm(total=len(jobs), desc=f"alfworld {split}", disable=not on_terminal, leave=False)
  if workers <= 1:
    games = []
    for job in jobs:
      games.append(generate_game(*job[:5], engine=engine, rooms=rooms))
      bar.update(1)
  else:
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(
      workers, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
      games = []
      for game in pool.map(_generate_job, jobs, chunksize=max(1, len(jobs) // (4 * workers))):
        games.append(game)
        bar.update(1)
  bar.close()
  _write_walkthroughs(out_dir, split, games)
  return games


def _write_walkthroughs(out_dir: str, split: str, games: Sequence[GeneratedGame]) -> None:
  path = os.path.join(out_dir, "walkthroughs", f"{split}.jsonl")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    for game in games:
      record = {
        "gamefile": os.path.relpath(game.gamefile, out_dir),
        "split": split,
        "task_type": game.task_type,
        "task": game.task,
        "actions": game.actions,
        "steps": game.steps,
      }
      f.write(json.dumps(record) + "\n")


def generate(
  out_dir: str,
  n_per_type: int,
  n_eval_per_type: int,
  seed: int = 0,
  task_types: Iterable[str] = TASK_TYPES,
  progress: bool = True,
  workers: int = 1,
  rooms: str = "full",
) -> dict[str, list[GeneratedGame]]:
  """All three splits: `n_per_type` train games and `n_eval_per_type` per validation split, per task type."""
  engine = engine_lib.start_engine() if workers <= 1 else None
  sizes = {"train": n_per_type, "valid_seen": n_eval_per_type, "valid_unseen": n_eval_per_type}
  return {
    split: generate_split(
      out_dir, split, n, seed, list(task_types), engine, progress, workers, rooms
    )
    for split, n in sizes.items()
  }


@exit_on_env_error
def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="output data directory")
  parser.add_argument("--n-per-type", type=int, default=50, help="train games per task type")
  parser.add_argument(
    "--n-eval-per-type",
    type=int,
    default=24,
    help="valid_seen and valid_unseen games per task type",
  )
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--task-types", nargs="*", default=list(TASK_TYPES), choices=TASK_TYPES)
  parser.add_argument(
    "--rooms",
    default="full",
    choices=ROOM_SIZES,
    help="room size (small: one receptacle per class)",
  )
  parser.add_argument(
    "--workers", type=int, default=1, help="generator processes (output does not depend on it)"
  )
  add_verbosity_argument(parser)
  args = parser.parse_args(argv)
  result = generate(
    args.out,
    args.n_per_type,
    args.n_eval_per_type,
    args.seed,
    args.task_types,
    workers=args.workers,
    rooms=args.rooms,
  )
  for split, games in result.items():
    print(
      f"{split}: {len(games)} games, walkthroughs in {os.path.join(args.out, 'walkthroughs', split + '.jsonl')}"
    )


if __name__ == "__main__":
  main()
