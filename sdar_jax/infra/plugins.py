"""Modules of the user's own that register methods, gates, losses, hooks or environments, named
on the command line (`--imports=pkg.methods,pkg.envs`) and imported before the config is read.

`load` imports them in this process and records them in the environment variable `SDAR_IMPORTS`,
which the env pool's worker processes (envs/pool.py) and any subprocess inherit and import in
turn, so a name registered there is known wherever it is looked up.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Sequence

from sdar_jax.infra.errors import UserError

ENV_VAR = "SDAR_IMPORTS"  # read by envs.base.import_user_modules too (envs/ imports nothing here)
_FLAG = re.compile(r"^--imports(=(?P<value>.*))?$")


class PluginImportError(UserError):
  heading = "PluginImportError"


def names(spec: str | Sequence[str] | None) -> list[str]:
  """Module names of a comma-separated spec (or a list of them), blanks dropped."""
  parts = spec.split(",") if isinstance(spec, str) else list(spec or [])
  return [p.strip() for p in parts if p and p.strip()]


def load(spec: str | Sequence[str] | None) -> list[str]:
  """Imports each module of `spec` and adds it to `SDAR_IMPORTS`; returns the names imported. A
  module that cannot be imported is a `PluginImportError` naming it and the flag."""
  modules = names(spec)
  for module in modules:
    try:
      importlib.import_module(module)
    except ModuleNotFoundError as e:
      raise PluginImportError(
        f"--imports={','.join(modules)}: no module named {e.name!r} (importing {module!r}). Fix: "
        "put the folder that holds the package on PYTHONPATH (or pip install it), and name it "
        "as Python imports it, e.g. --imports=mypkg.methods"
      ) from None
  known = names(os.environ.get(ENV_VAR, ""))
  os.environ[ENV_VAR] = ",".join(known + [m for m in modules if m not in known])
  return modules


def load_from_argv(argv: Sequence[str]) -> list[str]:
  """`load` of every --imports=... of a command line (also "--imports X"), before its flags are
  parsed: the config and its overrides may name what those modules register."""
  out: list[str] = []
  argv = list(argv)
  for i, arg in enumerate(argv):
    match = _FLAG.match(arg)
    if match is None:
      continue
    value = match.group("value")
    if value is None:
      value = argv[i + 1] if i + 1 < len(argv) else ""
    out += load(value)
  return out
