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


def _ruff(*args: str) -> tuple[int, str]:
  """(exit code, the end of its output) of ruff with `args` over the repository; skips the test
  where ruff is not installed."""
  beside = os.path.join(os.path.dirname(sys.executable), "ruff")
  ruff = beside if os.path.exists(beside) else shutil.which("ruff")
  if ruff is None:
    pytest.skip("ruff is not installed (requirements-dev.txt pins it)")
  result = subprocess.run([ruff, *args, "."], cwd=_REPO, capture_output=True, text=True)
  return result.returncode, result.stdout[-4000:] + result.stderr[-2000:]


def test_make_fmt_changes_nothing():
  code, out = _ruff("format", "--check", "--diff")
  assert code == 0, "`make fmt` would reformat these files; run it and commit the result:\n" + out


def test_ruff_check_finds_nothing():
  code, out = _ruff("check", "--output-format", "concise")
  assert code == 0, "`ruff check` reports these (`make fmt` mends the import order):\n" + out
