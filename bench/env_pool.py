"""EnvPool throughput of the three environments: env steps per second at 1, 8 and 64 envs.

    .venv/bin/python bench/env_pool.py [--data-dir DIR] [--sizes 1 8 64] [--steps 20] [--workers N]
        [--envs alfworld webshop search_qa dummy]

ALFWorld (real engine): without --data-dir it first generates one checked game per task type into
a temporary folder; each step is a random admissible action (not "help").
WebShop (generated 1,000-product catalogue, train goals): a random admissible action, where
"search[<your query>]" searches the instruction's first five words (a bm25s query over the
catalogue); a purchase ends the episode. An untimed search in every env, then a reset, first builds
each worker's search index (bm25s indexes the catalogue at the first search, ~0.2 s).
Search-QA (generated world, train questions): every turn searches the question (BM25 top 3 over
the generated corpus), so a step is one retrieval; the 4-turn limit ends the episode.
Each pool resets every env (env i plays task i % #tasks), then plays `--steps` rounds in every env;
an env that finishes is reset outside the timing. steps/s = env steps / wall time of the stepping
rounds (resets excluded, shown separately). The trivial "dummy" env measures the pool's own
overhead (IPC, batching).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from envs import EnvPool  # noqa: E402
from envs.alfworld import collect_game_files  # noqa: E402
from envs.alfworld.generator import generate_split  # noqa: E402


def random_admissible(result, rng: random.Random) -> str:
  """A random admissible command (ALFWorld: not "help"; WebShop: the search box gets the
  instruction's first five words)."""
  action = rng.choice([c for c in result.info["admissible_commands"] if c != "help"])
  if action == "search[<your query>]":
    action = "search[" + " ".join(result.info["task"].split()[:5]) + "]"
  return action


def search_the_question(result, rng: random.Random) -> str:
  """Search-QA: search the question itself (one retrieval per step)."""
  del rng
  return f"<search>{result.info['task']}</search>"


def bench_pool(
  env_name: str,
  env_kwargs: dict,
  num_tasks: int,
  num_envs: int,
  steps: int,
  workers: int | None,
  seed: int = 0,
  choose=random_admissible,
  warmup_action: str | None = None,
) -> dict:
  rng = random.Random(seed)
  num_workers = min(num_envs, workers if workers is not None else (os.cpu_count() or 1))
  with EnvPool(
    env_name, num_envs, env_kwargs=env_kwargs, num_workers=num_workers, timeout_s=600
  ) as pool:
    tasks = [i % num_tasks for i in range(num_envs)]
    if warmup_action is not None:  # untimed: one action in every env, then fresh episodes
      pool.reset(tasks=tasks)
      pool.step([warmup_action] * num_envs)
    start = time.perf_counter()
    results = pool.reset(tasks=tasks)
    reset_s = time.perf_counter() - start
    step_s, env_steps, failures = 0.0, 0, 0
    for _ in range(steps):
      actions = [choose(r, rng) for r in results]
      start = time.perf_counter()
      results = pool.step(actions)
      step_s += time.perf_counter() - start
      env_steps += num_envs
      failures += sum(r.failed for r in results)
      done = [i for i, r in enumerate(results) if r.done]
      if done:
        for i, r in zip(done, pool.reset(tasks=[tasks[i] for i in done], indices=done)):
          results[i] = r
  return {
    "envs": num_envs,
    "workers": num_workers,
    "reset_s": reset_s,
    "env_steps": env_steps,
    "steps_per_s": env_steps / step_s,
    "failures": failures,
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
    "--data-dir", help="ALFWorld or generated data folder (default: generate 6 games)"
  )
  parser.add_argument("--split", default="train")
  parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 64])
  parser.add_argument("--steps", type=int, default=20, help="stepping rounds per pool size")
  parser.add_argument(
    "--workers", type=int, default=None, help="worker processes (default: CPU count)"
  )
  parser.add_argument(
    "--envs", nargs="+", default=["alfworld", "webshop", "search_qa", "dummy"], help="which tables"
  )
  args = parser.parse_args()

  with tempfile.TemporaryDirectory() as tmp:
    data_dir = args.data_dir
    if "alfworld" not in args.envs:
      game_files = []
    elif data_dir is None:
      data_dir = tmp
      start = time.perf_counter()
      generate_split(tmp, args.split, 1, seed=0)
      print(f"generated 6 planner-checked games in {time.perf_counter() - start:.1f}s")
    if "alfworld" in args.envs:
      game_files = collect_game_files(data_dir, args.split)
    print(f"{len(game_files)} ALFWorld games, {os.cpu_count()} CPUs, {args.steps} rounds per pool")
    tables = {
      "alfworld": ("alfworld (real engine)", {"game_files": game_files}, len(game_files)),
      "webshop": ("webshop (generated catalogue, bm25s search)", {"split": "train"}, 500),
      "search_qa": ("search_qa (generated world, BM25 top 3)", {"split": "train"}, 500),
      "dummy": ("dummy (pool overhead only)", {}, 8),
    }
    for name in args.envs:
      title, kwargs, num_tasks = tables[name]
      choose = search_the_question if name == "search_qa" else random_admissible
      print(f"\n{title}")
      print(
        f"{'envs':>5} {'workers':>7} {'reset s':>8} {'env steps':>9} {'steps/s':>9} {'failures':>8}"
      )
      for size in args.sizes:
        row = bench_pool(
          name,
          kwargs,
          num_tasks,
          size,
          args.steps,
          args.workers,
          choose=choose,
          warmup_action="search[warm up]" if name == "webshop" else None,
        )
        print(
          f"{row['envs']:>5} {row['workers']:>7} {row['reset_s']:>8.2f} {row['env_steps']:>9} "
          f"{row['steps_per_s']:>9.1f} {row['failures']:>8}"
        )


if __name__ == "__main__":
  main()
