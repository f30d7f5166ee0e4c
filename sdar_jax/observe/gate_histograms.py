"""The gap and gate histograms of each iteration, on the host: the counts the compiled update took
on fixed bins (`sdar_jax.core.histograms`, "diag/" metrics) summed over an iteration's mini-batches
(`record_update_histograms`, the trainer's hook after the updates) and written to
`<workdir>/diagnostics/`: `histograms.jsonl` (one row of counts per iteration), with
logging.plots `histograms_step_<N>.png` and a copy of the latest as `histograms.png`, with
logging.tensorboard the TensorBoard histograms `diagnostics/gap` and `diagnostics/gate`. Only the
primary process writes (local or gs://, `sdar_jax.infra.paths`); a failed plot is logged, never
raised. No JAX here: the counts arrive as numpy. docs/running.md, "Diagnostics", shows the files.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from sdar_jax.core.histograms import HISTOGRAM_EDGES, METRIC_PREFIX
from sdar_jax.infra import paths
from sdar_jax.observe.metrics import read_history

log = logging.getLogger(__name__)

DIAGNOSTICS_DIR = "diagnostics"


@dataclasses.dataclass
class Histogram:
  """Fixed-bin counts of one quantity over an iteration's response tokens."""

  name: str  # "gap" or "gate"
  edges: np.ndarray  # [n + 1]
  counts: np.ndarray  # [n] in-range bins
  below: int  # entries < edges[0]
  above: int  # entries > edges[-1]

  @classmethod
  def from_packed(cls, name: str, packed: Sequence[int], edges: np.ndarray) -> Histogram:
    """From `masked_histogram`'s layout [below, bins..., above]."""
    packed = np.asarray(packed, np.int64)
    if packed.shape != (len(edges) + 1,):
      raise ValueError(
        f"histogram {name!r}: {packed.shape[0]} counts for {len(edges)} edges; expected "
        f"{len(edges) + 1} ([below, {len(edges) - 1} bins, above], masked_histogram's layout)."
      )
    return cls(name, np.asarray(edges), packed[1:-1], int(packed[0]), int(packed[-1]))

  @property
  def total(self) -> int:
    return int(self.counts.sum()) + self.below + self.above

  def tensorboard_fields(self) -> dict[str, Any]:
    """`add_histogram_raw` arguments: one bucket per bin plus the two out-of-range buckets (the
    last bucket's limit is the largest float, TensorBoard's convention). min / max / sum /
    sum_squares come from the bins (bin centres; out-of-range counts at half a bin outside)."""
    width = float(self.edges[1] - self.edges[0])
    centres = np.concatenate(
      [
        [self.edges[0] - width / 2],
        (self.edges[:-1] + self.edges[1:]) / 2,
        [self.edges[-1] + width / 2],
      ]
    ).astype(np.float64)
    counts = np.concatenate([[self.below], self.counts, [self.above]]).astype(np.float64)
    limits = [float(e) for e in self.edges] + [float(np.finfo(np.float64).max)]
    filled = np.flatnonzero(counts)
    return {
      "min": float(centres[filled[0]] - width / 2),
      "max": float(centres[filled[-1]] + width / 2),
      "num": float(counts.sum()),
      "sum": float((counts * centres).sum()),
      "sum_squares": float((counts * centres**2).sum()),
      "bucket_limits": limits,
      "bucket_counts": [float(c) for c in counts],
    }


def pop_update_histograms(
  per_batch: Iterable[tuple[dict[str, Any], float]],
) -> dict[str, Histogram]:
  """Removes the histogram counts from each update's metrics (so only scalars remain) and returns
  their sums over the updates, by name ("gap", "gate")."""
  sums: dict[str, np.ndarray] = {}
  for metrics, _ in per_batch:
    for key in [k for k in metrics if k.startswith(METRIC_PREFIX)]:
      counts = np.asarray(metrics.pop(key), np.int64)
      name = key[len(METRIC_PREFIX) :].removesuffix("_counts")
      sums[name] = sums[name] + counts if name in sums else counts
  return {
    name: Histogram.from_packed(name, counts, HISTOGRAM_EDGES[name])
    for name, counts in sorted(sums.items())
  }


def record_update_histograms(
  per_batch: list[tuple[dict[str, Any], float]],
  step: int,
  workdir: str,
  logger=None,
  plots: bool = True,
) -> dict[str, Histogram]:
  """The trainer's hook after an iteration's updates (`per_batch`: each update's metrics as
  numpy, with its token weight). Takes the histogram counts out of the metrics, appends them to
  `<workdir>/diagnostics/histograms.jsonl`, sends them to TensorBoard through `logger`
  (a `MetricsLogger`; nothing without TensorBoard) and, with `plots`, draws
  `histograms_step_<step>.png` and `histograms.png`. Returns the histograms ({} for an algorithm
  without a teacher). Only the primary process writes (`sdar_jax.infra.paths`); `workdir` may be
  remote."""
  hists = pop_update_histograms(per_batch)
  if not hists or not paths.is_primary_process():
    return hists
  out_dir = paths.join(workdir, DIAGNOSTICS_DIR)
  row: dict[str, Any] = {"step": int(step)}
  for h in hists.values():
    row[h.name] = {
      "edges": [float(e) for e in h.edges],
      "counts": [int(c) for c in h.counts],
      "below": h.below,
      "above": h.above,
    }
  path = paths.join(out_dir, "histograms.jsonl")
  paths.append_text(path, json.dumps(row) + "\n")
  if logger is not None and hasattr(logger, "log_histogram"):
    for h in hists.values():
      if h.total:
        logger.log_histogram(f"diagnostics/{h.name}", step, **h.tensorboard_fields())
  if plots:
    try:
      png = paths.join(out_dir, f"histograms_step_{step}.png")
      with paths.staged_output(png) as local_png:
        plot_histograms(hists, step, local_png, history=read_histogram_rows(path, up_to_step=step))
        paths.copy_file(local_png, paths.join(out_dir, "histograms.png"))
    except Exception as e:  # noqa: BLE001 (a plot must never stop training)
      log.warning("could not draw the gate histograms of iteration %d: %s", step, e)
  return hists


def read_histogram_rows(path: str, up_to_step: int | None = None) -> list[dict[str, Any]]:
  """The rows of histograms.jsonl by step, up to `up_to_step` when given: read as a metrics.jsonl
  is (`sdar_jax.observe.metrics.read_history`), so a later row of a step, as a resumed run logs the
  iterations after its checkpoint again, overwrites the earlier one's histograms and torn lines
  are skipped."""
  rows = read_history(path)
  return [row for row in rows if up_to_step is None or int(row["step"]) <= up_to_step]


_TITLES = {"gap": "teacher - student gap (lT - lθ)", "gate": "gate g"}


def _pyplot():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def plot_histograms(
  hists: Mapping[str, Histogram],
  step: int,
  out_path: str,
  history: Sequence[Mapping[str, Any]] = (),
) -> str:
  """One column per histogram: the iteration's share of response tokens per bin and, with
  `history` (histograms.jsonl rows), every iteration so far as a heat map below it (x: step,
  y: bin, colour: share of tokens). One figure, drawn once (stairs, no layout pass): it is
  drawn every iteration."""
  plt = _pyplot()
  rows = 2 if history else 1
  fig, axes = plt.subplots(rows, len(hists), figsize=(4.8 * len(hists), 3.0 * rows), squeeze=False)
  fig.subplots_adjust(left=0.08, right=0.97, bottom=0.1, top=0.9, hspace=0.55, wspace=0.3)
  for col, h in enumerate(hists.values()):
    ax = axes[0, col]
    total = max(h.total, 1)
    ax.stairs(h.counts / total, h.edges, fill=True, color="C0")
    note = f"{h.total} tokens"
    if h.name == "gap":
      ax.axvline(0.0, color="k", lw=0.8)
      positive = int(h.counts[h.edges[:-1] >= 0].sum()) + h.above
      note += f", gap >= 0: {positive / total:.1%}"
    if h.below or h.above:
      note += f"; {h.below} below {h.edges[0]:g}, {h.above} above {h.edges[-1]:g}"
    ax.set_title(f"{_TITLES.get(h.name, h.name)}, iteration {step}\n{note}", fontsize=9)
    ax.set_ylabel("share of tokens")
    ax.grid(alpha=0.3)
    have = [r for r in history if h.name in r]
    if have:
      ax = axes[1, col]
      shares = np.stack(
        [np.asarray(r[h.name]["counts"], float) / max(sum(r[h.name]["counts"]), 1) for r in have],
        1,
      )
      steps = [r["step"] for r in have]
      ax.imshow(
        shares,
        origin="lower",
        aspect="auto",
        cmap="viridis",
        interpolation="nearest",
        extent=(min(steps) - 0.5, max(steps) + 0.5, h.edges[0], h.edges[-1]),
      )
      ax.set_title(f"{_TITLES.get(h.name, h.name)}: share of tokens per iteration", fontsize=9)
      ax.set_xlabel("iteration")
  fig.savefig(out_path, dpi=100)
  plt.close(fig)
  return out_path
