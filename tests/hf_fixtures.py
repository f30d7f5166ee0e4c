"""Small random transformers (PyTorch) Qwen2 / Qwen3 models, saved to disk, for parity tests.

The weights are drawn wider than transformers' default init (std 0.02 gives nearly uniform
logits, which would hide most bugs): matrices ~ N(0, 0.08), embedding / output matrices ~ N(0, 0.5), norm scales ~ 1 + 0.3 N(0, 1),
biases ~ N(0, 0.3), so the next-token distributions are far from uniform.
"""

from __future__ import annotations

import numpy as np
import torch
import transformers

from tests.helpers import SMALL_QWEN3  # noqa: F401  (re-exported for the parity tests)

SMALL = dict(
  vocab_size=384,
  hidden_size=64,
  intermediate_size=160,
  num_hidden_layers=3,
  num_attention_heads=4,
  num_key_value_heads=2,
  rms_norm_eps=1e-6,
  max_position_embeddings=512,
)


def hf_config(family: str, tied: bool, **overrides):
  kw = dict(SMALL, tie_word_embeddings=tied)
  kw.update(overrides)
  if family == "qwen2":
    kw.setdefault("rope_theta", 10000.0)
    return transformers.Qwen2Config(**kw)
  kw.setdefault("head_dim", 24)  # deliberately != hidden / heads, as in real Qwen3
  kw.setdefault("rope_theta", 1e6)
  return transformers.Qwen3Config(**kw)


def make_hf_model(family: str, tied: bool, seed: int = 0, **overrides):
  torch.manual_seed(seed)
  config = hf_config(family, tied, **overrides)
  model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
  model = model.float().eval()
  gen = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
      elif name.endswith(".bias"):
        p.copy_(0.3 * torch.randn(p.shape, generator=gen))
      elif "embed_tokens" in name or "lm_head" in name:
        p.copy_(0.5 * torch.randn(p.shape, generator=gen))
      else:
        p.copy_(0.08 * torch.randn(p.shape, generator=gen))
  return model


def save_hf_model(model, path) -> str:
  model.save_pretrained(str(path))
  return str(path)


def ragged_batch(vocab: int, lengths: list[int], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Left-padded int32 tokens and mask for sequences of the given lengths (pad id 0)."""
  rng = np.random.default_rng(seed)
  T = max(lengths)
  tokens = np.zeros((len(lengths), T), np.int32)
  mask = np.zeros((len(lengths), T), np.int32)
  for i, n in enumerate(lengths):
    tokens[i, T - n :] = rng.integers(1, vocab, n)
    mask[i, T - n :] = 1
  return tokens, mask


def hf_logits(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """transformers' logits with left padding: positions follow the mask as in generate()."""
  t = torch.tensor(tokens, dtype=torch.long)
  m = torch.tensor(mask, dtype=torch.long)
  pos = (m.cumsum(-1) - 1).clamp(min=0)
  with torch.no_grad():
    out = model(input_ids=t, attention_mask=m, position_ids=pos, use_cache=False)
  return out.logits.float().numpy()
