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

An environment the trainer can run also registers an `EnvFamily` under the same name
(`register_family`): how a split of the run config becomes pool kwargs and task ids, the adapter
that writes its prompts, projects model outputs to actions and queries skills, its skills
directory, and optional expert data for the warm start. The trainer knows environments only
through `env_family(name)` (docs/extending.md, "Adding an environment").
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

# The public names are exported (and listed in `__all__`) by the package, envs/__init__.py.


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


def import_user_modules() -> None:
  """Imports the modules the command named with --imports (environment variable SDAR_IMPORTS,
  comma-separated; set by sdar_jax.infra.plugins.load and inherited by worker processes), so an
  environment a user registered in their own package is known in an env worker too."""
  for module in os.environ.get("SDAR_IMPORTS", "").split(","):
    if module.strip():
      importlib.import_module(module.strip())


def _import_env_module(name: str) -> None:
  """Imports ``envs.<name>`` (which registers what it defines); a missing module is not an error."""
  try:
    importlib.import_module(f"envs.{name}")
  except ModuleNotFoundError as e:
    if e.name != f"envs.{name}":
      raise


def make(name: str, **kwargs: Any) -> TextEnv:
  """Builds the environment registered as `name` with `kwargs`, importing ``envs.<name>`` if needed."""
  if name not in _REGISTRY:
    _import_env_module(name)
    if name not in _REGISTRY:
      raise KeyError(
        f"unknown environment {name!r}; registered: {registered_names()}. "
        f"Register it with @envs.register({name!r}) or add a module envs/{name} that does."
      )
  return _REGISTRY[name](**kwargs)


# ------------------------------------------------------------------------------ families
@dataclasses.dataclass
class EpisodeView:
  """What an adapter sees of a running episode (built by the agent loop from the env's infos)."""

  task: str
  task_type: str
  gamefile: str
  observation: str
  admissible: list[str]
  history: list[tuple[str, str]]  # (observation before the action, action sent), oldest first


@runtime_checkable
class EnvAdapter(Protocol):
  """Environment-specific text: the user message, the output -> action projection, the skill query.

  An adapter may also define ``is_admissible(action, view) -> bool | None``: whether a projected
  action is among the turn's admissible commands (None: nothing to check against). The agent loop
  records it on each turn (`Turn.admissible`, metric ``<prefix>/admissible_action_ratio``) and
  ``rollout.shaping.inadmissible_penalty`` reads it. ALFWorld defines it; WebShop's and Search-QA's actions
  take free text, so they do not.
  """

  def user_text(self, view: EpisodeView, history_length: int) -> str:
    """The user message of the current turn (its last `history_length` steps as history)."""
    ...

  def project(self, text: str) -> tuple[str, bool]:
    """(action sent to the env, whether the output was well-formed) for a model output `text`."""
    ...

  def skill_query(self, view: EpisodeView) -> str:
    """The text the skill retriever matches against (strategies "bm25" and "rules")."""
    ...


@dataclasses.dataclass(frozen=True)
class EnvSplit:
  """One split of an environment as a pool plays it.

  `env_kwargs` go to every env of the pool (the trainer adds ``seed`` and ``max_steps``);
  `task_names[t]` names task id t in logs (a game file, a goal id): the split has
  ``len(task_names)`` tasks.
  """

  env_kwargs: dict[str, Any]
  task_names: list[str]


@dataclasses.dataclass(frozen=True)
class EnvFamily:
  """What the trainer needs to run the environment registered (`register`) as `name`.

  Attributes:
    name: the environment's registry name (``env.name`` of a run config).
    split: (the run config's ``env`` section, split name) -> `EnvSplit`.
    adapter: builds the `EnvAdapter` of the agent loop.
    skills: the skills directory `envs.skills.SkillRetriever` reads when ``env.skills.dir`` is
      unset (a folder name under envs/skills/ or a path).
    expert_records: optional warm-start source ``warm_start.source="walkthroughs"``: (``env``
      section, split name) -> expert episode records ({"task", "task_type", "gamefile", "steps":
      [{"observation", "admissible_commands", "action"}, ...]}).
    expert_modes / play_expert: optional warm-start source ``warm_start.source="expert"``: the
      expert's modes and ``play_expert(pool, tasks, modes, skill_text=, epsilon=, seed=,
      search_order=, invalid_share=)`` that plays them on a pool and returns records as above (plus "mode",
      "won", "failed").
    episode_metrics: optional extra metrics of a batch of episodes: the last info of each finished
      (not failed) episode -> {name: value}, logged as ``<prefix>/<name>`` beside the success rates
      (WebShop: "score" and "acc"; Search-QA: "em").
    skill_retriever: optional class (or factory with `envs.skills.SkillRetriever`'s arguments) of
      the teacher's skill retriever; None: `SkillRetriever` (Search-QA: the authors' data_source
      rule, `envs.skills.data_source_rules.DataSourceSkillRetriever`).
    config_problems: optional check of the environment's own keys of a run config's ``env``
      section, one "<key>=<value>: <problem>. Fix: <fix>" line per problem (ALFWorld: the
      offline room size); `env_section_problems` adds them to the generic ones.
    start_check: optional check of what the environment reaches outside the run, made once the
      config is valid and before anything is compiled (`env_start_check`): (``env`` section) ->
      None, or `envs.errors.EnvInputError` naming what cannot be reached and the fix (Search-QA:
      the retrieval server answers a test query).
  """

  name: str
  split: Callable[[Any, str], EnvSplit]
  adapter: Callable[[], EnvAdapter]
  skills: str
  expert_records: Callable[[Any, str], list[dict[str, Any]]] | None = None
  expert_modes: tuple[str, ...] = ()
  play_expert: Callable[..., list[dict[str, Any]]] | None = None
  episode_metrics: Callable[[list[dict[str, Any]]], dict[str, float]] | None = None
  skill_retriever: Callable[..., Any] | None = None
  config_problems: Callable[[Any], list[str]] | None = None
  start_check: Callable[[Any], None] | None = None


def play_walkthroughs(
  env: TextEnv, walkthroughs: Iterable[tuple[int, Iterable[str]]], none_won: str
) -> list[dict[str, Any]]:
  """A scripted expert's `EnvFamily.expert_records`: plays each (task, actions) of `walkthroughs`
  on `env` until the episode ends or the actions run out, keeps the won episodes' records, then
  closes `env`. One action is drawn per turn, after the previous step, so a generator may read
  the env's state (an oracle). No episode won: ValueError `none_won` (what the expert failed to
  do), followed by the fix."""
  records = [
    record
    for task, actions in walkthroughs
    if (record := _play_walkthrough(env, task, actions)) is not None
  ]
  env.close()
  if not records:
    raise ValueError(f"{none_won}. Fix: raise env.expert_episodes or set warm_start.steps=0.")
  return records


def _play_walkthrough(env: TextEnv, task: int, actions: Iterable[str]) -> dict[str, Any] | None:
  """One episode of `play_walkthroughs`: its record if it is won, else None."""
  observation, info = env.reset(task=task)
  record = {"task": info["task"], "task_type": info["task_type"], "gamefile": "", "steps": []}
  for action in actions:
    record["steps"].append(
      {
        "observation": observation,
        "admissible_commands": list(info["admissible_commands"]),
        "action": action,
      }
    )
    observation, _, done, info = env.step(action)
    if done:
      break
  return record if info["won"] else None


_FAMILIES: dict[str, EnvFamily] = {}


def register_family(family: EnvFamily) -> EnvFamily:
  """Registers `family` under `family.name` (the name its env factory is registered under)."""
  if family.name in _FAMILIES and _FAMILIES[family.name] is not family:
    raise ValueError(
      f"environment family {family.name!r} is already registered; pick another name or register "
      "it once (at import of its module)"
    )
  _FAMILIES[family.name] = family
  return family


def env_family(name: str) -> EnvFamily:
  """The `EnvFamily` registered as `name`, importing ``envs.<name>`` if needed."""
  if name not in _FAMILIES:
    _import_env_module(name)
    if name not in _FAMILIES:
      raise KeyError(
        f"environment {name!r} has no EnvFamily, so the trainer cannot run it; families: "
        f"{sorted(_FAMILIES)}. Fix: register one with envs.register_family(EnvFamily({name!r}, "
        "...)) in its module (docs/extending.md, 'Adding an environment')."
      )
  return _FAMILIES[name]


def families_among(names: Sequence[str]) -> tuple[str, ...]:
  """Those of `names` that register an `EnvFamily` (the environments the trainer can run)."""
  runnable = []
  for name in names:
    try:
      env_family(name)
    except KeyError:
      continue
    runnable.append(name)
  return tuple(runnable)


def env_start_check(section: Any) -> None:
  """Runs the `EnvFamily.start_check` of the run config's ``env`` section's environment, if it has
  one (raises `envs.errors.EnvInputError`); nothing for a name without a family."""
  name = section.get("name")
  if name in families_among([name]) and env_family(name).start_check is not None:
    env_family(name).start_check(section)


def env_section_problems(section: Any, configured: Sequence[str]) -> list[str]:
  """What the registry tells of a run config's ``env`` section, one "<key>=<value>: <problem>.
  Fix: <fix>" line each: a name with neither a config (`configured`: the environments that have
  one) nor a registered family, a configured name without an `EnvFamily`, a data_dir that does
  not exist, and what the family's own `EnvFamily.config_problems` finds."""
  name, data_dir, problems = section.get("name"), section.get("data_dir"), []
  # A name without a config is still known when a family is registered under it (an environment
  # added from Python: docs/extending.md); only names that can be module names are looked up.
  extra = (name,) if isinstance(name, str) and name.isidentifier() else ()
  runnable = families_among((*configured, *extra))
  if name not in configured and name not in runnable:
    problems.append(
      f"env.name={name!r}: unknown name. Fix: use one of {sorted(configured)}, or register an "
      "envs.EnvFamily under that name in a module of your own and name it with "
      "--imports=your.module"
    )
  elif name not in runnable:
    problems.append(
      f"env.name={name!r}: this environment is not implemented yet (its config keys exist, the "
      f"host loop cannot run it). Fix: use one of {list(runnable)}"
    )
  elif env_family(name).config_problems is not None:
    problems.extend(env_family(name).config_problems(section))
  if data_dir and not os.path.isdir(os.path.expanduser(data_dir)):
    problems.append(
      f"env.data_dir={data_dir!r}: no such directory. Fix: point it at the prepared data, or "
      "unset it for the offline generated data"
    )
  return problems
