"""Rollout throughput: the agent loop against the raw sampler on the same model and prompts.

    .venv/bin/python bench/rollout.py [--games 4] [--group 2] [--turns 4] [--repeats 3]
        [--workers 2] [--data-dir DIR]

The model is the demo's (configs/default.py: the Qwen3 architecture at 4 layers, hidden 128, on
the compact ALFWorld tokenizer), with random weights; the rollout settings are the demo's
(temperature 1, 24 new tokens, history 2, prompts cut on the left past 1,024 tokens). The games
are generated ALFWorld games of the demo's two task types (planner-checked, into a temporary
folder unless --data-dir names one), played on the real engine in the run's `EnvPool` (worker
processes). One rollout = `--games` tasks x `--group` episodes (a GRPO group per task) for up to
`--turns` turns, as `AgentLoop.run` plays it in training: serially, every env steps, then the
whole batch decodes.

Every sampler call the agent loop makes is recorded (prompts, sampling parameters, key); "raw
sampler" replays exactly those calls, so both rows generate the same tokens (checked) and their
ratio is what the loop costs around the sampler: env resets and steps, prompt building,
tokenization, detokenization and action parsing.

tokens/s = generated response tokens / median wall time of one whole rollout (agent loop) or of
the replayed calls (raw sampler). env-wait share = seconds blocked on `EnvPool.reset` /
`EnvPool.step` / the agent loop's wall time (median over repeats), from the same
`sdar_jax.perf.RolloutTimings` that the trainer's `perf/env_wait_share` reads. One untimed round
first compiles every shape; then the repeats run round-robin over the two rows, so load from other
processes hits both alike. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax

import envs
from configs import common, default
from envs.alfworld.generator import generate_split
from sdar_jax import run_setup, sharding
from sdar_jax.perf import RolloutTimings
from sdar_jax.sampling import Sampler


class RecordingSampler:
  """A `Sampler` that keeps the arguments of every `generate` call, for an exact replay."""

  def __init__(self, sampler: Sampler):
    self.sampler = sampler
    self.calls: list[tuple] = []
    self.tokens: list[list[list[int]]] = []  # each call's generated tokens

  def generate(self, params, prompts, sampling, rng=None, share_prefix=True):
    self.calls.append((list(prompts), sampling, rng, share_prefix))
    out = self.sampler.generate(params, prompts, sampling, rng, share_prefix)
    self.tokens.append(out.tokens)
    return out


def bench_config(args, data_dir: str):
  """The demo config, playing `data_dir`'s games with one rollout's worth of envs, no evaluation."""
  config = default.get_config()
  return common.override(
    config,
    {
      "env.data_dir": data_dir,
      "env.tasks_per_step": args.games,
      "env.group_size": args.group,
      "env.max_turns": args.turns,
      "env.num_workers": args.workers,
      "train.eval_every": 0,
      "train.eval_before_train": False,
      "warm_start.steps": 0,
    },
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--games", type=int, default=4, help="tasks per rollout")
  parser.add_argument("--group", type=int, default=2, help="episodes per task (GRPO group size)")
  parser.add_argument("--turns", type=int, default=4, help="turn limit of an episode")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--workers", type=int, default=2, help="env worker processes")
  parser.add_argument("--data-dir", help="a generated ALFWorld data folder (default: generate)")
  args = parser.parse_args()
  load_before = os.getloadavg()[0]

  with tempfile.TemporaryDirectory() as tmp:
    data_dir = args.data_dir
    if data_dir is None:
      data_dir = tmp
      start = time.perf_counter()
      types = default.DEMO_TASK_TYPES.split(",")
      per_type = -(-args.games // len(types))
      generate_split(tmp, "train", per_type, seed=0, task_types=types, progress=False)
      print(f"generated {per_type * len(types)} games in {time.perf_counter() - start:.1f}s")
    config = bench_config(args, data_dir)
    family = envs.env_family(config.env.name)
    mesh = sharding.make_mesh(dict(config.mesh))
    tokenizer = run_setup.build_tokenizer(config.model)
    model_config, params = run_setup.build_policy(config, mesh)
    template = run_setup.build_chat_template(config.model, model_config.family)
    sampler = Sampler(model_config, mesh, tokenizer, max_prompt_len=config.rollout.max_prompt_len)
    recorder = RecordingSampler(sampler)
    loops = run_setup.build_agent_loops(
      config, family, recorder, tokenizer, template, with_teacher=False, eval_only=False
    )
    try:
      loop = loops.loop
      loop.progress = False
      n_games = len(loops.train_games)
      tasks = [g % n_games for g in range(args.games) for _ in range(args.group)]
      groups = [g for g in range(args.games) for _ in range(args.group)]
      key = jax.random.key(0)

      def agent_loop():
        timings = RolloutTimings()
        start = time.perf_counter()
        episodes = loop.run(params, tasks, groups, key, timings=timings)
        return time.perf_counter() - start, timings, episodes

      def raw_sampler():
        start = time.perf_counter()
        outs = [sampler.generate(params, p, s, k, share) for p, s, k, share in calls]
        return time.perf_counter() - start, [o.tokens for o in outs]

      first_s, timings, episodes = agent_loop()  # compiles; its calls are the replayed ones
      calls, recorded = recorder.calls, recorder.tokens
      recorder.calls, recorder.tokens = [], []
      raw_first_s, replayed = raw_sampler()
      raw_tokens = sum(len(t) for out in replayed for t in out)
      tokens = timings.generated_tokens
      loop_s, raw_s, env_shares, sampler_shares = [], [], [], []
      for _ in range(args.repeats):
        wall, t, _ = agent_loop()
        recorder.calls, recorder.tokens = [], []  # the same calls again
        loop_s.append(wall)
        env_shares.append(t.env_seconds / wall)
        sampler_shares.append(t.sampler_seconds / wall)
        raw_s.append(raw_sampler()[0])
    finally:
      loops.close()

  turns = sum(len(ep.turns) for ep in episodes)
  print(
    f"jax {jax.__version__} ({jax.device_count()} {jax.devices()[0].platform} devices), "
    f"{os.cpu_count()} CPUs, {args.workers} env workers, load average {load_before:.1f} before, "
    f"{os.getloadavg()[0]:.1f} after"
  )
  print(
    f"\nrollout: {args.games} ALFWorld games x {args.group} episodes, up to {args.turns} turns: "
    f"{turns} turns in {len(calls)} sampler calls, {tokens} generated tokens; model "
    f"{model_config.num_layers} layers x hidden {model_config.hidden_size}, vocab "
    f"{model_config.vocab_size}, random weights; median of {args.repeats} interleaved repeats"
  )
  print(f"{'row':<14} {'median s':>9} {'tokens/s':>9} {'first call s':>13}")
  loop_med, raw_med = statistics.median(loop_s), statistics.median(raw_s)
  print(f"{'agent loop':<14} {loop_med:>9.3f} {tokens / loop_med:>9.0f} {first_s:>13.2f}")
  print(f"{'raw sampler':<14} {raw_med:>9.3f} {raw_tokens / raw_med:>9.0f} {raw_first_s:>13.2f}")
  print(f"agent loop / raw sampler tokens/s: {raw_med / loop_med:.2f}x")
  env_share, sampler_share = statistics.median(env_shares), statistics.median(sampler_shares)
  print(
    f"agent loop wall time: env wait {env_share:.1%}, sampler {sampler_share:.1%}, "
    f"the rest (prompts, tokenization, parsing) {max(0.0, 1 - env_share - sampler_share):.1%}"
  )
  print(f"sanity: the raw replay generated the agent loop's tokens: {replayed == recorded}")
  print(f"sampler compilations: {sampler.num_compilations}")


if __name__ == "__main__":
  main()
