"""Rollout throughput: the agent loop against the raw sampler on the same model and prompts.

    .venv/bin/python bench/rollout.py [--games 4] [--group 2] [--turns 4] [--repeats 3]
        [--workers 2] [--data-dir DIR]

The model is the demo's (configs/default.py: the Qwen3 architecture at 4 layers, hidden 128, on
the compact ALFWorld tokenizer), with random weights; the rollout settings are the demo's
(temperature 1, 24 new tokens, history 2, prompts cut on the left past 1,024 tokens). The games
are generated ALFWorld games of the demo's two task types (planner-checked, into a temporary
folder unless --data-dir names one), played on the real engine in the run's `EnvPool` (worker
processes). One rollout = `--games` tasks x `--group` episodes (a GRPO group per task) for up to
`--turns` turns, as `AgentLoop.run` plays it in training, twice: serially (`rollout.overlap=off`:
every env steps, then the whole batch decodes) and overlapped (`rollout.overlap=halves`: one half
of the episodes decodes while the other half's envs step). Both play the same episodes (checked).

Every sampler call the agent loop makes is recorded (prompts, sampling parameters, key, row ids);
"raw sampler" replays exactly the serial loop's calls, so both rows generate the same tokens
(checked) and their ratio is what the loop costs around the sampler: env resets and steps, prompt
building, tokenization, detokenization and action parsing. "raw sampler, halves' calls" replays
the overlapped loop's calls (twice as many, half as large): what decoding in halves costs by
itself.

tokens/s = generated response tokens / median wall time of one whole rollout (agent loop) or of
the replayed calls (raw sampler). env-wait share = seconds blocked on `EnvPool.reset` /
`EnvPool.step` (overlapped: `EnvPool.wait`) / the agent loop's wall time (median over repeats),
from the same `sdar_jax.observe.perf.RolloutTimings` that the trainer's `perf/env_wait_share` reads.
One untimed round first compiles every shape; then the repeats run round-robin over the rows, so
load from other processes hits them alike. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import copy
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
from sdar_jax.core import sharding
from sdar_jax.core.sampling import Sampler
from sdar_jax.rollout.trajectory import RolloutTimings
from sdar_jax.run import setup as run_setup


class RecordingSampler:
  """A `Sampler` that keeps the arguments of every `generate` call, for an exact replay."""

  def __init__(self, sampler: Sampler):
    self.sampler = sampler
    self.calls: list[tuple] = []
    self.tokens: list[list[list[int]]] = []  # each call's generated tokens

  def generate(self, params, prompts, sampling, rng=None, share_prefix=True, row_ids=None):
    self.calls.append((list(prompts), sampling, rng, share_prefix, row_ids))
    out = self.sampler.generate(params, prompts, sampling, rng, share_prefix, row_ids=row_ids)
    self.tokens.append(out.tokens)
    return out


def bench_config(args, data_dir: str):
  """The demo config, playing `data_dir`'s games with one rollout's worth of envs, no evaluation."""
  config = default.get_config()
  return common.override(
    config,
    {
      "env.data_dir": data_dir,
      "env.tasks_per_iteration": args.games,
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
      serial_loop = loops.loop
      serial_loop.progress = False
      halves_loop = copy.copy(serial_loop)  # the same pool, sampler and prompts
      halves_loop.overlap = "halves"
      n_games = len(loops.train_games)
      tasks = [g % n_games for g in range(args.games) for _ in range(args.group)]
      groups = [g for g in range(args.games) for _ in range(args.group)]
      key = jax.random.key(0)

      def agent_loop(loop):
        recorder.calls, recorder.tokens = [], []
        timings = RolloutTimings()
        start = time.perf_counter()
        episodes = loop.run(params, tasks, groups, key, timings=timings)
        return time.perf_counter() - start, timings, episodes

      def raw_sampler(calls):
        start = time.perf_counter()
        outs = [sampler.generate(params, p, s, k, share, row_ids=r) for p, s, k, share, r in calls]
        return time.perf_counter() - start, [o.tokens for o in outs]

      # Untimed first round: compiles every shape; its calls are the replayed ones.
      first = {"serial": agent_loop(serial_loop)}
      calls = {"serial": (recorder.calls, recorder.tokens)}
      first["halves"] = agent_loop(halves_loop)
      calls["halves"] = (recorder.calls, recorder.tokens)
      replays = {mode: raw_sampler(calls[mode][0]) for mode in calls}
      loop_s = {mode: [] for mode in first}
      raw_s = {mode: [] for mode in first}
      env_shares = {mode: [] for mode in first}
      sampler_shares = {mode: [] for mode in first}
      for _ in range(args.repeats):
        for mode, loop in (("serial", serial_loop), ("halves", halves_loop)):
          wall, t, _ = agent_loop(loop)
          loop_s[mode].append(wall)
          env_shares[mode].append(t.env_seconds / wall)
          sampler_shares[mode].append(t.sampler_seconds / wall)
        for mode in first:
          raw_s[mode].append(raw_sampler(calls[mode][0])[0])
    finally:
      loops.close()

  _, timings, episodes = first["serial"]
  tokens = timings.generated_tokens
  turns = sum(len(ep.turns) for ep in episodes)
  same = [
    [(t.response_ids, t.action) for t in a.turns] == [(t.response_ids, t.action) for t in b.turns]
    for a, b in zip(episodes, first["halves"][2])
  ]
  print(
    f"jax {jax.__version__} ({jax.device_count()} {jax.devices()[0].platform} devices), "
    f"{os.cpu_count()} CPUs, {args.workers} env workers, load average {load_before:.1f} before, "
    f"{os.getloadavg()[0]:.1f} after"
  )
  print(
    f"\nrollout: {args.games} ALFWorld games x {args.group} episodes, up to {args.turns} turns: "
    f"{turns} turns in {len(calls['serial'][0])} sampler calls serially "
    f"({len(calls['halves'][0])} overlapped), {tokens} generated tokens; model "
    f"{model_config.num_layers} layers x hidden {model_config.hidden_size}, vocab "
    f"{model_config.vocab_size}, random weights; median of {args.repeats} interleaved repeats"
  )
  print(f"{'row':<27} {'median s':>9} {'tokens/s':>9} {'first call s':>13} {'env wait':>9}")
  med = {mode: statistics.median(loop_s[mode]) for mode in loop_s}
  raw = {mode: statistics.median(raw_s[mode]) for mode in raw_s}
  env = {mode: statistics.median(env_shares[mode]) for mode in env_shares}
  for mode in ("serial", "halves"):
    name = f"agent loop, {'serial' if mode == 'serial' else 'overlapped'}"
    print(
      f"{name:<27} {med[mode]:>9.3f} {tokens / med[mode]:>9.0f} {first[mode][0]:>13.2f} "
      f"{env[mode]:>9.1%}"
    )
  for mode in ("serial", "halves"):
    name = "raw sampler" + ("" if mode == "serial" else ", halves' calls")
    print(f"{name:<27} {raw[mode]:>9.3f} {tokens / raw[mode]:>9.0f} {replays[mode][0]:>13.2f}")
  print(f"agent loop / raw sampler tokens/s (serial): {raw['serial'] / med['serial']:.2f}x")
  print(f"overlapped / serial agent loop tokens/s: {med['serial'] / med['halves']:.2f}x")
  for mode in ("serial", "halves"):
    sampler_share = statistics.median(sampler_shares[mode])
    print(
      f"{mode} agent loop wall time: env wait {env[mode]:.1%}, sampler {sampler_share:.1%}, the "
      f"rest (prompts, tokenization, parsing) {max(0.0, 1 - env[mode] - sampler_share):.1%}"
    )
  print(
    "sanity: the raw replays generated the agent loops' tokens: "
    f"{all(replays[m][1] == calls[m][1] for m in calls)}; overlapped episodes equal the serial "
    f"ones (tokens, actions): {all(same)}"
  )
  print(f"sampler compilations: {sampler.num_compilations}")


if __name__ == "__main__":
  main()
