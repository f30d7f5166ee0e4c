"""Two arms of finished runs paired game by game (`paired_arms`), and the whole `compare` report
(`compare_runs`: each run beside its paper row, then the two arms).

A run's arm is its run.arm (default: algo.name); arms are paired on their common seeds and on the
games both played, matched by game file (`game_key`), not task id; final success and the area
under the success curve are compared with `sdar_jax.observe.stats.paired_comparison`, from each
evaluation's outcomes file (or, for older runs, its transcript). More than two arms, two runs of
one arm and seed, runs without outcome files and runs that share no game are refused
(`CompareError`, naming the runs and the fix). Reads run folders; writes nothing.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sdar_jax.infra import paths
from sdar_jax.observe import stats
from sdar_jax.observe.paper_table import CompareError, read_run, run_vs_paper
from sdar_jax.observe.transcripts import (
  OUTCOMES_PREFIX,
  TRANSCRIPT_PREFIX,
  read_outcomes,
  read_transcripts,
)

__all__ = ["CompareError", "compare_runs", "eval_outcomes", "game_key", "paired_arms"]


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
