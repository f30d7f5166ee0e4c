"""The text-environment contract shared by every environment, and the registry that builds them.

An environment is anything with `reset(task) -> (observation, info)` and
`step(action) -> (observation, reward, done, info)`. `info` always carries:

- ``won`` (bool): the episode's task is accomplished,
- ``admissible_commands`` (list[str]): the actions the engine accepts now (may be empty when the
    environment has no finite action set),
- ``task_type`` (str): the environment's task family, used for per-type success rates.

Environments register a factory under a name; `make(name, **kwargs)` builds one. A name that is not
registered yet is looked up as the module ``envs.<name>``, whose import registers it: worker
processes of the `EnvPool` can therefore build any environment from its name alone.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Protocol, runtime_checkable

__all__ = [
  "TextEnv",
  "StepResult",
  "register",
  "make",
  "registered_names",
  "failed_result",
  "EnvPool",
]


@runtime_checkable
class TextEnv(Protocol):
  """A multi-turn text environment."""

  @property
  def num_tasks(self) -> int:
    """How many distinct tasks `reset(task=...)` accepts (task ids are 0..num_tasks-1)."""
    ...

  def reset(self, task: int | None = None) -> tuple[str, dict[str, Any]]:
    """Starts an episode on task `task` (None: the env's own seeded choice). Returns (observation, info)."""
    ...

  def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
    """Plays one action text. Returns (observation, reward, done, info)."""
    ...

  def close(self) -> None:
    """Releases the engine's resources."""
    ...


@dataclasses.dataclass
class StepResult:
  """What the pool returns for one env after a reset or a step (reward 0 and done False after a reset)."""

  observation: str
  reward: float
  done: bool
  info: dict[str, Any]

  @property
  def failed(self) -> bool:
    """True when the env raised, hung or died during this call (the episode is lost)."""
    return "env_error" in self.info


def failed_result(message: str) -> StepResult:
  """The result reported for an env that raised, hung or died: the episode ends, not won."""
  return StepResult(
    observation="",
    reward=0.0,
    done=True,
    info={"env_error": message, "won": False, "admissible_commands": [], "task_type": "unknown"},
  )


_REGISTRY: dict[str, Callable[..., TextEnv]] = {}


def register(name: str) -> Callable[[Callable[..., TextEnv]], Callable[..., TextEnv]]:
  """Decorator: registers `factory` (a class or a function returning a TextEnv) under `name`."""

  def wrap(factory: Callable[..., TextEnv]) -> Callable[..., TextEnv]:
    if name in _REGISTRY and _REGISTRY[name] is not factory:
      raise ValueError(
        f"environment name {name!r} is already registered to {_REGISTRY[name]!r}; pick another name"
      )
    _REGISTRY[name] = factory
    return factory

  return wrap


def registered_names() -> list[str]:
  """Names registered so far (modules not imported yet are not listed)."""
  return sorted(_REGISTRY)


def make(name: str, **kwargs: Any) -> TextEnv:
  """Builds the environment registered as `name` with `kwargs`, importing ``envs.<name>`` if needed."""
  if name not in _REGISTRY:
    try:
      importlib.import_module(f"envs.{name}")
    except ModuleNotFoundError as e:
      if e.name != f"envs.{name}":
        raise
    if name not in _REGISTRY:
      raise KeyError(
        f"unknown environment {name!r}; registered: {registered_names()}. "
        f"Register it with @envs.register({name!r}) or add a module envs/{name} that does."
      )
  return _REGISTRY[name](**kwargs)


def __getattr__(attr: str) -> Any:
  # EnvPool lives in envs/pool.py (it imports this module); expose it here without a circular import.
  if attr == "EnvPool":
    from envs.pool import EnvPool

    return EnvPool
  raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
