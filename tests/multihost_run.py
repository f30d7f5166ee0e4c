"""The run of tests/integration/test_multihost.py, started once per process:

  python -m tests.multihost_run --workdir=W --steps=2 --skills_dir=S [--eval_every=2] \
      [--coordinator_address=localhost:P --num_processes=2 --process_id=I]

SDAR on the dummy say-the-word env (tests/integration/test_learning.py's family, registered here) with a tiny
random-weight model on a (data 1, fsdp 8, tensor 1) mesh of 8 CPU devices (the caller sets
XLA_FLAGS: 8 devices for one process, 4 each for two), so with two processes the parameters are
sharded across the processes and each process holds half of every batch. Per iteration: 4 tasks
x 2 episodes of up to 2 turns (16 turn-samples at most), mini-batches of 8, teacher log-probs
scored at θ_old, a checkpoint; validation of 7 games every `--eval_every` iterations and at the
last (none with 0). The trainer is called directly: the `sdar_jax.train` command accepts only the
environments that have a config (alfworld, webshop, search_qa).
"""

from __future__ import annotations

import argparse
import os

import envs
from sdar_jax.text.tokenizer import packaged_tokenizer_dir
from tests.helpers import tiny_run_config
from tests.integration.test_learning import WORDS, SayTheWordAdapter, say_the_word_split


class HashedWordAdapter(SayTheWordAdapter):
  """Every response is a valid action: the word its characters hash to. A random-weight model
  then wins a quarter of its turns, so rewards, GRPO advantages and episode lengths vary (and
  the two processes end up with different numbers of turn-samples)."""

  def project(self, text: str) -> tuple[str, bool]:
    return WORDS[sum(map(ord, text)) % len(WORDS)], True


def register_family() -> None:
  """The dummy env as a trainable family (once per process)."""
  try:
    envs.env_family("dummy")
  except KeyError:
    envs.register_family(
      envs.EnvFamily(
        name="dummy", split=say_the_word_split, adapter=HashedWordAdapter, skills="dummy"
      )
    )


def write_skills(directory: str) -> str:
  """A one-line skill file for the teacher's privileged block (`env.skills.dir`)."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "skill_mapping.json"), "w") as f:
    f.write('{"skill_files": {"general": "general_skills.md"}, "task_to_skill": {}}\n')
  with open(os.path.join(directory, "general_skills.md"), "w") as f:
    f.write(
      "### GENERAL SKILLS ###\n1. Answer: Say the word the task names, inside <action> tags.\n"
    )
  return directory


def run_config(steps: int, skills_dir: str, eval_every: int = 2):
  register_family()
  overrides = {
    "model.tokenizer_dir": str(packaged_tokenizer_dir("alfworld_compact")),
    "model.tiny.vocab_size": 1664,
    "model.tiny.hidden_size": 64,
    "model.tiny.intermediate_size": 128,
    "model.tiny.num_layers": 2,
    "mesh.data": 1,
    "mesh.fsdp": 8,
    "mesh.tensor": 1,
    "env.name": "dummy",
    "env.max_turns": 2,
    "env.history": 1,
    "env.tasks_per_iteration": 4,
    "env.group_size": 2,
    "env.num_workers": 0,
    "env.skills.dir": skills_dir,
    "eval.skills": "without",
    # 7: unequal shares (4 and 3 games), so a rate averaged per process would differ from the
    # episode-weighted one test_multihost compares against the single process.
    "eval.num_tasks": 7,
    "rollout.max_new_tokens": 8,
    "rollout.max_prompt_len": 128,
    "optim.lr": 1e-3,
    "train.mini_batch_size": 8,
    "train.micro_batch_size": 8,
    # mini-batches in length order: every process must compute the same permutation of all
    # processes' samples and gather the rows it names (rollout order is the identity of it)
    "train.minibatch_order": "length",
    "train.eval_before_train": False,
    "train.eval_every": eval_every,
    "checkpoint.every": 1,
    "logging.plots": False,
  }
  return tiny_run_config(steps, algo="sdar", **overrides)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--steps", type=int, required=True)
  parser.add_argument("--skills_dir", required=True)
  parser.add_argument("--eval_every", type=int, default=2)
  parser.add_argument("--coordinator_address")
  parser.add_argument("--num_processes", type=int)
  parser.add_argument("--process_id", type=int)
  args = parser.parse_args()
  from sdar_jax.observe.progress import configure_logging

  configure_logging()
  if args.num_processes:
    from sdar_jax.infra import multihost

    multihost.initialize(args.coordinator_address, args.num_processes, args.process_id)
  from sdar_jax.run import trainer

  trainer.run(run_config(args.steps, args.skills_dir, args.eval_every), args.workdir)


if __name__ == "__main__":
  main()
