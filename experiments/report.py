"""An experiment's report from its tidy tables alone (experiments.records): the per-arm summary, the
paired comparisons as one Holm family, and, where the tables hold them, the skill-internalisation
family, the commit check, the training dynamics and RetireOPD's retirement.

Input: a `Spec` (which experiment and stage, its arms, comparisons and measures) and the tables'
folder. Output: report.md beside summary.csv, paired.csv (and internalisation.csv, dynamics.csv,
retirement.csv, curves.png, dynamics.png where they apply) in the spec's folder. Statistics come
from sdar_jax.observe.stats only; this module reads no run folder.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import records, tables_view
from experiments.specs import SPECS, Spec
from experiments.tables_view import MEASURES
from sdar_jax.observe import stats

SUMMARY_COLUMNS = (
  "arm", "rate", "seeds", "heldout_seen", "heldout_seen_sd", "heldout_unseen",
  "heldout_unseen_sd", "valid_seen_final", "valid_seen_final_sd", "valid_seen_auc",
  "valid_seen_auc_sd", "wall_min",
)  # fmt: skip
FAMILY_COLUMNS = (
  "seeds", "games", "difference", "ci_low", "ci_high", "sim_low", "sim_high", "p", "p_se",
  "holm_p", "mark", "sign_flip_p",
)  # fmt: skip
PAIRED_COLUMNS = ("comparison", "measure", *FAMILY_COLUMNS)
INTERNALISATION_COLUMNS = ("arm", "measure", "without", "with", *FAMILY_COLUMNS)
DYNAMICS_ARMS = ("sdar", "grpo_opsd", "sdar_vocab", "sdar_vocab_ungated")
DYNAMICS = (
  ("sdar/teacher_gap_mean", "mean teacher-student gap (nats / token)"),
  ("sdar/positive_gap_share", "share of tokens with gap > 0"),
  ("sdar/gate_active_ratio", "share of tokens with g > 0.5"),
)
RETIREMENT = ("retire/retired_at", "retire/teacher_success", "retire/competence", "retire/progress")
BOOTSTRAP_SEEDS = (0, 1, 2, 3, 4)  # the marks are checked under each of these RNG seeds


def _family(diffs: Sequence[np.ndarray], resamples: int, rng_seed: int) -> list[dict[str, Any]]:
  rows = stats.family(diffs, resamples=resamples, rng_seed=rng_seed)
  own = [c for c in FAMILY_COLUMNS if c not in ("holm_p", "mark")]
  return [
    {**{c: getattr(r.bootstrap, c) for c in own}, "holm_p": r.holm_p, "mark": r.mark} for r in rows
  ]


def family_rows(
  keyed: Sequence[tuple[dict[str, Any], np.ndarray]], resamples: int
) -> tuple[list[dict[str, Any]], list[str]]:
  """Each (row's key, differences [seeds, games]) completed by the family's statistics, and the
  rows whose Holm mark differs under another of BOOTSTRAP_SEEDS (empty: the marks are stable)."""
  diffs = [d for _, d in keyed]
  if not diffs:
    return [], []
  first = _family(diffs, resamples, BOOTSTRAP_SEEDS[0])
  moved = set()
  for seed in BOOTSTRAP_SEEDS[1:]:
    for i, row in enumerate(_family(diffs, resamples, seed)):
      if row["mark"] != first[i]["mark"]:
        moved.add(i)
  rows = [{**key, **stat} for (key, _), stat in zip(keyed, first)]
  label = lambda key: " ".join(str(v) for v in list(key.values())[:2])  # noqa: E731
  return rows, [label(keyed[i][0]) for i in sorted(moved)]


def _f(x: Any, digits: int = 3) -> str:
  return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{digits}f}"


def _p(x: float) -> str:
  return f"{x:.2g}" if x >= 0.001 else f"{x:.1e}"


def _family_cells(r: dict[str, Any]) -> str:
  bold = "**" if r["mark"] == "rejected" else ""
  return (
    f"{bold}{r['difference']:+.3f}{bold} | [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] "
    f"| [{r['sim_low']:+.3f}, {r['sim_high']:+.3f}] | {_p(r['p'])} ± {_p(r['p_se'])} "
    f"| {_p(r['holm_p'])} | {r['mark']} | {_p(r['sign_flip_p'])}"
  )


FAMILY_HEADER = (
  "difference | 95% interval | simultaneous interval | bootstrap p ± MC se | Holm p | Holm "
  "| seed sign-flip p |"
)


def reading(r: dict[str, Any], interval: str = "simultaneous") -> str:
  """What a paired row's statistics support, in words: its decision and the interval that goes
  with it ("simultaneous" for a row of a Holm family, "own" for a comparison tested alone). A row
  Holm does not reject is "not detected", with the gain and the loss its interval leaves open;
  never "no effect"."""
  low, high = (
    (r["sim_low"], r["sim_high"]) if interval == "simultaneous" else (r["ci_low"], r["ci_high"])
  )
  span = f"{r['difference']:+.3f}, {interval} interval [{low:+.3f}, {high:+.3f}]"
  if r["mark"] == "rejected":
    side = "above" if r["difference"] > 0 else "below"
    held = " (the interval still holds 0)" if low <= 0 <= high else ""
    return f"detected, {side} 0: {span}{held}"
  if r["mark"] == "undecided":
    return f"undecided (p within 3 Monte Carlo standard errors of its threshold): {span}"
  if low > 0 or high < 0:
    return f"not detected by the test, though the interval excludes 0: {span}"
  open_ = []
  if low < 0:
    open_.append(f"a loss of up to {-low:.3f}")
  if high > 0:
    open_.append(f"a gain of up to {high:.3f}")
  left = f"; it leaves open {' and '.join(open_)}" if open_ else ""
  return f"not detected: {span}{left}"


def reading_lines(rows: Sequence[dict[str, Any]], name: Any = None) -> list[str]:
  """A family's rows read in words (`reading`, each with its simultaneous interval), one bullet a
  row named by `name(row)` (default: its comparison and measure)."""
  name = name or (lambda r: f"`{r['comparison']}`, {r['measure']}")
  return ["", "Readings (each row with its simultaneous interval):", ""] + [
    f"* {name(r)}: {reading(r)}." for r in rows
  ]


def _family_note(n: int, resamples: int, moved: list[str], seeds: Sequence[int]) -> list[str]:
  floor = stats.sign_flip_floor(min(seeds)) if seeds else 1.0
  return [
    f"Two-way (seed x game) bootstrap, {resamples:,} resamples; each row's 95% interval is its "
    f"own, the simultaneous interval (Bonferroni, level 1 - 0.05/{n}) covers the {n} rows "
    "jointly. The decision is Holm's step-down over the bootstrap p-values at family-wise "
    "0.05: bold means Holm rejects and nothing else; a row within 3 Monte Carlo standard errors "
    "of its Holm threshold is marked undecided, and a rejected row's simultaneous interval may "
    "still hold 0. The seed sign-flip p (the exact randomisation test over the seeds' mean "
    f"differences; its floor with {min(seeds) if seeds else 0} seeds is {floor:.4g}) is a "
    "column, not a decision.",
    "",
    "Marks under the bootstrap's RNG seeds "
    + ", ".join(map(str, BOOTSTRAP_SEEDS))
    + ": "
    + ("identical." if not moved else f"they differ on {'; '.join(moved)}."),
  ]


def write_csv(path: str, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
  from sdar_jax.observe import collect

  with open(path, "w") as f:
    f.write(collect.csv_text(rows, columns))


def summary_rows(view: tables_view.View, spec: Spec) -> list[dict[str, Any]]:
  rows = []
  for arm, seeds in view.runs.items():
    per = {m: [float(g[1].mean()) for s in seeds if (g := view.grid(arm, s, m))] for m in MEASURES}
    row: dict[str, Any] = {"arm": arm, "rate": view.rates[arm], "seeds": len(seeds)}
    for measure, column in zip(MEASURES, ("heldout_seen", "heldout_unseen", "valid_seen_auc")):
      row[column], row[f"{column}_sd"] = _mean_sd(per[measure])
    row["valid_seen_final"], row["valid_seen_final_sd"] = _mean_sd(
      [float(g[1].mean()) for s in seeds if (g := view.grid(arm, s, "final valid_seen"))]
    )
    row["wall_min"] = view.wall_minutes(arm)
    rows.append(row)
  return rows


def _mean_sd(values: Sequence[float]) -> tuple[float | None, float | None]:
  if not values:
    return None, None
  return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else None


def paired(view: tables_view.View, spec: Spec, resamples: int) -> tuple[list[dict], list[str]]:
  keyed = []
  for a, b in spec.comparisons:
    for measure in spec.measures:
      grids = view.paired(a, b, measure)
      if grids is not None:
        keyed.append(({"comparison": f"{a} - {b}", "measure": measure}, grids[0] - grids[1]))
  return family_rows(keyed, resamples)


def internalisation(view: tables_view.View, resamples: int) -> tuple[list[dict], list[str]]:
  keyed = []
  for arm in view.runs:
    for measure in MEASURES[:2]:
      grids = view.paired_skills(arm, measure)
      if grids is not None:
        with_, without = grids
        key = {"arm": arm, "measure": measure}
        keyed.append(({**key, "without": without.mean(), "with": with_.mean()}, with_ - without))
  return family_rows(keyed, resamples)


def report(tables: records.Tables, spec: Spec, resamples: int = stats.RESAMPLES) -> str:
  """Writes the spec's report and its CSVs and figures into spec.dest; returns report.md."""
  view = tables_view.View(tables, spec.experiment, spec.stage, spec.arms, spec.seeds)
  os.makedirs(spec.dest, exist_ok=True)
  summary = summary_rows(view, spec)
  write_csv(os.path.join(spec.dest, "summary.csv"), summary, SUMMARY_COLUMNS)
  shown = [
    (c, title)
    for c, title in (
      ("heldout_seen", "held-out seen"),
      ("heldout_unseen", "held-out unseen"),
      ("valid_seen_final", "valid_seen final"),
      ("valid_seen_auc", "valid_seen AUC"),
    )
    if any(r[c] is not None for r in summary)
  ]
  lines = [
    f"# {spec.title}: report",
    "",
    f"Written by `{spec.command}` from the tables in {tables.folder} alone "
    f"({', '.join(f'{a}: seeds {sorted(s)}' for a, s in view.runs.items()) or 'no run'}).",
    "",
    "Mean ± sample standard deviation over seeds of each policy's success on the panel's games.",
    "",
    "| arm | rate | seeds | " + " | ".join(t for _, t in shown) + " | wall / run (min, median) |",
    "|---|---:|---:|" + "---:|" * (len(shown) + 1),
  ]
  for r in summary:
    lines.append(
      f"| `{r['arm']}` | {r['rate']:.1e} | {r['seeds']} | "
      + " | ".join(f"{_f(r[c])} ± {_f(r[c + '_sd'])}" for c, _ in shown)
      + f" | {_f(r['wall_min'], 1)} |"
    )
  lines += tables_view.initial_lines(view) + tables_view.search_lines(view)
  pairs, moved = paired(view, spec, resamples)
  write_csv(os.path.join(spec.dest, "paired.csv"), pairs, PAIRED_COLUMNS)
  if pairs:
    lines += [
      "",
      f"Paired differences (A - B) over the seeds both arms finished and the games both policies "
      f"of a seed played (matched by game file), one family of {len(pairs)} rows"
      + (
        f"; the primary comparison, named before any run: {' - '.join(spec.primary[:2])}, "
        f"{spec.primary[2]}."
        if spec.primary
        else "."
      ),  # fmt: skip
      "",
      f"| comparison | measure | seeds x games | {FAMILY_HEADER}",
      "|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    lines += [
      f"| {r['comparison']} | {r['measure']} | {r['seeds']} x {r['games']} | {_family_cells(r)} |"
      for r in pairs
    ]
    lines += [""] + _family_note(len(pairs), resamples, moved, [r["seeds"] for r in pairs])
    lines += reading_lines(pairs)
  if tables_view.plot_curves(view, os.path.join(spec.dest, "curves.png")):
    lines += [
      "",
      "![valid_seen success per iteration: mean over seeds, band min to max](curves.png)",
    ]
  if spec.skills:
    lines += _skills_sections(view, spec, resamples)
  lines += ["", *tables_view.provenance_lines(view)]
  path = os.path.join(spec.dest, "report.md")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return path


def _skills_sections(view: tables_view.View, spec: Spec, resamples: int) -> list[str]:
  """The internalisation family, the commit check, the dynamics and the retirement sections."""
  lines: list[str] = []
  inner, moved = internalisation(view, resamples)
  write_csv(os.path.join(spec.dest, "internalisation.csv"), inner, INTERNALISATION_COLUMNS)
  if inner:
    lines += [
      "",
      "Skill internalisation: each final policy with the skills in the student's prompt at test "
      "time minus without (the same skills for every arm), paired over seeds and games; a "
      f"family of its own ({len(inner)} rows).",
      "",
      f"| arm | panel | seeds x games | without | with | {FAMILY_HEADER}",
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    lines += [
      f"| `{r['arm']}` | {r['measure'].removeprefix('final ')} | {r['seeds']} x {r['games']} "
      f"| {r['without']:.3f} | {r['with']:.3f} | {_family_cells(r)} |"
      for r in inner
    ]
    lines += [""] + _family_note(len(inner), resamples, moved, [r["seeds"] for r in inner])
    lines += reading_lines(inner, lambda r: f"`{r['arm']}`, {r['measure'].removeprefix('final ')}")
  lines += tables_view.commit_check_lines(view)
  dynamics = view.dynamics(DYNAMICS_ARMS, [k for k, _ in DYNAMICS])
  write_csv(
    os.path.join(spec.dest, "dynamics.csv"),
    dynamics,
    ("metric", "arm", "iteration", "mean", "min", "max"),
  )
  if tables_view.plot_dynamics(
    dynamics, DYNAMICS, os.path.join(spec.dest, "dynamics.png"), view.arms
  ):
    lines += [
      "",
      "Training dynamics per iteration (mean over seeds, band min to max; dynamics.csv): the mean "
      "teacher-student gap on the sampled tokens, the share of those tokens with a positive gap "
      "and the share whose gate exceeds 0.5.",
      "",
      "![training dynamics](dynamics.png)",
    ]
  retired = view.last_values("retire_opd", RETIREMENT)
  if retired:
    write_csv(os.path.join(spec.dest, "retirement.csv"), retired, ("seed", *RETIREMENT))
    lines += [
      "",
      "RetireOPD per seed, the last value each metric logged:",
      "",
      "| seed | retired at | teacher success | competence | progress |",
      "|---:|---|---:|---:|---:|",
    ]
    for r in retired:
      at = r[RETIREMENT[0]]
      lines.append(
        f"| {r['seed']} | {'not retired' if at is None else f'iteration {int(at)}'} | "
        + " | ".join(_f(r[k]) for k in RETIREMENT[1:])
        + " |"
      )
  return lines


def main(argv: Sequence[str] | None = None) -> int:
  import argparse

  parser = argparse.ArgumentParser(description="Every committed report from the tidy tables.")
  parser.add_argument("which", nargs="*", default=sorted(SPECS), help=f"of {sorted(SPECS)}")
  parser.add_argument("--records", default="docs/results", help="the tables' folder")
  parser.add_argument("--resamples", type=int, default=stats.RESAMPLES)
  args = parser.parse_args(argv)
  unknown = sorted(set(args.which) - set(SPECS))
  if unknown:
    parser.error(f"unknown report(s) {unknown}; the reports are {sorted(SPECS)}")
  for name in args.which:
    print(report(records.Tables(args.records), SPECS[name](), resamples=args.resamples))
  return 0


if __name__ == "__main__":
  import sys

  sys.exit(main())
