"""Where the suite's compile time goes, per test (a pytest plugin for the suite's diet).

    .venv/bin/python -m pytest tests -p bench.compile_profile --compile-profile=/tmp/compile.tsv
    .venv/bin/python bench/compile_profile.py /tmp/compile.tsv    # the largest, then the totals

Each test (setup, call and teardown together) gets one row: its wall seconds and, in this
process, the seconds JAX spent tracing, lowering and compiling, the programs compiled and those
loaded from the persistent cache. Programs compiled in a test's subprocesses are not seen. xdist
workers append to the same file (one line per write). With an empty compilation cache the rows
show what a clean CI run pays; with a warm one, what a developer's rerun does.
"""

from __future__ import annotations

import collections
import os
import sys
import time

import pytest

_EVENTS = {
  "/jax/core/compile/jaxpr_trace_duration": "trace_s",
  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
  "/jax/core/compile/backend_compile_duration": "compile_s",
}
_COUNTS = {"/jax/compilation_cache/cache_hits": "cache_hits"}
COLUMNS = ("wall_s", "trace_s", "lower_s", "compile_s", "compiles", "cache_hits")


def pytest_addoption(parser):
  parser.addoption("--compile-profile", default=None, help="a TSV file to append per-test rows to")


class _Recorder:
  def __init__(self, path: str):
    import jax

    self.path = path
    self.current: collections.Counter = collections.Counter()
    jax.monitoring.register_event_duration_secs_listener(self._duration)
    jax.monitoring.register_event_listener(self._event)

  def _duration(self, event: str, seconds: float, **_) -> None:
    if event in _EVENTS:
      self.current[_EVENTS[event]] += seconds
      if event.endswith("backend_compile_duration"):
        self.current["compiles"] += 1

  def _event(self, event: str, **_) -> None:
    if event in _COUNTS:
      self.current[_COUNTS[event]] += 1

  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(self, item, nextitem):
    self.current = collections.Counter()
    start = time.perf_counter()
    yield
    self.current["wall_s"] = time.perf_counter() - start
    row = "\t".join([item.nodeid] + [f"{self.current[c]:.3f}" for c in COLUMNS])
    with open(self.path, "a") as f:
      f.write(row + "\n")


def pytest_configure(config):
  path = config.getoption("--compile-profile")
  if path:
    config.pluginmanager.register(_Recorder(os.path.abspath(path)), "sdar_compile_profile")


def summarize(path: str, top: int = 40) -> str:
  """The largest rows by compile seconds, then the totals and the same by test module."""
  rows = []
  with open(path) as f:
    for line in f:
      name, *values = line.rstrip("\n").split("\t")
      rows.append((name, dict(zip(COLUMNS, map(float, values)))))
  by_module: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for name, values in rows:
    by_module[name.split("::")[0]].update(values)
  head = f"{'wall s':>8} {'compile s':>9} {'trace+lower s':>13} {'programs':>8} {'hits':>6}  "
  out = [head + "test"]

  def line(name, v):
    traced = v["trace_s"] + v["lower_s"]
    return (
      f"{v['wall_s']:8.1f} {v['compile_s']:9.1f} {traced:13.1f} {int(v['compiles']):8d}"
      f" {int(v['cache_hits']):6d}  {name}"
    )

  for name, values in sorted(rows, key=lambda r: -r[1]["compile_s"])[:top]:
    out.append(line(name, values))
  out += ["", head + "module"]
  for name, values in sorted(by_module.items(), key=lambda r: -r[1]["compile_s"])[:top]:
    out.append(line(name, values))
  total: collections.Counter = collections.Counter()
  for _, values in rows:
    total.update(values)
  out += ["", line(f"all {len(rows)} tests", total)]
  return "\n".join(out)


if __name__ == "__main__":
  print(summarize(*sys.argv[1:2], *(int(a) for a in sys.argv[2:3])))
