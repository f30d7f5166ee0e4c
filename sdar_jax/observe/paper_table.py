"""A finished run beside the paper's table (`run_vs_paper`), from the run's own files only:
config.json (its `paper` section, set by configs/paper.py: the row, model, environment, which
validation the row reads and the figures the paper reports, in %), metrics.jsonl (the last
validation row). Each environment's columns follow its averaging rule (AVERAGING: ALFWorld's
"avg" is the overall success rate, Search-QA's the macro mean over sources, WebShop's score and
accuracy), and `setup_differences` names what in the run's setup differs from the paper's. Writes
nothing; `CompareError` names a folder that cannot be compared and the fix.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from sdar_jax.infra import paths
from sdar_jax.infra.errors import UserError
from sdar_jax.observe.metrics import read_history

ALFWORLD_COLUMNS = {
  "pick": "pick_and_place_simple",
  "look": "look_at_obj_in_light",
  "clean": "pick_clean_then_place_in_recep",
  "heat": "pick_heat_then_place_in_recep",
  "cool": "pick_cool_then_place_in_recep",
  "pick2": "pick_two_obj_and_place",
}
AVERAGING = {
  "alfworld": "avg = success rate over all episodes (not a mean of the task types)",
  "search_qa": "avg = macro mean over the data sources (each source's rate weighs the same)",
  "webshop": "score = mean purchase score x 100; acc = share of purchases scoring 1",
}


class CompareError(UserError, ValueError):
  """A run folder that cannot be compared; the message names the fix."""

  heading = "Cannot compare"


def _read_json(path: str) -> dict[str, Any]:
  return json.loads(paths.read_text(path))


def read_run(run_dir: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
  """(config, metrics rows) of a run folder."""
  config_path = paths.join(run_dir, "config.json")
  metrics_path = paths.join(run_dir, "metrics.jsonl")
  if not paths.exists(config_path) or not paths.exists(metrics_path):
    raise CompareError(
      f"{run_dir}: no config.json and metrics.jsonl. Fix: pass a run folder (the --workdir of "
      "python -m sdar_jax.train) or an evaluation's results folder."
    )
  return _read_json(config_path), read_history(metrics_path)  # a torn last line is skipped


def val_prefix(config: Mapping[str, Any]) -> str:
  """The validation a run's paper row reads: "val", or "val_with_skill" for a row that reads the
  validation with skills of a run validated both ways (Skill-GRPO*)."""
  reads = (config.get("paper") or {}).get("reads", "without")
  both = config.get("eval", {}).get("skills") == "both"
  return "val_with_skill" if reads == "with" and both else "val"


def final_validation(rows: Sequence[Mapping[str, Any]], prefix: str = "val") -> dict[str, Any]:
  """The last metrics row holding `<prefix>/success_rate`, or {} when there is none."""
  for row in reversed(rows):
    if f"{prefix}/success_rate" in row:
      return dict(row)
  return {}


def our_columns(env: str, row: Mapping[str, Any], prefix: str) -> dict[str, float | None]:
  """The run's figures (in %) under the paper's column names for `env`."""

  def pct(key: str) -> float | None:
    value = row.get(f"{prefix}/{key}")
    return None if value is None else 100.0 * float(value)

  if env == "alfworld":
    out = {col: pct(f"{task_type}_success_rate") for col, task_type in ALFWORLD_COLUMNS.items()}
    out["avg"] = pct("success_rate")
    return out
  if env == "webshop":
    return {"score": pct("score"), "acc": pct("acc")}
  if env == "search_qa":
    sources = sorted(
      k[len(prefix) + 1 : -len("_success_rate")]
      for k in row
      if k.startswith(f"{prefix}/")
      and k.endswith("_success_rate")
      and k not in (f"{prefix}/success_rate", f"{prefix}/macro_success_rate")
    )
    out = {source: pct(f"{source}_success_rate") for source in sources}
    out["avg"] = pct("macro_success_rate")
    return out
  return {"success_rate": pct("success_rate")}


def _column_order(config: Mapping[str, Any]) -> list[str]:
  """The paper's column order for the run's environment (Search-QA: its eval_sources order)."""
  env = config["env"]
  if env["name"] == "alfworld":
    return [*ALFWORLD_COLUMNS, "avg"]
  if env["name"] == "search_qa":
    sources = str(env.get("eval_sources") or "").split(",")
    return [*(s.strip() for s in sources if s.strip()), "avg"]
  if env["name"] == "webshop":
    return ["score", "acc"]
  return []


def setup_differences(config: Mapping[str, Any]) -> list[str]:
  """What in the run's setup differs from the paper's runs of its row, one line each."""
  paper = config.get("paper") or {}
  model, env, train, ev = config["model"], config["env"], config["train"], config["eval"]
  notes = []
  if not paper:
    notes.append(f"model: {model.get('preset')}")
  elif model.get("preset") != paper.get("model"):
    notes.append(f"model: {model.get('preset')} (the paper: {paper.get('model')})")
  if not model.get("path"):
    notes.append("weights: random or the built-in demo policy, not the paper's checkpoint")
  notes.append(f"steps: {train.get('iterations', train.get('total_steps'))} training iterations")
  if not env.get("data_dir"):
    notes.append("data: the offline generated data, not the environment's real data")
  skills = (env.get("skills") or {}).get("dir")
  notes.append(
    f"skills: {skills or 'the built-in skills'} (rules {env['skills'].get('rules_version')})"
  )
  split, n = ev.get("split"), ev.get("num_tasks")
  whole = "the whole split" if n is not None and int(n) < 0 else f"{n} sampled tasks"
  notes.append(
    f"evaluation: {split}, {whole}, temperature {config['rollout'].get('val_temperature')}"
  )
  return notes


@dataclasses.dataclass
class PaperComparison:
  run_dir: str
  row: str
  env: str
  step: int | None
  columns: dict[str, tuple[float | None, float | None]]  # column -> (ours %, paper %)
  differences: list[str]

  def markdown(self) -> str:
    has_paper = any(theirs is not None for _, theirs in self.columns.values())
    what = f"paper row {self.row!r}" if has_paper else "no paper row"
    lines = [
      f"### {self.run_dir}: {what} ({self.env}), validation at step {self.step}",
      "",
      AVERAGING.get(self.env, ""),
      "",
    ]
    if has_paper:
      lines += ["| column | ours (%) | paper (%) | ours - paper |", "|---|---:|---:|---:|"]
      for col, (ours, theirs) in self.columns.items():
        diff = "" if ours is None or theirs is None else f"{ours - theirs:+.1f}"
        lines.append(f"| {col} | {_fmt(ours)} | {_fmt(theirs)} | {diff} |")
    else:  # a run of another config: its own figures only
      lines += ["| column | ours (%) |", "|---|---:|"]
      lines += [f"| {c} | {_fmt(o)} |" for c, (o, _) in self.columns.items() if o is not None]
    lines += ["", "Setup (what differs from the paper's runs):" if has_paper else "Setup:"]
    lines += [f"- {note}" for note in self.differences]
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
  return "n/a" if value is None else f"{value:.1f}"


def run_vs_paper(run_dir: str) -> PaperComparison:
  """A finished run's final validation beside its paper row's reported figures."""
  config, rows = read_run(run_dir)
  paper = config.get("paper")
  env = config["env"]["name"]
  prefix = val_prefix(config)
  final = final_validation(rows, prefix)
  ours = our_columns(env, final, prefix)
  reported = (paper or {}).get("reported") or {}
  order = [*_column_order(config), *ours, *reported]  # the paper's order, then any other
  columns = {col: (ours.get(col), reported.get(col)) for col in dict.fromkeys(order)}
  return PaperComparison(
    run_dir=run_dir,
    row=(paper or {}).get("row", "none (not a configs/paper.py run)"),
    env=env,
    step=final.get("step"),
    columns=columns,
    differences=setup_differences(config),
  )
