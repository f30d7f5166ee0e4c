"""The TPU slices the planner knows: each generation's chip (HBM, the part of it XLA lets one
program use, peak bf16 FLOP/s, libtpu's spelling, megacore or not), the chip grid of each slice
size, a slice by its Cloud TPU name (`parse_topology`), and its chips as compile-only devices
(`topology_devices`, which needs libtpu but no TPU). Used by `sdar_jax.run.tpu_plan`; no
compilation and no model here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from typing import Any

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation: per-chip HBM (Google Cloud's published figure, and what XLA's TPU
  compiler lets a program use, read from its out-of-memory message: the budget a plan must fit),
  peak dense bf16 FLOP/s, how libtpu spells its topologies, and whether a slice name counts
  TensorCores (v4 and v5p: two per chip, run as one "megacore" device) or chips (v5e, v6e)."""

  name: str
  hbm_gib: float
  usable_hbm_gib: float
  peak_bf16_tflops: float
  topology_prefix: str
  megacore: bool

  @property
  def hbm_bytes(self) -> int:
    """The budget: the HBM XLA lets one program use."""
    return int(self.usable_hbm_gib * GiB)


CHIPS: dict[str, Chip] = {
  "v4": Chip("v4", 32, 30.75, 275, "v4", megacore=True),
  "v5e": Chip("v5e", 16, 15.75, 197, "v5e", megacore=False),
  "v5p": Chip("v5p", 95, 95.74, 459, "v5", megacore=True),
  "v6e": Chip("v6e", 32, 31.25, 918, "v6e", megacore=False),
}

# Chip grid of each slice size (v4 / v5p: 3-D torus of chips; v5e / v6e: 2-D).
_GRIDS_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4)}
_GRIDS_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16)}


@dataclasses.dataclass(frozen=True)
class Slice:
  """A TPU slice: its name (e.g. "v5e-16"), chip generation and chip grid."""

  name: str
  chip: Chip
  grid: tuple[int, ...]

  @property
  def num_chips(self) -> int:
    return math.prod(self.grid)

  @property
  def topology_name(self) -> str:
    """libtpu's spelling, e.g. "v5e:4x4" or "v5:2x2x1"."""
    return f"{self.chip.topology_prefix}:{'x'.join(map(str, self.grid))}"

  @property
  def host_bounds(self) -> tuple[int, int, int]:
    """Chips per host: 2x2, the whole slice when it is smaller, 2x4 on single-host v5e-8 /
    v6e-8."""
    if self.grid == (2, 4):
      return (2, 4, 1)
    return (min(self.grid[0], 2), min(self.grid[1], 2), 1)

  def describe(self) -> str:
    return (
      f"{self.name}: {self.num_chips} x TPU {self.chip.name} ({self.topology_name}), "
      f"{self.chip.hbm_gib:g} GiB HBM ({self.chip.usable_hbm_gib:g} GiB usable by XLA) and "
      f"{self.chip.peak_bf16_tflops:g} bf16 TFLOP/s per chip"
    )


def known_slices() -> list[str]:
  names = []
  for chip in CHIPS.values():
    grids = _GRIDS_3D if chip.megacore else _GRIDS_2D
    names += [f"{chip.name}-{n * 2 if chip.megacore else n}" for n in grids]
  return names


def parse_topology(name: str) -> Slice:
  """A slice by its Cloud TPU name: "v5e-16", "v5p-8", "v6e-8", "v4-8", ... (v4 / v5p count
  TensorCores, two per chip; v5e / v6e count chips)."""
  generation, _, size = name.strip().lower().partition("-")
  chip = CHIPS.get(generation)
  grids = None if chip is None else (_GRIDS_3D if chip.megacore else _GRIDS_2D)
  count = int(size) if size.isdigit() else -1
  if chip is not None and chip.megacore and count % 2 == 0:
    count //= 2
  if grids is None or count not in grids:
    raise ValueError(
      f"--topology={name!r} is not a TPU slice this planner knows. Fix: use one of "
      f"{known_slices()}."
    )
  return Slice(name.strip().lower(), chip, grids[count])


def topology_devices(tpu_slice: Slice) -> list[Any]:
  """The slice's chips as compile-only devices (needs libtpu; no TPU has to be attached)."""
  if importlib.util.find_spec("libtpu") is None:
    raise RuntimeError(
      "Compiling for a TPU slice without a TPU needs libtpu. Fix: pip install -e '.[tpu-plan]' "
      "(or `make test-tpu-plan`)."
    )
  from jax.experimental import topologies

  # libtpu takes a machine-wide lock on load, meant for processes that drive the chips; compiling
  # for a described slice drives none, so several planners (and a test's subprocess) may load it.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  desc = topologies.get_topology_desc(
    tpu_slice.topology_name,
    "tpu",
    chip_config_name="megacore" if tpu_slice.chip.megacore else "default",
    chips_per_host_bounds=tpu_slice.host_bounds,
    num_slices=1,
    wrap=(False, False, False),
  )
  devices = list(desc.devices)
  if len(devices) != tpu_slice.num_chips:
    raise RuntimeError(
      f"libtpu described {tpu_slice.topology_name} as {len(devices)} devices, expected "
      f"{tpu_slice.num_chips} chips."
    )
  return devices
