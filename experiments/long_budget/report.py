"""The long-budget stage's report from the tidy tables alone: the curves of every per-iteration
measure per arm (mean and min-max band over seeds), the collapse count per arm (the definition
fixed in experiments.long_budget.plan), RetireOPD's retirement table and the held-out figures
with paired bootstrap intervals and Holm's decisions (sdar_jax.observe.stats). Works on partial
tables (one seed, missing arms, no held-out evaluation yet): what is missing is said, not drawn.

Output in `dest`: report.md, curves.png, dynamics.csv, collapse.csv, retirement.csv, heldout.csv,
paired.csv."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from experiments import records, tables_view
from experiments.long_budget.plan import ARMS, EXPERIMENT, FULL, RETIRE_ARM, STAGE
from experiments.report import FAMILY_COLUMNS, family_rows, reading_lines, write_csv
from sdar_jax.observe import stats

DEST = "docs/results/long_budget"
COLLAPSE_DROP = 0.2  # fixed before the runs: success at least this far below the best so far
COLLAPSE_RUN = 2  # ... on this many consecutive validations
# (name, how it is read from an iteration's metrics, axis label)
MEASURES: tuple[tuple[str, str], ...] = (
  ("valid_seen success", "valid_seen success (64 games)"),
  ("gap mean", "teacher - student gap, mean (nats/token)"),
  ("gap sd", "teacher - student gap, sd over tokens"),
  ("kl from initial", "KL from the initial policy (k3, nats/token)"),
  ("entropy", "policy entropy (nats/token)"),
  ("invalid actions", "share of invalid actions"),
  ("inadmissible actions", "share of actions the room did not offer"),
  ("grad norm", "gradient norm"),
)
RETIREMENT = (
  "retire/retired_at",
  "retire/teacher_success",
  "retire/competence",
  "retire/progress",
  "retire/kl",
)
COMPARISONS = (
  ("grpo_opsd", "grpo"),
  ("sdar", "grpo"),
  ("sdar", "grpo_opsd"),
  ("retire_opd", "grpo"),
)
HELDOUT_MEASURES = ("final heldout_seen", "final heldout_unseen")


def measure_values(row: Mapping[str, float]) -> dict[str, float]:
  """The per-iteration measures of one metrics row ({metric: value}); absent ones left out."""
  out = {}
  mean, rms = row.get("rollout/teacher_old_gap_mean"), row.get("rollout/teacher_old_gap_rms")
  if mean is not None:
    out["gap mean"] = mean
    if rms is not None:
      out["gap sd"] = math.sqrt(max(rms * rms - mean * mean, 0.0))
  for name, key in (
    ("kl from initial", "actor/kl_loss"),
    ("entropy", "actor/entropy"),
    ("grad norm", "train/grad_norm"),
  ):
    if row.get(key) is not None:
      out[name] = row[key]
  for name, key in (
    ("invalid actions", "episode/valid_action_ratio"),
    ("inadmissible actions", "episode/admissible_action_ratio"),
  ):
    if row.get(key) is not None:
      out[name] = 1.0 - row[key]
  return out


def collapsed(curve: Mapping[int, float], drop: float = COLLAPSE_DROP) -> int | None:
  """The iteration a run collapses at, else None: the second of COLLAPSE_RUN consecutive
  validations each at least `drop` below the best success of the validations up to and including
  it (`curve`: validation iteration -> success; the one before training counts)."""
  best, streak = -math.inf, 0
  for it in sorted(curve):
    best = max(best, curve[it])
    streak = streak + 1 if curve[it] <= best - drop + 1e-9 else 0
    if streak >= COLLAPSE_RUN:
      return it
  return None


class Data:
  """The stage's rows: per arm and seed, the valid_seen curve and each measure's curve."""

  def __init__(self, tables: records.Tables, seeds: Sequence[int] = FULL.seeds):
    self.view = tables_view.View(tables, EXPERIMENT, STAGE, tuple(ARMS), seeds)
    by_run: dict[str, dict[int, dict[str, float]]] = {}
    for r in self.view.metrics:
      by_run.setdefault(r["run"], {}).setdefault(r["iteration"], {})[r["metric"]] = r["value"]
    # arm -> seed -> measure -> {iteration: value}
    self.curves: dict[str, dict[int, dict[str, dict[int, float]]]] = {}
    self.raw: dict[str, dict[int, dict[int, dict[str, float]]]] = {}
    for arm, seeds_ in self.view.runs.items():
      for seed, run in seeds_.items():
        rows = by_run.get(run, {})
        self.raw.setdefault(arm, {})[seed] = rows
        mine = self.curves.setdefault(arm, {}).setdefault(seed, {})
        success = self.view.evaluations(run, "train", "valid_seen")
        mine["valid_seen success"] = {
          it: float(np.mean(list(g.values()))) for it, g in success.items()
        }
        for it, row in sorted(rows.items()):
          for name, value in measure_values(row).items():
            mine.setdefault(name, {})[it] = value

  def series(self, measure: str) -> dict[str, dict[int, dict[int, float]]]:
    """arm -> seed -> {iteration: value} of one measure (arms that logged it)."""
    out = {}
    for arm, seeds in self.curves.items():
      got = {s: c[measure] for s, c in seeds.items() if c.get(measure)}
      if got:
        out[arm] = got
    return out


def dynamics_rows(data: Data) -> list[dict[str, Any]]:
  rows = []
  for measure, _ in MEASURES:
    for arm, seeds in data.series(measure).items():
      its = sorted({it for c in seeds.values() for it in c})
      for it in its:
        v = [c[it] for c in seeds.values() if it in c]
        rows.append(
          {"measure": measure, "arm": arm, "iteration": it, "seeds": len(v)}
          | {"mean": float(np.mean(v)), "min": float(np.min(v)), "max": float(np.max(v))}
        )
  return rows


def collapse_rows(data: Data) -> list[dict[str, Any]]:
  rows = []
  for arm, seeds in data.curves.items():
    for seed, c in sorted(seeds.items()):
      curve = c.get("valid_seen success", {})
      at = collapsed(curve)
      best = max(curve.values()) if curve else None
      rows.append(
        {"arm": arm, "seed": seed, "validations": len(curve), "best": best}
        | {"final": curve[max(curve)] if curve else None, "collapsed_at": at}
      )
  return rows


def retirement_rows(data: Data) -> list[dict[str, Any]]:
  """Per retire_opd seed: the iteration it retired after, or the rule's values at the end."""
  rows = []
  for seed, by_it in sorted(data.raw.get(RETIRE_ARM, {}).items()):
    row: dict[str, Any] = {"seed": seed, "last_iteration": max(by_it) if by_it else None}
    for key in RETIREMENT:
      logged = [(it, r[key]) for it, r in sorted(by_it.items()) if r.get(key) is not None]
      row[key] = logged[-1][1] if logged else None
    rows.append(row)
  return rows


def heldout_rows(data: Data) -> list[dict[str, Any]]:
  """Per arm (and the initial policy): mean held-out success over its seeds, and per seed."""
  view, rows = data.view, []
  initial = {m: view.grid_of("initial", m) for m in HELDOUT_MEASURES}
  if any(initial.values()):
    rows.append(
      {"arm": "initial", "seeds": 1}
      | {m: float(g[1].mean()) if g else None for m, g in initial.items()}
      | {f"{m} games": len(g[0]) if g else None for m, g in initial.items()}
    )
  for arm, seeds in view.runs.items():
    grids = {m: [g for s in seeds if (g := view.grid(arm, s, m))] for m in HELDOUT_MEASURES}
    if not any(grids.values()):
      continue
    row: dict[str, Any] = {"arm": arm, "seeds": max(len(g) for g in grids.values())}
    for m, gs in grids.items():
      row[m] = float(np.mean([g[1].mean() for g in gs])) if gs else None
      row[f"{m} games"] = len(gs[0][0]) if gs else None
      row[f"{m} per seed"] = " ".join(f"{g[1].mean():.3f}" for g in gs)
    rows.append(row)
  return rows


def paired_rows(data: Data, resamples: int) -> tuple[list[dict[str, Any]], list[str]]:
  keyed = []
  for a, b in COMPARISONS:
    for measure in HELDOUT_MEASURES:
      grids = data.view.paired(a, b, measure)
      if grids is not None:
        keyed.append(({"comparison": f"{a} - {b}", "measure": measure}, grids[0] - grids[1]))
  return family_rows(keyed, resamples)


def plot(data: Data, path: str) -> str | None:
  """One panel per measure that any arm logged: mean over seeds, band min to max."""
  shown = [(m, label) for m, label in MEASURES if data.series(m)]
  if not shown:
    return None
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cols = 2
  fig, axes = plt.subplots(
    math.ceil(len(shown) / cols), cols, figsize=(11, 3.4 * math.ceil(len(shown) / cols))
  )
  axes = np.atleast_1d(axes).ravel()
  for ax, (measure, label) in zip(axes, shown):
    tables_view.draw_curves(ax, data.series(measure), label, data.view.arms)
  for ax in axes[len(shown) :]:
    ax.set_visible(False)
  return tables_view.save_figure(fig, path)


def _f(x: Any, digits: int = 3) -> str:
  return (
    "-"
    if x is None
    else f"{x:+.{digits}f}"
    if isinstance(x, float) and x < 0
    else (f"{x:.{digits}f}" if isinstance(x, float) else str(x))
  )


def report(
  tables: records.Tables, dest: str = DEST, resamples: int = stats.RESAMPLES, seeds=FULL.seeds
) -> str:
  """Writes the report and its files into `dest`; returns report.md's text."""
  data = Data(tables, seeds)
  os.makedirs(dest, exist_ok=True)
  dyn, col, ret = dynamics_rows(data), collapse_rows(data), retirement_rows(data)
  held = heldout_rows(data)
  pairs, moved = paired_rows(data, resamples)
  write_csv(
    os.path.join(dest, "dynamics.csv"),
    dyn,
    ("measure", "arm", "iteration", "seeds", "mean", "min", "max"),
  )
  write_csv(
    os.path.join(dest, "collapse.csv"),
    col,
    ("arm", "seed", "validations", "best", "final", "collapsed_at"),
  )
  write_csv(os.path.join(dest, "retirement.csv"), ret, ("seed", "last_iteration", *RETIREMENT))
  held_cols = ["arm", "seeds"] + [
    f"{m}{s}" for m in HELDOUT_MEASURES for s in ("", " games", " per seed")
  ]
  write_csv(os.path.join(dest, "heldout.csv"), held, held_cols)
  write_csv(os.path.join(dest, "paired.csv"), pairs, ("comparison", "measure", *FAMILY_COLUMNS))
  figure = plot(data, os.path.join(dest, "curves.png"))
  runs = {arm: sorted(s) for arm, s in data.view.runs.items()}
  missing = {arm: [s for s in seeds if s not in runs.get(arm, ())] for arm in ARMS}
  lines = [
    "# The third stage: long budget (report)",
    "",
    "Generated by `python -m experiments.long_budget report` from the tables "
    f"(experiment `{EXPERIMENT}`). Finished training runs per arm: "
    + (", ".join(f"`{a}` seeds {s}" for a, s in runs.items()) or "none yet")
    + "; arms with none: "
    + (", ".join(f"`{a}`" for a in ARMS if a not in runs) or "none")
    + ". The design's seeds not (yet) trained: "
    + ("; ".join(f"`{a}` {m}" for a, m in missing.items() if m) or "none")
    + ".",
    "",
  ]
  if figure:
    lines += [
      f"![every measure per arm, mean over seeds, band min to max]({os.path.basename(figure)})",
      "",
    ]
  lines += ["## Collapse", "", "| arm | seeds | collapsed | at iterations |", "|---|---:|---:|---|"]
  for arm in runs:
    mine = [r for r in col if r["arm"] == arm]
    at = [f"seed {r['seed']}: {r['collapsed_at']}" for r in mine if r["collapsed_at"] is not None]
    lines.append(f"| `{arm}` | {len(mine)} | {len(at)} | {', '.join(at) or '-'} |")
  lines += ["", "## Retirement (`retire_opd`)", ""]
  if ret:
    lines += [
      "| seed | retired at | teacher success | competence | progress | K (last) |",
      "|---:|---|---:|---:|---:|---:|",
    ]
    for r in ret:
      at = r["retire/retired_at"]
      lines.append(
        f"| {r['seed']} | {'not retired (values at ' + str(r['last_iteration']) + ')' if at is None else f'iteration {int(at)}'} | "
        f"{_f(r['retire/teacher_success'])} | {_f(r['retire/competence'])} | "
        f"{_f(r['retire/progress'])} | {_f(r['retire/kl'], 4)} |"
      )
  else:
    lines.append("No `retire_opd` run has finished yet.")
  lines += ["", "## Held-out panels", ""]
  if held:
    lines += [
      "| policy | seeds | held-out seen | held-out unseen | per seed (seen) |",
      "|---|---:|---:|---:|---|",
    ]
    for r in held:
      lines.append(
        f"| `{r['arm']}` | {r['seeds']} | {_f(r.get('final heldout_seen'))} | "
        f"{_f(r.get('final heldout_unseen'))} | {r.get('final heldout_seen per seed', '')} |"
      )
  else:
    lines.append("No held-out evaluation has finished yet.")
  if pairs:
    lines += [
      "",
      (
        f"Paired over seeds x games, two-way bootstrap ({resamples} resamples), one Holm family "
        f"of {len(pairs)} rows:"
      ),
      "",
      "| comparison | measure | seeds | games | difference | 95% interval | simultaneous | Holm |",
      "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in pairs:
      lines.append(
        f"| `{r['comparison']}` | {r['measure']} | {r['seeds']} | {r['games']} | "
        f"{_f(r['difference'])} | [{_f(r['ci_low'])}, {_f(r['ci_high'])}] | "
        f"[{_f(r['sim_low'])}, {_f(r['sim_high'])}] | {r['mark']} |"
      )
    if moved:
      lines.append(f"\nHolm marks that change under another bootstrap seed: {', '.join(moved)}.")
    lines += reading_lines(pairs)
  text = "\n".join(lines) + "\n"
  with open(os.path.join(dest, "report.md"), "w") as f:
    f.write(text)
  return text
