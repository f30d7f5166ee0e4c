"""Where the suite's compile time goes, per test (a pytest plugin for the suite's diet).

    .venv/bin/python -m pytest tests -p bench.compile_profile --compile-profile=/tmp/compile.tsv
    .venv/bin/python bench/compile_profile.py /tmp/compile.tsv    # the largest, then the totals
    # one row a program as well: the test, the program's name, its compile (or cache load)
    # seconds, and whether the persistent cache served it
    ... --compile-profile=/tmp/compile.tsv --compile-profile-programs=/tmp/programs.tsv
    .venv/bin/python bench/compile_profile.py /tmp/compile.tsv /tmp/programs.tsv

Each test (setup, call and teardown together) gets one row: its wall seconds and, in this
process, the seconds JAX spent tracing, lowering and compiling, the programs compiled and those
loaded from the persistent cache. Programs compiled in a test's subprocesses are not seen. xdist
workers append to the same file (one line per write). With an empty compilation cache the rows
show what a clean CI run pays; with a warm one, what a developer's rerun does.
"""

from __future__ import annotations

import collections
import logging
import os
import re
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


_FINISHED = re.compile(r"Finished XLA compilation of (\S+) in ([0-9.]+) sec")
_HIT = re.compile(r"Persistent compilation cache hit for '([^']+)'")


def pytest_addoption(parser):
  parser.addoption("--compile-profile", default=None, help="a TSV file to append per-test rows to")
  parser.addoption(
    "--compile-profile-programs",
    default=None,
    help="a TSV file to append one row a program to (turns on jax_log_compiles)",
  )


class _ProgramLog(logging.Handler):
  """Reads JAX's compile log: one row a program, (name, seconds, served by the cache)."""

  def __init__(self):
    super().__init__(logging.WARNING)
    self.rows: list[tuple[str, float, int]] = []
    self._hits: set[str] = set()

  def emit(self, record: logging.LogRecord) -> None:
    message = record.getMessage()
    if hit := _HIT.search(message):
      self._hits.add(hit.group(1))
    elif done := _FINISHED.search(message):
      name = done.group(1)
      # the cache names the module jit__run where the compile log names jit(_run); a program
      # compiled on another thread in between (the asynchronous rollout) can be misattributed
      served = int(re.sub(r"^jit\((.*)\)$", r"jit_\1", name) in self._hits)
      self._hits.clear()
      self.rows.append((name, float(done.group(2)), served))


class _Recorder:
  def __init__(self, path: str, programs_path: str | None = None):
    import jax

    self.path = path
    self.programs_path = programs_path
    self.programs = _ProgramLog() if programs_path else None
    if self.programs is not None:
      jax.config.update("jax_log_compiles", True)
      logging.getLogger("jax").addHandler(self.programs)
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
    if self.programs is not None:
      self.programs.rows.clear()
    start = time.perf_counter()
    yield
    self.current["wall_s"] = time.perf_counter() - start
    if self.programs is not None and self.programs.rows:
      with open(self.programs_path, "a") as f:
        f.writelines(
          f"{item.nodeid}\t{name}\t{seconds:.3f}\t{served}\n"
          for name, seconds, served in self.programs.rows
        )
    row = "\t".join([item.nodeid] + [f"{self.current[c]:.3f}" for c in COLUMNS])
    with open(self.path, "a") as f:
      f.write(row + "\n")


def pytest_configure(config):
  path = config.getoption("--compile-profile")
  programs = config.getoption("--compile-profile-programs")
  if programs and not path:
    raise pytest.UsageError(
      f"--compile-profile-programs={programs} needs --compile-profile=FILE as well (the per-test "
      "rows). Fix: add --compile-profile=/tmp/compile.tsv."
    )
  if path:
    recorder = _Recorder(os.path.abspath(path), programs and os.path.abspath(programs))
    config.pluginmanager.register(recorder, "sdar_compile_profile")


def summarize_programs(path: str, top: int = 40) -> str:
  """The programs by compile seconds summed over the suite: how many times each was compiled and
  how many times loaded from the cache, and the seconds either took."""
  stats: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  with open(path) as f:
    for line in f:
      _, name, seconds, served = line.rstrip("\n").split("\t")
      key = "hit" if served == "1" else "compiled"
      stats[name][key] += 1
      stats[name][f"{key}_s"] += float(seconds)
  out = [f"{'compile s':>9} {'compiled':>8} {'load s':>7} {'hits':>6}  program"]
  ranked = sorted(stats.items(), key=lambda r: -r[1]["compiled_s"])
  for name, v in ranked[:top]:
    out.append(f"{v['compiled_s']:9.1f} {v['compiled']:8d} {v['hit_s']:7.1f} {v['hit']:6d}  {name}")
  total: collections.Counter = collections.Counter()
  for v in stats.values():
    total.update(v)
  out.append(
    f"{total['compiled_s']:9.1f} {total['compiled']:8d} {total['hit_s']:7.1f} {total['hit']:6d}"
    f"  all {len(stats)} programs"
  )
  return "\n".join(out)


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
  print(summarize(sys.argv[1]))
  if len(sys.argv) > 2:
    print("\n" + summarize_programs(sys.argv[2]))
