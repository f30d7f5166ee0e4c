"""The README's commands run, and docs/README.md indexes every page.

Every command of README.md's shell blocks that runs `python -m <module>` or a Python script is
exercised: each distinct module or script once with its help flag, each of its flags checked
against that help, each `--config.<key>` override checked against the config it is applied to,
and every line that shows `--dry_run` run as written. `make <target>` lines must name a target of
the Makefile. So the README cannot drift from the code.
"""

import importlib.util
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.helpers import REPO

README = os.path.join(REPO, "README.md")
DOCS = os.path.join(REPO, "docs")
SHELL_LANGS = ("", "bash", "sh", "shell", "console")


def read(path: str) -> str:
  with open(path) as f:
    return f.read()


def shell_commands(text: str) -> list[str]:
  """The command lines of the fenced shell blocks, continuations joined, comments dropped."""
  commands = []
  for lang, body in re.findall(r"^```([a-z]*)\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
    if lang not in SHELL_LANGS:
      continue
    body = re.sub(r"\\\n\s*", " ", body)
    for line in body.splitlines():
      line = line.split(" #", 1)[0].strip()
      if line and not line.startswith("#"):
        commands.append(line)
  return commands


def python_invocations(commands: list[str]) -> list[tuple[str, str, list[str]]]:
  """(kind, target, arguments) of every command that runs python: kind "module" or "script"."""
  found = []
  for command in commands:
    words = shlex.split(command)
    for i, word in enumerate(words):
      if re.fullmatch(r"(\S*/)?python3?(\.\d+)?", word) and i + 1 < len(words):
        if words[i + 1] == "-m" and i + 2 < len(words):
          found.append(("module", words[i + 2], words[i + 3 :]))
        elif words[i + 1].endswith(".py"):
          found.append(("script", words[i + 1], words[i + 2 :]))
        break
  return found


def uses_absl(kind: str, target: str) -> bool:
  if kind == "script":
    path = os.path.join(REPO, target)
  else:
    path = importlib.util.find_spec(target).origin
  return "from absl import app" in read(path)


def run(args: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO}
  return subprocess.run(
    [sys.executable, *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )


def load_config(spec: str):
  """`configs/x.py[:arg]` as the commands load it."""
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("readme_config", os.path.join(REPO, path))
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


TEXT = read(README)
COMMANDS = shell_commands(TEXT)
INVOCATIONS = python_invocations(COMMANDS)
TARGETS = sorted({(kind, target) for kind, target, _ in INVOCATIONS})


def test_readme_is_short_and_self_contained():
  assert len(TEXT.splitlines()) <= 250
  assert "http://" not in TEXT and "https://" not in TEXT  # nothing outside the repository
  assert {t for _, t in TARGETS} >= {"sdar_jax.train", "sdar_jax.evaluate", "sdar_jax.aot"}
  assert COMMANDS[:2] == ["make demo", "make test"]  # the quick start's two commands


def test_make_targets_exist():
  makefile = read(os.path.join(REPO, "Makefile"))
  defined = set(re.findall(r"^([a-zA-Z][\w-]*):", makefile, flags=re.MULTILINE))
  used = {c.split()[1] for c in COMMANDS if c.startswith("make ")}
  assert used and used <= defined, used - defined


@pytest.mark.parametrize("kind,target", TARGETS, ids=[t for _, t in TARGETS])
def test_command_runs_with_help_and_knows_its_flags(kind, target):
  absl = uses_absl(kind, target)
  # absl's --help exits 1 by design; --helpfull lists every flag of the command, also exiting 1.
  flag = "--helpfull" if absl else "--help"
  proc = run(["-m", target, flag] if kind == "module" else [target, flag])
  assert proc.returncode == (1 if absl else 0), proc.stderr[-2000:]
  help_text = proc.stdout + proc.stderr
  assert "usage" in help_text.lower() or "flags:" in help_text, help_text[-2000:]
  for k, t, args in INVOCATIONS:
    if (k, t) != (kind, target):
      continue
    for arg in args:
      name = arg.split("=", 1)[0]
      if name.startswith("--") and not name.startswith("--config."):
        # absl lists a boolean flag as --[no]name
        pattern = rf"--(\[no\])?{re.escape(name[2:])}\b" if absl else rf"{re.escape(name)}\b"
        assert re.search(pattern, help_text), f"{target} does not know {name}"


def test_config_overrides_name_existing_keys():
  checked = 0
  for _, target, args in INVOCATIONS:
    spec = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
    if spec is None:
      continue
    config = load_config(spec)
    for arg in args:
      if not arg.startswith("--config."):
        continue
      node = config
      for key in arg.split("=", 1)[0][len("--config.") :].split("."):
        assert key in node, f"{target} {spec}: no config key {arg}"
        node = node[key]
      checked += 1
  assert checked >= 5


DRY_RUNS = [(t, a) for k, t, a in INVOCATIONS if k == "module" and "--dry_run" in a]


@pytest.mark.parametrize("target,args", DRY_RUNS, ids=[" ".join(a[:1]) for _, a in DRY_RUNS])
def test_dry_run_lines_pass(target, args):
  assert len(DRY_RUNS) <= 3  # keep this test fast
  proc = run(["-m", target, *args])
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "dry run" in proc.stdout


def test_docs_index_names_every_page():
  index = read(os.path.join(DOCS, "README.md"))
  named = set(re.findall(r"\]\(([\w./-]+\.md)\)", index))
  pages = {f for f in os.listdir(DOCS) if f.endswith(".md") and f != "README.md"}
  assert pages <= named, f"docs/README.md does not name {sorted(pages - named)}"
  missing = [n for n in named if not os.path.exists(os.path.join(DOCS, n))]
  assert not missing, f"docs/README.md names missing pages {missing}"
  for line in index.splitlines():  # one line per page
    assert len(re.findall(r"\]\([\w./-]+\.md\)", line)) <= 1, line


def test_docs_pages_named_in_readme_exist():
  for name in set(re.findall(r"\bdocs/([\w-]+\.md)", TEXT)):
    assert os.path.exists(os.path.join(DOCS, name)), name
