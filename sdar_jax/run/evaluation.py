"""Evaluations of a run's checkpoints or of a model directory: what to evaluate and where its
results go (`plan_evaluation`), and the record an evaluation leaves in its results directory
(`evaluation.json`: what was evaluated, when, and its metrics row). The evaluation itself is an
evaluation-only `sdar_jax.run.trainer.Trainer` (`run_evaluation` there); the command is
`python -m sdar_jax.evaluate`."""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from sdar_jax.infra import paths
from sdar_jax.infra.errors import UserError
from sdar_jax.run.checkpoint import CheckpointManager

EVAL_RECORD = "evaluation.json"  # written by an evaluation into its output directory
EVALUATIONS = "evaluations"  # <workdir>/evaluations/step_<N>: a checkpoint's evaluation results


class EvaluationError(UserError, ValueError):
  """The workdir / step / output combination cannot be evaluated; the message says the fix."""

  heading = "Cannot evaluate"


@dataclasses.dataclass(frozen=True)
class EvalPlan:
  """What one evaluation reads and where it writes."""

  output: str  # the results directory
  params_from: tuple[str, int] | None  # (checkpoint directory, step); None = the config's weights

  def describe(self) -> str:
    if self.params_from is None:
      what = "the config's weights (model.path, or random init)"
    else:
      what = f"checkpoint step {self.params_from[1]} of {self.params_from[0]}"
    return f"evaluating {what} into {self.output}"


def plan_evaluation(
  config,
  workdir: str,
  step: int | None = None,
  output: str | None = None,
  weights_named: bool = True,
) -> EvalPlan:
  """Resolves the checkpoint (`step`, default the latest of the workdir's checkpoints) and the
  results directory; reads the checkpoint directory's listing only. A checkpoint's results go to
  <workdir>/evaluations/step_<N>/, beside (never into) the training's own eval/step_<N>/.
  `weights_named`: the user named the weights to evaluate without a run (model.path, or the
  config's starting policy on purpose); without it a workdir holding no run is refused."""
  if config.eval.num_tasks == 0:  # -1: the whole split
    raise EvaluationError(
      "eval.num_tasks=0: no validation episode to play. Fix: pass --config.eval.num_tasks=N "
      "(N >= 1, or -1 for every task of the split)."
    )
  for what, where in (("--workdir", workdir), ("--output", output)):
    try:
      if where:
        paths.check_remote_workdir(where, what)  # gs:// without gcsfs: the package to install
    except (ValueError, ImportError) as e:
      raise EvaluationError(str(e)) from None
  workdir = paths.resolve(workdir)
  ckpt_dir = paths.resolve(config.checkpoint.get("dir") or paths.join(workdir, "checkpoints"))
  steps: list[int] = []
  if paths.isdir(ckpt_dir):
    with CheckpointManager(ckpt_dir, read_only=True) as ckpt:
      steps = ckpt.all_steps()
  if steps:
    if step is None:
      step = steps[-1]
    elif step not in steps:
      raise EvaluationError(
        f"--step={step}: {ckpt_dir} has no checkpoint of that step; its steps are {steps}. Fix: "
        "pass one of them, or leave --step out for the latest."
      )
    params_from: tuple[str, int] | None = (ckpt_dir, int(step))
    out = paths.resolve(output or paths.join(workdir, EVALUATIONS, f"step_{step}"))
    if out == workdir:
      raise EvaluationError(
        f"--output={output}: that is the training run itself; an evaluation never writes into a "
        "run's files. Fix: leave --output out (results go to <workdir>/eval/step_<N>/) or pass "
        "another directory."
      )
  else:
    if step is not None:
      raise EvaluationError(
        f"--step={step}: {ckpt_dir} holds no checkpoint. Fix: point --workdir (or "
        "--config.checkpoint.dir) at a training run with checkpoints, or leave --step out to "
        "evaluate the config's weights (model.path)."
      )
    if not weights_named and not paths.isdir(workdir):
      raise EvaluationError(
        f"--workdir={workdir}: no such run, so there is no checkpoint to evaluate; without one "
        "the config's own weights (its starting policy) would be evaluated. Fix: point --workdir "
        "at a training run, pass --config.model.path=<a model folder>, or pass "
        "--initial_policy to evaluate the config's starting policy on purpose."
      )
    params_from = None
    out = paths.resolve(output or workdir)
  if _written_by_training(out):
    raise EvaluationError(
      f"--output={output or out}: that folder holds files a training run wrote (its own "
      "evaluation's outcomes) and no evaluation record; an evaluation never writes over them. "
      f"Fix: leave --output out (results go to <workdir>/{EVALUATIONS}/step_<N>/) or pass "
      "another directory."
    )
  if paths.isfile(paths.join(out, "config.json")) and not paths.isfile(
    paths.join(out, EVAL_RECORD)
  ):
    raise EvaluationError(
      f"{out} holds a training run (its config.json) and no checkpoint to evaluate there; an "
      "evaluation never writes into a run's files. Fix: pass --output=<a directory for the "
      "results>, or evaluate the run once it has saved a checkpoint."
    )
  return EvalPlan(output=out, params_from=params_from)


def _written_by_training(folder: str) -> bool:
  """A training run's own evaluation folder (eval/step_<N>: outcomes or transcripts, and no
  evaluation record)."""
  if not paths.isdir(folder) or paths.isfile(paths.join(folder, EVAL_RECORD)):
    return False
  names = paths.listdir(folder)
  return any(n.startswith(("outcomes_", "episodes_")) for n in names)


def evaluated_source(config, params_from: tuple[str, int] | None) -> dict[str, Any]:
  """What an evaluation plays, as its evaluation.json records it."""
  if params_from is not None:
    return {"checkpoint_dir": params_from[0], "step": params_from[1]}
  return {"model_path": config.model.get("path"), "step": 0}


def start_eval_record(out_dir: str, source: dict[str, Any]) -> None:
  """Marks `out_dir` as an evaluation's (before anything else is written there) and removes the
  results of a previous evaluation in it: evaluating again replaces them. Only the primary
  process writes (`sdar_jax.infra.paths`); `out_dir` may be remote."""
  config_json = paths.join(out_dir, "config.json")
  if paths.exists(config_json) and not paths.exists(paths.join(out_dir, EVAL_RECORD)):
    raise FileExistsError(
      f"{out_dir} holds a training run (its config.json); an evaluation never writes into "
      "a run's files. Fix: evaluate into another directory (e.g. <workdir>/eval/step_<N>)."
    )
  if not paths.is_primary_process():
    return
  for name in ("metrics.jsonl", "metrics.png"):
    paths.remove(paths.join(out_dir, name))
  write_eval_record(out_dir, source, started=now())


def eval_finished(out_dir: str) -> bool:
  """Whether an evaluation into `out_dir` finished: its evaluation.json, written when it starts,
  holds the `finished` time only once it has written everything (a killed evaluation's, or one
  cut off mid-write, does not)."""
  path = paths.join(out_dir, EVAL_RECORD)
  if not paths.exists(path):
    return False
  try:
    return bool(json.loads(paths.read_text(path)).get("finished"))
  except json.JSONDecodeError:
    return False


def write_eval_record(out_dir: str, source: dict[str, Any], **fields: Any) -> None:
  if paths.is_primary_process():
    record = json.dumps({"evaluated": source, **fields}, indent=2)
    paths.write_text(paths.join(out_dir, EVAL_RECORD), record)


def now() -> str:
  return time.strftime("%Y-%m-%d %H:%M:%S %z")
