"""An experiment's records as three tidy tables: outcomes, metrics and the manifest of its runs.

* outcomes (OUTCOME_COLUMNS, gzip CSV): one row per policy x panel x game x evaluation;
* metrics (METRIC_COLUMNS, gzip CSV): one row per training run x iteration x metric;
* runs (RUN_COLUMNS, CSV): one row per step (a training run or an evaluation of one).

Rows are appended: a table file is a sequence of gzip members, the first one holding the header,
so a running experiment appends each finished step without rewriting what is there (`append`),
and `read` reads the whole file back. `step_rows` turns one run folder (what `sdar_jax.train` or
`sdar_jax.evaluate` wrote) into rows; `restore_step` writes a folder's records back from rows.
Nothing here knows an experiment's arms or stages: the caller passes them.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

OUTCOMES = "outcomes.csv.gz"
METRICS = "metrics.csv.gz"
RUNS = "runs.csv"
OUTCOME_COLUMNS = (
  "experiment", "stage", "run", "kind", "arm", "seed", "lr", "commit", "panel", "prompt",
  "eval_iteration", "repeat", "task_id", "game", "task_type", "success", "reward", "turns",
)  # fmt: skip
METRIC_COLUMNS = ("experiment", "stage", "run", "arm", "seed", "lr", "iteration", "metric", "value")
RUN_COLUMNS = (
  "experiment", "stage", "run", "kind", "arm", "seed", "lr", "config", "command", "commits",
  "wall_seconds", "finished", "files_at",
)  # fmt: skip
# the columns read back as numbers ("" stays None: a policy with no seed or rate, an old file)
_INTS = (
  "stage",
  "seed",
  "eval_iteration",
  "repeat",
  "task_id",
  "success",
  "turns",
  "iteration",
  "finished",
)
_FLOATS = ("lr", "reward", "value", "wall_seconds")
WITH_SKILL_MODE = "with_skill"  # the eval mode of a validation with the skills in the prompt


def _cell(value: Any) -> str:
  if value is None:
    return ""
  if isinstance(value, float):
    return repr(value) if math.isfinite(value) else str(value)
  return str(value)


def _text(rows: Iterable[Mapping[str, Any]], columns: Sequence[str], header: bool) -> str:
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  if header:
    writer.writerow(columns)
  for row in rows:
    writer.writerow([_cell(row.get(c)) for c in columns])
  return out.getvalue()


def append(path: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> int:
  """Appends `rows` to the table at `path` (created with its header when missing; gzip when the
  name ends in .gz, one member per call, written with mtime 0 so equal rows give equal bytes);
  returns the number of rows written. Refuses a file whose header is not `columns`."""
  fresh = not os.path.exists(path)
  if not fresh:
    have = header(path)
    if have != tuple(columns):
      raise ValueError(
        f"{path} has the columns {have}, not {tuple(columns)}. Fix: append to a table of this "
        "kind, or move the file aside."
      )
  if not rows and not fresh:
    return 0
  text = _text(rows, columns, header=fresh).encode()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "ab") as f:
    f.write(gzip.compress(text, mtime=0) if path.endswith(".gz") else text)
  return len(rows)


def _open(path: str):
  return gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")


def header(path: str) -> tuple[str, ...]:
  with _open(path) as f:
    return tuple(next(csv.reader(f), ()))


def read(path: str, **where: Any) -> list[dict[str, Any]]:
  """The rows of a table, numbers typed (_INTS, _FLOATS; an empty cell is None), keeping those
  whose columns equal every `where` value (a tuple or set: any of its values)."""
  rows = []
  with _open(path) as f:
    for row in csv.DictReader(f):
      for key in _INTS:
        if key in row:
          row[key] = int(row[key]) if row[key] != "" else None
      for key in _FLOATS:
        if key in row:
          row[key] = float(row[key]) if row[key] != "" else None
      if all(
        row.get(k) in v if isinstance(v, (tuple, set, frozenset)) else row.get(k) == v
        for k, v in where.items()
      ):
        rows.append(row)
  return rows


def _json(path: str) -> Any:
  with open(path) as f:
    return json.load(f)


def _outcome_files(folder: str) -> list[tuple[int | None, str]]:
  """(the evaluation folder's iteration or None, path) of every outcomes CSV of a run folder:
  eval/step_<N>/outcomes_*.csv (validation during training) and outcomes_*.csv beside it."""
  found = []
  eval_dir = os.path.join(folder, "eval")
  if os.path.isdir(eval_dir):
    for name in sorted(os.listdir(eval_dir)):
      if name.startswith("step_") and name[5:].isdigit():
        sub = os.path.join(eval_dir, name)
        found += [(int(name[5:]), os.path.join(sub, f)) for f in sorted(os.listdir(sub))]
  if os.path.isdir(folder):
    found += [(None, os.path.join(folder, f)) for f in sorted(os.listdir(folder))]
  return [(i, p) for i, p in found if os.path.basename(p).startswith("outcomes_")]


def _status(folder: str) -> dict[str, Any]:
  path = os.path.join(folder, "run_status.json")
  return _json(path) if os.path.isfile(path) else {}


def _step_finished(folder: str, kind: str, status: dict[str, Any]) -> bool:
  """Whether the step finished, by the drivers' own test (experiments.driver.step_done): a
  training run whose metrics reached train.iterations finished even when it was stopped before it
  wrote so in run_status.json (a SIGTERM after the last validation, before the final save)."""
  from sdar_jax.observe import collect
  from sdar_jax.run import evaluation

  if kind == "train":
    return collect.run_state(folder) == "finished"
  return bool(status.get("finished")) or evaluation.eval_finished(folder)


def step_rows(
  folder: str,
  *,
  experiment: str,
  stage: int | None,
  run: str,
  kind: str,
  arm: str,
  seed: int | None,
  lr: float | None,
  commit: str | None = None,
  files_at: str = "",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
  """(outcome rows, metric rows, the manifest row) of one step's folder: a training run (`kind`
  "train": its validation outcomes at every evaluation and its metrics.jsonl) or an evaluation
  (any other `kind`: the outcomes it wrote; no metric rows). `commit`: the code's
  commit when run_status.json does not record it."""
  from sdar_jax.observe import collect, pairing, transcripts

  status = _status(folder)
  attempts = status.get("attempts", [])
  commits = sorted({a.get("commit") for a in attempts if a.get("commit")})
  commit = commits[-1] if commits and not commit else commit or ""
  key = {"experiment": experiment, "stage": stage, "run": run, "arm": arm, "seed": seed, "lr": lr}
  outcomes = []
  for iteration, path in _outcome_files(folder):
    if kind != "train" and iteration is not None:
      continue  # an evaluation folder holds its own outcomes only
    # the skills in the prompt: a with-skills evaluation, or the frozen teacher's own validation
    # during training (RetireOPD's competence reference: outcomes_val_with_skill.csv)
    skills = kind == "heldout_skills" or path.endswith(f"_{WITH_SKILL_MODE}.csv")
    prompt = "skills" if skills else "plain"
    for row in transcripts.read_outcomes(path):
      outcomes.append(
        {
          **key,
          "kind": kind,
          "commit": commit,
          "panel": row["split"],
          "prompt": prompt,
          "eval_iteration": row["step"] if iteration is None else iteration,
          "repeat": row["repeat"],
          "task_id": row["task_id"],
          "game": pairing.game_key(row["gamefile"], row["task_id"]),
          "task_type": row["task_type"],
          "success": row["success"],
          "reward": row["reward"],
          "turns": row.get("turns"),
        }
      )
  metrics = []
  metrics_path = os.path.join(folder, "metrics.jsonl")
  if kind == "train" and os.path.isfile(metrics_path):
    with open(metrics_path) as f:
      for line in f:
        if not line.strip():
          continue
        record = json.loads(line)
        iteration = int(record["step"])
        for name, value in sorted(record.items()):
          if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics.append({**key, "iteration": iteration, "metric": name, "value": float(value)})
  command = status.get("command") or []
  config = next((c.split("=", 1)[1] for c in command if c.startswith("--config=")), "")
  overrides = [c.removeprefix("--config.") for c in command if c.startswith("--config.")]
  manifest = {
    **key,
    "kind": kind,
    "config": " ".join([config, *overrides]).strip(),
    "command": " ".join(command),
    "commits": " ".join(commits) or commit,
    "wall_seconds": collect.wall_seconds(folder, status) if attempts else None,
    "finished": int(_step_finished(folder, kind, status)),
    "files_at": files_at,
  }
  return outcomes, metrics, manifest


class Tables:
  """The three tables of a results folder (docs/results by default): append a step, read rows."""

  def __init__(self, folder: str):
    self.folder = folder
    self.outcomes = os.path.join(folder, OUTCOMES)
    self.metrics = os.path.join(folder, METRICS)
    self.runs = os.path.join(folder, RUNS)

  def has(self, experiment: str, run: str, kind: str) -> bool:
    """Whether the manifest already holds this step (a step is appended once)."""
    return os.path.exists(self.runs) and bool(
      read(self.runs, experiment=experiment, run=run, kind=kind)
    )

  def add(self, outcomes, metrics, manifest) -> bool:
    """Appends one step's rows unless the manifest holds it; returns whether it appended."""
    if self.has(manifest["experiment"], manifest["run"], manifest["kind"]):
      return False
    append(self.outcomes, outcomes, OUTCOME_COLUMNS)
    append(self.metrics, metrics, METRIC_COLUMNS)
    append(self.runs, [manifest], RUN_COLUMNS)  # last: a step is recorded once it is complete
    return True

  def read(self, table: str, **where: Any) -> list[dict[str, Any]]:
    path = {"outcomes": self.outcomes, "metrics": self.metrics, "runs": self.runs}[table]
    return read(path, **where) if os.path.exists(path) else []

  def withdraw(self, experiment: str, run: str, kind: str) -> int:
    """Removes one step's rows (a step recorded from a broken run, to be run again): its
    outcomes, its metrics when it is a training run, then its manifest row; returns the rows
    removed. Each table is rewritten whole (other rows' cells as they were) and replaced at once;
    run again after a crash, it removes what is left."""
    step = {"experiment": experiment, "run": run}
    removed = _drop(self.outcomes, OUTCOME_COLUMNS, dict(step, kind=kind))
    if kind == "train":
      removed += _drop(self.metrics, METRIC_COLUMNS, step)
    return removed + _drop(self.runs, RUN_COLUMNS, dict(step, kind=kind))


def _drop(path: str, columns: Sequence[str], where: Mapping[str, str]) -> int:
  """Rewrites the table at `path` without the rows whose cells equal `where`; returns how many."""
  if not os.path.exists(path):
    return 0
  with _open(path) as f:
    reader = csv.reader(f)
    have = tuple(next(reader, ()))
    if have != tuple(columns):
      raise ValueError(f"{path} has the columns {have}, not {tuple(columns)}")
    at = {columns.index(k): str(v) for k, v in where.items()}
    rows = list(reader)
  kept = [r for r in rows if any(r[i] != v for i, v in at.items())]
  if len(kept) == len(rows):
    return 0
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerows([list(columns), *kept])
  text = out.getvalue().encode()
  with open(path + ".tmp", "wb") as f:
    f.write(gzip.compress(text, mtime=0) if path.endswith(".gz") else text)
  os.replace(path + ".tmp", path)
  return len(rows) - len(kept)


def restore_step(tables: Tables, experiment: str, run: str, kind: str, folder: str) -> int:
  """Writes back into `folder` the records of one step kept in `tables`: run_status.json (its
  command, finished and wall time), an evaluation's evaluation.json, a training run's
  metrics.jsonl, and the outcome CSVs (eval/step_<N>/ for a
  training run). No weights: a run restored so must be trained again before it is evaluated.
  Returns the number of files written; writes nothing over an existing file."""
  from sdar_jax.observe import transcripts

  (manifest,) = tables.read("runs", experiment=experiment, run=run, kind=kind) or [None]
  if manifest is None:
    return 0
  files: dict[str, str] = {
    "run_status.json": json.dumps(
      {
        "attempts": [
          {"seconds": manifest["wall_seconds"], "returncode": 0, "commit": c}
          for c in manifest["commits"].split()
        ],
        "finished": bool(manifest["finished"]),
        "command": manifest["command"].split(),
        "restored": True,
      },
      indent=2,
    )
  }
  if kind != "train":  # an evaluation's done marker (sdar_jax.run.evaluation.eval_finished)
    files["evaluation.json"] = json.dumps({"evaluated": {"restored": True}, "finished": "restored"})
  else:
    by_iteration: dict[int, dict[str, Any]] = {}
    for row in tables.read("metrics", experiment=experiment, run=run):
      by_iteration.setdefault(row["iteration"], {"step": row["iteration"]})[row["metric"]] = row[
        "value"
      ]
    files["metrics.jsonl"] = "".join(
      json.dumps(by_iteration[i]) + "\n" for i in sorted(by_iteration)
    )
  groups: dict[str, list[dict[str, Any]]] = {}
  for row in tables.read("outcomes", experiment=experiment, run=run, kind=kind):
    prefix = "val" if row["panel"] in ("valid_seen", "heldout_seen") else f"val_{row['panel']}"
    if row["prompt"] == "skills" and kind == "train":
      prefix += f"_{WITH_SKILL_MODE}"
    name = f"{transcripts.OUTCOMES_PREFIX}{prefix}.csv"
    where = f"eval/step_{row['eval_iteration']}/{name}" if kind == "train" else name
    groups.setdefault(where, []).append(row)
  for where, rows in groups.items():
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(transcripts.OUTCOME_COLUMNS)
    for r in rows:
      writer.writerow(
        [r["arm"], r["seed"] or 0, r["eval_iteration"], r["panel"], r["repeat"], r["task_id"]]
        + [r["game"]]
        + [r["task_type"], r["success"], _cell(r["reward"]), _cell(r["turns"])]
      )
    files[where] = out.getvalue()
  written = 0
  for name, text in files.items():
    path = os.path.join(folder, name)
    if os.path.exists(path):
      continue
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)
    written += 1
  return written
