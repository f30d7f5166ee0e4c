"""Builds the offline demo's warm-started policy: the search expert's games, then supervised steps.

    python -m sdar_jax.tools.build_demo_policy              # rewrites the committed folder
    python -m sdar_jax.tools.build_demo_policy --out /tmp/policy --steps 50

A model trained from scratch needs several hundred supervised steps on the expert's turns before
it acts well enough for RL to have a signal (it must learn the output format, to take the target
when an observation shows it, to deliver, and what the skill block means). On a 2-core CPU that is
longer than the demo's whole budget, so the demo starts from this policy, built once and
committed in sdar_jax/assets/policies/alfworld_demo (a Hugging Face folder, ~4 MB), the way RL
runs start from a supervised checkpoint. The build is the demo's own warm start
(`configs/default.py` with `warm_start.steps` supervised steps and `train.total_steps=0`) run by
the trainer on more generated train games; it writes the policy, the tokenizer files and
`warm_start_metrics.json`: the expert's success with and without skills, the loss, and the
teacher-student gap on held-out skill-following expert turns measured before any RL. The same
command on another CPU gives a policy equal up to float rounding.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Sequence

DEFAULT_OUT_DIR = (
  pathlib.Path(__file__).resolve().parent.parent / "assets" / "policies" / "alfworld_demo"
)
# The build's differences from configs/default.py (the demo itself plays 24 games per task type).
BUILD_OVERRIDES = {
  "train.total_steps": 0,
  "train.eval_before_train": False,
  "warm_start.steps": 600,
  "env.offline.num_train": 64,
  "checkpoint.export_hf": False,
  "logging.plots": False,
}


def build(out_dir: str | os.PathLike = DEFAULT_OUT_DIR, steps: int | None = None) -> dict:
  """Runs the warm start and writes the policy folder; returns the warm-start metrics."""
  from configs import common, default
  from sdar_jax import trainer

  config = default.get_config()
  config.model.path = None  # start from random weights, not from the policy being rebuilt
  config.model.random_init = True
  overrides = dict(BUILD_OVERRIDES)
  if steps is not None:
    overrides["warm_start.steps"] = steps
  common.override(config, overrides)
  with tempfile.TemporaryDirectory(prefix="sdar-demo-policy-") as workdir:
    trainer.run(config, workdir)
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    metrics = {
      k: v for row in rows for k, v in row.items() if k.startswith("warm_start/") or k == "step"
    }
    metrics["warm_start/steps"] = overrides["warm_start.steps"]
    metrics["env/offline_num_train"] = overrides["env.offline.num_train"]
    out = pathlib.Path(out_dir)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".tmp-policy-", dir=out.parent.as_posix()))
    try:
      for item in pathlib.Path(workdir, "warm_start_policy").iterdir():
        shutil.copy(item, tmp / item.name)
      for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pathlib.Path(config.model.tokenizer_dir) / name, tmp / name)
      (tmp / "warm_start_metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
      (tmp / "README.md").write_text(_readme(metrics))
      if out.exists():
        shutil.rmtree(out)
      tmp.rename(out)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
  return metrics


def _readme(metrics: dict) -> str:
  lines = [
    "# alfworld_demo",
    "",
    "The offline demo's warm-started policy (configs/default.py reads it as `model.path`), written",
    "by `python -m sdar_jax.tools.build_demo_policy` (that module's docstring says how). Qwen3",
    "architecture, 4 layers, hidden 128, the compact ALFWorld tokenizer (its files are copied",
    "here). Measured at build time, before any RL:",
    "",
  ]
  lines += [f"- {k}: {v:.4g}" if isinstance(v, float) else f"- {k}: {v}" for k, v in metrics.items()]
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=str(DEFAULT_OUT_DIR), help="policy folder to (re)write")
  parser.add_argument("--steps", type=int, default=None, help="supervised steps (default 600)")
  args = parser.parse_args(argv)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  metrics = build(args.out, args.steps)
  print(json.dumps(metrics, indent=1))


if __name__ == "__main__":
  main()
