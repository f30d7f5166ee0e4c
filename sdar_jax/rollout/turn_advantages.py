"""Turn-level advantage rewrites (e.g. `sdar_jax.algos.TURN_ADVANTAGES`: AgentOPSD, GRSD) applied
to an iteration's packed mini-batches once the teacher's log-probs are in them.

Both estimators need what one mini-batch does not hold: every turn-sample of a GRPO group, and
every turn of an episode in order. So they run once per iteration, between scoring the teacher at
θ_old and the first update: the per-turn gaps (Σ and mean over the turn's tokens of lT − lθ_old)
are read off the mini-batches, the samples' groups, episodes, turns and outcomes off the
turn-samples (every process's, in the order `global_minibatches` packs them), and each
mini-batch's `advantages` are replaced by the rewritten ones. The update then broadcasts them to
the turn's tokens as GRPO's.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from sdar_jax import algos
from sdar_jax.core.batch import TurnBatch, TurnSample
from sdar_jax.infra import multihost
from sdar_jax.rollout.batching import minibatch_permutation, sample_lengths


def sample_table(samples: Sequence[TurnSample]) -> np.ndarray:
  """[N, 5] float64 per turn-sample: GRPO advantage, group id, episode, turn, won."""
  return np.asarray(
    [(s.advantage, s.group_id, s.episode, s.turn, float(s.won)) for s in samples], np.float64
  ).reshape(-1, 5)


def everyone_in_batch_order(
  samples: Sequence[TurnSample], with_teacher: bool, order: str
) -> np.ndarray:
  """`sample_table` of every process's samples, in the order the mini-batches take them (row k of
  mini-batch j is entry j·mini_batch_size + k), episodes numbered apart per process."""
  table = sample_table(samples)
  lengths = sample_lengths(samples, True if jax.process_count() == 1 else with_teacher)
  if jax.process_count() > 1:
    tables = multihost.allgather(table)
    lengths = np.concatenate(multihost.allgather(lengths))
    offset = 0
    for t in tables:  # episode indices are per process: number them apart
      if len(t):
        t[:, 2] += offset
        offset += int(t[:, 2].max()) + 1
    table = np.concatenate(tables)
  return table[minibatch_permutation(lengths, order)]


def turn_gaps(batches: Sequence[TurnBatch]) -> tuple[np.ndarray, np.ndarray]:
  """([rows], [rows]) Σ and mean over each row's response tokens of lT − lθ_old, the rows of the
  mini-batches one after the other (padding rows included: 0, 0)."""
  sums, means = [], []
  for b in batches:
    mask = multihost.fetch(b.response_mask).astype(np.float64) > 0
    gap = multihost.fetch(b.teacher_logp).astype(np.float64) - multihost.fetch(b.old_logp)
    total = np.where(mask, gap, 0.0).sum(axis=1)
    sums.append(total)
    means.append(total / np.maximum(mask.sum(axis=1), 1))
  return np.concatenate(sums), np.concatenate(means)


def rewrite(fn, table: np.ndarray, gap_sum: np.ndarray, gap_mean: np.ndarray) -> np.ndarray:
  """The advantages [N] `fn(TurnTable, num_groups=...)` gives the turn-samples `table`
  (`sample_table` rows) with their turns' gaps (e.g. `algos.turn_rewrite(algo)`)."""
  _, groups = np.unique(table[:, 1].astype(np.int64), return_inverse=True)
  # an episode is its (group, index) pair: indices restart with each rollout, groups do not
  _, episodes = np.unique(table[:, 1:3].astype(np.int64), axis=0, return_inverse=True)
  turns = algos.TurnTable(
    advantage=table[:, 0],
    gap_sum=gap_sum,
    gap_mean=gap_mean,
    group=groups.reshape(-1).astype(np.int32),
    episode=episodes.reshape(-1).astype(np.int32),
    turn=table[:, 3].astype(np.int32),
    won=table[:, 4],
  )
  num_groups = int(turns.group.max()) + 1 if len(table) else 1
  return np.asarray(fn(turns, num_groups=num_groups), np.float64)


def _place(values: np.ndarray, like: jax.Array) -> jax.Array:
  """`values` [B] (the same on every process) placed as `like` is."""
  values = np.asarray(values, np.float32)
  if not isinstance(like, jax.Array):  # a packed batch still on the host
    return values
  if jax.process_count() == 1 or like.is_fully_addressable:
    return jax.device_put(values, like.sharding)
  rows = multihost.process_rows(like.sharding, like.shape)
  return multihost.put_rows(values[rows], like.sharding, like.shape)


def apply_turn_advantages(
  fn,
  batches: Sequence[TurnBatch],
  samples: Sequence[TurnSample],
  with_teacher: bool,
  order: str = "rollout",
) -> tuple[list[TurnBatch], dict[str, float]]:
  """The mini-batches (with teacher_logp scored) with their advantages rewritten by
  `fn(TurnTable, num_groups=...)` (`rewrite`), and metrics: turn_adv/abs_mean (mean |A'| over the turn-samples),
  turn_adv/sign_flips (share whose sign differs from GRPO's A), turn_adv/grpo_abs_mean (mean |A|)."""
  table = everyone_in_batch_order(samples, with_teacher, order)
  n = len(table)
  gap_sum, gap_mean = turn_gaps(batches)
  size = batches[0].batch_size if batches else 0
  # the first n rows of the mini-batches in order are the samples; the rest pad the last one
  real = np.zeros(len(gap_sum), bool)
  for j in range(len(batches)):
    real[j * size : j * size + min(size, n - j * size)] = True
  new = rewrite(fn, table, gap_sum[real], gap_mean[real])
  out = []
  for j, b in enumerate(batches):
    values = np.zeros((b.batch_size,), np.float64)
    part = new[j * size : (j + 1) * size]
    values[: len(part)] = part
    out.append(b.replace(advantages=_place(values, b.advantages)))
  old = table[:, 0]
  metrics = {
    "turn_adv/abs_mean": float(np.abs(new).mean()) if n else 0.0,
    "turn_adv/grpo_abs_mean": float(np.abs(old).mean()) if n else 0.0,
    "turn_adv/sign_flips": float(np.mean(np.sign(new) * np.sign(old) < 0)) if n else 0.0,
  }
  return out, metrics


def context_gap_metrics(
  batches: Sequence[TurnBatch],
  samples: Sequence[TurnSample],
  names: Sequence[str],
  with_teacher: bool,
  order: str = "rollout",
) -> dict[str, float]:
  """context/<name>/teacher_old_gap: the teacher's minus the behaviour policy's log-prob over the
  response tokens of the turn-samples whose teacher context source `name` gave (token-weighted,
  every process's mini-batches, scored teacher_logp), per name of `names`."""
  member = np.asarray(
    [[name in s.context_sources for name in names] for s in samples], np.float64
  ).reshape(-1, len(names))
  lengths = sample_lengths(samples, True if jax.process_count() == 1 else with_teacher)
  if jax.process_count() > 1:
    member = np.concatenate(multihost.allgather(member))
    lengths = np.concatenate(multihost.allgather(lengths))
  member = member[minibatch_permutation(lengths, order)]
  n = len(member)
  gap_sum, tokens = [], []
  for b in batches:
    mask = multihost.fetch(b.response_mask).astype(np.float64) > 0
    gap = multihost.fetch(b.teacher_logp).astype(np.float64) - multihost.fetch(b.old_logp)
    gap_sum.append(np.where(mask, gap, 0.0).sum(axis=1))
    tokens.append(mask.sum(axis=1))
  size = batches[0].batch_size if batches else 0
  real = np.zeros(sum(len(g) for g in gap_sum), bool)
  for j in range(len(batches)):
    real[j * size : j * size + min(size, n - j * size)] = True
  gap_sum = np.concatenate(gap_sum)[real] if batches else np.zeros(0)
  tokens = np.concatenate(tokens)[real] if batches else np.zeros(0)
  return {
    f"context/{name}/teacher_old_gap": float(
      (member[:, k] * gap_sum).sum() / max((member[:, k] * tokens).sum(), 1.0)
    )
    for k, name in enumerate(names)
  }
