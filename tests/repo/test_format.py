"""The tree is as `make fmt` leaves it: `ruff format --check` over the repository (the settings in
pyproject.toml) finds nothing to change, so `make fmt` never rewrites a committed file; and
`ruff check` (pyflakes, pycodestyle's errors, import order: pyproject.toml's [tool.ruff.lint])
finds nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ruff() -> str | None:
  beside = os.path.join(os.path.dirname(sys.executable), "ruff")
  return beside if os.path.exists(beside) else shutil.which("ruff")


def test_make_fmt_changes_nothing():
  ruff = _ruff()
  if ruff is None:
    pytest.skip("ruff is not installed (requirements-dev.txt pins it)")
  result = subprocess.run(
    [ruff, "format", "--check", "--diff", "."], cwd=_REPO, capture_output=True, text=True
  )
  assert result.returncode == 0, (
    "`make fmt` would reformat these files; run `make fmt` and commit the result:\n"
    + result.stdout[-4000:]
    + result.stderr[-2000:]
  )


def test_ruff_check_finds_nothing():
  ruff = _ruff()
  if ruff is None:
    pytest.skip("ruff is not installed (requirements-dev.txt pins it)")
  result = subprocess.run(
    [ruff, "check", "--output-format", "concise", "."], cwd=_REPO, capture_output=True, text=True
  )
  assert result.returncode == 0, (
    "`ruff check` reports these (`ruff check --fix` mends the import order and some others):\n"
    + result.stdout[-4000:]
    + result.stderr[-2000:]
  )
