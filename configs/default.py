r"""The embedded offline demo: SDAR on ALFWorld with a tiny random Qwen3-architecture model.

Runs on a laptop CPU in minutes with nothing downloaded: the real Qwen tokenizer (bundled), ALFWorld
games generated offline and played on the real engine, 2 tasks x 4 episodes per step, 4 steps.
The numbers it produces show the machinery works end to end; a random tiny model learns nothing.

  python -m sdar_jax.train --workdir=/tmp/sdar_demo
  python -m sdar_jax.train --config=configs/default.py:algo=grpo --config.algo.beta=2.0 --dry_run

Arguments: algo (sdar_jax.algos.ALGO_PRESETS).
"""

from configs import alfworld, common


def get_config(arg: str = "algo=sdar"):
  arg = common.parse_arg(arg, algo="sdar")
  return alfworld.get_config(f"model=tiny,algo={arg.algo},local=True")
