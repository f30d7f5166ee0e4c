"""Rollout generation throughput: our sampler vs transformers' generate vs google-tunix's Sampler.

    .venv/bin/python bench/sampling.py [--repeats 7] [--devices 2] [--no-tunix]

All peers load one shared random Qwen3 checkpoint (HF safetensors in a temp dir; the benchmark
workload: vocab 4096, hidden 256, intermediate 768, 4 layers, 8 heads, 4 kv heads, head_dim 32,
untied, fp32; weights N(0, 0.02), norm scales 1 + 0.1 N(0, 1)) and decode the same 16 prompts x
64 random tokens greedily for exactly 64 new tokens (no stop token).
tokens/s = 16 * 64 generated tokens / median wall time of one whole call (prefill included).
transformers runs with torch's default threads ("hf_torch") and pinned to one thread
("hf_torch 1thr": on a CPU shared with other work, torch's spinning threads can make the default
many times slower); "vs hf" divides by the faster of the two.
Each peer is called once first (for JAX: compilation; printed as "first call"), then the timed
repeats run round-robin over the peers, so load from other processes hits every peer alike.
`--devices N` adds two rows for our sampler on meshes of N CPU devices (XLA runs each device's
program on its own thread): "dpN" splits the batch (every device streams all the weights),
"tpN" splits the heads, the MLP columns and the vocabulary (each device streams 1/N of the
weights, at the price of two all-reduces per layer per decode step).

Group prefix sharing: 2 distinct prompts x 8 copies (GRPO group size 8), the same batch with
sharing on (2 prefill rows) and off (16 prefill rows), at prompt length 64 and a longer one.

Row buckets: one greedy call of `--bucket-rows` (300) distinct prompts x 64 tokens, 16 new, at
the default row bucket (the next power of two: 512 rows) and at `rollout.row_step` =
`--row-step` (64: 320 rows), interleaved; the speedup and whether the tokens are identical.

Tunix is optional (`make bench` installs it beside .venv, requirements-bench.txt says how); without
it the table says so.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile


def _set_device_count(argv) -> None:
  """--devices must take effect before jax is imported."""
  for i, arg in enumerate(argv):
    n = (
      arg.split("=", 1)[1]
      if arg.startswith("--devices=")
      else (argv[i + 1] if arg == "--devices" and i + 1 < len(argv) else None)
    )
    if n and int(n) > 1:
      os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={int(n)}"
      )


_set_device_count(sys.argv)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from _common import (  # noqa: E402
  PEER_HF_CONFIG,
  bound_line,
  interleaved,
  machine_peaks,
  median_time,
  peer_model,
)

from sdar_jax.core import sharding  # noqa: E402
from sdar_jax.core.sampling import Sampler, SamplingParams  # noqa: E402
from sdar_jax.models import attention, load_pretrained  # noqa: E402
from sdar_jax.models.qwen import KVCache, decode_step, unstack_layers  # noqa: E402
from sdar_jax.models.roofline import decode_work, sampler_work  # noqa: E402


def write_checkpoint(path: str, seed: int = 0):
  """The benchmark workload model (bench/_common.py, docs/design.md) saved to `path`; returns the torch model."""
  model = peer_model(seed, attn_implementation="sdpa")
  model.save_pretrained(path)
  return model


# ------------------------------------------------------------------------------------ peers
def ours(path, prompts, new, devices=1, axis="data"):
  """A call of our sampler (greedy) returning [batch, new] tokens, and the Sampler; with
  `devices` > 1, on a mesh of that many CPU devices along `axis` ("data": the batch is split;
  "tensor": heads, MLP columns and the vocabulary are split, sharding.py's rules)."""
  config, params = load_pretrained(path)
  mesh = None
  if devices > 1:
    mesh = sharding.make_mesh({axis: devices})
    params = sharding.shard_params(params, config, mesh)
  sampler = Sampler(config, mesh)
  sp = SamplingParams(max_new_tokens=new, temperature=0.0, stop_token_ids=())
  lists = prompts.tolist()
  return (lambda: np.asarray(sampler.generate(params, lists, sp).tokens)), sampler


def hf(model, prompts, new, threads: int | None = None):
  """A call of transformers' greedy generate; `threads` pins torch's thread count for the call."""
  ids = torch.tensor(prompts, dtype=torch.long)
  mask = torch.ones_like(ids)

  def call():
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
      with torch.inference_mode():
        out = model.generate(
          ids,
          attention_mask=mask,
          do_sample=False,
          max_new_tokens=new,
          min_new_tokens=new,
          eos_token_id=None,
          pad_token_id=0,
        )
    finally:
      torch.set_num_threads(before)
    return out[:, prompts.shape[1] :].numpy()

  return call


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


def tunix(path, prompts, new):
  """A call of Tunix's Sampler (greedy), or a string saying why it cannot run."""
  try:
    from tunix.generate import sampler as tunix_sampler
    from tunix.models.qwen3 import model as tunix_model
    from tunix.models.qwen3 import params as tunix_params
  except ImportError as err:
    return (
      f"not installed (no module {err.name!r}): `make bench` installs it, or by hand .venv/bin/pip"
      " install --no-deps --target .venv-bench-peers -r requirements-bench.txt, then run with"
      " PYTHONPATH=.venv-bench-peers"
    )
  c = PEER_HF_CONFIG
  config = tunix_model.ModelConfig(
    num_layers=c["num_hidden_layers"],
    vocab_size=c["vocab_size"],
    embed_dim=c["hidden_size"],
    hidden_dim=c["intermediate_size"],
    num_heads=c["num_attention_heads"],
    head_dim=c["head_dim"],
    num_kv_heads=c["num_key_value_heads"],
    rope_theta=int(c["rope_theta"]),
    norm_eps=c["rms_norm_eps"],
    use_tied_embedding=False,
  )
  model = tunix_params.create_model_from_safe_tensors(path, config)
  cache = tunix_sampler.CacheConfig(
    cache_size=prompts.shape[1] + new,
    num_layers=config.num_layers,
    num_kv_heads=config.num_kv_heads,
    head_dim=config.head_dim,
  )
  sampler = tunix_sampler.Sampler(model, _IdsTokenizer(), cache)
  texts = [" ".join(map(str, row)) for row in prompts.tolist()]

  def call():
    out = sampler(
      texts,
      max_generation_steps=new,
      max_prompt_length=prompts.shape[1],
      temperature=0.0,
      eos_tokens=[-1],
    )
    return np.stack([np.asarray(t[:new]) for t in out.tokens])

  return call


# --------------------------------------------------------------------- decode vs filled length
def decode_filled(config, params, rows: int, buffer: int, filled: tuple[int, ...], steps: int):
  """Seconds per decode step of `rows` rows on a cache buffer of `buffer` slots holding `filled`
  slots (random keys and values, every slot real), `steps` steps in one jitted loop, with the
  blocked decode attention (`attention.DECODE_BLOCK`) and with one block over the whole buffer
  (the masked product, as before the blocked path): {(path, filled): seconds per step}."""
  layers_shape = (rows, config.num_kv_heads)
  rng = np.random.default_rng(0)
  dt = config.jnp_dtype
  k = [
    jax.numpy.asarray(rng.normal(size=(*layers_shape, config.head_dim, buffer)), dt)
    for _ in range(config.num_layers)
  ]
  v = [jax.numpy.swapaxes(a, 2, 3) for a in k]
  valid = jax.numpy.ones((rows, buffer), bool)
  tokens = jax.numpy.asarray(rng.integers(1, config.vocab_size, rows), jax.numpy.int32)
  out = {}
  default_block = attention.DECODE_BLOCK
  for path, block in (("blocked", default_block), ("whole buffer", buffer)):
    attention.DECODE_BLOCK = block

    def loop(params, cache, tokens):
      layers = unstack_layers(config, params)

      def body(i, carry):
        cache, tokens = carry
        positions = jax.numpy.full(tokens.shape, cache.index, jax.numpy.int32)
        h, cache = decode_step(config, params, tokens, positions, cache, layers)
        return cache, jax.numpy.argmax(h[:, :8], axis=-1).astype(jax.numpy.int32)

      return jax.lax.fori_loop(0, steps, body, (cache, tokens))[1]

    run = jax.jit(loop)  # a new function each path: traced with its block
    for n in filled:
      cache = KVCache(tuple(k), tuple(v), valid, jax.numpy.int32(n - steps))
      run(params, cache, tokens).block_until_ready()
      out[(path, n)] = (
        median_time(lambda r=run, c=cache: r(params, c, tokens).block_until_ready(), 5) / steps
      )
  attention.DECODE_BLOCK = default_block
  return out


# ------------------------------------------------------------------------------------- main
def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--prompt-len", type=int, default=64)
  parser.add_argument("--new", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--long-prompt", type=int, default=512)
  parser.add_argument(
    "--devices",
    type=int,
    default=1,
    help="also run ours on a data-parallel and on a tensor-parallel mesh of this many CPU devices",
  )
  parser.add_argument("--no-tunix", action="store_true")
  parser.add_argument("--bucket-rows", type=int, default=300, help="rows of the row-bucket lines")
  parser.add_argument("--row-step", type=int, default=64, help="rollout.row_step of those lines")
  parser.add_argument(
    "--decode-buffer", type=int, default=2048, help="cache slots of the filled-length lines"
  )
  args = parser.parse_args()
  peaks = machine_peaks()
  print(
    f"bound: {peaks[0] / 1e9:.0f} GFLOP/s, {peaks[1] / 1e9:.1f} GB/s ({peaks[2]}); "
    "x% of bound = roofline time (sdar_jax.models.roofline) / measured time"
  )
  print(
    f"jax {jax.__version__} ({jax.device_count()} {jax.devices()[0].platform} devices), "
    f"torch {torch.__version__} ({torch.get_num_threads()} threads), {os.cpu_count()} CPUs, "
    f"load average {os.getloadavg()[0]:.1f}"
  )

  rng = np.random.default_rng(0)
  prompts = rng.integers(1, PEER_HF_CONFIG["vocab_size"], (args.batch, args.prompt_len)).astype(
    np.int32
  )
  generated = args.batch * args.new
  with tempfile.TemporaryDirectory() as path:
    hf_model = write_checkpoint(path)
    ours_call, sampler = ours(path, prompts, args.new)
    calls = {
      "sdar_jax": ours_call,
      "hf_torch": hf(hf_model, prompts, args.new),
      "hf_torch 1thr": hf(hf_model, prompts, args.new, threads=1),
    }
    if args.devices > 1:
      calls[f"sdar_jax dp{args.devices}"] = ours(path, prompts, args.new, args.devices)[0]
      calls[f"sdar_jax tp{args.devices}"] = ours(path, prompts, args.new, args.devices, "tensor")[0]
    tunix_call = "skipped (--no-tunix)" if args.no_tunix else tunix(path, prompts, args.new)
    if callable(tunix_call):
      calls["tunix"] = tunix_call
    results = interleaved(calls, args.repeats)

    print(
      f"\ngenerate: {args.batch} prompts x {args.prompt_len} tokens, {args.new} new tokens, "
      f"greedy; median of {args.repeats} interleaved repeats"
    )
    print(f"{'peer':<14} {'median s/call':>14} {'tokens/s':>10} {'vs hf':>7} {'first call s':>13}")
    base = min(results["hf_torch"][1], results["hf_torch 1thr"][1])  # the faster transformers row
    for name, (first, median, _) in results.items():
      print(
        f"{name:<14} {median:>14.4f} {generated / median:>10.0f} {base / median:>6.2f}x {first:>13.2f}"
      )
    config, params = load_pretrained(path)
    work = sampler_work(config, args.batch, args.batch, args.prompt_len, args.new)
    for name, (_, median, _) in results.items():
      print(f"{name:<14} {bound_line(work, median, peaks)}")
    if not callable(tunix_call):
      print(f"{'tunix':<14} {tunix_call}")
    else:
      for name in results:
        if name.startswith("sdar_jax"):
          print(f"{name} vs tunix: {results['tunix'][1] / results[name][1]:.2f}x")
    reference = results["hf_torch"][2]
    for name, (_, _, tokens) in results.items():
      if not name.startswith("hf_torch"):
        print(
          f"sanity: {name} greedy tokens equal to transformers': "
          f"{int((tokens == reference).sum())}/{reference.size}"
        )
    print(f"sdar_jax compilations: {sampler.num_compilations}")

    # Decode cost against the filled length, the buffer fixed.
    buffer = args.decode_buffer
    filled = (args.prompt_len + args.new, buffer - 16)
    per_step = decode_filled(config, params, args.batch, buffer, filled, 16)
    print(
      f"\ndecode step, {args.batch} rows, cache buffer {buffer} slots, filled short and long "
      f"(block {attention.DECODE_BLOCK}); median of 5 calls of 16 steps"
    )
    for (path, n), seconds in per_step.items():
      work = decode_work(config, args.batch, n)
      print(
        f"{path:<13} filled {n:>5}: {1e3 * seconds:.3f} ms/step, {bound_line(work, seconds, peaks)}"
      )

    # Group prefix sharing: `group` copies of batch/group distinct prompts, sharing on vs off.
    sp = SamplingParams(max_new_tokens=args.new, temperature=1.0, stop_token_ids=())
    key = jax.random.key(0)
    print(
      f"\ngroup prefix sharing: {args.batch // args.group} prompts x {args.group} copies, "
      f"{args.new} new tokens, temperature 1"
    )
    for length in (args.prompt_len, args.long_prompt):
      distinct = rng.integers(1, PEER_HF_CONFIG["vocab_size"], (args.batch // args.group, length))
      grouped = [distinct[i // args.group].tolist() for i in range(args.batch)]
      shared = interleaved(
        {
          share: (
            lambda share=share, grouped=grouped: sampler.generate(params, grouped, sp, key, share)
          )
          for share in (True, False)
        },
        args.repeats,
      )
      same = shared[True][2].tokens == shared[False][2].tokens
      print(
        f"prompt {length:>4}: shared {shared[True][1]:.4f} s, unshared {shared[False][1]:.4f} s, "
        f"speedup {shared[False][1] / shared[True][1]:.2f}x (identical samples: {same})"
      )

    # Row buckets: a call of bucket_rows rows at the next power of two and at rollout.row_step.
    many = rng.integers(1, PEER_HF_CONFIG["vocab_size"], (args.bucket_rows, args.prompt_len))
    many = many.tolist()
    few = SamplingParams(max_new_tokens=16, temperature=0.0, stop_token_ids=())
    samplers = {"powers of two": Sampler(config)}
    samplers[f"row_step {args.row_step}"] = Sampler(config, row_step=args.row_step)
    timed = interleaved(
      {name: (lambda s=s: s.generate(params, many, few)) for name, s in samplers.items()},
      args.repeats,
    )
    (_, slow, pow2), (_, fast, stepped) = timed.values()
    print(
      f"\nrow buckets: {args.bucket_rows} prompts x {args.prompt_len} tokens, 16 new, greedy: "
      f"{pow2.shapes['batch']} rows {slow:.4f} s, {stepped.shapes['batch']} rows {fast:.4f} s, "
      f"speedup {slow / fast:.2f}x (identical tokens: {pow2.tokens == stepped.tokens})"
    )


if __name__ == "__main__":
  main()
