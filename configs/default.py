r"""The embedded offline demo: SDAR on ALFWorld with a small Qwen3-architecture model, on a CPU.

`make demo` runs it with nothing downloaded. The model is the Qwen3 architecture at toy size
(4 layers, hidden 128, ~1M parameters) on the compact ALFWorld tokenizer shipped in
sdar_jax/assets/tokenizers/alfworld_compact (1,642 ids instead of Qwen's 151,669, so the compute
goes into the layers rather than into a vocabulary the games never use). The games are generated
offline and played on the real TextWorld engine: look-at-in-light (find an object, take it, find
the lamp and turn it on; up to 15 turns) in small rooms (one receptacle of each class), whose
hidden objects lie where the skill text says objects of their kind are kept.

1. Warm start: the run starts from the committed warm-started policy
   (sdar_jax/assets/policies/alfworld_demo), built once from random weights by
   `python -m sdar_jax.tools.build_demo_policy` (its README lists the stages): supervised steps on
   pick-and-place and look-at-in-light games (10 turns) of the search expert (envs/alfworld/expert.py, which sees only observations) playing every train
   game twice, once searching the receptacles in the order the room lists them (its turns get the
   plain student prompt) and once visiting first the receptacles the skills name for the object's
   kind (its turns get the teacher's prompt with the skill block). Its warm_start/* metrics (the
   expert's success with and without skills, the teacher-student gap on held-out skill-following
   turns) are logged at iteration 0. `--config.model.path=<folder>` starts from another build, and
   `--config.model.path=None --config.model.random_init=True --config.warm_start.steps=N` runs the
   warm start inside the run instead.
2. Validation before RL: 64 valid_seen games at temperature 0.4, no skills (the sampler pads a
   batch to a power of two of rows, so 64 games cost what 48 did; the sampling keys are the
   same at every evaluation, so before and after differ by the policy, not by the draws).
3. SDAR: 16 iterations of 2 tasks x 8 episodes (8 per group: from a near-deterministic warm
   start, groups of 4 mostly won or lost together and carried no GRPO signal), GRPO on the episode
   reward plus the gated teacher distillation, updates of 32 turn-samples (about 7 per iteration);
   validation every 8 iterations. The distillation is preset `sdar_vocab` (ours): SDAR's gap gate
   applied to every vocabulary entry at each response position, a gated forward KL from the
   teacher's whole distribution with λ = 0.5, the teacher being the frozen warm-started policy
   given the skills. The reference's sampled-token form (`algo=sdar`, λ = 0.01) gained +0.016 to
   +0.078 here, GRPO alone +0.063 to +0.125: a sampled-token form can only reinforce what a
   near-deterministic student samples. Mini-batches are filled in length order (the same
   samples, less padding in the update). A turn whose command the room did not offer gets no share of a
   won episode's credit (`rollout.shaping.inadmissible_no_credit`, not in the reference).

  python -m sdar_jax.train --config=configs/default.py --workdir=/tmp/sdar_demo
  python -m sdar_jax.train --config=configs/default.py:algo=sdar --workdir=/tmp/sdar_ref_demo
  python -m sdar_jax.train --config=configs/default.py:algo=grpo --workdir=/tmp/grpo_demo
  python -m sdar_jax.train --config=configs/default.py --config.train.seed=1 --workdir=...

Arguments: algo (sdar_jax.algos.ALGO_PRESETS).
"""

from configs import alfworld, common
from envs.skills.library import skills_dir
from sdar_jax.text.tokenizer import packaged_policy_dir, packaged_tokenizer_dir

DEMO_TASK_TYPES = "look_at_obj_in_light"


DEMO_ALGO = "sdar_vocab"


def get_config(arg: str = f"algo={DEMO_ALGO}"):
  arg = common.parse_arg(arg, algo=DEMO_ALGO)
  config = alfworld.get_config(f"model=tiny,algo={arg.algo},local=True")
  common.override(config, demo_overrides())
  return config


def demo_overrides() -> dict:
  """What the demo changes in configs/alfworld.py:local=True (dotted keys)."""
  return {
    # The model: Qwen3 architecture, 1.0M parameters, on the compact tokenizer, warm-started.
    "model.path": str(packaged_policy_dir("alfworld_demo")),
    "model.random_init": False,
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
    "env.offline.num_train": 48,
    "env.offline.num_eval": 64,  # 64 valid_seen games
    "env.offline.rooms": "small",
    "env.max_turns": 15,
    "env.history": 2,
    "env.tasks_per_iteration": 2,
    "env.group_size": 8,
    # The teacher's skills: the three search habits of the general ALFWorld skills, with the
    # "Places by type:" list cut to the task's objects (~240 tokens instead of ~1,900).
    "env.skills.dir": skills_dir("alfworld_brief"),
    "env.skills.places": "task",
    # The warm start the committed policy was built with (build_demo_policy runs these settings
    # with warm_start.steps > 0); the demo itself starts from that policy.
    "warm_start.source": "expert",
    "warm_start.steps": 0,
    "warm_start.expert_search_order": "room",
    "warm_start.lr": 3e-3,
    "warm_start.batch_size": 16,
    "warm_start.expert_games": 0,
    "warm_start.expert_holdout": 0.1,
    # RL: 2 tasks x 8 episodes per iteration (up to 240 turn-samples), updates of 32 turn-samples.
    "rollout.max_new_tokens": 24,
    "rollout.max_prompt_len": 1024,
    "rollout.prompt_truncation": "left",
    # A well-formed command the room does not offer ("Nothing happens.") gets no share of a won
    # episode's credit (it keeps a lost one's blame): without it, RL raised the share of such
    # wasted turns (27% -> 53% on seed 1) and success fell (docs/results.md).
    "rollout.shaping.inadmissible_no_credit": True,
    "optim.lr": 5e-4,
    "train.iterations": 16,
    "train.mini_batch_size": 32,
    "train.micro_batch_size": 16,
    "train.minibatch_order": "length",
    "train.eval_every": 8,
    "eval.num_tasks": 64,
    "checkpoint.every": 4,
    # A rerun, a resume or the ablation's next run loads the compiled sampler and update
    # programs (about 20 of them, 3-4 minutes of compiling on 2 cores) instead of compiling.
    "train.xla_cache_dir": "~/.cache/sdar_jax/xla",
  }
