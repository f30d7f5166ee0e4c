"""Finished runs beside the paper's table, and two arms against each other.

`run_vs_paper(run_dir)` reads a run's own files only: config.json (its `paper` section, set by
configs/paper.py, holds the row, model, environment, which validation the row reads and the
figures the paper reports, in %), metrics.jsonl (the last validation row) and names what differs
in the run's setup from the paper's (model, steps, data, skills, evaluation). Each environment's
columns follow its averaging rule:

* ALFWorld: one column per task type (that type's success rate) and "avg", the overall success
  rate over episodes (`success_rate`), not a mean of the types.
* Search-QA: one column per data source and "avg", the macro mean over the sources
  (`macro_success_rate`: the paper's 303.8 / 7 = 43.4 for SDAR 3B).
* WebShop: "score" (mean purchase score) and "acc" (share of purchases scoring 1).

`paired_arms(run_dirs)` pairs the runs of two arms (each run's label: run.arm, default its
algo.name) on their common seeds and the games they share (matched by game file, not task id),
and compares final success and the area under the success curve with
`sdar_jax.observe.stats.paired_comparison`, from each evaluation's outcomes file (or, for runs
written before those files existed, its transcript). Runs it cannot tell apart (one label and
seed, different settings) and more than two arms are refused with the fix.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sdar_jax.infra import paths
from sdar_jax.infra.errors import UserError
from sdar_jax.observe import stats
from sdar_jax.observe.metrics import read_history
from sdar_jax.observe.transcripts import (
  OUTCOMES_PREFIX,
  TRANSCRIPT_PREFIX,
  read_outcomes,
  read_transcripts,
)

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


# ---------------------------------------------------------------------------- two arms, paired
def game_key(gamefile: str | None, task_id: int) -> str:
  """A game's identity across machines: its file's path below the cache's `sdar_jax/` folder (the
  game set, split, problem and trial), the path itself outside it, or "task<id>" without one."""
  if not gamefile:
    return f"task{int(task_id)}"
  parts = gamefile.replace("\\", "/").split("/")
  if "sdar_jax" in parts:
    return "/".join(parts[len(parts) - parts[::-1].index("sdar_jax") :])
  return gamefile


def eval_outcomes(run_dir: str, prefix: str = "val") -> dict[int, dict[str, float]]:
  """{step: {game: success}} of every evaluation of a run (`game_key`; a game played eval.repeats
  times: its mean success): the outcomes files, or the transcripts of runs written before them."""
  eval_root = paths.join(run_dir, "eval")
  out: dict[int, dict[int, float]] = {}
  if not paths.isdir(eval_root):
    return out
  for name in paths.listdir(eval_root):
    if not name.startswith("step_"):
      continue
    step = int(name[len("step_") :])
    folder = paths.join(eval_root, name)
    csv_path = paths.join(folder, f"{OUTCOMES_PREFIX}{prefix}.csv")
    jsonl_path = paths.join(folder, f"{TRANSCRIPT_PREFIX}{prefix}.jsonl")
    if paths.exists(csv_path):  # with eval.repeats, a game's outcome is its mean over them
      sums: dict[str, list[float]] = {}
      for r in read_outcomes(csv_path):
        sums.setdefault(game_key(r["gamefile"], r["task_id"]), []).append(float(r["success"]))
      out[step] = {game: float(np.mean(values)) for game, values in sums.items()}
    elif paths.exists(jsonl_path):
      out[step] = {
        game_key(t.get("gamefile"), t["task_id"]): float(bool(t["won"]))
        for t in read_transcripts(jsonl_path)
        if t.get("env_error") is None
      }
  return dict(sorted(out.items()))


@dataclasses.dataclass
class ArmComparison:
  arm_a: str
  arm_b: str
  seeds: list[int]
  final: stats.PairedComparison
  auc: stats.PairedComparison | None

  def markdown(self, label_a: str | None = None, label_b: str | None = None) -> str:
    """The comparison as markdown; the arms shown as `label_a` / `label_b` when given."""
    lines = [
      f"### {label_a or self.arm_a} - {label_b or self.arm_b}, paired on seeds {self.seeds}",
      "",
      f"- final validation success: {self.final.describe()}",
    ]
    if self.auc is not None:
      lines.append(f"- area under the success curve: {self.auc.describe()}")
    return "\n".join(lines)


def paired_arms(
  run_dirs: Sequence[str],
  resamples: int = stats.RESAMPLES,
  rng_seed: int = stats.RNG_SEED,
  labels: Mapping[str, str] | None = None,
) -> ArmComparison | None:
  """The two arms among `run_dirs` (`arm_label`) compared on their common seeds (A minus B, A the
  arm of the first run given); None for runs of one arm or with no seed in common. Games are those
  every run evaluated at its final step (and, for the AUC, at every evaluation step the runs
  share). Raises CompareError for more than two arms and for two runs of one label and seed.
  `labels` (run folder -> arm) names the arm of runs from before run.arm was kept."""
  labels = {os.path.normpath(k): v for k, v in (labels or {}).items()}
  unknown = sorted(set(labels) - {os.path.normpath(d) for d in run_dirs})
  if unknown:
    raise CompareError(
      f"--arm names {unknown}, not among the runs given. Fix: --arm RUN_DIR=LABEL."
    )
  by_arm: dict[str, dict[int, dict[int, dict[str, float]]]] = {}
  seen: dict[tuple[str, int], tuple[str, dict[str, Any]]] = {}
  for run_dir in run_dirs:
    config, _ = read_run(run_dir)
    arm = labels.get(os.path.normpath(run_dir)) or arm_label(config)
    seed = int((config.get("train") or {}).get("seed", 0))
    if (arm, seed) in seen:
      other, other_config = seen[(arm, seed)]
      what = "different settings" if _settings(config) != _settings(other_config) else "the same"
      raise CompareError(
        f"{other} and {run_dir} are both arm {arm!r}, seed {seed} ({what}): they cannot be told "
        "apart. Fix: pass one run per arm and seed, or label the arms (--config.run.arm=<label> "
        "when training; --arm RUN_DIR=LABEL here, e.g. from an experiment's runs.csv)."
      )
    seen[(arm, seed)] = (run_dir, config)
    by_arm.setdefault(arm, {})[seed] = eval_outcomes(run_dir)
  if len(by_arm) > 2:
    raise CompareError(
      f"the runs hold {len(by_arm)} arms ({sorted(by_arm)}); a paired comparison takes two. "
      "Fix: pass the runs of two arms (each run's arm is run.arm, default algo.name)."
    )
  if len(by_arm) != 2:
    return None
  blind = [d for d in run_dirs if not eval_outcomes(d)]
  if blind:
    raise CompareError(
      f"{', '.join(blind)}: no per-game outcomes (eval/step_<N>/outcomes_val.csv or "
      "episodes_val.jsonl), so the arms cannot be paired game by game. Fix: evaluate those runs "
      "again (python -m sdar_jax.evaluate writes the outcomes), or compare runs that have them."
    )
  (arm_a, runs_a), (arm_b, runs_b) = by_arm.items()  # A: the arm of the first run given
  seeds = sorted(s for s in set(runs_a) & set(runs_b) if runs_a[s] and runs_b[s])
  if not seeds:
    return None
  steps = sorted(set.intersection(*(set(r[s]) for r in (runs_a, runs_b) for s in seeds)))
  if not steps:
    raise CompareError(
      f"arms {arm_a!r} and {arm_b!r} share no evaluation step on seeds {seeds}. Fix: compare "
      "runs with the same train.eval_every and train.iterations."
    )
  games = sorted(
    set.intersection(*(set(r[s][step]) for r in (runs_a, runs_b) for s in seeds for step in steps))
  )
  if not games:
    raise CompareError(
      "the runs share no validation game. Fix: compare runs with the same eval.seed and "
      "eval.num_tasks (the same validation draw)."
    )

  def grid(runs, step):
    return np.array([[runs[s][step][g] for g in games] for s in seeds])

  final = stats.paired_comparison(
    grid(runs_a, steps[-1]), grid(runs_b, steps[-1]), resamples, rng_seed
  )
  auc = None
  if len(steps) >= 2:
    curves_a = np.stack([grid(runs_a, step) for step in steps], axis=1)  # [seeds, steps, games]
    curves_b = np.stack([grid(runs_b, step) for step in steps], axis=1)
    auc = stats.paired_comparison(
      stats.per_game_auc(steps, curves_a),
      stats.per_game_auc(steps, curves_b),
      resamples,
      rng_seed,
    )
  return ArmComparison(arm_a, arm_b, seeds, final, auc)


def arm_label(config: Mapping[str, Any]) -> str:
  """A run's arm: run.arm where set (saved configs from before it existed have none), else the
  algorithm's name."""
  label = (config.get("run") or {}).get("arm") or (config.get("algo") or {}).get("name")
  return str(label or "?")


def _settings(config: Mapping[str, Any]) -> dict[str, Any]:
  """What makes two runs of one arm different runs: everything but where they write."""
  return {k: v for k, v in config.items() if k not in ("logging", "checkpoint")}


def compare_runs(run_dirs: Sequence[str], **kwargs: Any) -> str:
  """The whole report as markdown: each run beside its paper row, then the paired arms."""
  missing = [d for d in run_dirs if not os.path.isdir(d) and not paths.is_remote(d)]
  if missing:
    raise CompareError(f"no such run folder(s): {missing}. Fix: pass existing run folders.")
  parts = [run_vs_paper(d).markdown() for d in run_dirs]
  arms = paired_arms(run_dirs, **kwargs)
  if arms is not None:
    parts.append(arms.markdown())
  return "\n\n".join(parts) + "\n"
