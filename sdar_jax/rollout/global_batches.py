"""The iteration's mini-batches over every process: `global_minibatches` turns each process's own
turn-samples into exactly the mini-batches one process would pack from all of them.

Each process packs its own samples at the iteration's widest lengths into its rows of one global
block (`_widen`); every process computes the same plan from all processes' sample lengths (one
exchange, `sdar_jax.infra.multihost.allgather`), and a jitted gather (`_select_fn`) takes each
mini-batch's rows out of the block, cut to the mini-batch's own bucketed lengths. One process: the
single-process path of `sdar_jax.rollout.batching` (`plan_minibatches`, then `pack_batch`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from sdar_jax.core import sharding as sharding_lib
from sdar_jax.core.batch import TurnBatch, TurnSample, new_tokens_bucket, prompt_bucket
from sdar_jax.infra import multihost
from sdar_jax.rollout.batching import (
  minibatch_permutation,
  pack_batch,
  plan_minibatches,
  sample_lengths,
)


def _widen(
  batch: TurnBatch, rows: int, Ps: int, R: int, Pt: int, pad_id: int, weights: bool = False
) -> TurnBatch:
  """A packed (numpy) batch with `rows` rows at the wider lengths Ps / R / Pt: prompts stay
  right-aligned at Ps (Pt), responses start there; new cells are padding. `weights`: with its
  `distill_weight` (0 in new cells)."""

  def place(x, width, prompt_pad, fill, dtype):
    out = np.full((rows, width), fill, dtype)
    if x is not None:
      out[: x.shape[0], prompt_pad : prompt_pad + x.shape[1]] = x
    return out

  def get(name):
    return None if batch is None else getattr(batch, name)

  def prompt_pad(tokens, width):  # a token row is prompt + response: the extra prompt padding
    return width if tokens is None else width - (tokens.shape[1] - batch.response_len)

  advantages = np.zeros((rows,), np.float32)
  if batch is not None:
    advantages[: batch.batch_size] = batch.advantages
  student = get("student_tokens")
  widened = {
    "student_tokens": place(student, Ps + R, prompt_pad(student, Ps), pad_id, np.int32),
    "student_mask": place(get("student_mask"), Ps + R, prompt_pad(student, Ps), 0, np.int32),
    "response_mask": place(get("response_mask"), R, 0, 0, np.float32),
    "old_logp": place(get("old_logp"), R, 0, 0, np.float32),
    "advantages": advantages,
  }
  if weights:
    widened["distill_weight"] = place(get("distill_weight"), R, 0, 0, np.float32)
  if Pt:
    teacher = get("teacher_tokens")
    widened["teacher_tokens"] = place(teacher, Pt + R, prompt_pad(teacher, Pt), pad_id, np.int32)
    widened["teacher_mask"] = place(
      get("teacher_mask"), Pt + R, prompt_pad(teacher, Pt), 0, np.int32
    )
  return TurnBatch(**widened)


@functools.lru_cache(maxsize=8)
def _select_fn(out_sharding: NamedSharding) -> Callable:
  """Jitted: the rows `index` of a block (-1 = a padding row), cut to one mini-batch's lengths."""

  def select(block: TurnBatch, index, *, Ps_block, Ps, R, Pt_block, Pt, pad_id):
    keep = index >= 0

    def rows(x, fill):
      y = jnp.take(x, jnp.maximum(index, 0), axis=0)
      return jnp.where(keep.reshape((-1,) + (1,) * (y.ndim - 1)), y, jnp.asarray(fill, y.dtype))

    picked = {
      "student_tokens": rows(block.student_tokens, pad_id)[:, Ps_block - Ps : Ps_block + R],
      "student_mask": rows(block.student_mask, 0)[:, Ps_block - Ps : Ps_block + R],
      "response_mask": rows(block.response_mask, 0)[:, :R],
      "old_logp": rows(block.old_logp, 0)[:, :R],
      "advantages": rows(block.advantages, 0),
    }
    if block.distill_weight is not None:
      picked["distill_weight"] = rows(block.distill_weight, 0)[:, :R]
    if Pt:
      picked["teacher_tokens"] = rows(block.teacher_tokens, pad_id)[:, Pt_block - Pt : Pt_block + R]
      picked["teacher_mask"] = rows(block.teacher_mask, 0)[:, Pt_block - Pt : Pt_block + R]
    return TurnBatch(**picked)

  return jax.jit(
    select,
    static_argnames=("Ps_block", "Ps", "R", "Pt_block", "Pt", "pad_id"),
    out_shardings=out_sharding,
  )


def global_minibatches(
  step_fn: Any,
  samples: Sequence[TurnSample],
  mini_batch_size: int,
  with_teacher: bool,
  pad_id: int = 0,
  order: str = "rollout",
  distill_weights: bool = False,
  rows: int | None = None,
) -> list[TurnBatch]:
  """The iteration's mini-batches placed on `step_fn`'s mesh: what `plan_minibatches` (in
  `order`, see `minibatch_permutation`) and `pack_batch` make of every process's turn-samples
  taken in process order (one process: of `samples`, the single-process code path).
  `distill_weights`: with the samples' `distill_weight` (`pack_batch`). `rows`: each mini-batch
  packed into this many rows (>= `mini_batch_size`; default `mini_batch_size`), the rest empty.

  Several processes: each packs its own samples at the iteration's widest lengths into its rows
  of one global block; every process computes the same plan from all processes' sample lengths
  (one exchange), and a jitted gather takes each mini-batch's rows out of the block, cut to the
  mini-batch's own bucketed lengths. The result equals the single-process mini-batch array for
  array, row for row; the samples themselves never leave the devices."""
  rows = max(int(rows or mini_batch_size), mini_batch_size)
  if jax.process_count() == 1 or step_fn.mesh is None:
    return [
      step_fn.shard_batch(pack_batch(mb, rows, with_teacher, pad_id, distill_weights))
      for mb in plan_minibatches(samples, mini_batch_size, order=order)
    ]
  per_process = multihost.allgather(sample_lengths(samples, with_teacher))
  everyone = np.concatenate(per_process)
  permutation = minibatch_permutation(everyone, order)  # every process computes the same one
  everyone = everyone[permutation]
  if not len(everyone):
    return []
  if with_teacher and not everyone[:, 2].all():
    raise ValueError(
      "The algorithm needs teacher log-probs but some samples have no teacher prompt; the rollout "
      "must build teacher prompts (AgentLoop(with_teacher=True))."
    )
  chunks = [
    (start, min(start + mini_batch_size, len(everyone)))
    for start in range(0, len(everyone), mini_batch_size)
  ]
  shapes = []
  for start, end in chunks:
    longest = everyone[start:end].max(axis=0)
    shapes.append(
      (
        prompt_bucket(int(longest[0])),
        new_tokens_bucket(int(longest[1])),
        prompt_bucket(int(longest[2])) if with_teacher else 0,
      )
    )
  Ps, R, Pt = (max(column) for column in zip(*shapes))

  out_sharding = sharding_lib.batch_sharding(step_fn.mesh, 1, step_fn.rules)
  counts = [len(part) for part in per_process]
  divisor = sharding_lib.batch_divisor(step_fn.mesh, step_fn.rules)
  block_rows = -(-jax.process_count() * max(counts) // divisor) * divisor
  owners = multihost.rows_by_process(out_sharding, (block_rows,))
  mine = owners[jax.process_index()]
  if len(mine) < max(counts):
    raise ValueError(
      f"a block of {block_rows} rows gives each process {len(mine)} rows, fewer than the "
      f"{max(counts)} turn-samples of the busiest process; the batch axes must split the rows "
      "evenly over the processes."
    )
  packed = (
    pack_batch(samples, len(mine), with_teacher, pad_id, distill_weights) if samples else None
  )
  local = _widen(packed, len(mine), Ps, R, Pt, pad_id, distill_weights)
  block = jax.tree.map(
    lambda x: multihost.put_rows(x, out_sharding, (block_rows,) + x.shape[1:]),
    local,
  )
  # Global sample g (process q's j-th) sits in block row owners[q][j].
  where = np.concatenate([owners[q][:n] for q, n in enumerate(counts)])[permutation]
  select = _select_fn(out_sharding)
  batches = []
  for (start, end), (ps, r, pt) in zip(chunks, shapes):
    index = np.full((rows,), -1, np.int32)
    index[: end - start] = where[start:end]
    batches.append(
      select(block, index, Ps_block=Ps, Ps=ps, R=r, Pt_block=Pt, Pt=pt, pad_id=int(pad_id))
    )
  return batches
