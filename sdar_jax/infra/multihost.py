"""Multi-process runs: JAX's multi-controller runtime, each process's share of an iteration, its
rows of the global arrays, and the small host-side exchanges between the processes.

`initialize` starts the runtime; `episode_share` is a process's contiguous share of whole GRPO
groups; `put_rows` / `get_rows` / `host_rows` move a process's rows into and out of a global
batch; `sum_over_processes`, `allgather`, `total` and `max_share_size` exchange small host values.
Requirements: every process has the same number of devices and each row of a batch lives on the
devices of one process (`process_rows` says what to change otherwise). With one process every
function is the identity or the single-process path and no collective runs. How a run spreads
tasks, samples, metrics and checkpoints over processes: docs/design.md, "Scale".
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

log = logging.getLogger(__name__)

_MIN_MESSAGE = 1024  # bytes: the smallest padded message of `allgather`

__all__ = [
  "allgather",
  "allgather_ints",
  "any_process",
  "episode_share",
  "fetch",
  "get_rows",
  "host_rows",
  "initialize",
  "is_multiprocess",
  "max_share_size",
  "process_rows",
  "put_rows",
  "rows_by_process",
  "sum_over_processes",
  "total",
]


# ------------------------------------------------------------------------------- start-up
def _cpu_only() -> bool:
  platforms = os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or ""
  return [p.strip() for p in platforms.split(",") if p.strip()] == ["cpu"]


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
) -> None:
  """Starts JAX's distributed runtime (before anything touches the devices). With no arguments
  JAX finds the job itself (TPU slices, SLURM, ...); `launch/local.sh -n N` passes all three. On
  CPU (JAX_PLATFORMS=cpu) the cross-process collectives are gloo's."""
  if num_processes is not None and num_processes < 1:
    raise ValueError(f"num_processes={num_processes}: use 1 or more processes.")
  if process_id is not None and num_processes is not None and not 0 <= process_id < num_processes:
    raise ValueError(
      f"process_id={process_id} is not in [0, num_processes={num_processes}). Fix: number the "
      "processes 0 .. num_processes - 1."
    )
  if _cpu_only():
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  kwargs = {
    "coordinator_address": coordinator_address,
    "num_processes": num_processes,
    "process_id": process_id,
    "coordinator_bind_address": loopback_bind_address(coordinator_address),
  }
  jax.distributed.initialize(**{k: v for k, v in kwargs.items() if v is not None})
  log.info(
    "process %d of %d: %d local device(s), %d in all",
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )


def loopback_bind_address(coordinator_address: str | None) -> str | None:
  """Where process 0's coordinator listens: the loopback address when the coordinator is named
  by a loopback host (processes of one machine, `launch/local.sh`), so that no other machine can
  reach it; None otherwise (JAX's default, every interface: the hosts of a pod must reach it)."""
  if not coordinator_address:
    return None
  host, _, port = coordinator_address.rpartition(":")
  if host.strip("[]") in ("localhost", "127.0.0.1", "::1"):
    return f"{'[::1]' if host.strip('[]') == '::1' else '127.0.0.1'}:{port}"
  return None


def is_multiprocess() -> bool:
  return jax.process_count() > 1


# ----------------------------------------------------------------------------------- shares
def episode_share(num_episodes: int, group_size: int = 1) -> slice:
  """This process's episodes among an iteration's `num_episodes` (groups of `group_size`
  consecutive episodes, never split): groups [p·n/P, (p+1)·n/P) of the n groups for process p of
  P, so the processes' shares follow each other in order. One process: all of them."""
  if group_size < 1 or num_episodes % group_size:
    raise ValueError(
      f"{num_episodes} episodes do not form whole groups of {group_size}. Fix: pass the "
      "episodes of whole GRPO groups."
    )
  groups, count, index = num_episodes // group_size, jax.process_count(), jax.process_index()
  return slice(index * groups // count * group_size, (index + 1) * groups // count * group_size)


def max_share_size(num_episodes: int, group_size: int = 1) -> int:
  """The most episodes any process's `episode_share` holds (the size of its env pool)."""
  groups, count = num_episodes // group_size, jax.process_count()
  return -(-groups // count) * group_size


# ------------------------------------------------------------------------- host exchanges
def allgather_ints(values: Sequence[int]) -> np.ndarray:
  """[processes, len(values)] int32: every process's `values`, in process order (one device
  all-gather; a collective)."""
  from jax.experimental import multihost_utils

  local = np.asarray(values, np.int32).reshape(-1)
  return np.asarray(multihost_utils.process_allgather(local)).reshape(jax.process_count(), -1)


def allgather(value: Any) -> list[Any]:
  """`value` of every process, in process order (pickled, through two device all-gathers): each
  process gets the same list. One process: [value]."""
  if jax.process_count() == 1:
    return [value]
  from jax.experimental import multihost_utils

  data = np.frombuffer(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  sizes = allgather_ints([data.size])[:, 0]
  # a power of two of bytes: the all-gather compiles once per size, not once per message
  padded = np.zeros(max(_MIN_MESSAGE, 1 << max(int(sizes.max()) - 1, 0).bit_length()), np.uint8)
  padded[: data.size] = data
  everyone = np.asarray(multihost_utils.process_allgather(padded))
  return [pickle.loads(everyone[i, : int(n)].tobytes()) for i, n in enumerate(sizes)]


def sync(name: str) -> None:
  """Waits until every process reaches this point (nothing with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)


def any_process(flag: bool) -> bool:
  """Whether `flag` holds on any process (a collective: every process must ask)."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(allgather_ints([int(bool(flag))]).any())


def sum_over_processes(values: Sequence[float]) -> list[float]:
  """The element-wise sums of every process's `values` (float64 on the host); one process:
  `values` as floats."""
  if jax.process_count() == 1:
    return [float(v) for v in values]
  parts = allgather([float(v) for v in values])
  return [float(sum(column)) for column in zip(*parts)]


# ------------------------------------------------------------------------ rows of a batch
@functools.lru_cache(maxsize=256)
def rows_by_process(sharding: NamedSharding, shape: tuple[int, ...]) -> tuple[np.ndarray, ...]:
  """For an array of `shape` placed with `sharding`: the indices of the rows (first dimension)
  held by each process's devices, ascending, one array per process. Raises when a row is held
  by two processes (the batch is not sharded over the processes) or the processes hold
  different numbers of rows."""
  shape = tuple(int(s) for s in shape)
  owner = np.full(shape[0], -1, np.int64)
  all_rows = np.arange(shape[0])
  for device, index in sharding.devices_indices_map(shape).items():
    rows = all_rows[index[0]]
    clash = (owner[rows] >= 0) & (owner[rows] != device.process_index)
    if clash.any():
      raise ValueError(
        f"a batch of {shape[0]} rows placed as {sharding.spec} on mesh "
        f"{dict(sharding.mesh.shape)} puts row {int(rows[clash][0])} on two processes: in a "
        f"multi-process run ({jax.process_count()} processes) each row must live on one "
        "process. Fix: shard the batch over the processes: make mesh.data x mesh.fsdp a multiple "
        "of the process count, with the axes inside one process (tensor) last."
      )
    owner[rows] = device.process_index
  per_process = tuple(np.flatnonzero(owner == p) for p in range(jax.process_count()))
  if len({len(rows) for rows in per_process}) != 1:
    raise ValueError(
      f"a batch of {shape[0]} rows placed as {sharding.spec} on mesh {dict(sharding.mesh.shape)} "
      f"gives the processes {[len(r) for r in per_process]} rows: every process needs the same "
      "number. Fix: give every process the same number of devices and a batch that divides over "
      "mesh.data x mesh.fsdp."
    )
  return per_process


def process_rows(sharding: NamedSharding, shape: tuple[int, ...]) -> np.ndarray:
  """The rows of an array of `shape` placed with `sharding` that this process's devices hold
  (ascending); see `rows_by_process`."""
  return rows_by_process(sharding, tuple(shape))[jax.process_index()]


def put_rows(local: np.ndarray, sharding: NamedSharding, shape: tuple[int, ...]) -> jax.Array:
  """The global array of `shape` whose rows `process_rows(sharding, shape)` are `local`, in
  order, on every process (a collective: every process passes its own rows)."""
  shape = tuple(int(s) for s in shape)
  rows = process_rows(sharding, shape)
  local = np.asarray(local)
  if local.shape != (len(rows),) + shape[1:]:
    raise ValueError(
      f"this process holds {len(rows)} rows of the {shape} array, got local data of shape "
      f"{local.shape}; pass shape {(len(rows),) + shape[1:]}."
    )

  def piece(index):
    wanted = np.arange(shape[0])[index[0]]
    return local[np.searchsorted(rows, wanted)][(slice(None),) + tuple(index[1:])]

  return jax.make_array_from_callback(shape, sharding, piece)


def get_rows(x: jax.Array, rows: np.ndarray | None = None) -> np.ndarray:
  """Rows `rows` (default: this process's rows of `x`'s own sharding) of the global array `x`, as
  a host array, read from this process's shards only."""
  rows = process_rows(x.sharding, x.shape) if rows is None else np.asarray(rows)
  out = np.zeros((len(rows),) + tuple(x.shape[1:]), x.dtype)
  covered = np.zeros(out.shape, bool)
  all_rows = np.arange(x.shape[0])
  for shard in x.addressable_shards:
    shard_rows = all_rows[shard.index[0]]
    hit = np.isin(shard_rows, rows)
    if not hit.any():
      continue
    at = np.searchsorted(rows, shard_rows[hit])
    data = np.asarray(shard.data)[hit]
    out[(at,) + tuple(shard.index[1:])] = data
    covered[(at,) + tuple(shard.index[1:])] = True
  if not covered.all():
    raise ValueError(
      f"this process's devices do not hold all of rows {rows.tolist()} of an array of shape "
      f"{x.shape} placed as {x.sharding}."
    )
  return out


def fetch(x: Any) -> np.ndarray:
  """All of a (global) array on the host; an array spread over several processes is gathered
  (a collective: every process must fetch it)."""
  if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
    return np.asarray(x)
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def host_rows(x: Any) -> np.ndarray:
  """A batch array on the host: all of it with one process, this process's rows otherwise (sum
  what is computed from them with `sum_over_processes`)."""
  if jax.process_count() == 1 or not isinstance(x, jax.Array) or x.is_fully_addressable:
    return np.asarray(x)
  return get_rows(x)


def total(x: Any) -> float:
  """The sum of all entries of a (global) array, e.g. a mini-batch's response tokens."""
  if jax.process_count() == 1:
    return float(np.asarray(x).sum())
  return sum_over_processes([host_rows(x).sum(dtype=np.float64)])[0]
