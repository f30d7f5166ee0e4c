"""Device mesh, logical-axis rules and parameter placement.

Every parameter carries logical axis names (models/qwen.py `param_specs`); a rules table maps each
logical name to mesh axes of the ('data', 'fsdp', 'tensor') mesh. The table is data: sweep or
override it from a config. Two guarantees:

* collisions are errors: a rule set that would put one mesh axis on two dimensions of the same
  array is refused with the parameter and axes named;
* a mapping that does not divide (14 heads on tensor=4) replicates that dimension with a warning
  instead of failing, so any model runs on any mesh.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sdar_jax.models.config import ModelConfig
from sdar_jax.models.qwen import ParamSpec, param_specs

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of mesh axes, or None = replicated)
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
  ("batch", ("data", "fsdp")),
  ("vocab", "tensor"),
  ("embed", "fsdp"),
  ("q_heads", "tensor"),
  ("kv_heads", "tensor"),
  ("mlp", "tensor"),
  ("head_dim", None),
  ("layers", None),
  ("norm", None),
  ("length", None),
)

Rules = Sequence[tuple[str, Any]]


def make_mesh(shape: Mapping[str, int] | Sequence[int] | None = None, devices=None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh. `shape` is a dict or a 3-tuple; one entry may be -1 (fill
  with the remaining devices). Built with `jax.sharding.Mesh` (auto axes), so jit propagates
  shardings without explicit-axis annotations."""
  devices = list(jax.devices() if devices is None else devices)
  if shape is None:
    shape = (len(devices), 1, 1)
  if isinstance(shape, Mapping):
    unknown = set(shape) - set(MESH_AXES)
    if unknown:
      raise ValueError(f"Unknown mesh axes {sorted(unknown)}; the mesh axes are {MESH_AXES}.")
    shape = tuple(int(shape.get(a, 1)) for a in MESH_AXES)
  shape = list(int(s) for s in shape)
  if len(shape) != 3:
    raise ValueError(f"Mesh shape {shape} must have 3 entries for axes {MESH_AXES}.")
  if shape.count(-1) > 1:
    raise ValueError(f"Mesh shape {shape}: at most one axis may be -1.")
  if -1 in shape:
    rest = math.prod(s for s in shape if s != -1)
    if len(devices) % rest:
      raise ValueError(f"Mesh shape {shape} cannot be filled from {len(devices)} devices.")
    shape[shape.index(-1)] = len(devices) // rest
  if math.prod(shape) != len(devices):
    raise ValueError(
      f"Mesh shape {dict(zip(MESH_AXES, shape))} needs {math.prod(shape)} devices but "
      f"{len(devices)} are available; make the product of the mesh axes equal the device count "
      f"(or use -1 for one axis)."
    )
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def _rules_dict(rules: Rules | None) -> dict[str, tuple[str, ...]]:
  rules = DEFAULT_RULES if rules is None else rules
  table: dict[str, tuple[str, ...]] = {}
  for name, target in rules:
    if name in table:
      raise ValueError(f"Sharding rules map logical axis {name!r} twice; keep one entry per axis.")
    if target is None:
      targets: tuple[str, ...] = ()
    elif isinstance(target, str):
      targets = (target,)
    else:
      targets = tuple(target)
    bad = [t for t in targets if t not in MESH_AXES]
    if bad:
      raise ValueError(
        f"Sharding rule {name!r} -> {target!r} names unknown mesh axes {bad}; "
        f"mesh axes are {MESH_AXES}."
      )
    table[name] = targets
  return table


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
  """Placement is recomputed for every jit and checkpoint restore; say each fallback once."""
  if message not in _WARNED:
    _WARNED.add(message)
    warnings.warn(message, stacklevel=3)


def logical_to_spec(
  axes: Iterable[str | None],
  shape: Sequence[int],
  mesh: Mesh,
  rules: Rules | None = None,
  name: str = "array",
) -> P:
  """PartitionSpec for an array with logical `axes`; non-dividing dimensions are replicated (with
  a warning), and a mesh axis used by two dimensions is a collision error."""
  table = _rules_dict(rules)
  axes = tuple(axes)
  if len(axes) != len(shape):
    raise ValueError(
      f"{name}: {len(axes)} logical axes {axes} for a {len(shape)}-d shape {tuple(shape)}."
    )
  used: dict[str, str] = {}
  spec = []
  for logical, dim in zip(axes, shape):
    targets = table.get(logical, ()) if logical is not None else ()
    if logical is not None and logical not in table:
      raise ValueError(
        f"{name}: logical axis {logical!r} has no sharding rule; add it to the rules "
        f"table (known: {sorted(table)})."
      )
    for t in targets:
      if t in used:
        raise ValueError(
          f"Sharding rule collision in {name}: mesh axis {t!r} would shard both {used[t]!r} and "
          f"{logical!r}. Map one of them to another mesh axis or to None."
        )
      used[t] = logical
    targets = tuple(t for t in targets if mesh.shape[t] > 1)
    size = math.prod(mesh.shape[t] for t in targets)
    if targets and dim % size:
      _warn_once(
        f"{name}: dimension {logical!r} of size {dim} does not divide over mesh axes {targets} "
        f"(size {size}); replicating it instead."
      )
      targets = ()
    spec.append(None if not targets else targets[0] if len(targets) == 1 else targets)
  return P(*spec)


def param_shardings(config: ModelConfig, mesh: Mesh, rules: Rules | None = None) -> dict[str, Any]:
  """NamedSharding per parameter (same tree as the params)."""
  specs = param_specs(config)

  def one(path, spec: ParamSpec):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    return NamedSharding(mesh, logical_to_spec(spec.axes, spec.shape, mesh, rules, name))

  return jax.tree_util.tree_map_with_path(one, specs, is_leaf=lambda x: isinstance(x, ParamSpec))


def shard_params(params, config: ModelConfig, mesh: Mesh, rules: Rules | None = None):
  """Places (or re-places) a parameter tree onto the mesh."""
  return jax.device_put(params, param_shardings(config, mesh, rules))


def batch_sharding(mesh: Mesh, ndim: int = 2, rules: Rules | None = None) -> NamedSharding:
  """Sharding of a [batch, ...] array: batch over the 'batch' rule's mesh axes, rest replicated."""
  targets = tuple(t for t in _rules_dict(rules).get("batch", ()) if mesh.shape[t] > 1)
  lead = None if not targets else targets[0] if len(targets) == 1 else targets
  return NamedSharding(mesh, P(lead, *([None] * (ndim - 1))))


def batch_divisor(mesh: Mesh, rules: Rules | None = None) -> int:
  """The batch size must be a multiple of this to shard over the mesh's batch axes."""
  return math.prod(mesh.shape[t] for t in _rules_dict(rules).get("batch", ()))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
