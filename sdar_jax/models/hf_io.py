"""Hugging Face checkpoints <-> our parameter pytree, both directions.

Reads `config.json` + `model.safetensors` or a sharded `model.safetensors.index.json` checkpoint,
checks every tensor name and shape before anything is converted, and writes directories that
`transformers.AutoModelForCausalLM.from_pretrained` loads.

The safetensors container is read and written here directly (an 8-byte header length, a JSON
header, raw little-endian bytes): tensors are memory-mapped, and bfloat16 goes through
`ml_dtypes` without a framework round trip.

Length: the container reader/writer, the name map in both directions, the damage checks
(header, byte ranges, shards) and the export belong together; split, each would need the others.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from sdar_jax.infra import multihost
from sdar_jax.infra.errors import UserError
from sdar_jax.models.config import ModelConfig
from sdar_jax.models.qwen import Params, param_specs
from sdar_jax.text.tokenizer import Tokenizer


class NonFiniteWeightsError(UserError):
  """A weight tensor holds NaN or infinity: a model loaded, restored or about to be exported with
  it would train (or be served) on garbage. The message names the tensor and where it came from."""


def all_finite(x: np.ndarray) -> bool:
  """Whether every element of a host array is finite, without a temporary array of its size: a
  float64 sum is finite exactly when every element is (NaN and infinities propagate; float32 and
  bfloat16 values cannot add up to float64's range). Non-float arrays are finite."""
  if not np.issubdtype(x.dtype, np.floating) and x.dtype != ml_dtypes.bfloat16:
    return True
  return bool(np.isfinite(np.sum(x, dtype=np.float64)))


# ----------------------------------------------------------------------------------- name table
# (HF name relative to `model.layers.{i}.`, our name under params["layers"], transform)
LAYER_TABLE: tuple[tuple[str, str, str], ...] = (
  ("input_layernorm.weight", "attn_norm", "copy"),
  ("self_attn.q_proj.weight", "q_proj", "in_heads"),
  ("self_attn.k_proj.weight", "k_proj", "in_heads"),
  ("self_attn.v_proj.weight", "v_proj", "in_heads"),
  ("self_attn.o_proj.weight", "o_proj", "out_heads"),
  ("self_attn.q_proj.bias", "q_bias", "heads"),
  ("self_attn.k_proj.bias", "k_bias", "heads"),
  ("self_attn.v_proj.bias", "v_bias", "heads"),
  ("self_attn.o_proj.bias", "o_bias", "copy"),
  ("self_attn.q_norm.weight", "q_norm", "copy"),
  ("self_attn.k_norm.weight", "k_norm", "copy"),
  ("post_attention_layernorm.weight", "mlp_norm", "copy"),
  ("mlp.gate_proj.weight", "gate_proj", "transpose"),
  ("mlp.up_proj.weight", "up_proj", "transpose"),
  ("mlp.down_proj.weight", "down_proj", "transpose"),
)
# (HF name, our top-level name, transform)
TOP_TABLE: tuple[tuple[str, str, str], ...] = (
  ("model.embed_tokens.weight", "embed", "copy"),
  ("model.norm.weight", "final_norm", "copy"),
  ("lm_head.weight", "lm_head", "transpose"),
)
# Buffers some exporters include; never parameters.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _hf_shape(kind: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  """HF tensor shape for one of our (per-layer) shapes."""
  if kind == "copy":
    return shape
  if kind == "transpose":
    return shape[::-1]
  if kind == "in_heads":  # ours [D, n, H], HF [n*H, D]
    return (shape[1] * shape[2], shape[0])
  if kind == "out_heads":  # ours [n, H, D], HF [D, n*H]
    return (shape[2], shape[0] * shape[1])
  if kind == "heads":  # ours [n, H], HF [n*H]
    return (shape[0] * shape[1],)
  raise ValueError(kind)


def _to_ours(kind: str, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  if kind == "copy":
    return x
  if kind == "transpose":
    return x.T
  if kind in ("in_heads", "out_heads"):
    return x.T.reshape(shape)
  if kind == "heads":
    return x.reshape(shape)
  raise ValueError(kind)


def _to_hf(kind: str, x: np.ndarray) -> np.ndarray:
  if kind == "copy":
    return x
  if kind == "transpose":
    return x.T
  if kind == "in_heads":
    return x.reshape(x.shape[0], -1).T
  if kind == "out_heads":
    return x.reshape(-1, x.shape[-1]).T
  if kind == "heads":
    return x.reshape(-1)
  raise ValueError(kind)


def expected_tensors(
  config: ModelConfig,
) -> dict[str, tuple[tuple[str, ...], str, tuple[int, ...]]]:
  """HF name -> (our path, transform, HF shape) for every tensor this config needs."""
  specs = param_specs(config)
  out = {}
  for hf_name, ours, kind in TOP_TABLE:
    if ours in specs:
      out[hf_name] = ((ours,), kind, _hf_shape(kind, specs[ours].shape))
  for i in range(config.num_layers):
    for hf_suffix, ours, kind in LAYER_TABLE:
      if ours in specs["layers"]:
        shape = specs["layers"][ours].shape[1:]
        out[f"model.layers.{i}.{hf_suffix}"] = (("layers", ours, i), kind, _hf_shape(kind, shape))
  return out


# ----------------------------------------------------------------------------------- safetensors
_ST_DTYPES = {
  "F64": np.dtype(np.float64),
  "F32": np.dtype(np.float32),
  "F16": np.dtype(np.float16),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "I64": np.dtype(np.int64),
  "I32": np.dtype(np.int32),
  "I16": np.dtype(np.int16),
  "I8": np.dtype(np.int8),
  "U8": np.dtype(np.uint8),
  "BOOL": np.dtype(np.bool_),
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


def read_safetensors_header(path: str) -> tuple[dict[str, Any], int]:
  """(header dict without __metadata__, byte offset of the data section). Raises ValueError naming
  `path` when the file is too short for its header or the header is not JSON."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    raw = f.read(8)
    if len(raw) != 8:
      raise ValueError(f"{path} is not a safetensors file (shorter than 8 bytes).")
    (n,) = struct.unpack("<Q", raw)
    if n > 100 * 2**20:
      raise ValueError(f"{path} is not a safetensors file (header length {n} is implausible).")
    if 8 + n > size:
      raise ValueError(
        f"{path}: truncated safetensors file: its header needs {8 + n} bytes but the file has "
        f"{size}. Fix: copy or export the checkpoint again."
      )
    try:
      header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise ValueError(
        f"{path}: the safetensors header is not valid JSON ({e}). Fix: copy or export the "
        "checkpoint again."
      ) from None
  if not isinstance(header, dict):
    raise ValueError(f"{path}: the safetensors header is not a JSON object.")
  header.pop("__metadata__", None)
  return header, 8 + n


def _check_byte_ranges(path: str, header: dict[str, Any], data_bytes: int) -> None:
  """Raises ValueError naming the file and the first tensor whose header entry is malformed, whose
  byte count does not match its dtype and shape, or whose bytes lie beyond the end of the file."""
  for name, info in header.items():
    where = f"{path}: tensor {name!r}"
    try:
      dtype, shape = info["dtype"], [int(d) for d in info["shape"]]
      begin, end = (int(o) for o in info["data_offsets"])
    except (KeyError, TypeError, ValueError):
      raise ValueError(
        f"{where}: malformed header entry {info!r} (needs dtype, shape, data_offsets)."
      ) from None
    if not 0 <= begin <= end:
      raise ValueError(f"{where}: invalid data_offsets [{begin}, {end}].")
    if dtype in _ST_DTYPES:
      expected = math.prod(shape) * _ST_DTYPES[dtype].itemsize
      if end - begin != expected:
        raise ValueError(
          f"{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes but dtype {dtype} x "
          f"shape {tuple(shape)} needs {expected}. Fix: copy or export the checkpoint again."
        )
    if end > data_bytes:
      raise ValueError(
        f"{where}: needs bytes [{begin}, {end}) of the data section but the file holds only "
        f"{data_bytes} data bytes: the file is truncated. Fix: copy or export the checkpoint again."
      )


class SafetensorsFile:
  """Lazy, memory-mapped access to the tensors of one .safetensors file. Opening it reads only the
  header and checks every tensor's byte range against the file size, so a truncated or corrupt file
  fails here, naming the file and the tensor."""

  def __init__(self, path: str):
    self.path = path
    self.header, self._data_start = read_safetensors_header(path)
    _check_byte_ranges(path, self.header, os.path.getsize(path) - self._data_start)
    self._mmap = None

  def names(self) -> list[str]:
    return list(self.header)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self.header[name]["shape"])

  def get(self, name: str) -> np.ndarray:
    info = self.header[name]
    if info["dtype"] not in _ST_DTYPES:
      raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {info['dtype']}.")
    if self._mmap is None:
      self._mmap = np.memmap(self.path, dtype=np.uint8, mode="r")
    begin, end = info["data_offsets"]
    buf = self._mmap[self._data_start + begin : self._data_start + end]
    return buf.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])


def write_safetensors(
  path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
):
  """Writes a .safetensors file (header padded to 8 bytes, tensors in the given order)."""
  header: dict[str, Any] = {}
  offset = 0
  arrays = []
  for name, x in tensors.items():
    x = np.ascontiguousarray(x)
    if x.dtype not in _ST_NAMES:
      raise ValueError(f"tensor {name!r}: dtype {x.dtype} cannot be stored in safetensors.")
    header[name] = {
      "dtype": _ST_NAMES[x.dtype],
      "shape": list(x.shape),
      "data_offsets": [offset, offset + x.nbytes],
    }
    offset += x.nbytes
    arrays.append(x)
  if metadata:
    header["__metadata__"] = metadata
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for x in arrays:
      f.write(x.tobytes())


# ----------------------------------------------------------------------------------- load
def checkpoint_files(hf_dir: str) -> list[str]:
  """The weight files of a Hugging Face directory: model.safetensors, or every shard listed by
  model.safetensors.index.json. Raises FileNotFoundError / ValueError naming what is missing."""
  index = os.path.join(hf_dir, "model.safetensors.index.json")
  if os.path.exists(index):
    try:
      with open(index) as f:
        weight_map = json.load(f).get("weight_map")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
      raise ValueError(f"{index} is not a valid index file ({e}).") from None
    if not weight_map or not isinstance(weight_map, dict):
      raise ValueError(f"{index} has no `weight_map`.")
    files = sorted(set(weight_map.values()))
    missing = [name for name in files if not os.path.exists(os.path.join(hf_dir, name))]
    if missing:
      raise FileNotFoundError(f"{index} lists shard files that are not in {hf_dir}: {missing}.")
    return [os.path.join(hf_dir, name) for name in files]
  single = os.path.join(hf_dir, "model.safetensors")
  if os.path.exists(single):
    return [single]
  present = sorted(os.listdir(hf_dir))
  hint = (
    " It holds PyTorch .bin weights: convert them to safetensors first "
    "(transformers: model.save_pretrained(dir, safe_serialization=True))."
    if any(name.endswith(".bin") for name in present)
    else ""
  )
  raise FileNotFoundError(
    f"No model.safetensors or model.safetensors.index.json in {hf_dir} (found: {present}).{hint}"
  )


def open_checkpoint(hf_dir: str) -> dict[str, SafetensorsFile]:
  """Tensor name -> the opened file holding it, over every weight file of `hf_dir`. Reads only the
  headers; every tensor's byte range is checked against its file's size."""
  return {name: f for f in map(SafetensorsFile, checkpoint_files(hf_dir)) for name in f.names()}


def verify_checkpoint(hf_dir: str | os.PathLike, config: ModelConfig | None = None) -> None:
  """Checks without loading anything that `hf_dir` holds complete weight files whose tensors match
  `config` (default: the directory's config.json). Raises FileNotFoundError / ValueError."""
  hf_dir = os.fspath(hf_dir)
  config = config or ModelConfig.from_hf_config(hf_dir)
  where = open_checkpoint(hf_dir)
  check_tensors(config, {name: f.shape(name) for name, f in where.items()}, hf_dir)


def check_tensors(
  config: ModelConfig, available: dict[str, tuple[int, ...]], hf_dir: str = ""
) -> None:
  """Raises one ValueError naming every missing, unexpected and mis-shaped tensor."""
  expected = expected_tensors(config)
  missing = [name for name in expected if name not in available]
  unexpected = [
    name
    for name in available
    if name not in expected
    and not name.endswith(_IGNORED_SUFFIXES)
    and not (name == "lm_head.weight" and config.tie_word_embeddings)
  ]
  misshaped = [
    f"{name}: checkpoint {tuple(available[name])}, config expects {expected[name][2]}"
    for name in expected
    if name in available and tuple(available[name]) != expected[name][2]
  ]
  problems = []
  if missing:
    problems.append(f"missing tensors ({len(missing)}): {_short(missing)}")
  if unexpected:
    problems.append(f"unexpected tensors ({len(unexpected)}): {_short(unexpected)}")
  if misshaped:
    problems.append(f"mis-shaped tensors ({len(misshaped)}): {_short(misshaped)}")
  if problems:
    raise ValueError(
      f"Checkpoint {hf_dir + ' ' if hf_dir else ''}does not match its config.json ("
      + config.name
      + "): "
      + "; ".join(problems)
      + ". Check that config.json and the weights come from "
      "the same model."
    )


def _short(items: list[str], limit: int = 8) -> str:
  shown = ", ".join(items[:limit])
  return shown + (f", ... (+{len(items) - limit} more)" if len(items) > limit else "")


def load_pretrained(
  hf_dir: str | os.PathLike, dtype: str | None = "float32", mesh=None, rules=None
) -> tuple[ModelConfig, Params]:
  """Loads a Hugging Face Qwen2/2.5/3 directory into (ModelConfig, params).

  `dtype` sets both the parameter storage and the compute dtype ("float32" or "bfloat16"; None
  keeps the checkpoint's). With a `mesh`, every parameter is placed with its NamedSharding
  (sharding.py rules) as it is converted, so the full model is never replicated on one device.
  """
  hf_dir = os.fspath(hf_dir)
  if not os.path.isdir(hf_dir):
    raise FileNotFoundError(f"Model directory {hf_dir!r} does not exist.")
  overrides = {} if dtype is None else {"dtype": dtype, "param_dtype": dtype}
  config = ModelConfig.from_hf_config(hf_dir, **overrides)
  where = open_checkpoint(hf_dir)
  check_tensors(config, {name: f.shape(name) for name, f in where.items()}, hf_dir)

  specs = param_specs(config)
  np_dtype = np.dtype(config.jnp_param_dtype)
  shardings = None
  if mesh is not None:
    from sdar_jax.core import sharding as sharding_lib

    shardings = sharding_lib.param_shardings(config, mesh, rules)

  def convert(hf_name: str, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    x = _to_ours(kind, where[hf_name].get(hf_name), shape).astype(np_dtype)
    if not all_finite(x):  # after the cast: a value beyond bfloat16's range becomes inf there
      raise NonFiniteWeightsError(
        f"{where[hf_name].path}: tensor {hf_name!r} holds NaN or infinite values (read as "
        f"{np_dtype}). Fix: use an intact copy of the model (download or export it again)."
      )
    return x

  def place(x: np.ndarray, path: tuple[str, ...]):
    if shardings is None:
      return jax.device_put(x)
    sharding = shardings[path[0]] if len(path) == 1 else shardings[path[0]][path[1]]
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

  params: Params = {"layers": {}}
  for hf_name, ours, kind in TOP_TABLE:
    if ours in specs:
      params[ours] = place(convert(hf_name, kind, specs[ours].shape), (ours,))
  for hf_suffix, ours, kind in LAYER_TABLE:
    if ours not in specs["layers"]:
      continue
    shape = specs["layers"][ours].shape[1:]
    stacked = np.stack(
      [convert(f"model.layers.{i}.{hf_suffix}", kind, shape) for i in range(config.num_layers)]
    )
    params["layers"][ours] = place(stacked, ("layers", ours))
  return config, params


# ----------------------------------------------------------------------------------- finite
@jax.jit
def _finite_flags(params: Params) -> Params:
  """Per parameter: whether it is all finite; per stacked layer parameter, one flag per layer.
  Reduced where the arrays live (sharded or not): only the flags come back to the host."""

  def one(path, x):
    if not jnp.issubdtype(x.dtype, jnp.floating):
      return jnp.ones(x.shape[:1] if path[0].key == "layers" else (), bool)
    finite = jnp.isfinite(x)
    if path[0].key == "layers":
      return finite.reshape(x.shape[0], -1).all(axis=1)
    return finite.all()

  return jax.tree_util.tree_map_with_path(one, params)


def first_non_finite(config: ModelConfig, params: Params) -> str | None:
  """The Hugging Face name of the first parameter (in checkpoint order) that holds NaN or
  infinity, e.g. "model.layers.1.mlp.down_proj.weight"; None when every value is finite. One
  compiled reduction over the whole tree, where the parameters live (no host copy)."""
  flags = jax.tree.map(multihost.fetch, _finite_flags(params))  # all processes: a collective
  for hf_name, ours, _ in TOP_TABLE:
    if ours in flags and not bool(flags[ours]):
      return hf_name
  for i in range(config.num_layers):
    for hf_suffix, ours, _ in LAYER_TABLE:
      if ours in flags["layers"] and not bool(flags["layers"][ours][i]):
        return f"model.layers.{i}.{hf_suffix}"
  return None


def check_finite(config: ModelConfig, params: Params, where: str, fix: str) -> None:
  """Raises NonFiniteWeightsError naming the first non-finite parameter of `params` (from
  `where`, e.g. a checkpoint folder), with `fix`."""
  name = first_non_finite(config, params)
  if name is not None:
    raise NonFiniteWeightsError(
      f"{where}: parameter {name!r} holds NaN or infinite values. Fix: {fix}"
    )


# ----------------------------------------------------------------------------------- save
def to_hf_tensors(config: ModelConfig, params: Params) -> Iterable[tuple[str, np.ndarray]]:
  """Yields (HF name, array in HF layout) for every tensor, in checkpoint order."""
  host = jax.device_get(params)
  for hf_name, ours, kind in TOP_TABLE:
    if ours == "lm_head" and config.tie_word_embeddings:
      continue
    yield hf_name, _to_hf(kind, np.asarray(host[ours]))
  for i in range(config.num_layers):
    for hf_suffix, ours, kind in LAYER_TABLE:
      if ours in host["layers"]:
        yield f"model.layers.{i}.{hf_suffix}", _to_hf(kind, np.asarray(host["layers"][ours][i]))


# Files of a Hugging Face tokenizer directory that an export carries over (those present).
EXPORTED_TOKENIZER_FILES = (
  "tokenizer.json",
  "tokenizer_config.json",
  "tokenizer.model",
  "vocab.json",
  "vocab.txt",
  "merges.txt",
  "special_tokens_map.json",
  "added_tokens.json",
  "chat_template.jinja",
  "chat_template.json",
)
# Written when the source model has no generation_config.json: the Qwen chat models' ids.
QWEN_GENERATION_CONFIG = {
  "bos_token_id": 151643,
  "eos_token_id": [151645, 151643],
  "pad_token_id": 151643,
}


def tokenizer_special_ids(tokenizer_dir: str | os.PathLike) -> dict[str, Any] | None:
  """{"bos_token_id", "eos_token_id", "pad_token_id"} of the tokenizer in `tokenizer_dir` as
  `Tokenizer` reads them (its first end-of-sequence id, its padding id), or None when it cannot be
  read. For the Qwen tokenizer this is QWEN_GENERATION_CONFIG's ids."""
  try:
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
  except Exception:  # noqa: BLE001  (the tokenizers library raises a bare Exception on a bad file)
    return None
  if not tokenizer.eos_token_ids or tokenizer.pad_token_id is None:
    return None
  eos, pad = tokenizer.eos_token_ids[0], tokenizer.pad_token_id
  return {
    "bos_token_id": pad,
    "eos_token_id": sorted({eos, pad}, key=[eos, pad].index),
    "pad_token_id": pad,
  }


def _fresh_dir(parent: str, prefix: str) -> str:
  """A new, uniquely named directory in `parent` with the permissions `os.makedirs` gives (0o777
  minus the umask; `tempfile.mkdtemp` would make it 0o700, unreadable to the rest of a team)."""
  while True:
    path = os.path.join(parent, prefix + os.urandom(6).hex())
    try:
      os.mkdir(path)
    except FileExistsError:
      continue
    return path


def save_pretrained(
  config: ModelConfig,
  params: Params,
  out_dir: str | os.PathLike,
  max_shard_bytes: int = 4 * 2**30,
  tokenizer_dir: str | os.PathLike | None = None,
  source_dir: str | os.PathLike | None = None,
) -> str:
  """Writes a transformers-loadable directory: config.json, generation_config.json, safetensors
  (sharded with an index above `max_shard_bytes`) and, optionally, the tokenizer files.

  `tokenizer_dir`: every file of `EXPORTED_TOKENIZER_FILES` it holds is copied
  (chat_template.jinja included), plus its `additional_chat_templates/` folder. `source_dir`: the
  model the weights came from; its generation_config.json (sampling defaults, stop ids) is copied
  when it has one, else the Qwen ids are written. The directory is assembled next to `out_dir` and
  renamed into place, so a crash never leaves a half-written model behind.
  """
  out_dir = os.path.abspath(os.fspath(out_dir))
  parent = os.path.dirname(out_dir)
  os.makedirs(parent, exist_ok=True)
  tmp = _fresh_dir(parent, prefix=".tmp-" + os.path.basename(out_dir) + "-")
  try:
    # Stop / pad ids: the tokenizer's own when it is exported with the weights (a compact
    # tokenizer's ids are not Qwen's), else the Qwen chat models' ids.
    special_ids = (tokenizer_special_ids(tokenizer_dir) if tokenizer_dir else None) or dict(
      QWEN_GENERATION_CONFIG
    )
    hf_config = config.to_hf_config()
    hf_config["bos_token_id"] = special_ids["bos_token_id"]
    hf_config["eos_token_id"] = special_ids["eos_token_id"][0]
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(hf_config, f, indent=2)
    source_generation = os.path.join(os.fspath(source_dir or ""), "generation_config.json")
    if source_dir is not None and os.path.isfile(source_generation):
      shutil.copy(source_generation, tmp)
    else:
      with open(os.path.join(tmp, "generation_config.json"), "w") as f:
        json.dump(special_ids, f, indent=2)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, x in to_hf_tensors(config, params):
      if not all_finite(x):  # nothing is written: the half-built folder is removed below
        raise NonFiniteWeightsError(
          f"refusing to export to {out_dir}: tensor {name!r} holds NaN or infinite values. Fix: "
          "the weights diverged: resume from an earlier checkpoint, e.g. with a lower optim.lr, "
          "and watch train/skipped_update and train/grad_norm in metrics.jsonl."
        )
      if shards[-1] and size + x.nbytes > max_shard_bytes:
        shards.append({})
        size = 0
      shards[-1][name] = x
      size += x.nbytes
    meta = {"format": "pt"}
    if len(shards) == 1:
      write_safetensors(os.path.join(tmp, "model.safetensors"), shards[0], meta)
    else:
      weight_map, total = {}, 0
      for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(tmp, fname), shard, meta)
        for name, x in shard.items():
          weight_map[name] = fname
          total += x.nbytes
      with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    if tokenizer_dir is not None:
      for fname in EXPORTED_TOKENIZER_FILES:
        if os.path.isfile(os.path.join(tokenizer_dir, fname)):
          shutil.copy(os.path.join(tokenizer_dir, fname), tmp)
      templates = os.path.join(tokenizer_dir, "additional_chat_templates")
      if os.path.isdir(templates):
        shutil.copytree(templates, os.path.join(tmp, "additional_chat_templates"))
    if os.path.exists(out_dir):
      shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return out_dir
