"""UCOB's reflection training (TU2021/UCOB@d38292c, verl/trainer/main_ucob.py and
verl/trainer/ppo/ucob_ray_trainer.py; `algo.skill_memory.train`, on in preset `ucob`): the policy
is trained on the very tokens with which it wrote its skills, each skill's advantage from its
utility in the memory (docs/reference.md, "UCOB's skill memory").

Per iteration, once the warm-up is over (`training_active`, UCOB's `_reflection_train_active`):

1. uses (`used_counts`, `_collect_current_step_memory_counts`): per pool, how many turns of the
   good view were given each skill in this iteration's rollout (the ids `retrieve_for` set);
2. records (`select_records`, `_select_reflection_train_records_for_pool`), per pool, after the
   round's utility update and writing (before the memory's cut): the skills used, written by the
   policy (with its tokens), of count >= `train_min_count_<pool>` and |utility| >=
   `train_min_abs_utility`, utility clipped to [−1, 1]; sorted by (uses, |utility|, count),
   largest first (ties keep the order of first use); the first `train_<pool>_samples`; none when
   fewer than 2; advantage (u − mean) / max(std, `train_eps`) over those (population std,
   float32 as UCOB's), clipped to ±`train_clip`; the records whose advantage is exactly 0 dropped;
   the task pool's records, then the state pool's (`_build_dynamic_memory_reflection_train_batch`);
3. the pass (`train_reflections`, after the iteration's updates, as UCOB's
   `_update_reflection_actor` after `update_actor`): one row per record, the writer's prompt ids
   and response ids with `train_loss_weight` × advantage on every response token; θ_old
   re-scored at the current weights; mini-batches of `train_mini_batch_size` rows, each one
   optimizer step of the run's update (`Iteration.update_on`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

PREFIX = "skill_memory_train"


def training_active(s: Any, iteration: int) -> bool:
  """Whether 0-based `iteration` trains (UCOB: step = iteration + 1 > warm-up, or no warm-up)."""
  return bool(s.train) and (s.train_warmup <= 0 or iteration + 1 > s.train_warmup)


def used_counts(episodes: Sequence[Any]) -> dict[str, dict[str, int]]:
  """Per pool, per skill id: the turns given it (`skill_memory_ids`: with UCOB's views, only the
  good view's turns have any), in the order of first use."""
  counts: dict[str, dict[str, int]] = {"task": {}, "state": {}}
  for ep in episodes:
    for task_ids, state_ids in getattr(ep, "skill_memory_ids", None) or []:
      for pool, ids in (("task", task_ids), ("state", state_ids)):
        for memory_id in ids:
          counts[pool][memory_id] = counts[pool].get(memory_id, 0) + 1
  return counts


def select_records(memory: Any, pool: str, counts: dict[str, int], s: Any) -> list[dict]:
  """The pool's training records with their advantages (module docstring, 2)."""
  most = s.train_state_samples if pool == "state" else s.train_task_samples
  min_count = s.train_min_count_state if pool == "state" else s.train_min_count_task
  if most <= 0:
    return []
  by_id = {e["id"]: e for e in memory.entries}
  found = []
  for memory_id, uses in counts.items():
    e = by_id.get(memory_id)
    if e is None or e["pool"] != pool or not e.get("prompt_ids") or not e.get("response_ids"):
      continue
    count, utility = int(e["count"]), float(e["utility"])
    if count < min_count or abs(utility) < s.train_min_abs_utility:
      continue
    found.append(
      {
        "id": memory_id,
        "pool": pool,
        "prompt_ids": list(e["prompt_ids"]),
        "response_ids": list(e["response_ids"]),
        "utility": max(-1.0, min(1.0, utility)),
        "uses": int(uses),
        "count": count,
      }
    )
  found.sort(key=lambda r: (r["uses"], abs(r["utility"]), r["count"]), reverse=True)
  found = found[:most]
  if len(found) < 2:
    return []
  utilities = np.asarray([r["utility"] for r in found], np.float32)
  mean = float(np.mean(utilities))
  std = max(float(np.std(utilities)), float(s.train_eps))
  for r in found:
    a = (r["utility"] - mean) / std
    if s.train_clip > 0:
      a = max(-s.train_clip, min(s.train_clip, a))
    r["advantage"] = float(a)
  return [r for r in found if abs(r["advantage"]) > 0.0]


def training_records(memory: Any, episodes: Sequence[Any], s: Any) -> list[dict]:
  """The iteration's records: the task pool's, then the state pool's."""
  counts = used_counts(episodes)
  return [r for pool in ("task", "state") for r in select_records(memory, pool, counts[pool], s)]


def training_rows(records: Sequence[dict], weight: float) -> list[dict]:
  """`Iteration.update_on`'s rows: the writer's tokens, `weight` × advantage (the log-probs are
  placeholders: the pass re-scores θ_old)."""
  return [
    {
      "prompt_ids": r["prompt_ids"],
      "response_ids": r["response_ids"],
      "logprobs": [0.0] * len(r["response_ids"]),
      "advantage": float(weight) * r["advantage"],
      "score": r["utility"],
    }
    for r in records
  ]


def record_metrics(records: Sequence[dict]) -> dict[str, float]:
  """Rows (per pool), their mean utility, mean |advantage|, mean uses and response tokens."""
  out = {f"{PREFIX}/rows": float(len(records))}
  if not records:
    return out
  for pool in ("task", "state"):
    out[f"{PREFIX}/{pool}_rows"] = float(sum(r["pool"] == pool for r in records))
  out[f"{PREFIX}/utility_mean"] = float(np.mean([r["utility"] for r in records]))
  out[f"{PREFIX}/advantage_abs_mean"] = float(np.mean([abs(r["advantage"]) for r in records]))
  out[f"{PREFIX}/uses_mean"] = float(np.mean([r["uses"] for r in records]))
  out[f"{PREFIX}/response_tokens"] = float(sum(len(r["response_ids"]) for r in records))
  return out


def train_reflections(view: Any, records: Sequence[dict], s: Any) -> dict[str, float]:
  """The training pass over `records` after the iteration's updates (module docstring, 3); its
  metrics, the updates' as skill_memory_train/<x>. Several processes all join the pass."""
  metrics = record_metrics(records)
  rows = training_rows(records, s.train_loss_weight)
  if rows or jax.process_count() > 1:
    metrics.update(
      view.update_on(rows, PREFIX, mini_batch_size=s.train_mini_batch_size, recompute_old_logp=True)
    )
  return metrics


__all__ = [
  "select_records",
  "train_reflections",
  "training_active",
  "training_records",
  "training_rows",
  "used_counts",
]
