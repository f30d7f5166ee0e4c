r"""Search-QA (Search-R1 protocol): the reference setup of the paper's Search-QA column (docs/reference.md §6.3).

128 questions x 8 episodes per iteration, up to 4 turns, history 4, prompts up to 4096 tokens
(left-truncated), KL 0.001, invalid-format penalty 0.01, lr warm-up over the first 15 of 150
iterations, one greedy validation at the end (512 questions per batch, 7 data sets).

  python -m sdar_jax.train --config=configs/search_qa.py:model=qwen2.5-7b,algo=sdar \
      --config.model.path=/data/Qwen2.5-7B-Instruct --config.env.data_dir=/data/search_r1
  python -m sdar_jax.train --config=configs/search_qa.py:model=qwen2.5-7b,algo=sdar \
      --config.model.path=/data/Qwen2.5-7B-Instruct --config.env.data_dir=/data/search_r1 \
      --config.env.retriever=server --config.env.search_url=http://127.0.0.1:8000/retrieve
  python -m sdar_jax.train --config=configs/search_qa.py:local=True    # generated world, tiny model

data_dir: Search-R1's train/test.parquet with a wiki-18 style corpus.jsonl, or a tfds dataset
(python -m envs.datasets search_qa); unset, the generated world (docs/environments.md).

Arguments: model (configs/models.py names), algo (sdar_jax.algos.ALGO_PRESETS), local.
"""

from configs import common


def get_config(arg: str = "model=qwen2.5-3b,algo=sdar,local=False"):
  arg = common.parse_arg(arg, model="qwen2.5-3b", algo="sdar", local=False)
  config = common.base(model=arg.model, algo_name=arg.algo)
  config.env = common.search_qa(history=4, max_turns=4, group_size=8, tasks_per_iteration=128)
  config.algo.kl_coef = 0.001
  config.rollout.shaping.invalid_penalty = 0.01
  config.optim.warmup_iterations = 15  # warm-up ratio 0.1 of 150 iterations
  config.rollout.max_prompt_len = 4096
  config.rollout.prompt_truncation = "left"
  config.rollout.val_temperature = 0.0  # greedy validation
  config.train.mini_batch_size = 256
  config.train.micro_batch_size = 64
  config.train.eval_every = 150  # validate once, at the end
  config.train.eval_before_train = False
  config.eval.num_tasks = 512
  config.eval.split = "test"
  if arg.local:
    common.override(config, common.local_overrides("search_qa"))
    config.train.eval_every = 2
  return common.finalize(config)


def sweep():
  """β x λ x gate around the SDAR defaults (read by launch/sweep.py; keys are config paths)."""
  return common.gate_sweep()
