"""ModelConfig: the static description of a Qwen2 / Qwen2.5 / Qwen3 decoder.

One dataclass covers both families; the differences are flags:

* Qwen2 / Qwen2.5: bias on q/k/v, head_dim = hidden / heads.
* Qwen3: per-head RMSNorm on q and k before RoPE, an explicit head_dim (0.6B: 16 x 128 != 1024).

The config is frozen and hashable so it can be a static argument of `jax.jit`.
`from_hf_config` reads any config.json of these two families (transformers 4.x and 5.x layouts)
and refuses everything else with a message that says what is supported.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax.numpy as jnp

from sdar_jax.infra.errors import UserError

FAMILIES = ("qwen2", "qwen3")
DTYPES = ("float32", "bfloat16", "float16")
_CONFIG_FIX = (
  "Fix: copy the model's config.json again from its source (e.g. the Hugging Face repository), "
  "or point model.path at a complete model folder"
)


class ModelConfigFileError(UserError, ValueError):
  """A model's config.json that cannot be read: not JSON, or lacking a field the model needs."""

  heading = "Bad model config"


# How a whole sequence attends to itself (models/attention.py `attention_implementation`): "auto"
# picks by backend; "xla" builds the T x T scores; "chunked" is an online softmax over key blocks;
# "cudnn" is cuDNN's fused kernel (GPU, bf16/fp16); "splash" is Pallas splash attention (TPU).
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "chunked", "cudnn", "splash")
# How a whole sequence runs through the decoder layers (models/qwen.py `layer_loop_implementation`):
# "scan" is one `lax.scan` over the stacked weights (compile time independent of depth); "unroll"
# traces every layer (faster on XLA:CPU, see models/qwen.py); "auto" picks by backend.
LAYER_LOOPS = ("auto", "scan", "unroll")

_ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture + numerics of one decoder. All sizes are the Hugging Face config values."""

  family: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  qkv_bias: bool = False
  o_bias: bool = False
  qk_norm: bool = False
  max_position_embeddings: int = 32768
  dtype: str = "float32"  # activations / matmul inputs
  param_dtype: str = "float32"  # how parameters are stored
  remat: bool = False  # rematerialise each decoder layer in the backward pass
  attention: str = "auto"  # one of ATTENTION_IMPLEMENTATIONS
  attention_block: int = 512  # query / key block length of the "chunked" implementation
  layer_loop: str = "auto"  # one of LAYER_LOOPS
  name: str = "custom"

  def __post_init__(self):
    if self.family not in FAMILIES:
      raise ValueError(f"ModelConfig.family={self.family!r}; supported families: {FAMILIES}.")
    for field in ("dtype", "param_dtype"):
      if getattr(self, field) not in DTYPES:
        raise ValueError(f"ModelConfig.{field}={getattr(self, field)!r}; choose one of {DTYPES}.")
    for field in (
      "vocab_size",
      "hidden_size",
      "intermediate_size",
      "num_layers",
      "num_heads",
      "num_kv_heads",
      "head_dim",
    ):
      if int(getattr(self, field)) <= 0:
        raise ValueError(
          f"ModelConfig.{field}={getattr(self, field)!r} must be a positive integer."
        )
    if self.attention not in ATTENTION_IMPLEMENTATIONS:
      raise ValueError(
        f"ModelConfig.attention={self.attention!r} (config key model.attention). Fix: choose "
        f"one of {ATTENTION_IMPLEMENTATIONS}."
      )
    if self.layer_loop not in LAYER_LOOPS:
      raise ValueError(
        f"ModelConfig.layer_loop={self.layer_loop!r} (config key model.layer_loop). Fix: choose "
        f"one of {LAYER_LOOPS}."
      )
    if int(self.attention_block) <= 0:
      raise ValueError(
        f"ModelConfig.attention_block={self.attention_block!r} must be a positive integer "
        "(the chunked attention's block length, e.g. 512)."
      )
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}: "
        "grouped-query attention needs every kv head to serve the same number of q heads."
      )
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings.")

  # ----------------------------------------------------------------------------- derived
  @property
  def jnp_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def jnp_param_dtype(self):
    return jnp.dtype(self.param_dtype)

  @property
  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
    attn = d * h * (self.num_heads * 2 + self.num_kv_heads * 2)
    if self.qkv_bias:
      attn += h * (self.num_heads + 2 * self.num_kv_heads)
    if self.o_bias:
      attn += d
    if self.qk_norm:
      attn += 2 * h
    layer = attn + 3 * d * f + 2 * d
    embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
    return self.num_layers * layer + embed + d

  def replace(self, **kwargs) -> ModelConfig:
    return dataclasses.replace(self, **kwargs)

  # ----------------------------------------------------------------------------- presets
  @classmethod
  def preset(cls, name: str, **overrides) -> ModelConfig:
    """A published Qwen model by short name, e.g. 'qwen2.5-3b' or 'qwen3-1.7b'."""
    key = name.lower().removesuffix("-instruct")
    if key not in _PRESETS:
      raise ValueError(f"Unknown model preset {name!r}; known presets: {sorted(_PRESETS)}.")
    return dataclasses.replace(_PRESETS[key], **overrides)

  @classmethod
  def preset_names(cls) -> list[str]:
    return sorted(_PRESETS)

  @classmethod
  def qwen2_5_0_5b(cls, **kw):
    return cls.preset("qwen2.5-0.5b", **kw)

  @classmethod
  def qwen2_5_1_5b(cls, **kw):
    return cls.preset("qwen2.5-1.5b", **kw)

  @classmethod
  def qwen2_5_3b(cls, **kw):
    return cls.preset("qwen2.5-3b", **kw)

  @classmethod
  def qwen2_5_7b(cls, **kw):
    return cls.preset("qwen2.5-7b", **kw)

  @classmethod
  def qwen3_0_6b(cls, **kw):
    return cls.preset("qwen3-0.6b", **kw)

  @classmethod
  def qwen3_1_7b(cls, **kw):
    return cls.preset("qwen3-1.7b", **kw)

  @classmethod
  def qwen3_4b(cls, **kw):
    return cls.preset("qwen3-4b", **kw)

  @classmethod
  def qwen3_8b(cls, **kw):
    return cls.preset("qwen3-8b", **kw)

  @classmethod
  def tiny(cls, family: str = "qwen3", **kw) -> ModelConfig:
    """A small random model of the given family, for the CPU demo, tests and benches."""
    base = dict(
      family=family,
      vocab_size=4096,
      hidden_size=256,
      intermediate_size=768,
      num_layers=4,
      num_heads=8,
      num_kv_heads=4,
      head_dim=32,
      qkv_bias=family == "qwen2",
      qk_norm=family == "qwen3",
      tie_word_embeddings=False,
      name=f"tiny-{family}",
    )
    base.update(kw)
    return cls(**base)

  # ----------------------------------------------------------------------------- HF config.json
  @classmethod
  def from_hf_config(cls, hf: dict[str, Any] | str | os.PathLike, **overrides) -> ModelConfig:
    """Reads a Hugging Face config.json (dict, file, or model directory) of Qwen2/2.5/3. A file
    that is not a JSON object, or lacks a field or holds a bad value, is a `ModelConfigFileError`
    naming the file; an unsupported option a NotImplementedError naming it."""
    source = "the config.json dict"
    if not isinstance(hf, dict):
      path = os.fspath(hf)
      if os.path.isdir(path):
        path = os.path.join(path, "config.json")
      if not os.path.exists(path):
        raise FileNotFoundError(
          f"No config.json at {path!r}: point at a Hugging Face model directory."
        )
      source = path
      try:
        with open(path, encoding="utf-8") as f:
          hf = json.load(f)
      except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f"{e.msg}: line {e.lineno}, column {e.colno}" if hasattr(e, "lineno") else str(e)
        raise ModelConfigFileError(
          f"model config {path!r} is not valid JSON ({where}; the file has "
          f"{os.path.getsize(path)} bytes). {_CONFIG_FIX}"
        ) from None
      if not isinstance(hf, dict):
        raise ModelConfigFileError(
          f"model config {path!r} holds a JSON {type(hf).__name__}, not an object. {_CONFIG_FIX}"
        )
    try:
      return cls._from_hf_dict(hf, overrides)
    except KeyError as e:
      raise ModelConfigFileError(
        f"model config {source!r} lacks the field {e.args[0]!r}. {_CONFIG_FIX}"
      ) from None
    except NotImplementedError as e:
      raise NotImplementedError(f"model config {source!r}: {e}") from None
    except TypeError as e:  # a field of the wrong type (a list where a number belongs)
      raise ModelConfigFileError(f"model config {source!r}: {e}. {_CONFIG_FIX}") from None
    except ValueError as e:  # an unsupported model, or a field that is no number
      text = str(e).rstrip(".")
      fix = "" if "support" in text or "Fix" in text else f" {_CONFIG_FIX}"
      raise ModelConfigFileError(f"model config {source!r}: {text}.{fix}") from None

  @classmethod
  def _from_hf_dict(cls, hf: dict[str, Any], overrides: dict[str, Any]) -> ModelConfig:
    family = _family_of(hf)
    if hf.get("hidden_act", "silu") != "silu":
      raise ValueError(
        f"hidden_act={hf['hidden_act']!r}: Qwen decoders use 'silu'; this checkpoint is not supported."
      )
    if hf.get("use_sliding_window", False):
      raise NotImplementedError(
        "use_sliding_window=True is not supported (no published Qwen2.5/Qwen3 model uses it); "
        "set it to false in config.json if the sliding window is not needed."
      )
    theta, rope_type = _rope_of(hf)
    if rope_type not in (None, "default"):
      raise NotImplementedError(
        f"rope type {rope_type!r} (rope scaling) is not supported; only default RoPE is implemented."
      )
    heads = int(hf["num_attention_heads"])
    head_dim = hf.get("head_dim") or int(hf["hidden_size"]) // heads
    attention_bias = bool(hf.get("attention_bias", False))
    dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    values = dict(
      family=family,
      vocab_size=int(hf["vocab_size"]),
      hidden_size=int(hf["hidden_size"]),
      intermediate_size=int(hf["intermediate_size"]),
      num_layers=int(hf["num_hidden_layers"]),
      num_heads=heads,
      num_kv_heads=int(hf.get("num_key_value_heads") or heads),
      head_dim=int(head_dim),
      rope_theta=float(theta),
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qkv_bias=True if family == "qwen2" else attention_bias,
      o_bias=False if family == "qwen2" else attention_bias,
      qk_norm=family == "qwen3",
      max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
      dtype=dtype if dtype in DTYPES else "float32",
      param_dtype=dtype if dtype in DTYPES else "float32",
      name=hf.get("_name_or_path") or family,
    )
    values.update(overrides)
    return cls(**values)

  def to_hf_config(self) -> dict[str, Any]:
    """A config.json dict that transformers' AutoConfig reads back into the same architecture."""
    if self.family == "qwen2" and (not self.qkv_bias or self.qk_norm or self.o_bias):
      raise ValueError(
        "A qwen2-family config must have qkv_bias=True, qk_norm=False, o_bias=False "
        "to be expressible as a transformers Qwen2 config."
      )
    if self.family == "qwen3" and (not self.qk_norm or self.qkv_bias != self.o_bias):
      raise ValueError(
        "A qwen3-family config must have qk_norm=True and qkv_bias == o_bias "
        "(transformers' attention_bias) to be expressible as a transformers Qwen3 config."
      )
    hf = {
      "architectures": ["Qwen2ForCausalLM" if self.family == "qwen2" else "Qwen3ForCausalLM"],
      "model_type": self.family,
      "vocab_size": self.vocab_size,
      "hidden_size": self.hidden_size,
      "intermediate_size": self.intermediate_size,
      "num_hidden_layers": self.num_layers,
      "num_attention_heads": self.num_heads,
      "num_key_value_heads": self.num_kv_heads,
      "hidden_act": "silu",
      "max_position_embeddings": self.max_position_embeddings,
      "rms_norm_eps": self.rms_norm_eps,
      "rope_theta": self.rope_theta,
      "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
      "tie_word_embeddings": self.tie_word_embeddings,
      "use_sliding_window": False,
      "attention_dropout": 0.0,
      "initializer_range": 0.02,
      "use_cache": True,
      "dtype": self.param_dtype,
      "bos_token_id": 151643,
      "eos_token_id": 151645,
    }
    if self.family == "qwen3":
      hf["head_dim"] = self.head_dim
      hf["attention_bias"] = self.qkv_bias
    elif self.head_dim * self.num_heads != self.hidden_size:
      raise ValueError(
        f"qwen2 family derives head_dim from hidden_size / num_heads, but head_dim={self.head_dim} != "
        f"{self.hidden_size} / {self.num_heads}."
      )
    return hf


def _family_of(hf: dict[str, Any]) -> str:
  model_type = hf.get("model_type")
  archs = hf.get("architectures") or []
  named = {_ARCHITECTURES[a] for a in archs if a in _ARCHITECTURES}
  if model_type is not None and named and named != {model_type}:
    raise ValueError(
      f"config.json: model_type={model_type!r} contradicts architectures={archs} (a "
      f"{'/'.join(sorted(named))} model). Fix: correct the file: a Qwen3 checkpoint has "
      "model_type 'qwen3' and architectures ['Qwen3ForCausalLM'], a Qwen2 / Qwen2.5 one 'qwen2' "
      "and ['Qwen2ForCausalLM']."
    )
  if model_type in FAMILIES:
    return model_type
  for arch in archs:
    if arch in _ARCHITECTURES:
      return _ARCHITECTURES[arch]
  raise ValueError(
    f"Unsupported architecture (model_type={model_type!r}, architectures={archs}): sdar-jax implements "
    f"Qwen2 / Qwen2.5 (model_type 'qwen2') and Qwen3 (model_type 'qwen3') dense decoders only."
  )


def _rope_of(hf: dict[str, Any]) -> tuple[float, str | None]:
  """RoPE theta and type from either transformers 4.x (`rope_theta`, `rope_scaling`) or 5.x
  (`rope_parameters`) layouts."""
  params = hf.get("rope_parameters")
  if isinstance(params, dict) and "rope_theta" in params:
    return float(params["rope_theta"]), params.get("rope_type") or params.get("type")
  scaling = hf.get("rope_scaling") or {}
  rope_type = scaling.get("rope_type") or scaling.get("type")
  if "rope_theta" not in hf:
    raise ValueError("config.json has neither `rope_theta` nor `rope_parameters.rope_theta`.")
  return float(hf["rope_theta"]), rope_type


def _qwen2(name, layers, hidden, inter, heads, kv, vocab, tied):
  return ModelConfig(
    family="qwen2",
    vocab_size=vocab,
    hidden_size=hidden,
    intermediate_size=inter,
    num_layers=layers,
    num_heads=heads,
    num_kv_heads=kv,
    head_dim=hidden // heads,
    rope_theta=1e6,
    tie_word_embeddings=tied,
    qkv_bias=True,
    qk_norm=False,
    max_position_embeddings=32768,
    dtype="bfloat16",
    param_dtype="bfloat16",
    name=name,
  )


def _qwen3(name, layers, hidden, inter, heads, kv, tied, theta=1e6):
  return ModelConfig(
    family="qwen3",
    vocab_size=151936,
    hidden_size=hidden,
    intermediate_size=inter,
    num_layers=layers,
    num_heads=heads,
    num_kv_heads=kv,
    head_dim=128,
    rope_theta=theta,
    tie_word_embeddings=tied,
    qkv_bias=False,
    qk_norm=True,
    max_position_embeddings=40960,
    dtype="bfloat16",
    param_dtype="bfloat16",
    name=name,
  )


_PRESETS: dict[str, ModelConfig] = {
  "qwen2.5-0.5b": _qwen2("Qwen2.5-0.5B-Instruct", 24, 896, 4864, 14, 2, 151936, True),
  "qwen2.5-1.5b": _qwen2("Qwen2.5-1.5B-Instruct", 28, 1536, 8960, 12, 2, 151936, True),
  "qwen2.5-3b": _qwen2("Qwen2.5-3B-Instruct", 36, 2048, 11008, 16, 2, 151936, True),
  "qwen2.5-7b": _qwen2("Qwen2.5-7B-Instruct", 28, 3584, 18944, 28, 4, 152064, False),
  "qwen3-0.6b": _qwen3("Qwen3-0.6B", 28, 1024, 3072, 16, 8, True),
  "qwen3-1.7b": _qwen3("Qwen3-1.7B", 28, 2048, 6144, 16, 8, True),
  "qwen3-4b": _qwen3("Qwen3-4B", 36, 2560, 9728, 32, 8, True),
  "qwen3-4b-2507": _qwen3("Qwen3-4B-Instruct-2507", 36, 2560, 9728, 32, 8, True, theta=5e6),
  "qwen3-8b": _qwen3("Qwen3-8B", 36, 4096, 12288, 32, 8, False),
}
