r"""The embedded offline demo: SDAR on ALFWorld with a small Qwen3-architecture model, on a CPU.

`make demo` runs it with nothing downloaded. The model is the Qwen3 architecture at toy size
(4 layers, hidden 128, ~1M parameters, random weights) on the compact ALFWorld tokenizer shipped
in sdar_jax/assets/tokenizers/alfworld_compact (1,642 ids instead of Qwen's 151,669, so the
compute goes into the layers rather than into a vocabulary the games never use). The games are
generated offline and played on the real TextWorld engine: two task types, pick-and-place and
look-at-in-light, whose hidden objects lie where the skill text says objects of their kind are kept.

1. Warm start. A model trained from scratch can neither act nor read skill text. The search
   expert (envs/alfworld/expert.py), which sees only observations, plays every train game twice:
   searching in a knowledge-free order (its turns get the plain student prompt) and visiting first
   the receptacles the skills name for the object's kind (its turns get the teacher's prompt with
   the skill block). Supervised steps on both teach the format, the moves and what the skill block
   means; the teacher-student gap on held-out skill-following turns is logged before RL.
2. Validation before RL: 48 valid_seen games at temperature 0.4, no skills.
3. SDAR: GRPO on the episode reward plus the gated teacher distillation; validation again.

What it shows today is the machinery on a model that is too small and too briefly trained to win:
150 supervised steps (and 600, measured) leave it producing well-formed actions that are often not
in the admissible list, so validation success is 0 before and after (README, "Quick start").
A longer warm start can be built once and reused (`python -m sdar_jax.tools.build_demo_policy`,
then `--config.model.path=<its folder> --config.warm_start.steps=0`).

  python -m sdar_jax.train --config=configs/default.py --workdir=/tmp/sdar_demo
  python -m sdar_jax.train --config=configs/default.py:algo=grpo --workdir=/tmp/grpo_demo
  python -m sdar_jax.train --config=configs/default.py --config.train.seed=1 --workdir=...

Arguments: algo (sdar_jax.algos.ALGO_PRESETS).
"""

from configs import alfworld, common
from envs.skills.library import skills_dir
from sdar_jax.tokenizer import packaged_tokenizer_dir

DEMO_TASK_TYPES = "pick_and_place_simple,look_at_obj_in_light"


def get_config(arg: str = "algo=sdar"):
  arg = common.parse_arg(arg, algo="sdar")
  config = alfworld.get_config(f"model=tiny,algo={arg.algo},local=True")
  common.override(config, demo_overrides())
  return config


def demo_overrides() -> dict:
  """What the demo changes in configs/alfworld.py:local=True (dotted keys)."""
  return {
    # The model: Qwen3 architecture, 1.0M parameters, on the compact tokenizer.
    "model.tokenizer_dir": str(packaged_tokenizer_dir("alfworld_compact")),
    "model.tiny.vocab_size": 1664,  # the tokenizer's 1,642 ids, padded to a multiple of 64
    "model.tiny.hidden_size": 128,
    "model.tiny.intermediate_size": 384,
    "model.tiny.num_layers": 4,
    "model.tiny.num_heads": 4,
    "model.tiny.num_kv_heads": 2,
    "model.tiny.head_dim": 32,
    # The games.
    "env.task_types": DEMO_TASK_TYPES,
    "env.offline.num_train": 24,
    "env.offline.num_eval": 24,  # per task type: 48 valid_seen games
    "env.max_turns": 10,
    "env.history": 2,
    "env.tasks_per_step": 4,
    "env.group_size": 4,
    # The teacher's skills: the three search habits of the general ALFWorld skills, with the
    # "Places by type:" list cut to the task's objects (~240 tokens instead of ~1,900).
    "env.skills.dir": skills_dir("alfworld_brief"),
    "env.skills.places": "task",
    # Warm start on the search expert, with and without skills.
    "warm_start.source": "expert",
    "warm_start.steps": 150,
    "warm_start.lr": 3e-3,
    "warm_start.batch_size": 16,
    "warm_start.expert_games": 0,
    "warm_start.expert_holdout": 0.1,
    # RL: 4 tasks x 4 episodes per iteration, two updates of 80 turn-samples each.
    "rollout.max_new_tokens": 24,
    "rollout.max_prompt_len": 1024,
    "rollout.prompt_truncation": "left",
    "optim.lr": 1e-3,
    "train.total_steps": 4,
    "train.mini_batch_size": 80,
    "train.micro_batch_size": 16,
    "train.eval_every": 4,
    "eval.num_tasks": 48,
    "checkpoint.every": 2,
  }
