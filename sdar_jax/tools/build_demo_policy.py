"""Builds the demo's warm-started policy: expert SFT from random weights, once, in stages.

    python -m sdar_jax.tools.build_demo_policy --out runs/demo_policy --stages 4 --steps 300
    python -m sdar_jax.tools.build_demo_policy --out runs/more --init runs/demo_policy --stages 2
    python -m sdar_jax.tools.build_demo_policy --measure runs/demo_policy \
        --set warm_start.contexts=sibling,hindsight
    python -m sdar_jax.train --config=configs/default.py --config.model.path=runs/demo_policy \
        --workdir=runs/demo_from_policy

Each stage is the demo config's own warm start (`warm_start.steps` = --steps, `train.iterations`
= 0) run by the trainer, continuing from the previous stage's weights; after every stage the
folder is rewritten whole (the policy as safetensors, the tokenizer, `warm_start_metrics.json`,
`build_log.json`, a README), so `--init <the folder>` continues an interrupted build. The committed
policies are sdar_jax/assets/policies/alfworld_demo and alfworld_demo_context (which also reads
the "sibling" and "hindsight" teacher blocks, `--set warm_start.contexts=sibling,hindsight`); each
README lists its commands. `--measure POLICY` plays the build's expert games and prints the
policy's teacher-student gaps on the held-out ones (per block named in warm_start.contexts, the
skill block's always), training and writing nothing. Why a prebuilt policy: docs/environments.md,
"The expert warm start".
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from envs.errors import EnvInputError
from sdar_jax.infra.errors import UserError, add_verbosity_argument, exit_on_user_error

DEFAULT_OUT_DIR = "runs/demo_policy"
BUILD_LOG = "build_log.json"
# The build's differences from configs/default.py (the demo itself plays look-at-in-light only, up to
# 15 turns, and starts from the committed policy).
BUILD_OVERRIDES = {
  # The expert plays both task types of the small rooms, 10 turns at most.
  "env.task_types": "pick_and_place_simple,look_at_obj_in_light",
  "env.max_turns": 10,
  "train.iterations": 0,
  "warm_start.steps": 300,
  "env.offline.num_train": 128,
  "eval.num_tasks": 24,
  "model.path": None,
  "model.random_init": True,
  "checkpoint.export_hf": False,
  "logging.plots": False,
}


@contextlib.contextmanager
def _reuse_expert_games() -> Iterator[None]:
  """Within the block, the warm start plays the expert once and reuses its samples afterwards."""
  from sdar_jax.run import warm_start

  original, cache = warm_start.expert_warm_start_data, []

  def once(*args: Any, **kwargs: Any):
    if not cache:
      cache.append(original(*args, **kwargs))
    return cache[0]

  warm_start.expert_warm_start_data = once
  try:
    yield
  finally:
    warm_start.expert_warm_start_data = original


def build(
  out_dir: str | os.PathLike = DEFAULT_OUT_DIR,
  steps: int | None = None,
  overrides: dict | None = None,
  *,
  init: str | os.PathLike | None = None,
  stages: int = 1,
  seed: int = 0,
) -> dict:
  """Runs `stages` warm-start stages of `steps` supervised steps each (from random weights, or
  from the policy folder `init`), rewriting `out_dir` after each; returns the last stage's
  metrics. Stage k uses train.seed = `seed` + k. `overrides`: further dotted config keys."""
  if stages < 1:
    raise ValueError(f"stages={stages}: must be >= 1 (each stage is --steps supervised steps)")
  log = _read_log(init) if init else []
  previous = str(init) if init else None
  metrics: dict = {}
  with _reuse_expert_games():
    for k in range(stages):
      metrics, stage = _stage(previous, steps, overrides or {}, seed + k)
      log.append(stage)
      metrics["warm_start/steps"] = sum(s["steps"] for s in log)
      _write(out_dir, metrics, log)
      previous = str(out_dir)
      print(f"stage {len(log)}: {json.dumps(_brief(metrics))}", flush=True)
  return metrics


def measure(policy: str | os.PathLike, overrides: dict | None = None, seed: int = 0) -> dict:
  """The teacher-student gaps of the policy folder `policy` on the held-out expert games of a
  build stage with train.seed `seed` (the skill block's, and each block of
  `warm_start.contexts` in `overrides`); nothing is trained or written."""
  from configs import common, default
  from sdar_jax.run import trainer

  config = default.get_config()
  common.override(
    config,
    {
      **BUILD_OVERRIDES,
      **(overrides or {}),
      "train.seed": seed,
      "warm_start.steps": 0,
      "warm_start.measure": True,
      "model.path": str(policy),
      "model.random_init": False,
    },
  )
  trainer.validate(config)
  with tempfile.TemporaryDirectory(prefix="sdar-demo-measure-") as workdir:
    run = trainer.Trainer(config, workdir)  # its warm start measures the gaps when it is built
    run.close()
  return dict(run.warm_start_metrics)


def _stage(init: str | None, steps: int | None, extra: dict, seed: int) -> tuple[dict, dict]:
  from configs import common, default
  from sdar_jax.observe.metrics import read_history
  from sdar_jax.run import trainer

  config = default.get_config()
  overrides = {**BUILD_OVERRIDES, **extra, "train.seed": seed}
  if steps is not None:
    overrides["warm_start.steps"] = steps
  if init:
    overrides.update({"model.path": str(init), "model.random_init": False})
  common.override(config, overrides)
  with tempfile.TemporaryDirectory(prefix="sdar-demo-policy-") as workdir:
    trainer.run(config, workdir)
    rows = read_history(os.path.join(workdir, "metrics.jsonl"))
    metrics = {
      k: v
      for row in rows
      for k, v in row.items()
      if k.startswith(("warm_start/", "val/valid_action_ratio"))
      or (k.startswith("val/") and k.endswith("success_rate"))
    }
    metrics["env/offline_num_train"] = config.env.offline.num_train
    # The weights go into a staging folder beside the output while the workdir still exists.
    policy = pathlib.Path(tempfile.mkdtemp(prefix="sdar-stage-"))
    for item in pathlib.Path(workdir, "warm_start_policy").iterdir():
      shutil.copy(item, policy / item.name)
  for name in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(pathlib.Path(config.model.tokenizer_dir) / name, policy / name)
  metrics["_staged"] = str(policy)
  stage = {
    "steps": int(overrides["warm_start.steps"]),
    "seed": seed,
    "init": "random weights" if not init else "the previous stage",
    "overrides": dict(extra),
    "metrics": _brief(metrics),
  }
  return metrics, stage


def _write(out_dir: str | os.PathLike, metrics: dict, log: list) -> None:
  from sdar_jax.run.warm_start import BUILT_POLICY_METRICS

  staged = pathlib.Path(metrics.pop("_staged"))
  out = pathlib.Path(out_dir)
  out.parent.mkdir(parents=True, exist_ok=True)
  try:
    (staged / BUILT_POLICY_METRICS).write_text(json.dumps(metrics, indent=1) + "\n")
    (staged / BUILD_LOG).write_text(json.dumps(log, indent=1) + "\n")
    (staged / "README.md").write_text(_readme(metrics, log))
    tmp = out.with_name(f".{out.name}.new")
    if tmp.exists():
      shutil.rmtree(tmp)
    shutil.copytree(staged, tmp)
    if out.exists():
      shutil.rmtree(out)
    tmp.rename(out)  # the folder is replaced whole: a reader sees the old stage or the new one
  finally:
    shutil.rmtree(staged, ignore_errors=True)


def _read_log(folder: str | os.PathLike) -> list:
  path = pathlib.Path(folder) / BUILD_LOG
  return json.loads(path.read_text()) if path.exists() else []


def _brief(metrics: dict) -> dict:
  keys = (
    "loss_last",
    "expert_plain_success",
    "expert_skills_success",
    "expert_demo_success",
    "gap_on_expert",
  )
  return {
    k: round(v, 4) if isinstance(v, float) else v
    for k, v in metrics.items()
    if k.endswith(keys) or k.startswith("val/") or k == "warm_start/steps"
  }


def _readme(metrics: dict, log: list) -> str:
  lines = [
    "# A warm-started policy for the offline demo",
    "",
    "Qwen3 architecture, 4 layers, hidden 128, on the compact ALFWorld tokenizer (its files are",
    "copied here), trained from random weights by supervised steps on the search expert's turns",
    "(`python -m sdar_jax.tools.build_demo_policy`; start a run from it with",
    "`--config.model.path=<this folder>`). Measured after the last stage, before any RL:",
    "",
  ]
  lines += [
    f"- {k}: {v:.4g}" if isinstance(v, float) else f"- {k}: {v}" for k, v in metrics.items()
  ]
  lines += ["", "Stages (each continues from the one before, with a fresh optimizer state):", ""]
  for n, stage in enumerate(log, 1):
    extra = " ".join(f"--set {k}={v}" for k, v in stage["overrides"].items())
    lines.append(
      f"{n}. {stage['steps']} steps, seed {stage['seed']}, from {stage['init']}"
      + (f" ({extra})" if extra else "")
      + f": {json.dumps(stage['metrics'])}"
    )
  return "\n".join(lines) + "\n"


def _parse_set(values: Sequence[str]) -> dict:
  """--set KEY=VALUE items as overrides; VALUE is a Python literal (64, 3e-3, True) or a string."""
  overrides = {}
  for item in values:
    key, sep, value = item.partition("=")
    if not sep or not key:
      raise UserError(f"--set {item!r}: expected KEY=VALUE, e.g. --set env.offline.num_train=64")
    try:
      overrides[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      overrides[key] = value
  return overrides


@exit_on_user_error(extra_types=(EnvInputError,))
def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=DEFAULT_OUT_DIR, help="policy folder to (re)write")
  parser.add_argument("--steps", type=int, default=None, help="supervised steps per stage (300)")
  parser.add_argument("--stages", type=int, default=1, help="stages, each --steps steps")
  parser.add_argument("--init", default=None, help="continue from this policy folder")
  parser.add_argument("--seed", type=int, default=0, help="train.seed of the first stage")
  parser.add_argument("--set", action="append", default=[], help="KEY=VALUE config override")
  parser.add_argument(
    "--measure", default=None, metavar="POLICY", help="only measure this policy folder's gaps"
  )
  add_verbosity_argument(parser)
  args = parser.parse_args(argv)
  if args.measure:
    print(json.dumps(measure(args.measure, _parse_set(args.set), args.seed), indent=1))
    return
  metrics = build(
    args.out,
    args.steps,
    _parse_set(args.set),
    init=args.init,
    stages=args.stages,
    seed=args.seed,
  )
  print(json.dumps(metrics, indent=1))


if __name__ == "__main__":
  main()
