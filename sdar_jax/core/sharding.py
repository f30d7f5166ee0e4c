"""Device mesh, logical-axis rules and the placement of parameters and batches.

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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from sdar_jax.models.attention import attention_implementation
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


MeshShape = Mapping[str, int] | Sequence[int]


def resolve_mesh_shape(shape: MeshShape, num_devices: int) -> dict[str, int]:
  """The size of each mesh axis for `num_devices` devices. `shape` is a dict or config section (a
  missing axis is 1) or a 3-tuple in MESH_AXES order; one entry may be -1 (all the remaining
  devices). Raises a ValueError naming the shape and the fix."""
  if hasattr(shape, "keys"):  # a dict or a config section
    unknown = sorted(set(shape.keys()) - set(MESH_AXES))
    if unknown:
      raise ValueError(f"Unknown mesh axes {unknown}. Fix: use only {MESH_AXES}.")
    sizes = {axis: int(shape[axis]) if axis in shape else 1 for axis in MESH_AXES}
  else:
    if len(shape) != len(MESH_AXES):
      raise ValueError(
        f"Mesh shape {tuple(shape)} has {len(shape)} entries. Fix: give one size per axis of "
        f"{MESH_AXES}."
      )
    sizes = {axis: int(size) for axis, size in zip(MESH_AXES, shape)}
  bad = {axis: size for axis, size in sizes.items() if size == 0 or size < -1}
  if bad:
    raise ValueError(
      f"mesh {bad}: axis sizes must be >= 1 (or -1 for all remaining devices). "
      "Fix: set them to positive sizes."
    )
  free = [axis for axis, size in sizes.items() if size == -1]
  if len(free) > 1:
    raise ValueError(f"mesh {sizes}: only one axis may be -1 (got {free}). Fix: size the others.")
  fixed = math.prod(size for size in sizes.values() if size != -1)
  if free:
    if num_devices % fixed:
      raise ValueError(
        f"mesh {sizes}: the fixed axes need a multiple of {fixed} devices but {num_devices} are "
        f"available. Fix: choose axis sizes whose product divides {num_devices}."
      )
    sizes[free[0]] = num_devices // fixed
  elif fixed != num_devices:
    raise ValueError(
      f"mesh {sizes}: the product of the axes is {fixed}, so it needs {fixed} devices but "
      f"{num_devices} devices are available. Fix: make data x fsdp x tensor = {num_devices}, or "
      "set one axis to -1."
    )
  return sizes


def make_mesh(shape: MeshShape | None = None, devices=None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh over `devices` (default: all), of `shape` as
  `resolve_mesh_shape` reads it (default: every device on 'data'). Built with `jax.sharding.Mesh`
  (auto axes), so jit propagates shardings without explicit-axis annotations."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = resolve_mesh_shape((-1, 1, 1) if shape is None else shape, len(devices))
  return Mesh(np.asarray(devices).reshape(tuple(sizes.values())), MESH_AXES)


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


def batch_divisor(mesh: Mesh | Mapping[str, int], rules: Rules | None = None) -> int:
  """How many shards the batch dimension is split into (the product of the 'batch' rule's mesh
  axes): a batch must be a multiple of it. `mesh` is a Mesh or its axis sizes."""
  sizes = mesh.shape if isinstance(mesh, Mesh) else mesh
  return math.prod(int(sizes[axis]) for axis in _rules_dict(rules).get("batch", ()))


def replicated(mesh: Mesh) -> NamedSharding:
  """The sharding of an array every device holds whole."""
  return NamedSharding(mesh, P())


class _WithMesh:
  """A jitted function whose calls and `lower` run with `mesh` in context (`jax.set_mesh`)."""

  def __init__(self, fn: Any, mesh: Mesh):
    self._fn = fn
    self._mesh = mesh

  def __call__(self, *args, **kwargs):
    with jax.set_mesh(self._mesh):
      return self._fn(*args, **kwargs)

  def lower(self, *args, **kwargs):
    with jax.set_mesh(self._mesh):
      return self._fn.lower(*args, **kwargs)

  def __getattr__(self, name: str):
    return getattr(self._fn, name)


def with_kernel_mesh(fn: Any, mesh: Mesh | None, config: ModelConfig) -> Any:
  """`fn` (a jitted function of `config`'s model), traced with `mesh` in context when the model's
  attention may run a Pallas kernel ("splash", or "auto" on TPU): XLA cannot partition a Pallas
  call, so the kernel runs under `shard_map` over the mesh it finds there. Unchanged otherwise
  (and without a mesh or with one device)."""
  if mesh is None or mesh.size == 1:
    return fn
  if attention_implementation(config, length=1) != "splash":
    return fn
  return _WithMesh(fn, mesh)


def set_kernel_mesh(mesh: Mesh | None, config: ModelConfig) -> bool:
  """Puts `mesh` in context for the rest of this thread (`jax.set_mesh`) when `config`'s
  attention runs a Pallas kernel on several devices (see `with_kernel_mesh`), so that every
  jitted function of the model finds it, those outside TrainStep and Sampler included (warm
  start, diagnostics). Returns whether it did; does nothing otherwise."""
  if with_kernel_mesh(_identity, mesh, config) is _identity:
    return False
  jax.set_mesh(mesh)
  return True


def _identity(x):
  return x
