"""Qwen2 / Qwen2.5 / Qwen3 decoders as pure JAX functions of a parameter pytree."""

from sdar_jax.models.config import ModelConfig
from sdar_jax.models.hf_io import load_pretrained, save_pretrained
from sdar_jax.models.qwen import (
  KVCache,
  Params,
  apply,
  decode_step,
  forward,
  hidden_states,
  init_params,
  logits_from_hidden,
  param_logical_axes,
  param_shapes,
  param_specs,
  positions_from_mask,
  prefill,
  unstack_layers,
)

__all__ = [
  "ModelConfig",
  "Params",
  "KVCache",
  "load_pretrained",
  "save_pretrained",
  "init_params",
  "forward",
  "apply",
  "hidden_states",
  "logits_from_hidden",
  "param_logical_axes",
  "param_shapes",
  "param_specs",
  "positions_from_mask",
  "prefill",
  "decode_step",
  "unstack_layers",
]
