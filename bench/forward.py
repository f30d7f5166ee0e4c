"""Forward throughput: our jitted Flax/JAX Qwen3 vs transformers' PyTorch Qwen3, same weights.

    .venv/bin/python bench/forward.py [--batch 8 --seq 256 --repeats 10]

Both run the same random Qwen3-architecture model (the benchmark workload of docs/design.md config: vocab 4096,
hidden 256, intermediate 768, 4 layers, 8 heads, 4 kv heads, head_dim 32, fp32) on the same
[batch, seq] token batch and produce full [batch, seq, vocab] logits. tokens/s = batch*seq /
median wall time of one call; the first call (JAX: compilation) is printed separately, and the
repeats alternate between the peers (bench/_common.py).
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import PEER_HF_CONFIG, interleaved, peer_model  # noqa: E402

from sdar_jax.models import forward, load_pretrained  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=10)
  args = parser.parse_args()

  hf = peer_model(0, attn_implementation="sdpa")
  vocab = PEER_HF_CONFIG["vocab_size"]
  tokens = np.random.default_rng(0).integers(0, vocab, (args.batch, args.seq)).astype(np.int32)
  with tempfile.TemporaryDirectory() as d:
    hf.save_pretrained(d)
    config, params = load_pretrained(d, dtype="float32")
  t = torch.tensor(tokens, dtype=torch.long)

  def torch_call():
    with torch.inference_mode():
      return hf(input_ids=t, use_cache=False).logits

  def jax_call():
    return jax.block_until_ready(forward(config, params, tokens))

  results = interleaved(
    {"sdar-jax (jit)": jax_call, "transformers (torch)": torch_call}, args.repeats
  )
  jax_first, jax_s, _ = results["sdar-jax (jit)"]
  torch_first, torch_s, ref = results["transformers (torch)"]
  ours = np.asarray(forward(config, params, tokens))
  max_abs = float(np.max(np.abs(ours - ref.float().numpy())))
  n = args.batch * args.seq
  print(
    f"forward [{args.batch}, {args.seq}] -> logits [{args.batch}, {args.seq}, {vocab}], "
    f"fp32, {jax.device_count()} {jax.devices()[0].platform} device(s), torch threads {torch.get_num_threads()}"
  )
  print(f"{'peer':<22}{'median s':>10}{'tokens/s':>12}{'first call s':>14}")
  print(f"{'sdar-jax (jit)':<22}{jax_s:>10.4f}{n / jax_s:>12.0f}{jax_first:>14.2f}")
  print(f"{'transformers (torch)':<22}{torch_s:>10.4f}{n / torch_s:>12.0f}{torch_first:>14.2f}")
  print(
    f"speed-up sdar-jax / transformers: {torch_s / jax_s:.2f}x; logits max |diff| {max_abs:.2e}"
  )


if __name__ == "__main__":
  main()
