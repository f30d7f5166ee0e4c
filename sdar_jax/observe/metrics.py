"""Run metrics: one log line per logged iteration, a JSONL history, TensorBoard (tensorboardX), PNG plots.

`metrics.jsonl` holds one JSON object per logged step ({"step": k, "<name>": value, ...}); it is
appended to, so a resumed run continues the same file, after `drop_rows_after` removed the rows of
iterations the restored checkpoint does not contain (a run killed between logging a row and saving
its checkpoint logs that step again). `plot_history` turns it into a grid of curves
(`metrics.png`): success rate, reward, the SDAR gate and gap, losses. TensorBoard event files go to
the same directory when `logging.tensorboard` is on and tensorboardX is installed, and every row and
histogram to a Weights & Biases run when one is given (`sdar_jax.observe.wandb_log`). The directory may
be remote (gs://, through `sdar_jax.infra.paths`; TensorBoard writes locally and is copied up), and
only the primary process writes (`sdar_jax.infra.paths.is_primary_process`). `FigureClock` says
when a run's figures are drawn again (`logging.plot_every_s`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sdar_jax.infra import paths

log = logging.getLogger(__name__)

# Panels of the default plot: (title, metric names drawn in it).
PLOT_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
  ("success rate", ("episode/success_rate", "val/success_rate")),
  ("episode reward", ("episode/reward_mean",)),
  ("valid-format actions", ("episode/valid_action_ratio", "episode/admissible_action_ratio")),
  ("SDAR gate", ("sdar/gate_mean", "sdar/gate_active_ratio", "sdar/positive_gap_share")),
  ("teacher - student gap", ("sdar/teacher_gap_mean", "rollout/teacher_old_gap_mean")),
  ("losses", ("train/loss", "actor/pg_loss", "sdar/loss")),
  ("entropy", ("actor/entropy",)),
  ("grad norm", ("train/grad_norm",)),
)


class FigureClock:
  """When a run's figures are drawn again: with `enabled` (logging.plots), at most once every
  `every_s` seconds per figure (logging.plot_every_s; 0 draws every time it is asked) and whenever
  forced (an evaluation, the last iteration). A figure takes a second or two to draw on a CPU
  however fast the iteration was, so drawing both of a run's figures every iteration cost about 5%
  of a 35-second ALFWorld iteration here and would cost far more of a seconds-long one on an
  accelerator."""

  def __init__(self, enabled: bool, every_s: float, clock=time.monotonic):
    if every_s < 0:
      raise ValueError(
        f"logging.plot_every_s={every_s!r} is negative. Fix: the seconds between two drawings of a "
        "figure (0 draws it at every logged iteration), or logging.plots=False for none."
      )
    self.enabled, self.every_s, self.clock = bool(enabled), float(every_s), clock
    self.drawn: dict[str, float] = {}  # figure -> when it was last drawn

  def due(self, figure: str, force: bool = False) -> bool:
    """Whether to draw `figure` now; a True answer counts as drawn now."""
    if not self.enabled:
      return False
    now = self.clock()
    last = self.drawn.get(figure)
    if force or last is None or now - last >= self.every_s:
      self.drawn[figure] = now
      return True
    return False

  def draw_metrics(self, jsonl_path: str | None, force: bool = True) -> str | None:
    """metrics.png from `jsonl_path` (`plot_history`) if it is due; returns the PNG's path."""
    return plot_history(jsonl_path) if jsonl_path and self.due("metrics", force) else None


def _scalar(value: Any) -> float | None:
  try:
    x = float(np.asarray(value))
  except (TypeError, ValueError):
    return None
  return x


class MetricsLogger:
  """Writes metrics of each logged iteration to the console, `<logdir>/metrics.jsonl`, TensorBoard and W&B."""

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
    write: bool | None = None,
    wandb_run: Any = None,
  ):
    """write: whether this process writes files (default: only the primary process does; the
    others compute and return the same rows, and `path` is None there). wandb_run: a
    `sdar_jax.observe.wandb_log.WandbRun` that gets every row and histogram (its owner finishes
    it), or None."""
    self.logdir = paths.resolve(logdir)
    self.write = paths.is_primary_process() if write is None else write
    self.path = paths.join(self.logdir, "metrics.jsonl") if jsonl and self.write else None
    self.console_keys = tuple(console_keys)
    self._tb = None
    self._tb_mirror: paths.LocalMirror | None = None
    self.wandb_run = wandb_run if self.write else None
    if self.write:
      paths.makedirs(self.logdir)
    if tensorboard and self.write:
      try:
        from tensorboardX import SummaryWriter
      except ImportError:
        log.warning(
          "logging.tensorboard=True but tensorboardX is not installed: writing metrics.jsonl and "
          "metrics.png only. Install the pinned requirements (pip install -r requirements.txt) or "
          "set --config.logging.tensorboard=False."
        )
      else:
        self._tb_mirror = paths.LocalMirror(self.logdir)  # event files are written locally
        self._tb = SummaryWriter(self._tb_mirror.local)

  def log(self, step: int, metrics: Mapping[str, Any], echo: bool = True) -> dict[str, float]:
    row = {"step": int(step)}
    for name, value in metrics.items():
      x = _scalar(value)
      if x is not None:
        row[name] = x
    if self.path:
      paths.append_text(self.path, json.dumps(row) + "\n")
    if self._tb is not None:
      for name, x in row.items():
        if name != "step" and math.isfinite(x):
          self._tb.add_scalar(name, x, step)
      self._tb.flush()
      self._tb_mirror.sync()
    if self.wandb_run is not None:
      self.wandb_run.log(row)
    if echo:
      log.info("[iteration %d] %s", step, self.summary(row))
    return row

  def log_histogram(self, name: str, step: int, **fields: Any) -> None:
    """A histogram to TensorBoard and W&B (nothing without them): `fields` are tensorboardX's
    `add_histogram_raw` arguments (min, max, num, sum, sum_squares, bucket_limits, bucket_counts);
    `sdar_jax.observe.gate_histograms.Histogram.tensorboard_fields` makes them from fixed-bin counts."""
    if self.wandb_run is not None:
      self.wandb_run.log_histogram(name, step, fields["bucket_limits"], fields["bucket_counts"])
    if self._tb is not None:
      self._tb.add_histogram_raw(name, global_step=step, **fields)
      self._tb.flush()
      self._tb_mirror.sync()

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
    if not self.path or not paths.exists(self.path):
      return 0
    kept, dropped = [], 0
    for line in paths.read_text(self.path).splitlines(keepends=True):
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
      paths.write_text(self.path, "".join(kept))
    return dropped

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._tb_mirror.close()
      self._tb = None


def read_history(path: str) -> list[dict[str, Any]]:
  """The rows of a metrics.jsonl file by step (a later row for the same step updates an earlier
  one); lines that do not parse (a write cut by a kill) are skipped, a missing file gives [].
  Also reads the gate histograms' histograms.jsonl (`sdar_jax.observe.gate_histograms`)."""
  rows: dict[int, dict[str, Any]] = {}
  if not paths.exists(path):
    return []
  for line in paths.read_text(path).splitlines():
    try:
      row = json.loads(line)
      step = int(row["step"])
    except (ValueError, KeyError, TypeError):
      continue
    rows.setdefault(step, {}).update(row)
  return [rows[k] for k in sorted(rows)]


def validation_summary(path: str, key: str = "val/success_rate") -> str | None:
  """ "validation success_rate 0.104 (iteration 0) -> 0.271 (iteration 20)": the first and the last
  evaluation of a metrics.jsonl, or None before two evaluations."""
  evals = [(int(row["step"]), row[key]) for row in read_history(path) if key in row]
  if len(evals) < 2:
    return None
  (first_step, first), (last_step, last) = evals[0], evals[-1]
  return (
    f"validation {key.split('/', 1)[1]} {first:.3f} (iteration {first_step}) -> {last:.3f} "
    f"(iteration {last_step}), change {last - first:+.3f}"
  )


def plot_history(
  jsonl_path: str,
  out_path: str | None = None,
  panels: Sequence[tuple[str, Sequence[str]]] = PLOT_PANELS,
) -> str | None:
  """Draws the panels that have data into a PNG next to the JSONL (returns its path; either may
  be remote: the PNG is drawn locally and copied up)."""
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
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  for ax in list(axes.flat)[len(present) :]:
    ax.axis("off")
  fig.tight_layout()
  out_path = out_path or paths.join(paths.resolve(jsonl_path).rsplit("/", 1)[0], "metrics.png")
  try:
    with paths.staged_output(out_path) as local_png:
      fig.savefig(local_png, dpi=110)
  finally:
    plt.close(fig)
  return out_path


# ------------------------------------------------------------------------- one iteration's rows
def rollout_metrics(
  episodes: Sequence[Any], prefix: str = "episode", episode_metrics=None
) -> dict[str, float]:
  """Success, reward, length and format rates of `episodes` (`sdar_jax.rollout.Episode`s),
  success per task type and their mean (`macro_success_rate`), and the env family's own metrics
  (`EnvFamily.episode_metrics` of the finished episodes' last infos). Every rate is over episodes
  (or turns), never a mean of per-batch rates: pass all of an evaluation's episodes at once.
  Failed episodes (env_error) are counted, not averaged."""
  from envs.common import success_rates

  done = [ep for ep in episodes if ep.env_error is None]
  m: dict[str, float] = {f"{prefix}/env_failures": float(len(episodes) - len(done))}
  # Student prompts cut by rollout.prompt_truncation=left (failed episodes' turns included).
  m[f"{prefix}/truncated_prompts"] = float(sum(ep.truncated_prompts for ep in episodes))
  if not done:
    return m
  rates = success_rates((ep.task_type, ep.won) for ep in done)
  m[f"{prefix}/success_rate"] = rates.pop("success_rate")  # over episodes (each weighs the same)
  # The mean over task types (ALFWorld) or data sources (Search-QA) of their own rates: the
  # paper's Search-QA "Avg" column; ALFWorld's "All" is success_rate.
  m[f"{prefix}/macro_success_rate"] = float(np.mean(list(rates.values())))
  m[f"{prefix}/reward_mean"] = float(np.mean([ep.reward for ep in done]))
  m[f"{prefix}/length_mean"] = float(np.mean([ep.length for ep in done]))
  turns = [t for ep in done for t in ep.turns]
  m[f"{prefix}/valid_action_ratio"] = float(np.mean([t.valid for t in turns])) if turns else 0.0
  listed, checked = (sum(x) for x in zip(*(ep.admissible_turns for ep in done)))
  if checked:  # the env lists its admissible commands (ALFWorld)
    m[f"{prefix}/admissible_action_ratio"] = listed / checked
  m[f"{prefix}/response_tokens_mean"] = (
    float(np.mean([len(t.response_ids) for t in turns])) if turns else 0.0
  )
  m.update({f"{prefix}/{name}": rate for name, rate in rates.items()})  # <task type>_success_rate
  if episode_metrics is not None:
    for name, value in episode_metrics([ep.info for ep in done]).items():
      m[f"{prefix}/{name}"] = float(value)
  return m


def search_error_count(episodes: Sequence[Any]) -> float:
  """How many searches of `episodes` failed (`Episode.search_errors`: Search-QA's retrieval
  server unreachable, too slow, answering an error), failed episodes included."""
  return float(sum(len(ep.search_errors) for ep in episodes))


def mean_over_updates(per_update: list[tuple[Mapping[str, Any], float]]) -> dict[str, float]:
  """One iteration's update metrics from (metrics, response tokens) per mini-batch update: the
  token-weighted mean of each, the sum for train/skipped_update."""
  total = sum(w for _, w in per_update) or 1.0
  out = {}
  for k in sorted({k for m, _ in per_update for k in m}):
    vals = [(float(np.asarray(m[k])), w) for m, w in per_update if k in m]
    if k == "train/skipped_update":
      out[k] = sum(v for v, _ in vals)
    else:
      out[k] = sum(v * w for v, w in vals) / total
  return out


def teacher_old_gap_metrics(batches, rows=np.asarray, combine=None) -> dict[str, float]:
  """Teacher minus old (behaviour) log-prob over every response token of the iteration's
  mini-batches, token-weighted (Σ gap / Σ tokens, not a mean of per-mini-batch means), and its
  root mean square (the reference's "std" of this gap is this RMS). Several processes: `rows`
  reads this process's rows of a batch array and `combine` sums [Σ gap, Σ gap², tokens] over the
  processes (`sdar_jax.infra.multihost.host_rows`, `sum_over_processes`)."""
  total = sq = tokens = 0.0
  for b in batches:
    mask = np.asarray(rows(b.response_mask), np.float64) > 0
    gap = np.asarray(rows(b.teacher_logp), np.float64) - np.asarray(rows(b.old_logp), np.float64)
    gap = np.where(mask, gap, 0.0)
    total, sq, tokens = total + gap.sum(), sq + (gap * gap).sum(), tokens + mask.sum()
  if combine is not None:
    total, sq, tokens = combine([total, sq, tokens])
  tokens = max(tokens, 1.0)
  return {
    "rollout/teacher_old_gap_mean": float(total / tokens),
    "rollout/teacher_old_gap_rms": float(np.sqrt(sq / tokens)),
  }
