"""Rollout generation throughput: our sampler vs transformers' generate vs google-tunix's Sampler.

    .venv/bin/python bench/sampling.py [--repeats 5] [--no-tunix]

All three peers load one shared random Qwen3 checkpoint (HF safetensors in a temp dir; the
peers.md workload: vocab 4096, hidden 256, intermediate 768, 4 layers, 8 heads, 4 kv heads,
head_dim 32, untied, fp32; weights N(0, 0.02), norm scales 1 + 0.1 N(0, 1)) and decode the same
16 prompts x 64 random tokens greedily for exactly 64 new tokens (no stop token).
tokens/s = 16 * 64 generated tokens / median wall time of one whole call (prefill included),
after a first call that includes JAX compilation (printed separately).

Group prefix sharing: 2 distinct prompts x 8 copies (GRPO group size 8), the same batch with
sharing on (2 prefill rows) and off (16 prefill rows), at prompt length 64 and a longer one.

Tunix is optional (requirements-bench.txt has the install recipe); without it the table says so.
Numbers on a shared 2-core CPU are noisy: compare peers within one run.
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

from sdar_jax.models import load_pretrained  # noqa: E402
from sdar_jax.sampling import Sampler, SamplingParams  # noqa: E402

HF_CONFIG = dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=4, head_dim=32, rope_theta=1e6,
                 rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=4096)


def write_checkpoint(path: str, seed: int = 0):
  """A random HF Qwen3 checkpoint (the peers.md init) saved to `path`; returns the torch model."""
  torch.manual_seed(seed)
  model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**HF_CONFIG)).float().eval()
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
      else:
        p.copy_(0.02 * torch.randn(p.shape, generator=gen))
  model.save_pretrained(path)
  return model


def timed(fn, repeats: int) -> tuple[float, float, object]:
  """(first-call seconds, median seconds of `repeats` further calls, last output)."""
  t = time.perf_counter()
  out = fn()
  first = time.perf_counter() - t
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    out = fn()
    times.append(time.perf_counter() - t)
  return first, statistics.median(times), out


# ------------------------------------------------------------------------------------ peers
def run_ours(path, prompts, new, repeats):
  config, params = load_pretrained(path)
  sampler = Sampler(config)
  sp = SamplingParams(max_new_tokens=new, temperature=0.0, stop_token_ids=())
  lists = prompts.tolist()
  first, median, result = timed(lambda: sampler.generate(params, lists, sp), repeats)
  return first, median, np.asarray(result.tokens), sampler


def run_hf(model, prompts, new, repeats):
  ids = torch.tensor(prompts, dtype=torch.long)
  mask = torch.ones_like(ids)

  def call():
    with torch.inference_mode():
      return model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new,
                            min_new_tokens=new, eos_token_id=None, pad_token_id=0)

  first, median, out = timed(call, repeats)
  return first, median, out[:, prompts.shape[1]:].numpy()


class _IdsTokenizer:
  """Tunix's Sampler takes strings only: "12 345 ..." <-> ids, no BOS, pad 0, no EOS."""

  def encode(self, text, **_):
    return [int(t) for t in text.split()]

  def decode(self, ids, **_):
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self):
    return None

  def eos_id(self):
    return -1

  def pad_id(self):
    return 0


def run_tunix(path, prompts, new, repeats):
  try:
    from tunix.generate import sampler as tunix_sampler
    from tunix.models.qwen3 import model as tunix_model
    from tunix.models.qwen3 import params as tunix_params
  except ImportError as err:
    return f"not installed ({err.name}); see requirements-bench.txt"
  c = HF_CONFIG
  config = tunix_model.ModelConfig(
      num_layers=c["num_hidden_layers"], vocab_size=c["vocab_size"], embed_dim=c["hidden_size"],
      hidden_dim=c["intermediate_size"], num_heads=c["num_attention_heads"], head_dim=c["head_dim"],
      num_kv_heads=c["num_key_value_heads"], rope_theta=int(c["rope_theta"]),
      norm_eps=c["rms_norm_eps"], use_tied_embedding=False)
  model = tunix_params.create_model_from_safe_tensors(path, config)
  cache = tunix_sampler.CacheConfig(cache_size=prompts.shape[1] + new, num_layers=config.num_layers,
                                    num_kv_heads=config.num_kv_heads, head_dim=config.head_dim)
  sampler = tunix_sampler.Sampler(model, _IdsTokenizer(), cache)
  texts = [" ".join(map(str, row)) for row in prompts.tolist()]

  def call():
    return sampler(texts, max_generation_steps=new, max_prompt_length=prompts.shape[1],
                   temperature=0.0, eos_tokens=[-1])

  first, median, out = timed(call, repeats)
  return first, median, np.stack([np.asarray(t[:new]) for t in out.tokens])


# ------------------------------------------------------------------------------------- main
def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--prompt-len", type=int, default=64)
  parser.add_argument("--new", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--long-prompt", type=int, default=512)
  parser.add_argument("--no-tunix", action="store_true")
  args = parser.parse_args()
  print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), {os.cpu_count()} CPUs")

  rng = np.random.default_rng(0)
  prompts = rng.integers(1, HF_CONFIG["vocab_size"], (args.batch, args.prompt_len)).astype(np.int32)
  generated = args.batch * args.new
  rows = []
  with tempfile.TemporaryDirectory() as path:
    hf_model = write_checkpoint(path)
    ours = run_ours(path, prompts, args.new, args.repeats)
    hf = run_hf(hf_model, prompts, args.new, args.repeats)
    tunix = "skipped (--no-tunix)" if args.no_tunix else run_tunix(path, prompts, args.new, args.repeats)
    rows = [("sdar_jax", ours[:3]), ("hf_torch", hf), ("tunix", tunix)]

    print(f"\ngenerate: {args.batch} prompts x {args.prompt_len} tokens, {args.new} new tokens, greedy")
    print(f"{'peer':<10} {'median s/call':>14} {'tokens/s':>10} {'vs hf':>7} {'first call s':>13}")
    for name, r in rows:
      if isinstance(r, str):
        print(f"{name:<10} {r}")
        continue
      print(f"{name:<10} {r[1]:>14.4f} {generated / r[1]:>10.0f} {hf[1] / r[1]:>6.2f}x {r[0]:>13.2f}")
    if not isinstance(tunix, str):
      print(f"sdar_jax vs tunix: {tunix[1] / ours[1]:.2f}x")
    for name, r in rows:
      if not isinstance(r, str) and name != "hf_torch":
        same = int((r[2] == hf[2]).sum())
        print(f"sanity: {name} greedy tokens equal to transformers': {same}/{hf[2].size}")
    print(f"sdar_jax compilations: {ours[3].num_compilations}")

    # Group prefix sharing: G copies of B/G distinct prompts, sharing on vs off.
    sampler = ours[3]
    config, params = load_pretrained(path)
    sp = SamplingParams(max_new_tokens=args.new, temperature=1.0, stop_token_ids=())
    print(f"\ngroup prefix sharing: {args.batch // args.group} prompts x {args.group} copies, "
          f"{args.new} new tokens, temperature 1")
    for length in (args.prompt_len, args.long_prompt):
      distinct = rng.integers(1, HF_CONFIG["vocab_size"], (args.batch // args.group, length))
      grouped = [distinct[i // args.group].tolist() for i in range(args.batch)]
      key = jax.random.key(0)
      results = {}
      for share in (True, False):
        results[share] = timed(lambda: sampler.generate(params, grouped, sp, key, share), args.repeats)
      same = results[True][2].tokens == results[False][2].tokens
      print(f"prompt {length:>4}: shared {results[True][1]:.4f} s, unshared {results[False][1]:.4f} s, "
            f"speedup {results[False][1] / results[True][1]:.2f}x (identical samples: {same})")


if __name__ == "__main__":
  main()
