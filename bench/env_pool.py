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

`--envs alfworld_stock` (in the default list) plays the ALFWorld table's pools again with stock
TextWorld text generation and translation (SDAR_STOCK_TEXTWORLD=1 in the workers: the peer of
envs.alfworld.fast_text), `--repeats` times each, and prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from envs import EnvPool  # noqa: E402
from envs.alfworld import collect_game_files, fast_text  # noqa: E402
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


def compare_text_generation(
  game_files: list[str], sizes: list[int], steps: int, workers: int | None, repeats: int
) -> None:
  """Median reset seconds and steps/s of ALFWorld pools with stock TextWorld text generation and
  with envs.alfworld.fast_text, interleaved `repeats` times, and the ratio."""
  print(f"\nalfworld: stock TextWorld vs fast_text (median of {repeats}, interleaved)")
  print(
    f"{'envs':>5} {'reset s stock':>13} {'reset s ours':>12} {'steps/s stock':>13} "
    f"{'steps/s ours':>12} {'steps ratio':>11} {'reset ratio':>11}"
  )
  for size in sizes:
    runs: dict[str, list[dict]] = {"stock": [], "ours": []}
    for _ in range(repeats):
      for kind in runs:
        if kind == "stock":
          os.environ[fast_text.ENV_FLAG] = "1"  # the spawned workers read it at start_engine
        try:
          runs[kind].append(
            bench_pool(
              "alfworld", {"game_files": game_files}, len(game_files), size, steps, workers
            )
          )
        finally:
          os.environ.pop(fast_text.ENV_FLAG, None)
    med = {
      kind: {k: statistics.median(r[k] for r in rows) for k in ("reset_s", "steps_per_s")}
      for kind, rows in runs.items()
    }
    print(
      f"{size:>5} {med['stock']['reset_s']:>13.2f} {med['ours']['reset_s']:>12.2f} "
      f"{med['stock']['steps_per_s']:>13.1f} {med['ours']['steps_per_s']:>12.1f} "
      f"{med['ours']['steps_per_s'] / med['stock']['steps_per_s']:>10.2f}x "
      f"{med['stock']['reset_s'] / med['ours']['reset_s']:>10.2f}x"
    )


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
    "--envs",
    nargs="+",
    default=["alfworld", "alfworld_stock", "webshop", "search_qa", "dummy"],
    choices=["alfworld", "alfworld_stock", "webshop", "search_qa", "dummy"],
    help="which tables",
  )
  parser.add_argument(
    "--repeats", type=int, default=3, help="alfworld_stock: interleaved runs per pool size"
  )
  args = parser.parse_args()

  with tempfile.TemporaryDirectory() as tmp:
    data_dir = args.data_dir
    alfworld = {"alfworld", "alfworld_stock"} & set(args.envs)
    if not alfworld:
      game_files = []
    elif data_dir is None:
      data_dir = tmp
      start = time.perf_counter()
      generate_split(tmp, args.split, 1, seed=0)
      print(f"generated 6 planner-checked games in {time.perf_counter() - start:.1f}s")
    if alfworld:
      game_files = collect_game_files(data_dir, args.split)
    print(f"{len(game_files)} ALFWorld games, {os.cpu_count()} CPUs, {args.steps} rounds per pool")
    tables = {
      "alfworld": ("alfworld (real engine)", {"game_files": game_files}, len(game_files)),
      "webshop": ("webshop (generated catalogue, bm25s search)", {"split": "train"}, 500),
      "search_qa": ("search_qa (generated world, BM25 top 3)", {"split": "train"}, 500),
      "dummy": ("dummy (pool overhead only)", {}, 8),
    }
    for name in args.envs:
      if name == "alfworld_stock":
        compare_text_generation(game_files, args.sizes, args.steps, args.workers, args.repeats)
        continue
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
