r"""WebShop: the reference setup of the paper's WebShop column (docs/reference.md §6.2).

16 goals x 8 episodes per iteration, up to 15 turns, history 2, prompts up to 4096 tokens, KL
0.01, invalid-format penalty 0.1, 150 iterations, validation on 128 goals (index < 500) every 5
iterations at T 0.4.
Reward 10 only for a purchase with WebShop score 1.0; the score itself is the table's "Score".

  python -m sdar_jax.train --config=configs/webshop.py:model=qwen2.5-7b,algo=sdar \
      --config.model.path=/data/Qwen2.5-7B-Instruct --config.env.data_dir=/data/webshop
  python -m sdar_jax.train --config=configs/webshop.py:local=True    # generated catalogue, tiny model

data_dir: the original's items_shuffle_1000.json / items_ins_v2_1000.json folder, or a tfds dataset
(python -m envs.datasets webshop); unset, the generated catalogue (docs/environments.md).

Arguments: model (configs/models.py names), algo (sdar_jax.algos.ALGO_PRESETS), local.
"""

from configs import common


def get_config(arg: str = "model=qwen2.5-3b,algo=sdar,local=False"):
  arg = common.parse_arg(arg, model="qwen2.5-3b", algo="sdar", local=False)
  config = common.base(model=arg.model, algo_name=arg.algo)
  config.env = common.webshop(history=2, max_turns=15, group_size=8, tasks_per_iteration=16)
  config.algo.kl_coef = 0.01
  config.rollout.shaping.invalid_penalty = 0.1
  config.rollout.max_prompt_len = 4096
  config.rollout.prompt_truncation = "error"
  config.rollout.val_temperature = 0.4
  config.train.mini_batch_size = 64
  config.train.micro_batch_size = 16
  config.eval.num_tasks = 128
  config.eval.split = "test"
  if arg.local:
    common.override(config, common.local_overrides("webshop"))
  return common.finalize(config)


def sweep():
  """β x λ x gate around the SDAR defaults (read by launch/sweep.py; keys are config paths)."""
  return common.gate_sweep()
