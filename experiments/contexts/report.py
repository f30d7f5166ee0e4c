"""The contexts stage's report from the tidy tables alone: the pilot and the rate it decides, the
valid_seen curves per arm (mean and min-max band over seeds), the held-out figures, the primary
comparison alone at alpha = 0.05, the Holm family of every other row (experiments.contexts.plan
names them; sdar_jax.observe.stats) and the verdicts' four questions, each with its rows read in
words. Works on partial tables: what is missing is said, not drawn.

Output in `dest`: report.md, curves.png, pilot.csv, heldout.csv, primary.csv, paired.csv."""

from __future__ import annotations

import os
import types
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import records, tables_view
from experiments.contexts import plan as plan_mod
from experiments.contexts.plan import ARMS, EXPERIMENT, FULL, PRIMARY, PRIMARY_MEASURE, STAGE
from experiments.long_budget.report import heldout_rows
from experiments.powered.plan import rate_name
from experiments.report import FAMILY_COLUMNS, family_rows, reading, reading_lines, write_csv
from sdar_jax.observe import stats

DEST = "docs/results/contexts"
HELDOUT_MEASURES = plan_mod.HELDOUT_MEASURES


def _final(view: tables_view.View, run: str) -> float | None:
  curve = view.evaluations(run, "train", "valid_seen")
  return float(np.mean(list(curve[max(curve)].values()))) if curve else None


def pilot_rows(view: tables_view.View, pilot_seeds: Sequence[int]) -> list[dict[str, Any]]:
  """Per pilot arm, rate and seed: the run's final valid_seen success (None: not finished)."""
  trained = {
    (r["arm"], r["lr"], r["seed"]): r["run"]
    for r in view.manifest
    if r["kind"] == "train" and r["finished"]
  }
  rows = []
  for arm in plan_mod.PILOT_ARMS:
    for rate in (plan_mod.RATE, plan_mod.PILOT_RATE):
      for seed in pilot_seeds:
        run = trained.get((arm, rate, seed))
        rows.append(
          {"arm": arm, "lr": rate, "seed": seed, "final": _final(view, run) if run else None}
        )
  return rows


def chosen_rate(rows: Sequence[dict[str, Any]]) -> float | None:
  """The rate rule on the pilot rows, None while a pilot run is missing."""
  if any(r["final"] is None for r in rows):
    return None
  finals: dict[str, dict[float, list[float]]] = {}
  for r in rows:
    finals.setdefault(r["arm"], {}).setdefault(r["lr"], []).append(r["final"])
  return plan_mod.rate_rule(finals)


def vocab_context(view: tables_view.View) -> str | None:
  """The vocab arm's context, read from its training runs' recorded config."""
  for r in view.manifest:
    if r["arm"] == plan_mod.VOCAB_ARM and r["kind"] == "train":
      for token in (r["config"] or "").split():
        if token.startswith("algo.context="):
          return token.split("=", 1)[1]
  return None


def at_rate(view: tables_view.View, rate: float, seeds: Sequence[int]) -> None:
  """Every arm's runs at `rate` alone (the pilot's other rate is not compared)."""
  view.runs, view.rates = {}, {}
  for arm in ARMS:
    own = {
      r["seed"]: r["run"]
      for r in view.manifest
      if r["kind"] == "train" and r["finished"] and r["arm"] == arm
      and r["lr"] == rate and r["seed"] in seeds
    }  # fmt: skip
    if own:
      view.runs[arm], view.rates[arm] = dict(sorted(own.items())), rate


def _diff(view, a: str, b: str, measure: str):
  grids = view.paired(a, b, measure)
  return None if grids is None else grids[0] - grids[1]


def _f(x: Any, digits: int = 3) -> str:
  if x is None:
    return "-"
  return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _family_table(rows: Sequence[dict[str, Any]]) -> list[str]:
  lines = [
    "| comparison | measure | seeds | games | difference | 95% interval | simultaneous | p | Holm |",
    "|---|---|---:|---:|---:|---:|---:|---:|---|",
  ]
  for r in rows:
    bold = "**" if r["mark"] == "rejected" else ""
    lines.append(
      f"| `{r['comparison']}` | {r['measure']} | {r['seeds']} | {r['games']} | "
      f"{bold}{r['difference']:+.3f}{bold} | [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | "
      f"[{r['sim_low']:+.3f}, {r['sim_high']:+.3f}] | {r['p']:.2g} | {r['mark']} |"
    )
  return lines


def question_lines(
  vocab: str, primary: Sequence[dict[str, Any]], pairs: Sequence[dict[str, Any]]
) -> list[str]:
  """The verdicts' questions, each with the readings of the rows that answer it: the primary
  comparison with its own interval (it is tested alone), every other row with its simultaneous
  one (the Holm family's)."""
  found = {(r["comparison"], r["measure"]): (r, "simultaneous") for r in pairs}
  for r in primary:
    found[(r["comparison"], r["measure"])] = (r, "own")
  lines = ["", "## The questions, each with the readings of its rows", ""]
  for question, comparisons in plan_mod.questions(vocab):
    lines.append(f"**{question}**")
    lines.append("")
    for a, b in comparisons:
      for measure in HELDOUT_MEASURES:
        got = found.get((f"{a} - {b}", measure))
        text = reading(*got) if got else "not computable yet"
        lines.append(f"* `{a} - {b}`, {measure}: {text}.")
    lines.append("")
  return lines[:-1]


def report(
  tables: records.Tables,
  dest: str = DEST,
  resamples: int = stats.RESAMPLES,
  seeds: Sequence[int] = FULL.seeds,
  pilot_seeds: Sequence[int] = FULL.pilot_seeds,
) -> str:
  """Writes the report and its files into `dest`; returns report.md's text."""
  view = tables_view.View(tables, EXPERIMENT, STAGE, tuple(ARMS), seeds)
  pilot = pilot_rows(view, pilot_seeds)
  rate = chosen_rate(pilot)
  at_rate(view, plan_mod.RATE if rate is None else rate, seeds)
  ruled, gaps = plan_mod.vocab_context()  # the rule, from the policy's recorded gaps
  recorded = vocab_context(view)  # what the vocab runs read, if any ran
  vocab = recorded or ruled
  vocab_note = (
    f"{vocab} (the vocab rule on the context policy's {plan_mod.WARM_START_METRICS}: "
    + ", ".join(f"{c} gap {g:.3f}" for c, g in gaps.items())
    + ("" if recorded else "; no vocab run yet")
    + ("" if vocab == ruled else f"; the runs read {vocab}, the rule says {ruled}")
    + ")"
  )
  os.makedirs(dest, exist_ok=True)
  write_csv(os.path.join(dest, "pilot.csv"), pilot, ("arm", "lr", "seed", "final"))
  held = heldout_rows(types.SimpleNamespace(view=view))
  held_cols = ["arm", "seeds"] + [
    f"{m}{s}" for m in HELDOUT_MEASURES for s in ("", " games", " per seed")
  ]
  write_csv(os.path.join(dest, "heldout.csv"), held, held_cols)
  key = {"comparison": f"{PRIMARY[0]} - {PRIMARY[1]}", "measure": PRIMARY_MEASURE}
  d = _diff(view, *PRIMARY, PRIMARY_MEASURE)
  primary, _ = family_rows([(key, d)] if d is not None else [], resamples)
  keyed = []
  for a, b, m in plan_mod.family(vocab):
    d = _diff(view, a, b, m)
    if d is not None:
      keyed.append(({"comparison": f"{a} - {b}", "measure": m}, d))
  pairs, moved = family_rows(keyed, resamples)
  cols = ("comparison", "measure", *FAMILY_COLUMNS)
  write_csv(os.path.join(dest, "primary.csv"), primary, cols)
  write_csv(os.path.join(dest, "paired.csv"), pairs, cols)
  figure = tables_view.plot_curves(view, os.path.join(dest, "curves.png"))
  runs = {arm: sorted(s) for arm, s in view.runs.items()}
  decided = (
    f"{rate:g} (the rule on the pilot's runs in the tables)"
    if rate is not None
    else f"not decided yet (a pilot run is missing); the arms are shown at {plan_mod.RATE:g}"
  )
  lines = [
    "# The third stage: contexts (report)",
    "",
    f"Generated by `python -m experiments.contexts report` from the tables (experiment "
    f"`{EXPERIMENT}`). The rate: {decided}. The vocab arm's context: "
    f"{vocab_note}. Finished training runs per arm at that rate: "
    + (", ".join(f"`{a}` seeds {s}" for a, s in runs.items()) or "none yet")
    + "; arms with none: "
    + (", ".join(f"`{a}`" for a in ARMS if a not in runs) or "none")
    + ".",
    "",
    "## The pilot (final valid_seen success, 64 games)",
    "",
    "| arm | rate | " + " | ".join(f"seed {s}" for s in pilot_seeds) + " | mean |",
    "|---|---|" + "---:|" * (len(pilot_seeds) + 1),
  ]
  for arm in plan_mod.PILOT_ARMS:
    for lr in (plan_mod.RATE, plan_mod.PILOT_RATE):
      got = [r["final"] for r in pilot if r["arm"] == arm and r["lr"] == lr]
      mean = float(np.mean(got)) if all(g is not None for g in got) else None
      lines.append(
        f"| `{arm}` | {rate_name(lr)} | " + " | ".join(_f(g) for g in got) + f" | {_f(mean)} |"
      )
  if figure:
    lines += [
      "",
      f"![valid_seen success per arm, mean over seeds, band min to max]({os.path.basename(figure)})",
    ]
  lines += ["", "## Held-out panels", ""]
  if held:
    lines += [
      "| policy | seeds | held-out seen | held-out unseen | per seed (seen) |",
      "|---|---:|---:|---:|---|",
    ]
    lines += [
      f"| `{r['arm']}` | {r['seeds']} | {_f(r.get('final heldout_seen'))} | "
      f"{_f(r.get('final heldout_unseen'))} | {r.get('final heldout_seen per seed', '')} |"
      for r in held
    ]
  else:
    lines.append("No held-out evaluation has finished yet.")
  lines += ["", f"## The primary comparison: `{key['comparison']}`, {PRIMARY_MEASURE}", ""]
  if primary:
    r = primary[0]
    lines += [
      (
        f"Tested alone at alpha = 0.05 (two-way bootstrap, {resamples:,} resamples): "
        f"{r['difference']:+.3f}, 95% interval [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}], "
        f"p = {r['p']:.2g} (Monte Carlo se {r['p_se']:.2g}): {r['mark']} "
        f"({r['seeds']} seeds x {r['games']} games; seed sign-flip p {r['sign_flip_p']:.2g})."
      ),
      "",
      f"Reading: {reading(r, 'own')}.",
    ]
  else:
    lines.append("Not computable yet: no seed has both arms evaluated on held-out seen.")
  lines += [
    "",
    f"## Every other row: one Holm family of {len(pairs)} rows (of {len(plan_mod.family(vocab))} planned)",
    "",
  ]
  if pairs:
    lines += _family_table(pairs)
    lines.append(
      "\nBold: Holm rejects at family-wise 0.05; undecided: within 3 Monte Carlo standard errors "
      "of its threshold. Marks under the bootstrap's other RNG seeds: "
      + ("identical." if not moved else f"they differ on {', '.join(moved)}.")
    )
    lines += reading_lines(pairs)
  else:
    lines.append("No row is computable yet.")
  lines += question_lines(vocab, primary, pairs)
  text = "\n".join(lines) + "\n"
  with open(os.path.join(dest, "report.md"), "w") as f:
    f.write(text)
  return text
