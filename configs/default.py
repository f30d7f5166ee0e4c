r"""The embedded offline demo: SDAR on ALFWorld with a tiny Qwen3-architecture model.

`make demo` runs it on a 2-core CPU in minutes with nothing downloaded. It is
`configs/alfworld.py` with `local=True` (configs/common.local_overrides): the tiny model (2 layers,
hidden 64, the full Qwen vocabulary, random weights asked for with `model.random_init=True`) driven
by the real, bundled Qwen tokenizer; ALFWorld games generated offline (4 train and 2 + 2 validation
games per task type: valid_seen and valid_unseen; 48 in all, planner-checked) and played on the
real TextWorld engine. A random model never wins, so the run first warm-starts on the planner's
walkthroughs (80 supervised steps), then runs SDAR for 3 iterations of 2 tasks x 4 episodes, up to
6 turns each, with validation (4 valid_seen episodes) before and after. What it shows is the
machinery end to end (format-valid actions, the teacher-student gap, the gates, every loss term,
checkpoints, the Hugging Face export); 3 iterations are too few to measure learning.

  python -m sdar_jax.train --workdir=/tmp/sdar_demo
  python -m sdar_jax.train --config=configs/default.py:algo=grpo --config.algo.beta=2.0 --dry_run

Arguments: algo (sdar_jax.algos.ALGO_PRESETS).
"""

from configs import alfworld, common


def get_config(arg: str = "algo=sdar"):
  arg = common.parse_arg(arg, algo="sdar")
  return alfworld.get_config(f"model=tiny,algo={arg.algo},local=True")
