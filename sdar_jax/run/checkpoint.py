"""Checkpoints: the TrainState (params, optimizer state, step) plus JSON metadata, via orbax.

`CheckpointManager(directory)` saves `<directory>/<step>/` (``state``: the pytree, written shard
by shard; ``meta``: model config, run config, version, step; ``extra``: the trainer's host-side
state) atomically, keeps the last `keep`, and restores onto any mesh from an abstract TrainState
(`abstract_train_state`), after comparing the stored model config with the run's; `restore_params`
reads the parameters alone and a `read_only` manager never writes. `export_hf` writes the final
policy as a Hugging Face folder. Every process of a multi-process run calls `save` and `restore`;
`<directory>` may be local or gs://. The layout, atomicity and restore rules: docs/design.md,
"Checkpoints".
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import Mesh

import sdar_jax
from sdar_jax.core import sharding as sharding_lib
from sdar_jax.core.train_state import TrainState, init_train_state, train_state_shardings
from sdar_jax.infra import paths
from sdar_jax.infra.errors import UserError
from sdar_jax.models import ModelConfig, param_shapes, save_pretrained
from sdar_jax.models.hf_io import NonFiniteWeightsError, first_non_finite

__all__ = [
  "ARCH_FIELDS",
  "CheckpointManager",
  "abstract_train_state",
  "export_hf",
  "model_config_mismatches",
]

# ModelConfig fields a checkpoint may differ in: they change numerics or memory, not what the
# weights mean.
NON_ARCH_FIELDS = ("max_position_embeddings", "dtype", "param_dtype", "remat", "name")
NON_ARCH_FIELDS += ("attention", "attention_block")  # how attention is computed, not what
NON_ARCH_FIELDS += ("layer_loop",)  # how the layers are looped over, not what they compute
# Every other field changes the function the parameters compute (or their shapes): a checkpoint
# written for other values of any of them is a different model.
ARCH_FIELDS = tuple(
  f.name for f in dataclasses.fields(ModelConfig) if f.name not in NON_ARCH_FIELDS
)

_ITEMS = ("state", "meta", "extra")


class _DropReadOnlyNotice(logging.Filter):
  """Orbax warns "Given directory is read only" for every read-only manager: what we asked for."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Given directory is read only")


_READ_ONLY_NOTICE = _DropReadOnlyNotice()

# How TensorStore words the OS errors a write can meet (in a ValueError: "... No space left on
# device [os_error_code='28']"), by errno.
_WRITE_ERRNOS = {
  errno.ENOSPC: ("No space left on device", "os_error_code='28'"),
  errno.EDQUOT: ("Disk quota exceeded", "os_error_code='122'"),
  errno.EACCES: ("Permission denied", "os_error_code='13'"),
  errno.EROFS: ("Read-only file system", "os_error_code='30'"),
}
_WRITE_FIX = {
  errno.ENOSPC: "free space on that disk, or point --workdir (or checkpoint.dir) at a disk with room",
  errno.EDQUOT: "free space within your quota, or point --workdir (or checkpoint.dir) elsewhere",
  errno.EACCES: "fix the folder's rights, or point --workdir (or checkpoint.dir) elsewhere",
  errno.EROFS: "point --workdir (or checkpoint.dir) at a writable disk",
}


class CheckpointWriteError(UserError, OSError):
  """A checkpoint that could not be written: a full disk, an exhausted quota, missing rights."""

  heading = "Checkpoint not written"

  def __str__(self) -> str:
    return str(self.strerror)


def write_errno(err: BaseException) -> int | None:
  """The errno of a failed checkpoint write when it is the user's to fix (an `OSError` with it,
  or TensorStore's ValueError naming it, anywhere in the exception's chain); else None."""
  seen = set()
  while err is not None and id(err) not in seen:
    seen.add(id(err))
    if isinstance(err, OSError) and err.errno in _WRITE_ERRNOS:
      return err.errno
    text = str(err)
    for code, marks in _WRITE_ERRNOS.items():
      if any(mark in text for mark in marks):
        return code
    err = err.__cause__ or err.__context__
  return None


class _QuietWriteFailures(logging.Filter):
  """A checkpoint write that fails for a user's reason (a full disk) is logged by each of
  orbax's writer threads, with its traceback (hundreds of lines), before the save raises it in
  the run's thread: the `CheckpointWriteError` says it once, so those records are dropped."""

  def filter(self, record: logging.LogRecord) -> bool:
    try:
      message = record.getMessage()
    except Exception:  # noqa: BLE001 - a malformed record: keep it
      return True
    return not any(mark in message for marks in _WRITE_ERRNOS.values() for mark in marks)


_QUIET = _QuietWriteFailures()


# What TensorStore's leftover writes print after one of them failed (see below).
_NOISE_TEXTS = (
  "Event loop is closed",
  "sys.meta_path is None, Python is likely shutting down",
)


@contextlib.contextmanager
def _quiet_failed_write_noise() -> Any:
  """While a save runs: when one of its writes fails (a full disk), TensorStore's other pending
  writes report into the writer's closed event loop, each printing a traceback ("Event loop is
  closed", and at interpreter exit "sys.meta_path is None"). Hooks that drop exactly those
  reports; left in place when the save failed (the run stops), removed after a good save."""
  previous_unraisable, previous_except = sys.unraisablehook, sys.excepthook

  def unraisable(info):
    if str(info.exc_value) not in _NOISE_TEXTS:
      previous_unraisable(info)

  def excepthook(kind, value, tb):
    if not (issubclass(kind, (RuntimeError, ImportError)) and str(value) in _NOISE_TEXTS):
      previous_except(kind, value, tb)

  sys.unraisablehook, sys.excepthook = unraisable, excepthook
  yield
  if sys.unraisablehook is unraisable and sys.excepthook is excepthook:
    sys.unraisablehook, sys.excepthook = previous_unraisable, previous_except


def _write_failure(
  err: BaseException, directory: str, step: int | None
) -> CheckpointWriteError | None:
  code = write_errno(err)
  if code is None:
    return None
  free = ""
  if not paths.is_remote(directory):
    probe = directory
    while probe and not os.path.exists(probe):
      probe = os.path.dirname(probe)
    with contextlib.suppress(OSError):
      stats = os.statvfs(probe)
      free = f"; {stats.f_bavail * stats.f_frsize / 2**20:.1f} MiB free there"
  reason = _WRITE_ERRNOS[code][0]
  return CheckpointWriteError(
    code,
    f"{'the pending checkpoint' if step is None else f'checkpoint {step}'} could not be written to {directory} ({reason}{free}). The run stopped; "
    f"the checkpoints written before it are intact and the run resumes from the latest. Fix: "
    f"{_WRITE_FIX[code]}, then run the same command again.",
  )


def model_config_mismatches(
  stored: Mapping[str, Any], expected: ModelConfig | Mapping[str, Any]
) -> list[tuple[str, Any, Any]]:
  """(field, stored value, expected value) for every architecture field that differs."""
  if isinstance(expected, ModelConfig):
    expected = dataclasses.asdict(expected)
  return [
    (f, stored.get(f), expected.get(f)) for f in ARCH_FIELDS if stored.get(f) != expected.get(f)
  ]


# The TrainState fields of every checkpoint (`ema_params` came later, see `CheckpointManager.restore`)
_BASE_FIELDS = ("step", "params", "opt_state", "skipped_updates")


def _without_ema(state: Any) -> Any:
  """A TrainState without an EMA as the dict of the fields every checkpoint holds, so it is stored
  and read exactly as before `ema_params` existed; anything else as it is."""
  if isinstance(state, TrainState) and state.ema_params is None:
    return {f: getattr(state, f) for f in _BASE_FIELDS}
  return state


def abstract_train_state(
  model_config: ModelConfig,
  optimizer: optax.GradientTransformation,
  mesh: Mesh,
  rules=None,
  ema: bool = False,
) -> TrainState:
  """The TrainState as `jax.ShapeDtypeStruct`s with shardings on `mesh` (no memory allocated):
  the restore target for `CheckpointManager.restore`, or the out_shardings of an init. `ema`: with
  the EMA teacher's params (algo.teacher_weights="ema")."""
  abstract = jax.eval_shape(lambda: init_train_state(model_config, optimizer, 0, ema))
  shardings = train_state_shardings(model_config, optimizer, mesh, rules, ema)
  return jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )


def _as_abstract(target: Any) -> Any:
  """Concrete arrays -> ShapeDtypeStructs with their sharding (a restore target)."""

  def one(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return x
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))

  return jax.tree.map(one, target)


def _json_safe(value: Any, what: str) -> Any:
  try:
    return json.loads(json.dumps(value))
  except (TypeError, ValueError) as e:
    raise TypeError(
      f"checkpoint {what} must be JSON-serialisable (dicts, lists, str, numbers, bools, None): {e}"
    ) from None


class CheckpointUnreadableError(UserError):
  """A checkpoint whose files cannot be read (truncated, partly deleted): the message names the
  step, what failed and the fix."""

  heading = "Unreadable checkpoint"


# What the storage layer says of files that are truncated, missing or corrupt (TensorStore's
# status codes, orbax's missing item), as opposed to a checkpoint of another model or optimizer.
_UNREADABLE_MARKS = (
  "OUT_OF_RANGE", "DATA_LOSS", "FAILED_PRECONDITION", "NOT_FOUND", "Truncated",
  "was not found in the checkpoint", "No such file", "Unexpected end",
)  # fmt: skip


def unreadable_reason(error: BaseException) -> str | None:
  """The first line of what made a checkpoint's files unreadable, from `error` or the errors it
  was raised from; None for any other failure (a checkpoint of another model, a bug)."""
  seen: set[int] = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    text = str(error).strip().strip("'\"")
    if isinstance(error, (FileNotFoundError, json.JSONDecodeError)) or any(
      mark in text for mark in _UNREADABLE_MARKS
    ):
      return (text.splitlines() or [type(error).__name__])[0][:300]
    error = error.__cause__ or error.__context__
  return None


class CheckpointManager:
  """Keep-N, optionally asynchronous, atomic checkpoints of a TrainState and its metadata.

  ckpt = CheckpointManager(workdir / "checkpoints", keep=3, save_interval_steps=10)
  ckpt.save(step, state, model_config, run_config=config, extra={"replay": ...})
  state, meta = ckpt.restore(target=abstract_train_state(model_config, optimizer, mesh),
                             model_config=model_config)
  """

  def __init__(
    self,
    directory: str | os.PathLike,
    keep: int | None = 3,
    save_interval_steps: int = 1,
    async_save: bool = False,
    create: bool = True,
    read_only: bool = False,
  ):
    """read_only: only list and restore (an evaluation reading a run's checkpoints): nothing is
    created, cleaned up or deleted in `directory`, and `save` is refused."""
    if keep is not None and keep < 1:
      raise ValueError(f"checkpoint keep={keep}: keep at least 1 checkpoint (or None for all).")
    if save_interval_steps < 1:
      raise ValueError(f"checkpoint save_interval_steps={save_interval_steps} must be >= 1.")
    # A URL (gs://...) stays a URL: orbax reaches it through epath and TensorStore.
    self.directory = paths.resolve(directory)
    self.read_only = read_only
    logging.getLogger("absl").addFilter(_QUIET)  # idempotent
    if read_only:
      logging.getLogger("absl").addFilter(_READ_ONLY_NOTICE)  # idempotent
      options = ocp.CheckpointManagerOptions(
        read_only=True,
        max_to_keep=None,
        save_interval_steps=0,
        create=False,
        cleanup_tmp_directories=False,
      )
    else:
      options = ocp.CheckpointManagerOptions(
        max_to_keep=keep,
        save_interval_steps=save_interval_steps,
        enable_async_checkpointing=async_save,
        create=create,
        cleanup_tmp_directories=True,
      )
    self._manager = ocp.CheckpointManager(
      epath.Path(self.directory), item_names=_ITEMS, options=options
    )

  # ------------------------------------------------------------------------------------ save
  def save(
    self,
    step: int,
    state: TrainState,
    model_config: ModelConfig,
    run_config: Any = None,
    extra: Mapping[str, Any] | None = None,
    force: bool = False,
  ) -> bool:
    """Saves `state` as checkpoint `step` unless the save interval skips it (`force` overrides).
    `run_config`: a ConfigDict (stored with `to_dict()`) or a dict. `extra`: JSON-able host state.
    Returns whether a save was started (with async_save it finishes in the background)."""
    if self.read_only:
      raise PermissionError(f"CheckpointManager({self.directory}) is read-only: nothing is saved.")
    step = int(step)
    if run_config is not None and hasattr(run_config, "to_dict"):
      run_config = run_config.to_dict()
    meta = {
      "model_config": dataclasses.asdict(model_config),
      "run_config": _json_safe(run_config, "run_config"),
      "sdar_jax_version": sdar_jax.__version__,
      "step": step,
      "saved_at_unix": time.time(),
    }
    args = ocp.args.Composite(
      state=ocp.args.StandardSave(_without_ema(state)),
      meta=ocp.args.JsonSave(meta),
      extra=ocp.args.JsonSave(_json_safe(dict(extra or {}), "extra")),
    )
    try:
      with _quiet_failed_write_noise():
        return bool(self._manager.save(step, args=args, force=force))
    except Exception as err:
      failure = _write_failure(err, self.directory, step)
      if failure is None:
        raise
      raise failure from err

  # ------------------------------------------------------------------------------------ query
  def all_steps(self) -> list[int]:
    """Steps of the complete checkpoints on disk, ascending (unfinished tmp saves excluded)."""
    self._manager.reload()
    return sorted(int(s) for s in self._manager.all_steps())

  def latest_step(self) -> int | None:
    steps = self.all_steps()
    return steps[-1] if steps else None

  def _resolve_step(self, step: int | None) -> int:
    steps = self.all_steps()
    if step is None:
      if not steps:
        raise FileNotFoundError(f"No checkpoint in {self.directory}: nothing to restore.")
      return steps[-1]
    if int(step) not in steps:
      raise FileNotFoundError(
        f"No checkpoint for step {step} in {self.directory}; available steps: {steps}."
      )
    return int(step)

  def restore_meta(self, step: int | None = None) -> dict[str, Any]:
    """The metadata of checkpoint `step` (default: latest) with its `extra` dict under "extra";
    reads no arrays."""
    step = self._resolve_step(step)
    out = self._manager.restore(
      step, args=ocp.args.Composite(meta=ocp.args.JsonRestore(), extra=ocp.args.JsonRestore())
    )
    meta = dict(out["meta"])
    meta["extra"] = dict(out["extra"] or {})
    return meta

  # ------------------------------------------------------------------------------------ restore
  def restore(
    self, step: int | None = None, target: Any = None, model_config: ModelConfig | None = None
  ) -> tuple[Any, dict[str, Any]]:
    """Restores checkpoint `step` (default: the latest). Returns (state, meta).

    target: an (abstract) TrainState; every array is read directly into the target's sharding, so
      the checkpoint may come from any mesh shape. Without a target the state comes back as nested
      dicts of arrays on the default device (for inspection, not for training).
    model_config: when given, the stored model config must describe the same architecture, else a
      ValueError lists the differing fields before any array is read.
    """
    step = self._resolve_step(step)
    meta = self.restore_meta(step)
    if model_config is not None:
      self._check_model(meta, model_config, step)
    if target is not None and getattr(target, "ema_params", None) is not None:
      try:
        state = self._restore_state(step, target)
      except (ValueError, KeyError, TypeError):
        # written before the EMA teacher existed (or without it): the EMA starts from the params
        state = self._restore_state(step, target.replace(ema_params=None))
        logging.getLogger(__name__).info(
          "checkpoint %s/%d holds no EMA of the params: the EMA teacher starts from them",
          self.directory,
          step,
        )
        state = state.replace(ema_params=jax.tree.map(jnp.copy, state.params))
    else:
      state = self._restore_state(step, target)
    if model_config is not None and isinstance(state, TrainState):
      self._check_finite(model_config, state.params, step)
    return state, meta

  def _check_finite(self, model_config: ModelConfig, params: Any, step: int) -> None:
    """NonFiniteWeightsError naming the first parameter of checkpoint `step` that holds NaN or
    infinity (one compiled reduction where the restored arrays live)."""
    name = first_non_finite(model_config, params)
    if name is None:
      return
    earlier = [s for s in self.all_steps() if s < step]
    fix = (
      f"move {self.directory}/{step} out of that folder so that the run resumes from step "
      f"{earlier[-1]}, or evaluate that step (--step={earlier[-1]})"
      if earlier
      else "start the run again in a new workdir"
    )
    raise NonFiniteWeightsError(
      f"checkpoint {self.directory}/{step}: parameter {name!r} holds NaN or infinite values. "
      f"Fix: {fix}."
    )

  def _restore_state(self, step: int, target: Any) -> Any:
    if isinstance(target, TrainState) and target.ema_params is None:
      # the fields every checkpoint holds, by name (`save` stores a state without an EMA so)
      restore_args = ocp.args.StandardRestore(_without_ema(_as_abstract(target)))
    else:
      restore_args = (
        ocp.args.StandardRestore()
        if target is None
        else ocp.args.StandardRestore(_as_abstract(target))
      )
    try:
      out = self._manager.restore(step, args=ocp.args.Composite(state=restore_args))
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(
        f"Could not restore the TrainState of {self.directory}/{step} into the given target: {e}\n"
        "The parameter tree or optimizer state differs from the checkpoint's (was the optimizer "
        "changed, e.g. optim.clip_norm switched on/off?)."
      ) from e
    if isinstance(out["state"], dict) and isinstance(target, TrainState):
      return TrainState(**out["state"])
    return out["state"]

  def restore_params(
    self,
    model_config: ModelConfig,
    mesh: Mesh | None = None,
    step: int | None = None,
    rules=None,
  ) -> tuple[Any, dict[str, Any]]:
    """Restores only the parameters of checkpoint `step` (default: the latest), cast to
    `model_config.param_dtype` and placed by the logical-axis rules on `mesh` (default device
    without one); the optimizer state is not read. The stored model config must match
    `model_config`'s architecture. Returns (params, meta)."""
    step = self._resolve_step(step)
    meta = self.restore_meta(step)
    self._check_model(meta, model_config, step)
    shapes = param_shapes(model_config)
    if mesh is not None:
      shardings = sharding_lib.param_shardings(model_config, mesh, rules)
    else:
      device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
      shardings = jax.tree.map(lambda _: device, shapes)
    restore_args = jax.tree.map(
      lambda a, s: ocp.ArrayRestoreArgs(sharding=s, dtype=a.dtype), shapes, shardings
    )
    item = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings
    )
    try:
      out = self._manager.restore(
        step,
        args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
            item={"params": item}, restore_args={"params": restore_args}, partial_restore=True
          )
        ),
      )
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(
        f"Could not restore the parameters of {self.directory}/{step}: {e}\nThe parameter tree "
        "differs from the checkpoint's."
      ) from e
    params = out["state"]["params"]
    self._check_finite(model_config, params, step)
    return params, meta

  def _check_model(self, meta: Mapping[str, Any], model_config: ModelConfig, step: int) -> None:
    diffs = model_config_mismatches(meta["model_config"], model_config)
    if diffs:
      stored = ", ".join(f"{f}={a!r}" for f, a, _ in diffs)
      ours = ", ".join(f"{f}={b!r}" for f, _, b in diffs)
      raise ValueError(
        f"Checkpoint {self.directory}/{step} was written for a different model: it has {stored}; "
        f"this run has {ours}. Point checkpoint.dir at a checkpoint of this model, or set the "
        f"model config (model.preset / model.path / model.tiny.*) to the checkpoint's."
      )

  def set_aside(self, step: int) -> str:
    """Moves checkpoint `step` out of the directory into <directory>.unreadable/<step> (kept, not
    deleted: its files may be recovered); returns where it went."""
    if self.read_only:
      raise PermissionError(f"CheckpointManager({self.directory}) is read-only: nothing moves.")
    aside = epath.Path(f"{self.directory}.unreadable")
    aside.mkdir(parents=True, exist_ok=True)
    target, n = aside / str(step), 2
    while target.exists():
      target, n = aside / f"{step}-{n}", n + 1
    (epath.Path(self.directory) / str(step)).rename(target)
    self._manager.reload()
    return str(target)

  # ------------------------------------------------------------------------------------ lifecycle
  def wait_until_finished(self) -> None:
    """Blocks until a pending asynchronous save is committed."""
    try:
      with _quiet_failed_write_noise():
        self._manager.wait_until_finished()
    except Exception as err:
      failure = _write_failure(err, self.directory, None)
      if failure is None:
        raise
      raise failure from err

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> CheckpointManager:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def export_hf(
  model_config: ModelConfig,
  params: Any,
  out_dir: str | os.PathLike,
  tokenizer_dir: str | os.PathLike | None = None,
  source_dir: str | os.PathLike | None = None,
) -> str | None:
  """Writes the policy as a Hugging Face directory (config.json + safetensors [+ tokenizer]) that
  transformers loads: every tokenizer file of `tokenizer_dir` (chat_template.jinja included) and
  the generation_config.json of `source_dir` (the model the run started from) when it has one.
  Sharded parameters are gathered first; on a multi-host run every process must call this (the
  gather is collective) and the primary process writes. `out_dir` may be remote (gs://): the
  directory is written locally, then copied up (`sdar_jax.infra.paths.staged_output`). Returns the
  directory (None elsewhere)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    params = multihost_utils.process_allgather(params, tiled=True)
  if not paths.is_primary_process():
    return None
  out_dir = paths.resolve(out_dir)
  with paths.staged_output(out_dir) as local_dir:
    save_pretrained(
      model_config, params, local_dir, tokenizer_dir=tokenizer_dir, source_dir=source_dir
    )
  return out_dir
