r"""ALFWorld (text): the reference setup of the paper's ALFWorld column (docs/reference.md §6.1).

16 tasks x 8 episodes per iteration, up to 50 turns, history 2, KL 0.01, invalid-format penalty
0.1, 150 iterations, validation on valid_seen every 5 iterations at temperature 0.4.

  python -m sdar_jax.train --config=configs/alfworld.py:model=qwen2.5-3b,algo=sdar \
      --config.model.path=/data/Qwen2.5-3B-Instruct --config.env.data_dir=/data/alfworld \
      --config.algo.beta=2.5
  python -m sdar_jax.train --config=configs/alfworld.py:local=True    # tiny model, 2-core CPU

Arguments: model (configs/models.py names), algo (sdar_jax.algos.ALGO_PRESETS), local.
"""

from configs import common


def get_config(arg: str = "model=qwen2.5-3b,algo=sdar,local=False"):
  arg = common.parse_arg(arg, model="qwen2.5-3b", algo="sdar", local=False)
  config = common.base(model=arg.model, algo_name=arg.algo)
  config.env = common.alfworld(history=2, max_turns=50, group_size=8, tasks_per_iteration=16)
  config.algo.kl_coef = 0.01
  config.rollout.shaping.invalid_penalty = 0.1
  config.rollout.max_prompt_len = 2048
  config.rollout.prompt_truncation = "error"
  config.rollout.val_temperature = 0.4
  config.train.mini_batch_size = 256
  config.train.micro_batch_size = 32
  config.eval.num_tasks = 128
  config.eval.split = "valid_seen"
  if arg.local:
    common.override(config, common.local_overrides("alfworld"))
  return common.finalize(config)


def sweep():
  """β x λ x gate around the SDAR defaults (read by launch/sweep.py; keys are config paths)."""
  return common.gate_sweep()
