"""docs/extending.md runs as written: each section's module, saved outside the checkout under the
file name the text gives, and its command (with this interpreter for `python`) pass the dry run;
the environment's module also reaches an env worker through SDAR_IMPORTS alone."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.helpers import REPO

SECTIONS = {  # section title -> the module file its text names
  "Adding a gate": "mygates.py",
  "Adding a loss term": "myterms.py",
  "Adding an environment": "mysay.py",
}


def _section(title: str) -> str:
  with open(os.path.join(REPO, "docs", "extending.md"), encoding="utf-8") as f:
    text = f.read()
  return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _save_module(title: str, folder) -> str:
  """Writes the section's python block(s) as the module its text names; returns the module name."""
  section, filename = _section(title), SECTIONS[title]
  assert f"`{filename}`" in section, f"{title!r} no longer names {filename}"
  (folder / filename).write_text(
    "\n\n".join(re.findall(r"```python\n(.*?)```", section, re.DOTALL))
  )
  return filename.removesuffix(".py")


@pytest.mark.slow
@pytest.mark.parametrize("title", list(SECTIONS))
def test_the_section_command_runs_as_written(title, tmp_path):
  module = _save_module(title, tmp_path)
  (command,) = [
    c for c in re.findall(r"```bash\n(.*?)```", _section(title), re.DOTALL) if "--imports" in c
  ]
  argv = shlex.split(command.replace("\\\n", " "))
  assert argv[0] == "python" and f"--imports={module}" in argv
  env = {**os.environ, "PYTHONPATH": str(tmp_path), "JAX_PLATFORMS": "cpu"}
  env.pop("SDAR_IMPORTS", None)
  out = subprocess.run(
    [sys.executable, *argv[1:]],
    check=False,
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert "dry run: config valid, nothing trained." in out.stdout


@pytest.mark.slow
def test_the_environment_is_built_by_a_worker_from_its_name_alone(tmp_path, monkeypatch):
  """The module is never imported here: the worker finds "say" through SDAR_IMPORTS only."""
  import envs
  from envs import base

  module = _save_module("Adding an environment", tmp_path)
  assert "say" not in base._REGISTRY
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # what the spawned worker imports from
  monkeypatch.setenv("SDAR_IMPORTS", module)
  try:
    pool = envs.EnvPool("say", 1, {}, num_workers=1)
    try:
      (result,) = pool.reset([0])
      assert not result.failed, result.info
    finally:
      pool.close()
  finally:  # in case the pool built an env in this process
    base._REGISTRY.pop("say", None)
    base._FAMILIES.pop("say", None)
    sys.modules.pop(module, None)
