"""Packaging: pyproject.toml and the requirements files agree with the code and with what is
installed (Python version, every runtime import pinned, test-only packages kept out of the
runtime, the skill texts shipped as package data)."""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import pathlib
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
RUNTIME_DIRS = ("sdar_jax", "envs", "configs", "launch")
FIRST_PARTY = {"sdar_jax", "envs", "configs", "tests", "bench", "_common"}
# Imported only inside a function, for a feature that is off unless asked for; installed with the
# runtime requirements anyway (a dependency of textworld's jericho).
OPTIONAL_IMPORTS = {"spacy", "fsspec"}  # fsspec: only for gs:// workdirs (the gcs extra pins it)
# Imported only inside a function, for an option that is off by default, and installed by its
# extra (pinned there, and in requirements-dev.txt for the tests): logging.wandb.
EXTRA_IMPORTS = {"wandb"}
TEST_ONLY = {"transformers", "torch", "safetensors", "pytest"}


def _pyproject() -> dict:
  with open(REPO / "pyproject.toml", "rb") as f:
    return tomllib.load(f)


def _requirements(name: str) -> list[Requirement]:
  lines = (REPO / name).read_text().splitlines()
  return [Requirement(line) for line in lines if line.strip() and not line.startswith(("#", "-"))]


def _runtime_imports() -> dict[str, str]:
  """Top-level module name -> a file importing it, over the code a run executes."""
  found: dict[str, str] = {}
  for directory in RUNTIME_DIRS:
    for path in sorted((REPO / directory).rglob("*.py")):
      for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
          names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
          names = [node.module]
        else:
          continue
        for name in names:
          found.setdefault(name.split(".")[0], str(path.relative_to(REPO)))
  return found


def test_requires_python_matches_the_pins():
  """The lowest Python that every pinned runtime package supports is the one pyproject declares."""
  floor = Version("3.0")
  for requirement in _requirements("requirements.txt"):
    declared = importlib.metadata.metadata(requirement.name)["Requires-Python"]
    for spec in SpecifierSet(declared or ""):
      if spec.operator == ">=":
        floor = max(floor, Version(spec.version))
  assert floor == Version("3.11")
  assert _pyproject()["project"]["requires-python"] == f">={floor}"
  assert sys.version_info >= (3, 11)


def test_dependencies_come_from_requirements_txt_and_extras_pin_jax():
  project = _pyproject()
  assert "dependencies" in project["project"]["dynamic"]
  dynamic = project["tool"]["setuptools"]["dynamic"]["dependencies"]
  assert dynamic == {"file": ["requirements.txt"]}
  jax_pin = next(r for r in _requirements("requirements.txt") if r.name == "jax").specifier
  extras = project["project"]["optional-dependencies"]
  # tpu-plan: the libtpu that jax's own tpu extra pins (the compiler paired with this jax).
  libtpu = [
    str(r).split(";")[0].strip()
    for r in map(Requirement, importlib.metadata.requires("jax"))
    if r.name == "libtpu" and r.marker is not None and r.marker.evaluate({"extra": "tpu"})
  ]
  gcs = extras.pop("gcs")
  (wandb,) = extras.pop("wandb")
  assert extras == {
    "gpu": [f"jax[cuda12]{jax_pin}"],
    "tpu": [f"jax[tpu]{jax_pin}"],
    "tpu-plan": libtpu,
  }
  # gs:// workdirs: exact pins, the same ones launch/tpu_pod.sh --install puts on every worker.
  assert sorted(Requirement(r).name for r in gcs) == ["gcsfs", "google-cloud-storage"]
  assert all("==" in r for r in gcs)
  launcher = (REPO / "launch" / "tpu_pod.sh").read_text()
  assert all(f"'{r}'" in launcher for r in gcs)
  # the W&B extra: the pin the tests install and the one its error message names
  from sdar_jax.observe.wandb_log import PINNED

  assert wandb == PINNED and Requirement(wandb) in _requirements("requirements-dev.txt")


def _outside_functions(node: ast.AST):
  """The nodes under `node` that no function body holds (module level, classes, if / try)."""
  for child in ast.iter_child_nodes(node):
    if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      yield child
      yield from _outside_functions(child)


def test_extras_are_imported_inside_functions_only():
  """An extra's package is imported where its option is used, never at a module's top level:
  a run without the option neither needs it nor pays its import."""
  for directory in RUNTIME_DIRS:
    for path in sorted((REPO / directory).rglob("*.py")):
      tree = ast.parse(path.read_text(), filename=str(path))
      for inner in _outside_functions(tree):
        if isinstance(inner, ast.Import):
          names = {alias.name.split(".")[0] for alias in inner.names}
        elif isinstance(inner, ast.ImportFrom) and inner.module and inner.level == 0:
          names = {inner.module.split(".")[0]}
        else:
          continue
        assert not names & EXTRA_IMPORTS, f"{path.relative_to(REPO)}:{inner.lineno}"


def test_every_runtime_import_is_pinned_directly():
  pinned = {canonicalize_name(r.name) for r in _requirements("requirements.txt")}
  owners = importlib.metadata.packages_distributions()
  stdlib = set(sys.stdlib_module_names) | {"__future__"}
  unpinned = []
  for module, where in sorted(_runtime_imports().items()):
    if module in stdlib | FIRST_PARTY | OPTIONAL_IMPORTS | EXTRA_IMPORTS:
      continue
    distributions = {canonicalize_name(d) for d in owners.get(module, [])}
    if not distributions & pinned:
      unpinned.append(f"{module} ({where}; distribution {sorted(distributions) or 'unknown'})")
  assert not unpinned, f"imported at run time but not pinned in requirements.txt: {unpinned}"


def test_test_only_packages_stay_out_of_the_runtime():
  runtime = {canonicalize_name(r.name) for r in _requirements("requirements.txt")}
  dev = {canonicalize_name(r.name) for r in _requirements("requirements-dev.txt")}
  assert not runtime & TEST_ONLY
  assert TEST_ONLY <= dev
  imported = set(_runtime_imports())
  assert not imported & TEST_ONLY, imported & TEST_ONLY


def test_pins_are_exact_and_installed():
  for name in ("requirements.txt", "requirements-dev.txt"):
    for requirement in _requirements(name):
      (spec,) = requirement.specifier
      assert spec.operator == "==", (name, str(requirement))
      installed = Version(importlib.metadata.version(requirement.name))
      assert installed.base_version == Version(spec.version).base_version, (
        name,
        str(requirement),
        str(installed),
      )


def test_skill_texts_are_package_data():
  patterns = _pyproject()["tool"]["setuptools"]["package-data"]["envs.skills"]
  root = REPO / "envs" / "skills"
  texts = [p for p in root.rglob("*") if p.suffix in (".md", ".json")]
  assert any(p.name == "skill_mapping.json" for p in texts)
  for path in texts:
    relative = path.relative_to(root).as_posix()
    assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), relative


def test_compact_tokenizer_files_are_package_data():
  patterns = _pyproject()["tool"]["setuptools"]["package-data"]["sdar_jax"]
  root = REPO / "sdar_jax"
  files = [p for p in (root / "assets" / "tokenizers").rglob("*") if p.is_file()]
  assert any(p.name == "tokenizer.json" for p in files)
  for path in files:
    relative = path.relative_to(root).as_posix()
    assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), relative
