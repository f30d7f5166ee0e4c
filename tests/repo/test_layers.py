"""The package layers, read from the source: every import of sdar_jax/, envs/ and experiments/
(module-level and inside functions) points to its own layer or one below, no two modules import
each other (directly or round a longer cycle), no module-level `__getattr__` imports a module on demand, and
sdar_jax/ holds few modules directly. The layers are those of the README's architecture section.

Pure text analysis (the `ast` of every file): nothing is imported, so the test runs in a second.
"""

from __future__ import annotations

import ast
import os

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("sdar_jax", "envs", "experiments")

# Lowest first. A module belongs to the longest prefix listed; envs/ imports nothing of sdar_jax/.
LAYERS: tuple[tuple[str, ...], ...] = (
  ("sdar_jax", "sdar_jax.infra", "sdar_jax.text"),  # 0: files, processes, text
  ("sdar_jax.models", "sdar_jax.algos", "sdar_jax.core"),  # 1: pure JAX
  ("sdar_jax.rollout", "envs"),  # 2: episodes and the environments they play
  ("sdar_jax.observe",),  # 3: metrics, diagnostics, transcripts
  ("sdar_jax.run",),  # 4: the trainer and what it composes
  # 5: the commands
  ("sdar_jax.train", "sdar_jax.evaluate", "sdar_jax.aot", "sdar_jax.compare", "sdar_jax.tools"),
  ("experiments",),  # 6: the experiments' drivers and reports (outside the package)
)
MAX_TOP_LEVEL_MODULES = 12


def _modules() -> dict[str, str]:
  """module name -> file path, for every .py file of PACKAGES."""
  out = {}
  for package in PACKAGES:
    for root, dirs, names in os.walk(os.path.join(_REPO, package)):
      dirs[:] = [d for d in dirs if d != "__pycache__"]
      for name in names:
        if name.endswith(".py"):
          path = os.path.join(root, name)
          module = os.path.relpath(path, _REPO)[:-3].replace(os.sep, ".")
          out[module.removesuffix(".__init__")] = path
  return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
  """The module `name` refers to: itself, else its longest known parent (a.b.attr -> a.b)."""
  parts = name.split(".")
  while parts:
    if ".".join(parts) in MODULES:
      return ".".join(parts)
    parts.pop()
  return None


def _imports(module: str) -> list[tuple[str, int]]:
  """(imported project module, line) for every import statement of `module`, at any depth."""
  path = MODULES[module]
  is_package = path.endswith("__init__.py")
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[: len(here) - node.level + 1]
        base = ".".join(here + ([base] if base else []))
      targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    else:
      continue
    for target in targets:
      resolved = _resolve(target)
      if resolved is not None and resolved != module and (resolved, node.lineno) not in out:
        out.append((resolved, node.lineno))
  return out


GRAPH = {module: _imports(module) for module in MODULES}


def layer_of(module: str) -> int:
  best, layer = "", None
  for k, names in enumerate(LAYERS):
    for name in names:
      if (module == name or module.startswith(name + ".")) and len(name) > len(best):
        best, layer = name, k
  if layer is None:
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS (and the README)")
  return layer


def _where(module: str, line: int) -> str:
  return f"{os.path.relpath(MODULES[module], _REPO)}:{line}"


def test_every_module_has_a_layer():
  for module in MODULES:
    layer_of(module)


def test_imports_point_to_the_same_layer_or_below():
  upward = [
    f"{_where(m, line)}: {m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})"
    for m, edges in GRAPH.items()
    for t, line in edges
    if layer_of(t) > layer_of(m)
  ]
  assert not upward, "imports from a higher layer:\n" + "\n".join(sorted(upward))


def test_envs_import_nothing_of_sdar_jax():
  found = [
    f"{_where(m, line)}: {m} imports {t}"
    for m, edges in GRAPH.items()
    if m.split(".")[0] == "envs"
    for t, line in edges
    if t.split(".")[0] == "sdar_jax"
  ]
  assert not found, "\n".join(found)


def find_cycles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan, iterative)."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  on_stack: set[str] = set()
  cycles = []
  for start in graph:
    if start in index:
      continue
    work = [(start, iter(sorted({t for t, _ in graph[start]})))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = len(index)
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted({t for t, _ in graph[child]}))))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        parent = work[-1][0]
        low[parent] = min(low[parent], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          component.append(member)
          if member == node:
            break
        if len(component) > 1:
          cycles.append(sorted(component))
  return cycles


def test_no_import_cycles():
  cycles = find_cycles(GRAPH)
  described = []
  for cycle in cycles:
    members = set(cycle)
    edges = [
      f"    {_where(m, line)}: {m} -> {t}" for m in cycle for t, line in GRAPH[m] if t in members
    ]
    described.append(f"cycle of {len(cycle)}: {', '.join(cycle)}\n" + "\n".join(edges))
  assert not cycles, "\n".join(described)


def test_find_cycles_sees_a_cycle_through_a_function_local_import():
  graph = {"a": [("b", 1)], "b": [("c", 2)], "c": [("a", 3)], "d": [("a", 4)]}
  assert find_cycles(graph) == [["a", "b", "c"]]
  assert find_cycles({"a": [("b", 1)], "b": []}) == []


def test_no_module_getattr_imports_on_demand():
  found = []
  for module, path in MODULES.items():
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in tree.body:
      if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
        if any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(node)):
          found.append(_where(module, node.lineno))
        if "importlib" in ast.unparse(node) or "__import__" in ast.unparse(node):
          found.append(_where(module, node.lineno))
  assert not found, "module __getattr__ importing on demand (import it at the top):\n" + "\n".join(
    found
  )


def test_few_modules_directly_in_sdar_jax():
  top = sorted(n for n in os.listdir(os.path.join(_REPO, "sdar_jax")) if n.endswith(".py"))
  assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_only_run_and_the_commands_take_a_trainer():
  """Below run/, functions take what they use (a step function, a mesh, a folder), never the
  Trainer: no parameter named `trainer` or annotated `Trainer`."""
  found = []
  for module, path in MODULES.items():
    if layer_of(module) >= layer_of("sdar_jax.run"):
      continue
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
          annotation = ast.unparse(arg.annotation) if arg.annotation else ""
          if arg.arg == "trainer" or "Trainer" in annotation:
            found.append(f"{_where(module, node.lineno)}: {node.name}({arg.arg})")
  assert not found, "\n".join(found)
