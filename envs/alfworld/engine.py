"""Glue to the real engine: alfworld's ALFRED PDDL domain and grammar, played by TextWorld's PDDL env.

A `.tw-pddl` game file is a JSON object holding the domain text ("pddl_domain"), the grammar with
the task sentence filled in ("grammar"), the problem ("pddl_problem"), and "solvable"/"walkthrough"
as alfworld's own generator writes them. TextWorld's `PddlEnv` plays it (Fast Downward grounds the
problem; its planner gives `policy_commands`), and alfworld's `AlfredDemangler` turns ids such as
``Cabinet_bar_3`` into "cabinet 3", `AlfredInfos` adds the game path to the state.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from envs.alfworld import fast_text, planner_lib
from envs.errors import EnvInputError, read_json_file

__all__ = [
  "GameFileError",
  "read_game_file",
  "domain_text",
  "grammar_text",
  "game_json",
  "write_game_file",
  "start_engine",
  "release_engine",
]

_TASK_PLACEHOLDER = "UNKNOWN GOAL"
GAME_KEYS = ("pddl_domain", "grammar", "pddl_problem")
_FIX = (
  "The file is truncated or corrupted: regenerate the games (python -m envs.alfworld.generator "
  "--out DIR; for the cached offline games, delete their folder and the trainer regenerates it) "
  "or download the ALFWorld data again."
)


class GameFileError(EnvInputError):
  """A `.tw-pddl` game file that cannot be played (not JSON, or missing the game's fields)."""


def read_game_file(path: str) -> dict[str, Any]:
  """The JSON content of a `.tw-pddl` game file; a file that is not a JSON object holding the
  domain, grammar and problem is a `GameFileError` naming it."""
  data = read_json_file(path, "ALFWorld game file", GameFileError, _FIX)
  if not isinstance(data, dict):
    raise GameFileError(
      f"ALFWorld game file {path!r} holds a JSON {type(data).__name__}, not an object. {_FIX}"
    )
  missing = [key for key in GAME_KEYS if key not in data]
  if missing:
    raise GameFileError(f"ALFWorld game file {path!r} lacks the fields {missing}. {_FIX}")
  return data


@functools.cache
def domain_text() -> str:
  """alfworld's ALFRED PDDL domain (ships inside the `alfworld` package)."""
  return (importlib.resources.files("alfworld") / "data" / "alfred.pddl").read_text()


@functools.cache
def grammar_text() -> str:
  """alfworld's TextWorld grammar for the ALFRED domain, with the task still a placeholder."""
  text = (importlib.resources.files("alfworld") / "data" / "alfred.twl2").read_text()
  if _TASK_PLACEHOLDER not in text:
    raise RuntimeError(
      f"alfworld's grammar no longer contains {_TASK_PLACEHOLDER!r}; "
      "this alfworld version is not supported (tested with alfworld==0.4.2)"
    )
  return text


def game_json(
  problem: str,
  task_desc: str,
  walkthrough: Sequence[str] | None = None,
  extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
  """The content of a `.tw-pddl` file for `problem` with task sentence `task_desc`."""
  data = {
    "pddl_domain": domain_text(),
    "grammar": grammar_text().replace(_TASK_PLACEHOLDER, task_desc),
    "pddl_problem": problem,
    "solvable": walkthrough is not None,
    "walkthrough": list(walkthrough) if walkthrough is not None else None,
  }
  data.update(extra or {})
  return data


def write_game_file(path: str, data: dict[str, Any]) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(data, f)


# Every PddlEnv loads a private copy of Fast Downward's C++ library (1.1 MB: planner_lib).
# Unloading a copy (dlclose) leaves the process corrupt: a later load, or interpreter exit,
# segfaults (reproduced with jax and torch loaded). So an engine is never unloaded: `release_engine` parks it and
# `start_engine` hands parked engines out again, which bounds the copies to the most engines a
# process ever uses at once.
_IDLE: dict[tuple[bool, bool], list[Any]] = {}
_IDLE_LOCK = threading.Lock()


def start_engine(policy_commands: bool = False, facts: bool = False) -> Any:
  """A TextWorld PDDL env wrapped like alfworld's text env (demangled names, gamefile in the state).

  Load a game with `.load(path)`, then `.reset()` / `.step(command)` return TextWorld GameStates.
  `policy_commands=True` asks the planner for a plan at every state (slow: use for experts only).
  TextWorld's text generation and problem translation run through `fast_text` (the same text,
  several times faster) unless `SDAR_STOCK_TEXTWORLD=1`.
  """
  fast_text.install()
  planner_lib.use_lean_library()  # every engine copies the library: 1.1 MB instead of 33.8
  key = (bool(policy_commands), bool(facts))
  with _IDLE_LOCK:
    if _IDLE.get(key):
      return _IDLE[key].pop()
  import textworld
  from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
  from textworld.envs import PddlEnv

  infos = textworld.EnvInfos(
    won=True,
    admissible_commands=True,
    policy_commands=policy_commands,
    facts=facts,
    extras=["gamefile"],
  )
  env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
  env.sdar_engine_key = key
  return env


def release_engine(env: Any) -> None:
  """Parks an engine for reuse by `start_engine` (its library stays loaded: see `_IDLE`)."""
  with _IDLE_LOCK:
    _IDLE.setdefault(getattr(env, "sdar_engine_key", (False, False)), []).append(env)
