"""The modules' size and the one implementation of each computation, read from the source: no
module of the repository (library, environments, experiments, tools, tests) is over MAX_LINES
lines; the update's loss and the token view score through one function of core/scoring.py (and
observe/ only renders: it compiles nothing of its own); one FLOPs function serves the TPU planner
and the benchmarks; each command module holds its flags and main and nothing else of size.

Pure text analysis (the `ast` of each file): nothing is imported, so the test runs in a second.
"""

from __future__ import annotations

import ast
import os

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_LINES = 600
SCORING = "sdar_jax.core.scoring"
TWO_BRANCH = "two_branch_scores"  # the chunked two-branch head
# what only core/scoring.py computes: the lm_head, its log-softmax, the hidden states it reads
HEAD_NAMES = {"logits_from_hidden", "log_softmax", "response_hidden", TWO_BRANCH}


def _path(module: str) -> str:
  return os.path.join(_REPO, *module.split(".")) + ".py"


def _tree(module: str) -> ast.Module:
  path = _path(module)
  return ast.parse(open(path, encoding="utf-8").read(), path)


def _imported(module: str, source: str) -> set[str]:
  """The names `module` imports from `source` (`from source import a, b`), at any depth."""
  return {
    alias.name
    for node in ast.walk(_tree(module))
    if isinstance(node, ast.ImportFrom) and node.module == source and not node.level
    for alias in node.names
  }


def _calls(tree: ast.AST) -> set[str]:
  """The names called in `tree` (f(...) and x.f(...) both give f)."""
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Call):
      func = node.func
      out.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
  return out


def _function(module: str, name: str) -> ast.FunctionDef:
  found = [
    node
    for node in ast.walk(_tree(module))
    if isinstance(node, ast.FunctionDef) and node.name == name
  ]
  assert len(found) == 1, f"{module} defines {name} {len(found)} times"
  return found[0]


# every folder of Python the repository holds: the library, the environments, the experiments,
# the launchers, benches and configs, and the tests themselves
PYTHON_FOLDERS = ("sdar_jax", "envs", "experiments", "launch", "bench", "configs", "tests")


def test_no_module_over_the_line_limit():
  long = []
  walks = [os.walk(os.path.join(_REPO, folder)) for folder in PYTHON_FOLDERS]
  for root, dirs, names in (step for walk in walks for step in walk):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for name in names:
      if name.endswith(".py"):
        path = os.path.join(root, name)
        with open(path, encoding="utf-8") as f:
          count = sum(1 for _ in f)
        if count > MAX_LINES:
          long.append(f"{os.path.relpath(path, _REPO)}: {count} lines")
  assert not long, f"modules over {MAX_LINES} lines (split them where a reader would look):\n" + (
    "\n".join(sorted(long))
  )


def test_the_update_and_the_token_view_score_through_one_function():
  # the update: TrainStep (core/train_step.py) takes its loss from core/loss.py, whose student
  # branch is the two-branch head
  assert "loss_and_grads" in _imported("sdar_jax.core.train_step", "sdar_jax.core.loss")
  assert TWO_BRANCH in _imported("sdar_jax.core.loss", SCORING)
  assert TWO_BRANCH in _calls(_function("sdar_jax.core.loss", "student_scores"))
  # the token view: core/scoring.py's score_responses, which runs the same head
  view = _imported("sdar_jax.observe.token_view", SCORING)
  assert "score_responses" in view, view
  assert "_view_fn" in _calls(_function(SCORING, "score_responses"))
  assert TWO_BRANCH in _calls(_function(SCORING, "_view_fn"))
  # the head is defined once, in core/scoring.py
  defined = [
    module
    for module in _modules("sdar_jax")
    for node in ast.walk(_tree(module))
    if isinstance(node, ast.FunctionDef) and node.name == TWO_BRANCH
  ]
  assert defined == [SCORING], defined


def test_observe_computes_no_scores():
  """observe/ renders: it jits nothing and forms no lm_head or log-softmax of its own."""
  found = []
  for module in _modules("sdar_jax.observe"):
    tree = _tree(module)
    for node in ast.walk(tree):
      name = None
      if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
      if name in HEAD_NAMES | {"jit"}:
        found.append(f"{module}:{node.lineno}: {name}(...)")
  assert not found, "observe/ computes scores; call sdar_jax.core.scoring instead:\n" + "\n".join(
    found
  )


def test_one_flops_function_serves_the_planner_and_the_benchmarks():
  flops = "sdar_jax.models.flops"
  assert "update_flops" in _imported("sdar_jax.run.tpu_plan", flops)
  for bench in ("bench/train_step.py", "bench/gpu_check.py"):
    path = os.path.join(_REPO, bench)
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    imports = {
      alias.name
      for node in ast.walk(tree)
      if isinstance(node, ast.ImportFrom) and node.module == flops
      for alias in node.names
    }
    defines = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert "update_flops" in imports and not defines & {"update_flops", "forward_flops"}, bench
  defined = [
    module
    for module in _modules("sdar_jax")
    for node in ast.walk(_tree(module))
    if isinstance(node, ast.FunctionDef) and node.name.endswith("_flops")
  ]
  assert set(defined) == {flops}, defined


COMMANDS = ("sdar_jax.train", "sdar_jax.evaluate", "sdar_jax.aot", "sdar_jax.compare")


def test_a_command_module_holds_flags_and_main():
  """A command module defines its flags, `main` and small helpers, no dataclass or table of its
  own (those live in the layers below)."""
  for module in COMMANDS:
    tree = _tree(module)
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "main" in names, module
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    assert all(c.endswith("Error") for c in classes), (module, classes)


def _modules(package: str) -> list[str]:
  root = os.path.join(_REPO, *package.split("."))
  out = []
  for where, dirs, names in os.walk(root):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for name in names:
      if name.endswith(".py") and name != "__init__.py":
        out.append(os.path.relpath(os.path.join(where, name), _REPO)[:-3].replace(os.sep, "."))
  return sorted(out)
