"""A training whose algorithm has a first stage (`algo.teacher_stage`: RetireOPD trains its
skill-conditioned teacher with the reward first): `run` trains the stage's preset in
<workdir>/teacher, then the run itself in <workdir> with that stage's final checkpoint as its
frozen teacher (`algo.teacher_path`, read with `algo.teacher_weights="frozen"`).

Each stage is an ordinary run of the host loop (`sdar_jax.run.trainer.run`) on its own workdir, so
each resumes from its own checkpoints when the command is run again, and a first stage that has
reached its last iteration is not trained again. The first stage's config is the run's with the
stage preset's method settings: every `algo` setting on which the two presets differ takes the
stage preset's value, every other (temperature, KL, PPO clip, ... and the user's overrides of
them) stays the run's; `train.iterations` is `algo.teacher_stage.iterations` (0: the run's), and its
checkpoints and logs go to <workdir>/teacher. An algorithm without a first stage runs as one run.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from sdar_jax.algos import ALGO_PRESETS, AlgoConfig
from sdar_jax.infra import paths
from sdar_jax.run.setup import ConfigError

TEACHER_DIR = "teacher"  # <workdir>/teacher: the first stage's run


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
  """A preset's fields as dotted keys (its sections' fields one by one)."""
  if isinstance(value, dict):
    out = {}
    for key, sub in value.items():
      out.update(_flat(sub, f"{prefix}{key}."))
    return out
  return {prefix[:-1]: value}


def _set(section, dotted: str, value: Any) -> None:
  *parents, leaf = dotted.split(".")
  for key in parents:
    section = section[key]
  section[leaf] = value


def teacher_stage_config(config):
  """The first stage's run config (module doc), or a `ConfigError` naming an unknown preset."""
  stage = config.algo.teacher_stage
  if stage.preset not in ALGO_PRESETS or ALGO_PRESETS[stage.preset].teacher_stage.preset:
    one_stage = sorted(n for n, p in ALGO_PRESETS.items() if not p.teacher_stage.preset)
    raise ConfigError(
      f"algo.teacher_stage.preset={stage.preset!r}: not a preset that trains in one stage. Fix: "
      f"use one of {one_stage}"
    )
  own = _flat(dataclasses.asdict(ALGO_PRESETS.get(config.algo.name, AlgoConfig())))
  theirs = _flat(dataclasses.asdict(ALGO_PRESETS[stage.preset]))
  first = copy.deepcopy(config)  # keeps the config's links (algo.temperature)
  for key, value in theirs.items():
    if key == "name" or own.get(key) != value:
      _set(first.algo, key, value)
  first.train.iterations = int(stage.iterations) or int(config.train.iterations)
  first.checkpoint.dir = None  # <workdir>/teacher/checkpoints
  first.logging.dir = None
  return first


def plan(config, workdir: str) -> list[tuple[Any, str]]:
  """[(run config, workdir)] of each stage, in order: one, or the teacher's then the run's."""
  if not config.algo.teacher_stage.get("preset"):
    return [(config, workdir)]
  teacher_dir = paths.join(paths.resolve(workdir), TEACHER_DIR)
  second = copy.deepcopy(config)
  second.algo.teacher_path = paths.join(teacher_dir, "checkpoints")
  return [(teacher_stage_config(config), teacher_dir), (second, workdir)]


def finished(config, workdir: str) -> bool:
  """Whether the run of `config` in `workdir` has saved its last iteration's checkpoint."""
  from sdar_jax.run.checkpoint import CheckpointManager

  folder = config.checkpoint.get("dir") or paths.join(workdir, "checkpoints")
  if not paths.isdir(folder):
    return False
  with CheckpointManager(folder, read_only=True) as ckpt:
    last = ckpt.latest_step()
  return last is not None and last >= int(config.train.iterations)


def validate_stages(config, workdir: str) -> None:
  """Validates the config of every stage but the last (the caller validates the run's own); one
  `ConfigError` listing what is wrong."""
  from sdar_jax.run.config_validation import validate

  for stage_config, _ in plan(config, workdir)[:-1]:
    validate(stage_config)


def run(config, workdir: str, validated: bool = False) -> dict[str, float]:
  """Trains every stage of `config` (module doc) and returns the last run's last metrics row."""
  from sdar_jax.run import trainer
  from sdar_jax.run.config_validation import validate

  stages = plan(config, workdir)
  if not validated:
    validate(config)
  for stage_config, _ in stages[:-1]:
    validate(stage_config)
  for stage_config, stage_dir in stages[:-1]:
    if not finished(stage_config, stage_dir):
      trainer.run(stage_config, stage_dir, validated=True)
  last_config, last_dir = stages[-1]
  return trainer.run(last_config, last_dir, validated=True)
