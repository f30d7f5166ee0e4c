r"""Model sections of a config: one entry per Qwen model, mapped to `ModelConfig.preset`.

    config.model = models.model("qwen2.5-3b")
    --config.model.path=/data/Qwen2.5-3B-Instruct      # real weights (config.json + safetensors)

Without `path` the architecture comes from the preset and the weights are random, which a run
accepts only with `random_init=True` (benchmarks, throughput tests; the tiny demo model sets it).
With `path` the checkpoint's config.json is the architecture; the preset name must then describe
the same model (checked by `sdar_jax.run.config_validation`, which also checks that the weight files
are there).
`tokenizer_dir` defaults to `path`, else the bundled Qwen tokenizer files. `chat_template="auto"`
prompts with the template that folder ships (a real checkpoint's own), else with the built-in
template of the model's family; "qwen2.5" or "qwen3" forces that built-in template
(`sdar_jax.text.chat_templates`).

"tiny" is the offline demo's model: the Qwen3 architecture at toy size, but with the full Qwen
vocabulary so that the real tokenizer drives it.
"""

from __future__ import annotations

import ml_collections as mlc
from ml_collections import config_dict

# name -> (ModelConfig preset, Hugging Face id)
_MODELS: dict[str, tuple[str, str]] = {
  # The three models of the paper's table (docs/reference.md §8).
  "qwen2.5-3b": ("qwen2.5-3b", "Qwen/Qwen2.5-3B-Instruct"),
  "qwen2.5-7b": ("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct"),
  "qwen3-1.7b": ("qwen3-1.7b", "Qwen/Qwen3-1.7B"),
  # Other published sizes of the same families.
  "qwen2.5-0.5b": ("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct"),
  "qwen2.5-1.5b": ("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct"),
  "qwen3-0.6b": ("qwen3-0.6b", "Qwen/Qwen3-0.6B"),
  "qwen3-4b": ("qwen3-4b", "Qwen/Qwen3-4B"),
  "qwen3-4b-2507": ("qwen3-4b-2507", "Qwen/Qwen3-4B-Instruct-2507"),
  "qwen3-8b": ("qwen3-8b", "Qwen/Qwen3-8B"),
  "tiny": ("tiny", ""),
}

# Non-thinking Qwen3 models: their published chat template opens the assistant turn with no
# `<think>` block at all (hybrid Qwen3 models get an empty one, which switches thinking off).
_NON_THINKING = frozenset({"qwen3-4b-2507"})

# The Qwen vocabulary padded as in the published checkpoints: every tokenizer id (151,669) fits.
QWEN_VOCAB = 151936


def names() -> list[str]:
  """Every model name `model()` accepts."""
  return sorted(_MODELS)


def tiny_arch() -> mlc.ConfigDict:
  """The demo architecture (ModelConfig.tiny fields): ~9.8M parameters, nearly all embedding."""
  return mlc.ConfigDict(
    dict(
      family="qwen3",
      vocab_size=QWEN_VOCAB,
      hidden_size=64,
      intermediate_size=192,
      num_layers=2,
      num_heads=4,
      num_kv_heads=2,
      head_dim=16,
      tie_word_embeddings=True,
      max_position_embeddings=8192,
    )
  )


def model(name: str) -> mlc.ConfigDict:
  """The `config.model` section for model `name` (see `names()`; the Hugging Face spelling with
  "-Instruct", e.g. "Qwen3-4B-Instruct-2507", is accepted too)."""
  key = name.lower().replace("-instruct", "")
  if key not in _MODELS:
    raise ValueError(f"unknown model {name!r}; valid models: {names()}")
  preset, hf_id = _MODELS[key]
  tiny = key == "tiny"
  return mlc.ConfigDict(
    dict(
      preset=preset,
      hf_id=hf_id,  # documentation: where `path` comes from (nothing is downloaded)
      path=config_dict.placeholder(str),  # a local Hugging Face model directory
      # Used only without `path`: a run then refuses to start unless random weights are asked for
      # explicitly (the tiny demo model asks for them; a real preset without weights is a slip).
      random_init=tiny,
      tokenizer_dir=config_dict.placeholder(str),  # default: path, else the bundled Qwen tokenizer
      # "auto": the template the tokenizer folder ships, else the model family's built-in one;
      # "qwen2.5" | "qwen3": that built-in template (sdar_jax.text.chat_templates).
      chat_template="auto",
      # Qwen3 generation prompt. False: `<|im_start|>assistant\n<think>\n\n</think>\n\n`, thinking
      # switched off as the reference runs hybrid Qwen3 models. True: `<|im_start|>assistant\n`,
      # which is the published template's prompt of the non-thinking Instruct-2507 models.
      enable_thinking=key in _NON_THINKING,
      # Activations in bf16 on accelerators; parameters and AdamW moments in fp32 (the master copy).
      dtype="float32" if tiny else "bfloat16",
      param_dtype="float32",
      remat=not tiny,
      # How a sequence attends to itself (sdar_jax.models.attention): "auto" = cuDNN's fused kernel
      # on GPU (bf16), Pallas splash on TPU, XLA on CPU ("chunked" from 2,048 tokens on); "xla" |
      # "chunked" (online softmax over key blocks, no T x T scores) | "cudnn" | "splash".
      attention="auto",
      # How a sequence runs through the layers: "auto" = unrolled on CPU (faster there), one
      # lax.scan elsewhere (compile time independent of depth); "scan" | "unroll".
      layer_loop="auto",
      tiny=tiny_arch(),  # used only when preset == "tiny"
    )
  )
