"""Reads the training runs under a directory into one table and plots (sweeps and ablations), and
keeps each run's run record (`run_status.json`: attempts, wall time, whether it finished).

A run is a directory with `config.json` and `metrics.jsonl` (an evaluation's folder, marked by
`evaluation.json`, is not). `read_run` gives a `RunRecord`: its settings by dotted key (saved
configs translated to today's keys, `sdar_jax.config_keys`; an old key is read at its new place),
its validation curve (step, val/success_rate), final and initial success, `success_auc` (the
curve's mean over its span) and its wall time from the run record. `collect_sweep(root)` writes
`sweep.csv`, `sweep.md` and `sweep.png`; `run_and_record` runs a command and keeps the run record.
Reads runs, writes only into its output folder (local or gs://). How wall time is counted:
docs/design.md, "Sweeps".
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from sdar_jax import config_keys
from sdar_jax.infra import paths
from sdar_jax.infra.errors import UserError
from sdar_jax.observe.metrics import read_history
from sdar_jax.observe.pairing import CompareError, paired_arms

RUN_STATUS = "run_status.json"
SUCCESS_KEY = "val/success_rate"
EVAL_MARKER = "evaluation.json"  # sdar_jax.evaluate.EVAL_RECORD: an evaluation, not a run

# The settings a sweep table shows (dotted config keys) and their column names.
SWEEP_KEYS: tuple[tuple[str, str], ...] = (
  ("algo.name", "algo"),
  ("algo.gate", "gate"),
  ("algo.beta", "beta"),
  ("algo.lam", "lambda"),
  ("train.seed", "seed"),
)


# ------------------------------------------------------------------------------------ reading
def read_metrics(path: str) -> list[dict[str, Any]]:
  """The rows of a metrics.jsonl by step, torn lines skipped (`metrics.read_history`)."""
  return read_history(path)


def config_value(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
  """config["a"]["b"] for "a.b" (`default` when a level is missing)."""
  node: Any = config
  for key in dotted.split("."):
    if not isinstance(node, Mapping) or key not in node:
      return default
    node = node[key]
  return node


def success_auc(curve: Sequence[tuple[float, float]]) -> float:
  """Area under the success curve [(step, success), ...] by the trapezoid rule, divided by the
  step span (the mean success over the span); one point: its value; none: NaN."""
  if not curve:
    return math.nan
  steps = np.asarray([s for s, _ in curve], np.float64)
  values = np.asarray([v for _, v in curve], np.float64)
  if len(curve) == 1 or steps[-1] == steps[0]:
    return float(values[-1])
  area = float(np.sum((values[1:] + values[:-1]) / 2.0 * np.diff(steps)))
  return area / float(steps[-1] - steps[0])


def read_status(run_dir: str) -> dict[str, Any] | None:
  path = paths.join(run_dir, RUN_STATUS)
  try:
    return json.loads(paths.read_text(path))
  except (OSError, ValueError):
    return None


def _last_activity(run_dir: str) -> float | None:
  path = paths.join(run_dir, "metrics.jsonl")
  return paths.getmtime(path) if paths.exists(path) else None


def wall_seconds(run_dir: str, status: Mapping[str, Any] | None = None) -> float | None:
  """Total wall time of the run's attempts (docs/design.md, "Sweeps"); None without a run record."""
  status = read_status(run_dir) if status is None else status
  if not status or not status.get("attempts"):
    return None
  attempts = status["attempts"]
  total = 0.0
  for i, attempt in enumerate(attempts):
    if attempt.get("seconds") is not None:
      total += float(attempt["seconds"])
      continue
    alive = attempt.get("alive")
    ends = [alive] if alive is not None else [_last_activity(run_dir)]
    if i + 1 < len(attempts):
      ends.append(attempts[i + 1]["started"])
    ends = [e for e in ends if e is not None]
    if ends:
      total += max(0.0, min(ends) - float(attempt["started"]))
  return total


@dataclasses.dataclass
class RunRecord:
  """One run's settings, metric rows and run record."""

  path: str
  name: str  # relative to the collected root
  config: dict[str, Any]
  rows: list[dict[str, Any]]
  status: dict[str, Any] | None = None

  def get(self, dotted: str, default: Any = None) -> Any:
    """The setting at `dotted`; a key that was renamed is read at its new place."""
    return config_value(self.config, config_keys.new_key(dotted) or dotted, default)

  def curve(self, key: str = SUCCESS_KEY) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[key])) for r in self.rows if key in r]

  @property
  def last_step(self) -> int | None:
    return int(self.rows[-1]["step"]) if self.rows else None

  @property
  def iterations(self) -> int | None:
    total = self.get("train.iterations")
    return None if total is None else int(total)

  @property
  def finished(self) -> bool:
    """The run record says it finished, or the metrics reached train.iterations."""
    if self.status and self.status.get("finished"):
      return True
    total, last = self.iterations, self.last_step
    return total is not None and last is not None and last >= total

  @property
  def final_success(self) -> float:
    curve = self.curve()
    return curve[-1][1] if curve else math.nan

  @property
  def initial_success(self) -> float:
    curve = self.curve()
    return curve[0][1] if curve else math.nan

  @property
  def auc(self) -> float:
    return success_auc(self.curve())

  @property
  def wall_seconds(self) -> float | None:
    return wall_seconds(self.path, self.status) if self.status else None


def is_run_dir(path: str) -> bool:
  return (
    paths.isfile(paths.join(path, "config.json"))
    and paths.isfile(paths.join(path, "metrics.jsonl"))
    and not paths.exists(paths.join(path, EVAL_MARKER))
  )


def find_runs(root: str) -> list[str]:
  """The run directories under `root` (itself included), sorted; a run's own subdirectories
  (checkpoints, eval/, ...) are not searched."""
  found = []
  for dirpath, dirnames in paths.walk_dirs(root):
    if is_run_dir(dirpath):
      found.append(dirpath)
      dirnames[:] = []
    else:
      dirnames.sort()
  return sorted(found)


def _run_name(path: str, root: str | None) -> str:
  """`path` relative to `root` ("." for the root itself), else its last component."""
  if not paths.is_remote(path):
    return os.path.relpath(path, root) if root else os.path.basename(os.path.normpath(path))
  path, root = path.rstrip("/"), (root or "").rstrip("/")
  if root and path == root:
    return "."
  if root and path.startswith(root + "/"):
    return path[len(root) + 1 :]
  return path.rsplit("/", 1)[-1]


def read_run(path: str, root: str | None = None) -> RunRecord:
  """The run in `path` (its config.json is required)."""
  config_path = paths.join(path, "config.json")
  try:
    # keys that moved since the run was written are read at their new place (sdar_jax.config_keys)
    config = config_keys.translate(json.loads(paths.read_text(config_path)))
  except FileNotFoundError:
    raise FileNotFoundError(
      f"{path} is not a run directory: it has no config.json. Fix: pass the workdir of a "
      "`python -m sdar_jax.train` run (or a directory above such runs)."
    ) from None
  return RunRecord(
    path=path,
    name=_run_name(path, root),
    config=config,
    rows=read_metrics(paths.join(path, "metrics.jsonl")),
    status=read_status(path),
  )


# ------------------------------------------------------------------------------------ tables
def fmt(value: Any, digits: int = 3) -> str:
  """A table cell: floats to `digits` decimals, NaN / None as "n/a"."""
  if value is None:
    return "n/a"
  if isinstance(value, float):
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"
  return str(value)


def mean_std(values: Iterable[float]) -> tuple[float, float, int]:
  """(mean, sample standard deviation with ddof 1 (NaN for fewer than 2), count) of the values
  that are not NaN."""
  xs = np.asarray([v for v in values if not math.isnan(v)], np.float64)
  if xs.size == 0:
    return math.nan, math.nan, 0
  std = float(np.std(xs, ddof=1)) if xs.size > 1 else math.nan
  return float(xs.mean()), std, int(xs.size)


def pm(mean: float, std: float, digits: int = 3) -> str:
  """The cell "mean ± std" ("mean" alone when the std is NaN)."""
  if math.isnan(mean):
    return "n/a"
  return fmt(mean, digits) if math.isnan(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
  """A GitHub markdown table of `rows` (cells through `fmt`; '|' in a cell escaped)."""
  lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
  for row in rows:
    cells = [fmt(row.get(c)).replace("|", "\\|") for c in columns]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def csv_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
  """The rows as CSV (floats at full precision, NaN / None empty)."""
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(columns)
  for row in rows:
    cells = []
    for c in columns:
      v = row.get(c)
      cells.append("" if v is None or (isinstance(v, float) and math.isnan(v)) else v)
    writer.writerow(cells)
  return out.getvalue()


def _minutes(seconds: float | None) -> float | None:
  return None if seconds is None else seconds / 60.0


SWEEP_COLUMNS = (
  "run",
  *(name for _, name in SWEEP_KEYS),
  "steps",
  "val_success_before",
  "val_success_final",
  "val_success_auc",
  "finished",
  "wall_minutes",
)


def sweep_rows(runs: Sequence[RunRecord]) -> list[dict[str, Any]]:
  """One table row per run (columns `SWEEP_COLUMNS`), sorted by the settings then the name."""
  rows = []
  for run in runs:
    row: dict[str, Any] = {"run": run.name}
    for dotted, name in SWEEP_KEYS:  # settings as written in the config (5.0, 0.01)
      value = run.get(dotted)
      row[name] = None if value is None else str(value)
    row["steps"] = f"{run.last_step if run.last_step is not None else 0}/{run.iterations}"
    row["val_success_before"] = run.initial_success
    row["val_success_final"] = run.final_success
    row["val_success_auc"] = run.auc
    row["finished"] = "yes" if run.finished else "no"
    row["wall_minutes"] = _minutes(run.wall_seconds)
    rows.append(row)

  def key(row):
    return tuple(str(row[name]) for _, name in SWEEP_KEYS) + (row["run"],)

  return sorted(rows, key=key)


# ------------------------------------------------------------------------------------- plots
def _pyplot():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def grouped_success(
  runs: Sequence[RunRecord], x_key: str, line_key: str = "algo.gate"
) -> dict[str, list[tuple[float, float, float, float]]]:
  """{line: [(x, mean, min, max) of the final validation success of the runs at x]} over the runs
  that have a success value, x ascending (the other settings are averaged over)."""
  groups: dict[str, dict[float, list[float]]] = {}
  for run in runs:
    x, value = run.get(x_key), run.final_success
    if x is None or math.isnan(value):
      continue
    groups.setdefault(str(run.get(line_key)), {}).setdefault(float(x), []).append(value)
  return {
    line: [
      (x, float(np.mean(v)), float(np.min(v)), float(np.max(v))) for x, v in sorted(xs.items())
    ]
    for line, xs in sorted(groups.items())
  }


def plot_sweep(runs: Sequence[RunRecord], out_path: str) -> str | None:
  """Final validation success against β and against λ, one line per gate (mean over the runs at
  each value, bars from min to max). None when no run has a validation success yet."""
  panels = [("algo.beta", "beta", False), ("algo.lam", "lambda", True)]
  data = [(key, label, log, grouped_success(runs, key)) for key, label, log in panels]
  if not any(groups for *_, groups in data):
    return None
  plt = _pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4), squeeze=False)
  for ax, (_, label, log, groups) in zip(axes.flat, data):
    for line, points in groups.items():
      xs, means, lows, highs = (np.asarray(c) for c in zip(*points))
      ax.errorbar(
        xs, means, yerr=[means - lows, highs - means], marker="o", ms=4, capsize=3, label=line
      )
    if log:
      ax.set_xscale("log")
    ax.set_xlabel(label)
    ax.set_ylabel("final validation success")
    ax.set_title(f"final success against {label}, per gate", fontsize=10)
    ax.grid(alpha=0.3)
    if groups:
      ax.legend(fontsize=7, title="gate", title_fontsize=7)
  fig.tight_layout()
  try:
    with paths.staged_output(out_path) as local_png:
      fig.savefig(local_png, dpi=110)
  finally:
    plt.close(fig)
  return out_path


class ReportShrinkError(UserError, FileExistsError):
  """A report would be replaced by one built from fewer finished runs than it holds."""


def refuse_shrinking_report(
  existing_csv: str, finished_now: int, count_old, runs_dir: str, overwrite: bool
) -> None:
  """Raises `ReportShrinkError` when the report whose table is `existing_csv` holds more finished
  runs (`count_old(rows)`) than the `finished_now` it would be rebuilt from (e.g. a fresh clone
  without the runs), unless `overwrite`."""
  if overwrite or not paths.exists(existing_csv):
    return
  rows = list(csv.DictReader(io.StringIO(paths.read_text(existing_csv))))
  before = count_old(rows)
  if finished_now < before:
    raise ReportShrinkError(
      f"{existing_csv} holds {before} finished run(s); rebuilding it from {runs_dir} would leave "
      f"{finished_now}. Nothing was written. Fix: point at the folder that holds the runs, or "
      "pass --overwrite to replace the report anyway."
    )


def collect_sweep(root: str, out_dir: str | None = None, overwrite: bool = False) -> dict[str, str]:
  """Writes sweep.csv, sweep.md and sweep.png (when any run has a validation success) for the
  runs under `root` into `out_dir` (default `root`); returns {kind: path}. An existing table with
  more finished runs than `root` holds is not replaced unless `overwrite`
  (`refuse_shrinking_report`)."""
  run_dirs = find_runs(root)
  if not run_dirs:
    raise FileNotFoundError(
      f"no runs under {root}: no directory there holds both config.json and metrics.jsonl. Fix: "
      "pass the --root the sweep's runs were written to (launch/sweep.py --root)."
    )
  runs = [read_run(p, root) for p in run_dirs]
  rows = sweep_rows(runs)
  out_dir = out_dir or root
  refuse_shrinking_report(
    paths.join(out_dir, "sweep.csv"),
    sum(r.finished for r in runs),
    lambda old: sum(row.get("finished") == "yes" for row in old),
    root,
    overwrite,
  )
  paths.makedirs(out_dir)
  written = {}
  written["csv"] = paths.join(out_dir, "sweep.csv")
  paths.write_text(written["csv"], csv_text(rows, SWEEP_COLUMNS))
  md = [
    f"# Sweep: {len(runs)} runs under `{root}`\n",
    (
      "Final validation success is the last evaluation's val/success_rate; before: the first "
      "evaluation's; AUC: the area under the validation-success curve (trapezoid over the "
      "evaluation steps) divided by the step span, i.e. the mean success over the run. Wall "
      "time: the runs' recorded attempts (n/a when not started by a launcher).\n"
    ),
    markdown_table(rows, SWEEP_COLUMNS),
  ]
  try:  # two arms (run.arm, default algo.name) on common seeds: paired, with intervals
    arms = paired_arms(run_dirs)
  except CompareError as e:  # a sweep's settings are not two arms: said, not paired
    said = str(e).replace(root.rstrip("/") + "/", "")  # the runs by their names in the sweep
    md.append(f"\nNo paired comparison: {said}\n")
  else:
    if arms is not None:
      md.append("\n" + arms.markdown() + "\n")
  png = plot_sweep(runs, paths.join(out_dir, "sweep.png"))
  if png:
    written["png"] = png
    md.append("\n![final success against beta and lambda](sweep.png)\n")
  written["md"] = paths.join(out_dir, "sweep.md")
  paths.write_text(written["md"], "\n".join(md))
  return written


# ----------------------------------------------------------------------------- launching runs
def _write_status(run_dir: str, status: Mapping[str, Any]) -> None:
  paths.write_text(paths.join(run_dir, RUN_STATUS), json.dumps(status, indent=2))


def run_state(run_dir: str) -> str:
  """What a launcher finds in `run_dir`: "finished" (the run record says so, or its metrics
  reached train.iterations), "partial" (something was started there: the trainer resumes it from
  its latest checkpoint) or "new"."""
  if not paths.isdir(run_dir):
    return "new"
  if (read_status(run_dir) or {}).get("finished"):
    return "finished"
  if paths.isfile(paths.join(run_dir, "config.json")) and read_run(run_dir).finished:
    return "finished"
  started = ("config.json", "metrics.jsonl", "checkpoints", "warm_start_policy", RUN_STATUS)
  return "partial" if any(paths.exists(paths.join(run_dir, p)) for p in started) else "new"


def code_commit(folder: str | None = None) -> str | None:
  """The git commit checked out in `folder` (default: the working directory), short form, with
  "+modified" when a tracked file differs from it; None outside a git work tree or without git."""

  def git(*args: str) -> str | None:
    try:
      done = subprocess.run(
        ["git", *args], cwd=folder, capture_output=True, text=True, check=False, timeout=30
      )
    except (OSError, subprocess.TimeoutExpired):
      return None
    return done.stdout.strip() if done.returncode == 0 else None

  commit = git("rev-parse", "--short=12", "HEAD")
  if not commit:
    return None
  return commit + ("+modified" if git("status", "--porcelain", "--untracked-files=no") else "")


HEARTBEAT_SECONDS = 30.0


def run_and_record(
  cmd: Sequence[str],
  run_dir: str,
  cwd: str | None = None,
  log_path: str | None = None,
  runner: Callable[..., Any] = subprocess.run,
  clock: Callable[[], float] = time.time,
  heartbeat: float = HEARTBEAT_SECONDS,
) -> int:
  """Runs `cmd` (a training run writing into `run_dir`) to its end and keeps its run record:
  an attempt (start, end, seconds, return code, and the commit of the code in `cwd` that ran it,
  `code_commit`) is added before it starts and completed after; a return code of 0 marks the run
  finished. While the command runs, the attempt's `alive` is set to the clock every `heartbeat`
  seconds, so that an attempt killed with its launcher still has an end (`wall_seconds`).
  Output goes to `log_path` (appended) when given. Returns the return code."""
  status = dict(read_status(run_dir) or {})
  attempts = list(status.get("attempts", []))
  attempt: dict[str, Any] = {"started": clock(), "ended": None, "seconds": None, "returncode": None}
  attempt["commit"] = code_commit(cwd)
  attempts.append(attempt)
  status.update(attempts=attempts, finished=False, command=list(cmd))
  _write_status(run_dir, status)
  stop, lock = threading.Event(), threading.Lock()

  def beat() -> None:
    while not stop.wait(heartbeat):
      with lock:
        if stop.is_set():
          return
        attempt["alive"] = clock()
        _write_status(run_dir, status)

  beating = threading.Thread(target=beat, name="run-heartbeat", daemon=True)
  beating.start()
  try:
    if log_path:
      with open(log_path, "a") as log:
        result = runner(list(cmd), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, check=False)
    else:
      result = runner(list(cmd), cwd=cwd, check=False)
  finally:
    with lock:
      stop.set()
    beating.join()
  code = int(getattr(result, "returncode", result))
  attempt.update(ended=clock(), returncode=code)
  attempt["seconds"] = attempt["ended"] - attempt["started"]
  status.update(attempts=attempts, finished=code == 0)
  _write_status(run_dir, status)
  return code
