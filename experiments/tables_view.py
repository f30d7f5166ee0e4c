"""One experiment's tidy tables (experiments.records) seen as its policies' outcome grids: which
run stands for an arm and seed, each policy's per-game outcomes on a measure, the grids two arms
share, and the smaller sections of a report (the warm-started policy, the rate search, the commit
check, provenance, the figures). Reads the tables only; computes no statistics beyond means.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import records
from sdar_jax.observe import stats

# measure -> (step kind, panel); "final" is the policy after its last iteration
MEASURES = ("final heldout_seen", "final heldout_unseen", "valid_seen AUC")
_PANELS = {
  "final heldout_seen": "heldout_seen",
  "final heldout_unseen": "heldout_unseen",
  "final valid_seen": "valid_seen",
  "valid_seen AUC": "valid_seen",
}
Grid = tuple[list[str], np.ndarray]  # (games, one outcome per game)


class View:
  """The rows of `experiment` in `tables`, indexed by run, step kind, panel and evaluation."""

  def __init__(
    self,
    tables: records.Tables,
    experiment: str,
    stage: int | None,
    arms: Sequence[str],
    seeds: Sequence[int],
  ):
    self.tables, self.experiment, self.stage = tables, experiment, stage
    self.arms = tuple(arms)
    self.manifest = tables.read("runs", experiment=experiment)
    self.metrics = tables.read("metrics", experiment=experiment)
    games: dict[tuple, dict[str, list[int]]] = {}
    for r in tables.read("outcomes", experiment=experiment):
      if r["kind"] == "train" and r["prompt"] != "plain":
        continue  # a teacher's validation during training (RetireOPD's reference), not the policy
      key = (r["run"], r["kind"], r["panel"], r["eval_iteration"])
      games.setdefault(key, {}).setdefault(r["game"], []).append(r["success"])
    self.outcomes = {k: {g: float(np.mean(v)) for g, v in d.items()} for k, d in games.items()}
    trained = [r for r in self.manifest if r["kind"] == "train" and r["finished"]]
    self.rates: dict[str, float] = {}
    self.runs: dict[str, dict[int, str]] = {}
    for arm in arms:
      own = [r for r in trained if r["arm"] == arm and not r["run"].startswith("commit_check")]
      if not own:
        continue
      by_rate: dict[float, set[int]] = {}
      for r in own:
        by_rate.setdefault(r["lr"], set()).add(r["seed"])
      # the chosen rate: the one whose policies were evaluated on the held-out panels (only the
      # chosen rate's are), else the one most seeds ran at (the search ran every rate on two)
      held = {r["lr"] for r in self.manifest if r["kind"] == "heldout" and r["arm"] == arm}
      self.rates[arm] = max(by_rate, key=lambda lr: (lr in held, len(by_rate[lr]), lr))
      self.runs[arm] = {
        r["seed"]: r["run"] for r in own if r["lr"] == self.rates[arm] and r["seed"] in seeds
      }
      self.runs[arm] = dict(sorted(self.runs[arm].items()))

  def evaluations(self, run: str, kind: str, panel: str) -> dict[int, dict[str, float]]:
    """{evaluation iteration: {game: success}} of one run's step."""
    return {
      it: games for (r, k, p, it), games in self.outcomes.items() if (r, k, p) == (run, kind, panel)
    }

  def grid_of(self, run: str, measure: str, kind: str = "heldout") -> Grid | None:
    panel = _PANELS[measure]
    if measure == "valid_seen AUC":
      curve = self.evaluations(run, "train", panel)
      its = sorted(curve)
      if len(its) < 2:
        return None
      games = sorted(set.intersection(*(set(curve[i]) for i in its)))
      y = np.array([[curve[i][g] for g in games] for i in its])
      return games, stats.per_game_auc(its, y)
    step = "train" if measure == "final valid_seen" else kind
    found = self.evaluations(run, step, panel)
    if not found:
      return None
    last = found[max(found)]
    games = sorted(last)
    return games, np.array([last[g] for g in games])

  def grid(self, arm: str, seed: int, measure: str, kind: str = "heldout") -> Grid | None:
    run = self.runs.get(arm, {}).get(seed)
    return None if run is None else self.grid_of(run, measure, kind)

  def _pair(self, left, right) -> tuple[np.ndarray, np.ndarray] | None:
    """left/right: seed -> Grid | None. The [seeds, games] arrays over the seeds both have and the
    games every one of those grids holds."""
    seeds = [s for s in sorted(set(left) & set(right)) if left[s] and right[s]]
    if not seeds:
      return None
    games = sorted(set.intersection(*(set(side[s][0]) for side in (left, right) for s in seeds)))
    if not games:
      return None

    def rows(side):
      out = []
      for s in seeds:
        ids, values = side[s]
        index = {g: i for i, g in enumerate(ids)}
        out.append([values[index[g]] for g in games])
      return np.asarray(out, np.float64)

    return rows(left), rows(right)

  def paired(self, a: str, b: str, measure: str) -> tuple[np.ndarray, np.ndarray] | None:
    if a not in self.runs or b not in self.runs:
      return None
    return self._pair(
      {s: self.grid(a, s, measure) for s in self.runs[a]},
      {s: self.grid(b, s, measure) for s in self.runs[b]},
    )

  def paired_skills(self, arm: str, measure: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(with the skills, without) of one arm's policies on a held-out measure."""
    seeds = self.runs.get(arm, {})
    return self._pair(
      {s: self.grid(arm, s, measure, "heldout_skills") for s in seeds},
      {s: self.grid(arm, s, measure) for s in seeds},
    )

  def wall_minutes(self, arm: str) -> float | None:
    """Median over the arm's seeds of its training run's and held-out evaluation's wall time."""
    walls = []
    for run in self.runs.get(arm, {}).values():
      rows = [r for r in self.manifest if r["run"] == run and r["kind"] in ("train", "heldout")]
      walls.append(sum(r["wall_seconds"] or 0.0 for r in rows))
    return float(np.median(walls)) / 60.0 if walls and any(walls) else None

  def _metric_rows(self, arm: str) -> dict[int, list[dict[str, Any]]]:
    runs = {run: seed for seed, run in self.runs.get(arm, {}).items()}
    found: dict[int, list[dict[str, Any]]] = {}
    for r in self.metrics:
      if r["run"] in runs:
        found.setdefault(runs[r["run"]], []).append(r)
    return found

  def dynamics(self, arms: Sequence[str], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Per metric, arm and iteration: the mean, min and max over the arm's seeds that logged it."""
    rows = []
    for key in keys:
      for arm in arms:
        by_it: dict[int, list[float]] = {}
        for seed_rows in self._metric_rows(arm).values():
          for r in seed_rows:
            if r["metric"] == key:
              by_it.setdefault(r["iteration"], []).append(r["value"])
        rows += [
          {"metric": key, "arm": arm, "iteration": it, "mean": float(np.mean(v))}
          | {"min": float(np.min(v)), "max": float(np.max(v))}
          for it, v in sorted(by_it.items())
        ]
    return rows

  def last_values(self, arm: str, keys: Sequence[str]) -> list[dict[str, Any]]:
    """Per seed of `arm`, each metric's value at the last iteration that logged it (or None)."""
    out = []
    for seed, rows in sorted(self._metric_rows(arm).items()):
      row: dict[str, Any] = {"seed": seed}
      for key in keys:
        logged = sorted((r["iteration"], r["value"]) for r in rows if r["metric"] == key)
        row[key] = logged[-1][1] if logged else None
      out.append(row)
    return out


def initial_lines(view: View) -> list[str]:
  """The warm-started policy's held-out success, with the skills too where evaluated so."""
  shown = []
  for kind, label in (("heldout", "without the skills"), ("heldout_skills", "with them")):
    parts = [
      f"{panel} {np.mean(list(g.values())):.3f} ({len(g)} games)"
      for panel in ("heldout_seen", "heldout_unseen")
      if (g := view.evaluations("initial", kind, panel).get(0))
    ]
    if parts:
      shown.append(f"{label}: {', '.join(parts)}")
  return ["", f"The warm-started policy (every arm's start), {'; '.join(shown)}."] if shown else []


def search_lines(view: View) -> list[str]:
  """The rate search's final valid_seen success per arm, rate and search seed (0 and 1), where the
  tables hold a search (an arm trained at several rates)."""
  from experiments.powered.plan import SEARCH_SEEDS

  lines = []
  for arm, rate in view.rates.items():
    rows = [
      r
      for r in view.manifest
      if r["kind"] == "train" and r["arm"] == arm and r["stage"] == view.stage
      if not r["run"].startswith("commit_check") and r["seed"] in SEARCH_SEEDS
    ]
    rates = sorted({r["lr"] for r in rows})
    if len(rates) < 2:
      continue
    cells = []
    for lr in rates:
      finals = []
      for seed in SEARCH_SEEDS:
        run = next((r["run"] for r in rows if (r["lr"], r["seed"]) == (lr, seed)), None)
        g = view.grid_of(run, "final valid_seen") if run else None
        finals.append("-" if g is None else f"{g[1].mean():.3f}")
      cell = " / ".join(finals)
      cells.append(f"**{cell}**" if lr == rate else cell)
    lines.append(f"| `{arm}` | " + " | ".join(cells) + " |")
    header = "| arm | " + " | ".join(f"{lr:g}" for lr in rates) + " |"
  if not lines:
    return []
  return [
    "",
    "The rate search: final valid_seen success of search seeds 0 / 1 at each rate (the chosen "
    "rate in bold; these games chose the rates, so valid_seen rows below are not independent of "
    "the choice):",
    "",
    header,
    "|---|" + "---|" * (header.count("|") - 2),
    *lines,
  ]


def commit_check_lines(view: View) -> list[str]:
  """The commit check: `grpo` seed 0 trained again by the later stage's commit against the reused
  run, valid_seen outcome by outcome (games x evaluations both logged)."""
  check = [r for r in view.manifest if r["run"].startswith("commit_check") and r["kind"] == "train"]
  if not check or "grpo" not in view.runs or 0 not in view.runs["grpo"]:
    return []
  a = view.evaluations(view.runs["grpo"][0], "train", "valid_seen")
  b = view.evaluations(check[0]["run"], "train", "valid_seen")
  pairs = [
    (a[i][g], b[i][g]) for i in sorted(set(a) & set(b)) for g in sorted(set(a[i]) & set(b[i]))
  ]
  differ = sum(x != y for x, y in pairs)
  same = "identical in all" if not differ else f"different in {differ}"
  return [
    "",
    f"Commit check: `grpo` seed 0 trained again by commit {check[0]['commits']} "
    f"({check[0]['run']}): its valid_seen outcomes are {same} of {len(pairs)} (games x the "
    f"{len(set(a) & set(b))} evaluations both logged).",
  ]


def provenance_lines(view: View) -> list[str]:
  """The commits the stage's steps ran at, evaluations that scored fewer games than their panel
  holds, and where the run folders of these rows are kept."""
  rows = [r for r in view.manifest if view.stage is None or r["stage"] == view.stage]
  commits: dict[str, int] = {}
  for r in rows:
    for c in (r["commits"] or "").split() or ["not recorded"]:
      commits[c] = commits.get(c, 0) + 1
  size: dict[str, int] = {}
  for (_, _, panel, _), games in view.outcomes.items():
    size[panel] = max(size.get(panel, 0), len(games))
  short = sorted(
    f"{run} {kind} {panel}: {len(games)} of {size[panel]}"
    for (run, kind, panel, _), games in view.outcomes.items()
    if len(games) < size[panel] and any(r["run"] == run for r in rows)
  )
  held = sorted({r["files_at"].split(":")[0] for r in rows if r["files_at"]})
  return [
    f"{len(rows)} steps; the code they ran at: "
    + ", ".join(f"{c} ({n})" for c, n in sorted(commits.items()))
    + " (a step resumed across commits counts under each).",
    "",
    "Evaluations that scored fewer games than their panel holds: "
    + ("none." if not short else "; ".join(short) + "."),
    "",
    "Each step's command is the `command` column of runs.csv"
    + (f"; its run folder is kept at commit {', '.join(held)} (`files_at`)." if held else "."),
  ]


def arm_color(arm: str, arms: Sequence[str]) -> str:
  """The colour of `arm` in every figure of a report: its place among the plan's `arms`, so an
  arm keeps its colour in a panel that some arms did not log."""
  return f"C{list(arms).index(arm)}" if arm in arms else f"C{len(arms)}"


# more points than this on a curve (one a training iteration): drawn without markers
DENSE_POINTS = 40


def draw_curves(
  ax, series: dict[str, dict[int, dict[int, float]]], ylabel: str, arms: Sequence[str]
) -> int:
  """series: arm -> seed -> {x: y}; per arm the mean over seeds and a min-max band, coloured by
  the arm's place among `arms`. Returns the number of arms drawn."""
  drawn = 0
  for arm, seeds in series.items():
    xs = sorted({x for curve in seeds.values() for x in curve})
    if not xs:
      continue
    values = [[c[x] for c in seeds.values() if x in c] for x in xs]
    color = arm_color(arm, arms)
    dense = len(xs) > DENSE_POINTS  # a long run's curve: a thin line, no markers
    ax.plot(
      xs,
      [np.mean(v) for v in values],
      marker=None if dense else "o",
      ms=4,
      lw=1.0 if dense else 1.5,
      color=color,
      label=f"{arm} (n={len(seeds)})",
    )
    ax.fill_between(
      xs, [min(v) for v in values], [max(v) for v in values], color=color, alpha=0.2, lw=0
    )
    drawn += 1
  ax.set_xlabel("iteration")
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  if drawn:
    ax.legend(fontsize=8)
  return drawn


PALETTE_COLORS = 128


def save_figure(fig, path: str) -> str:
  import matplotlib.pyplot as plt
  from PIL import Image

  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.tight_layout()
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=100)
  plt.close(fig)
  # A palette of PALETTE_COLORS: a long run's noisy curves, antialiased in RGBA, made the long
  # budget's figure 600 KB; in a palette it is a third of that and looks the same.
  image = Image.open(buffer).convert("RGB")
  image.quantize(PALETTE_COLORS, dither=Image.Dither.NONE).save(path, optimize=True)
  return path


def plot_curves(view: View, path: str) -> str | None:
  """valid_seen success against the iteration, per arm the mean over seeds with a min-max band."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  series = {
    arm: {
      s: {
        it: float(np.mean(list(g.values())))
        for it, g in view.evaluations(run, "train", "valid_seen").items()
      }
      for s, run in seeds.items()
    }
    for arm, seeds in view.runs.items()
  }
  fig, ax = plt.subplots(figsize=(7, 4.2))
  if not draw_curves(ax, series, "valid_seen success", view.arms):
    plt.close(fig)
    return None
  return save_figure(fig, path)


def plot_dynamics(
  rows: Sequence[dict[str, Any]], keys, path: str, arms: Sequence[str]
) -> str | None:
  """One panel per (metric, title) of `keys` that `rows` (View.dynamics) hold, mean and band,
  each arm in its colour among `arms`."""
  shown = [(k, t) for k, t in keys if any(r["metric"] == k for r in rows)]
  if not shown:
    return None
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(shown), figsize=(5.0 * len(shown), 3.8), squeeze=False)
  for ax, (key, title) in zip(axes.flat, shown):
    drawn = list(dict.fromkeys(r["arm"] for r in rows if r["metric"] == key))
    for arm in drawn:
      color = arm_color(arm, arms)
      mine = [r for r in rows if r["metric"] == key and r["arm"] == arm]
      xs = [r["iteration"] for r in mine]
      ax.plot(xs, [r["mean"] for r in mine], marker="o", ms=3, color=color, label=arm)
      ax.fill_between(
        xs, [r["min"] for r in mine], [r["max"] for r in mine], color=color, alpha=0.2, lw=0
      )
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("iteration")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  return save_figure(fig, path)
