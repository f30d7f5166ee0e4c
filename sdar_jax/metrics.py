"""Run metrics: one log line per step, a JSONL history, TensorBoard (tensorboardX), PNG plots.

`metrics.jsonl` holds one JSON object per logged step ({"step": k, "<name>": value, ...}); it is
appended to, so a resumed run continues the same file, after `drop_rows_after` removed the rows of
iterations the restored checkpoint does not contain (a run killed between logging a row and saving
its checkpoint logs that step again). `plot_history` turns it into a grid of curves
(`metrics.png`): success rate, reward, the SDAR gate and gap, losses. TensorBoard event files go to
the same directory when `logging.tensorboard` is on and tensorboardX is installed.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

log = logging.getLogger(__name__)

# Panels of the default plot: (title, metric names drawn in it).
PLOT_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
  ("success rate", ("episode/success_rate", "val/success_rate")),
  ("episode reward", ("episode/reward_mean",)),
  ("valid-format actions", ("episode/valid_action_ratio",)),
  ("SDAR gate", ("sdar/gate_mean", "sdar/gate_active_ratio")),
  ("teacher - student gap", ("sdar/teacher_gap_mean", "rollout/teacher_old_gap_mean")),
  ("losses", ("train/loss", "actor/pg_loss", "sdar/loss")),
  ("entropy", ("actor/entropy",)),
  ("grad norm", ("train/grad_norm",)),
)


def _scalar(value: Any) -> float | None:
  try:
    x = float(np.asarray(value))
  except (TypeError, ValueError):
    return None
  return x


class MetricsLogger:
  """Writes metrics of each step to the console, `<logdir>/metrics.jsonl` and TensorBoard."""

  def __init__(
    self,
    logdir: str,
    jsonl: bool = True,
    tensorboard: bool = False,
    console_keys: Sequence[str] = (
      "episode/success_rate",
      "episode/reward_mean",
      "episode/valid_action_ratio",
      "train/loss",
      "sdar/gate_mean",
      "sdar/teacher_gap_mean",
      "val/success_rate",
    ),
  ):
    os.makedirs(logdir, exist_ok=True)
    self.logdir = logdir
    self.path = os.path.join(logdir, "metrics.jsonl") if jsonl else None
    self.console_keys = tuple(console_keys)
    self._tb = None
    if tensorboard:
      try:
        from tensorboardX import SummaryWriter
      except ImportError:
        log.warning(
          "logging.tensorboard=True but tensorboardX is not installed: writing metrics.jsonl and "
          "metrics.png only. Install the pinned requirements (pip install -r requirements.txt) or "
          "set --config.logging.tensorboard=False."
        )
      else:
        self._tb = SummaryWriter(logdir)

  def log(self, step: int, metrics: Mapping[str, Any], echo: bool = True) -> dict[str, float]:
    row = {"step": int(step)}
    for name, value in metrics.items():
      x = _scalar(value)
      if x is not None:
        row[name] = x
    if self.path:
      with open(self.path, "a") as f:
        f.write(json.dumps(row) + "\n")
    if self._tb is not None:
      for name, x in row.items():
        if name != "step" and math.isfinite(x):
          self._tb.add_scalar(name, x, step)
      self._tb.flush()
    if echo:
      log.info("[step %d] %s", step, self.summary(row))
    return row

  def summary(self, metrics: Mapping[str, Any]) -> str:
    """The console keys present in `metrics`, as "name=value" pairs."""
    return "  ".join(
      f"{k}={float(metrics[k]):.4g}"
      for k in self.console_keys
      if k in metrics and _scalar(metrics[k]) is not None
    )

  def drop_rows_after(self, step: int) -> int:
    """Removes the rows of steps > `step` (and a torn last line) from metrics.jsonl, atomically;
    returns how many lines were dropped. A resumed run calls it with the restored step."""
    if not self.path or not os.path.exists(self.path):
      return 0
    kept, dropped = [], 0
    with open(self.path) as f:
      for line in f:
        try:
          row = json.loads(line)
          keep = int(row["step"]) <= step
        except (ValueError, KeyError, TypeError):
          keep = False  # a line torn by a kill mid-write
        if keep:
          kept.append(line if line.endswith("\n") else line + "\n")
        elif line.strip():
          dropped += 1
    if dropped:
      tmp = self.path + ".tmp"
      with open(tmp, "w") as f:
        f.writelines(kept)
      os.replace(tmp, self.path)
    return dropped

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def read_history(path: str) -> list[dict[str, float]]:
  """The rows of a metrics.jsonl file (a later row for the same step replaces an earlier one)."""
  rows: dict[int, dict[str, float]] = {}
  with open(path) as f:
    for line in f:
      line = line.strip()
      if line:
        row = json.loads(line)
        rows.setdefault(int(row["step"]), {}).update(row)
  return [rows[k] for k in sorted(rows)]


def plot_history(
  jsonl_path: str,
  out_path: str | None = None,
  panels: Sequence[tuple[str, Sequence[str]]] = PLOT_PANELS,
) -> str | None:
  """Draws the panels that have data into a PNG next to the JSONL (returns its path)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = read_history(jsonl_path)
  present = [(title, [k for k in keys if any(k in r for r in rows)]) for title, keys in panels]
  present = [(title, keys) for title, keys in present if keys]
  if not present:
    return None
  cols = 3
  nrows = math.ceil(len(present) / cols)
  fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
  for ax, (title, keys) in zip(axes.flat, present):
    for key in keys:
      xs = [r["step"] for r in rows if key in r]
      ys = [r[key] for r in rows if key in r]
      ax.plot(xs, ys, marker="o", markersize=3, label=key)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  for ax in list(axes.flat)[len(present) :]:
    ax.axis("off")
  fig.tight_layout()
  out_path = out_path or os.path.join(os.path.dirname(jsonl_path), "metrics.png")
  fig.savefig(out_path, dpi=110)
  plt.close(fig)
  return out_path
