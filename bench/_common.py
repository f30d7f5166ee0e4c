"""Shared by the benchmarks: the benchmark workload of docs/design.md model and interleaved timing.

Every peer comparison runs the same random Qwen3 (vocab 4096, hidden 256, intermediate 768,
4 layers, 8 heads, 4 kv heads, head_dim 32, untied, rope theta 1e6, fp32; matrices N(0, 0.02),
norm scales 1 + 0.1 N(0, 1)), saved once as a Hugging Face checkpoint so every peer loads the
same weights. Timed repeats run round-robin over the peers, so background load on this shared
2-core machine hits every peer alike; compare peers within one run.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

PEER_HF_CONFIG = dict(
  vocab_size=4096,
  hidden_size=256,
  intermediate_size=768,
  num_hidden_layers=4,
  num_attention_heads=8,
  num_key_value_heads=4,
  head_dim=32,
  rope_theta=1e6,
  rms_norm_eps=1e-6,
  tie_word_embeddings=False,
  max_position_embeddings=4096,
)


def peer_model(seed: int = 0, attn_implementation: str = "sdpa"):
  """The transformers (PyTorch) model of the benchmark workload of docs/design.md, fp32, eval mode."""
  import torch
  import transformers

  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(
    transformers.Qwen3Config(**PEER_HF_CONFIG), attn_implementation=attn_implementation
  )
  model = model.float().eval()
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
      else:
        p.copy_(0.02 * torch.randn(p.shape, generator=gen))
  return model


def interleaved(
  calls: dict[str, Callable[[], Any]], repeats: int
) -> dict[str, tuple[float, float, Any]]:
  """name -> (first-call s, median s, last output); the repeats run round-robin over the calls."""
  first, outputs, times = {}, {}, {name: [] for name in calls}
  for name, call in calls.items():
    start = time.perf_counter()
    outputs[name] = call()
    first[name] = time.perf_counter() - start
  for _ in range(repeats):
    for name, call in calls.items():
      start = time.perf_counter()
      outputs[name] = call()
      times[name].append(time.perf_counter() - start)
  return {name: (first[name], statistics.median(times[name]), outputs[name]) for name in calls}


def median_time(fn: Callable[[], Any], repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)
