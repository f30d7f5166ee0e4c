"""Forward throughput: our jitted Flax/JAX Qwen3 vs transformers' PyTorch Qwen3, same weights.

    .venv/bin/python bench/forward.py [--batch 8 --seq 256 --repeats 10]

Both run the same random Qwen3-architecture model (the peers.md workload config: vocab 4096,
hidden 256, intermediate 768, 4 layers, 8 heads, 4 kv heads, head_dim 32, fp32) on the same
[batch, seq] token batch and produce full [batch, seq, vocab] logits. tokens/s = batch*seq /
median wall time of one call (after a warm-up call; the JAX compile time is printed separately).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from sdar_jax.models import forward, load_pretrained  # noqa: E402

CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=4, head_dim=32, rope_theta=1e6,
              rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=4096)


def _median_time(fn, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=10)
  args = parser.parse_args()

  torch.manual_seed(0)
  hf = transformers.AutoModelForCausalLM.from_config(
      transformers.Qwen3Config(**CONFIG), attn_implementation="sdpa").float().eval()
  with torch.no_grad():  # norm scales 1 + 0.1 N(0,1) as in peers.md
    for name, p in hf.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn(p.shape))
  tokens = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (args.batch, args.seq)).astype(np.int32)

  with tempfile.TemporaryDirectory() as d:
    hf.save_pretrained(d)
    config, params = load_pretrained(d, dtype="float32")

  start = time.perf_counter()
  jax.block_until_ready(forward(config, params, tokens))
  jax_first = time.perf_counter() - start
  jax_s = _median_time(lambda: jax.block_until_ready(forward(config, params, tokens)), args.repeats)

  t = torch.tensor(tokens, dtype=torch.long)

  def torch_call():
    with torch.inference_mode():
      return hf(input_ids=t, use_cache=False).logits

  start = time.perf_counter()
  ref = torch_call()
  torch_first = time.perf_counter() - start
  torch_s = _median_time(torch_call, args.repeats)

  ours = np.asarray(forward(config, params, tokens))
  max_abs = float(np.max(np.abs(ours - ref.float().numpy())))
  n = args.batch * args.seq
  print(f"forward [{args.batch}, {args.seq}] -> logits [{args.batch}, {args.seq}, {CONFIG['vocab_size']}], "
        f"fp32, {jax.device_count()} {jax.devices()[0].platform} device(s), torch threads {torch.get_num_threads()}")
  print(f"{'peer':<22}{'median s':>10}{'tokens/s':>12}{'first call s':>14}")
  print(f"{'sdar-jax (jit)':<22}{jax_s:>10.4f}{n / jax_s:>12.0f}{jax_first:>14.2f}")
  print(f"{'transformers (torch)':<22}{torch_s:>10.4f}{n / torch_s:>12.0f}{torch_first:>14.2f}")
  print(f"speed-up sdar-jax / transformers: {torch_s / jax_s:.2f}x; logits max |diff| {max_abs:.2e}")


if __name__ == "__main__":
  main()
