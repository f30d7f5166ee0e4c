"""Methods as plug-ins (docs/extending.md, "A method that acts once per iteration"): a turn-advantage
rewrite, a teacher-weight schedule and a teacher-context builder, registered here as a user would
in their own module, are selected by a run config and drive one iteration of the real Trainer;
nothing under sdar_jax/ names them."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import jax
import numpy as np
import pytest

from sdar_jax import algos
from tests.helpers import ONE_ITERATION, tiny_run_config

PREFIX = 3  # tokens the context builder puts before the student's prompt


class EveryOtherIteration(algos.MethodHooks):
  """A teacher-weight schedule: the EMA teacher moves after iterations 1, 3, 5, ..."""

  def after_updates(self, view):
    moved = view.iteration % 2 == 0 and view.updates_applied()
    if moved:
      view.move_teacher_ema()
    return {"every_other/moved": float(moved)}


class RepeatTheFirstToken(algos.MethodHooks):
  """A teacher-context builder: the teacher reads the student's prompt after PREFIX copies of its
  first token (in place of the skills)."""

  def after_rollout(self, view):
    for sample in view.samples:
      sample.teacher_prompt_ids = [sample.prompt_ids[0]] * PREFIX + list(sample.prompt_ids)
    return {"repeat/samples": float(len(view.samples))}


@pytest.fixture
def plugins():
  @algos.register_turn_advantage("halve")
  def halve(algo, table, num_groups=None):
    return np.asarray(table.advantage, np.float32) * 0.5

  algos.register_hooks("every_other")(
    lambda a: EveryOtherIteration() if "every_other" in a.hook_names else None
  )
  algos.register_hooks("repeat_first")(
    lambda a: RepeatTheFirstToken() if "repeat_first" in a.hook_names else None
  )
  yield
  algos.TURN_ADVANTAGES.unregister("halve")
  algos.ADVANTAGE_ESTIMATORS.unregister("halve")
  algos.METHOD_HOOKS.unregister("every_other")
  algos.METHOD_HOOKS.unregister("repeat_first")


@pytest.mark.slow
def test_registered_hooks_drive_one_iteration(tmp_path, plugins):
  from sdar_jax.run import trainer
  from sdar_jax.run.checkpoint import CheckpointManager

  workdir = str(tmp_path / "plugins")
  settings = {
    "algo.advantage": "halve",  # a turn-level rewrite: the teacher is scored at θ_old
    "algo.teacher_weights": "ema",
    "algo.ema.every": "manual",  # moved only by the schedule's hook
    "algo.ema.decay": 0.0,  # a move makes the EMA the params
    "algo.hooks": "every_other,repeat_first",
    "algo.kl_coef": 0.0,
  }
  trainer.run(tiny_run_config(1, "grpo", **ONE_ITERATION, **settings), workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    (row,) = [r for r in map(json.loads, f) if "train/loss" in r]
  assert row["train/skipped_update"] == 0.0
  # the rewrite: every advantage halved
  assert row["turn_adv/abs_mean"] == pytest.approx(0.5 * row["turn_adv/grpo_abs_mean"], rel=1e-6)
  # the context builder: every teacher prompt is PREFIX tokens longer than the student's
  assert row["rollout/skill_block_tokens"] == PREFIX and row["repeat/samples"] >= 1
  assert row["every_other/moved"] == 1.0  # iteration 1 is the first, moved after it
  with CheckpointManager(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
    state, _ = ckpt.restore()
  # decay 0: the EMA is the params after the move
  jax.tree.map(np.testing.assert_array_equal, state["ema_params"], state["params"])


def test_an_unregistered_hook_is_refused_naming_the_flag():
  from sdar_jax.algos import AlgoConfig

  with pytest.raises(
    ValueError, match=r"algo.hooks='nope': 'nope' is not a registered method hook.*--imports"
  ):
    AlgoConfig(hooks="nope")


def _section_blocks(lang: str) -> list[str]:
  """The `lang` code blocks of docs/extending.md's section on methods acting once per iteration."""
  from tests.helpers import REPO

  with open(os.path.join(REPO, "docs", "extending.md"), encoding="utf-8") as f:
    text = f.read()
  section = text.split("## A method that acts once per iteration", 1)[1].split("\n## ", 1)[0]
  return re.findall(rf"```{lang}\n(.*?)```", section, re.DOTALL)


@pytest.mark.slow
def test_the_docs_example_runs_as_written_from_a_package_outside_the_checkout(tmp_path):
  """docs/extending.md's module, saved outside the checkout, and its command, run as written (with
  this interpreter for `python`): the names it registers are known to the config check."""
  from tests.helpers import REPO

  (module,) = _section_blocks("python")
  (command,) = _section_blocks("bash")
  (tmp_path / "mymethods.py").write_text(module)
  argv = shlex.split(command.replace("\\\n", " "))
  assert argv[0] == "python" and "--imports=mymethods" in argv
  env = {**os.environ, "PYTHONPATH": str(tmp_path), "JAX_PLATFORMS": "cpu"}
  env.pop("SDAR_IMPORTS", None)
  out = subprocess.run(
    [sys.executable, *argv[1:]],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert "dry run: config valid, nothing trained." in out.stdout
  # without the flag, the names are unknown: one message naming it, exit status 2
  bare = [a for a in argv[1:] if not a.startswith("--imports")]
  out = subprocess.run(
    [sys.executable, *bare],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert out.returncode == 2 and "--imports=your.module" in out.stderr, out.stderr[-3000:]


def test_imports_name_a_missing_module_and_reach_env_workers(tmp_path, monkeypatch):
  """A module --imports cannot find is one message naming the flag; one it finds is recorded in
  SDAR_IMPORTS, which env workers import before building their envs (envs.base)."""
  import envs
  from sdar_jax.infra import plugins

  monkeypatch.setenv(plugins.ENV_VAR, "")  # restored (unset) after the test: load() writes it
  with pytest.raises(plugins.PluginImportError, match=r"--imports=no_such_pkg.x: no module named"):
    plugins.load("no_such_pkg.x")
  (tmp_path / "my_echo_env.py").write_text(
    "import envs\nfrom envs.dummy import DummyEnv\n\n"
    "@envs.register('my_echo')\ndef make(**kw):\n  return DummyEnv(**kw)\n"
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # what the spawned worker imports from
  assert plugins.load_from_argv(["x", "--imports", "my_echo_env"]) == ["my_echo_env"]
  assert os.environ[plugins.ENV_VAR] == "my_echo_env"
  envs.base._REGISTRY.pop("my_echo")  # the worker must find it through SDAR_IMPORTS alone
  pool = envs.EnvPool("my_echo", 1, {"slow_s": 0.0}, num_workers=1)
  try:
    (result,) = pool.reset([0])
    assert not result.failed, result.info
  finally:
    pool.close()
