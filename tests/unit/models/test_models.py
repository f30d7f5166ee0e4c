"""Our Flax/JAX Qwen2 and Qwen3 against transformers' PyTorch implementation on the same weights."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from sdar_jax.core.scoring import response_logprobs
from sdar_jax.models import (
  ModelConfig,
  forward,
  hf_io,
  init_params,
  load_pretrained,
  qwen,
  save_pretrained,
)
from sdar_jax.models.qwen import decode_step, logits_from_hidden, prefill, unstack_layers
from tests import hf_fixtures

LENGTHS = [11, 4, 7, 1]  # ragged, left-padded; one single-token row

CASES = [("qwen2", False), ("qwen2", True), ("qwen3", False), ("qwen3", True)]


@pytest.fixture(
  scope="module", params=CASES, ids=[f"{f}-{'tied' if t else 'untied'}" for f, t in CASES]
)
def hf_case(request, tmp_path_factory):
  family, tied = request.param
  model = hf_fixtures.make_hf_model(family, tied, seed=len(family) + tied)
  path = hf_fixtures.save_hf_model(model, tmp_path_factory.mktemp(f"{family}{tied}"))
  return family, tied, model, path


def _real_positions_max_abs(a, b, mask):
  sel = mask.astype(bool)
  return float(np.max(np.abs(a[sel] - b[sel])))


@pytest.mark.slow
def test_logits_match_transformers_fp32(hf_case):
  family, tied, model, path = hf_case
  config, params = load_pretrained(path, dtype="float32")
  assert config.family == family and config.tie_word_embeddings == tied
  tokens, mask = hf_fixtures.ragged_batch(config.vocab_size, LENGTHS)
  ref = hf_fixtures.hf_logits(model, tokens, mask)
  ours = np.asarray(forward(config, params, tokens, mask))
  # The weights are wide enough that the distributions are far from uniform.
  probs = jax.nn.softmax(ref[mask.astype(bool)], axis=-1)
  assert float(np.max(probs)) > 0.3
  assert float(np.std(ref[mask.astype(bool)])) > 1.0
  assert _real_positions_max_abs(ours, ref, mask) < 1e-4


@pytest.mark.slow
def test_left_padding_does_not_change_real_tokens(hf_case):
  _, _, _, path = hf_case
  config, params = load_pretrained(path)
  tokens, mask = hf_fixtures.ragged_batch(config.vocab_size, LENGTHS)
  batched = np.asarray(forward(config, params, tokens, mask))
  for i, n in enumerate(LENGTHS):
    alone = np.asarray(forward(config, params, tokens[i : i + 1, -n:]))
    np.testing.assert_allclose(batched[i, -n:], alone[0], atol=1e-4, rtol=0)


@pytest.mark.slow
def test_prefill_then_decode_steps_match_transformers(hf_case):
  """The one decode path: prefill ragged, left-padded prompts into the model's KVCache, then feed
  one token per row per decode_step; every step's logits equal transformers' on the whole
  sequence, and the cache ends full."""
  _, _, model, path = hf_case
  config, params = load_pretrained(path, dtype="float32")
  steps = 4
  prompt, mask = hf_fixtures.ragged_batch(config.vocab_size, LENGTHS, seed=4)
  T = prompt.shape[1]
  fed = np.random.default_rng(5).integers(1, config.vocab_size, (len(LENGTHS), steps))
  full = np.concatenate([prompt, fed], axis=1).astype(np.int32)
  full_mask = np.concatenate([mask, np.ones_like(fed)], axis=1).astype(np.int32)
  ref = hf_fixtures.hf_logits(model, full, full_mask)  # [B, T + steps, V]

  # each call one compiled program (op by op, every operation would compile on its own)
  run_prefill = jax.jit(prefill, static_argnums=0, static_argnames=("cache_size", "last_only"))
  to_logits = jax.jit(logits_from_hidden, static_argnums=0)
  hidden, cache = run_prefill(config, params, prompt, mask, cache_size=T + steps)
  assert cache.size == T + steps and int(cache.index) == T
  got = np.asarray(to_logits(config, params, hidden[:, -1]))
  np.testing.assert_allclose(got, ref[:, T - 1], atol=1e-4, rtol=0)
  # last_only (the sampler's prefill): the same cache, and the last position's hidden state only
  last, last_cache = run_prefill(config, params, prompt, mask, cache_size=T + steps, last_only=True)
  assert last.shape[:2] == (len(LENGTHS), 1)
  # float32 rounding only: bounded by the size of the values compared, not a fixed epsilon
  want = np.asarray(hidden[:, -1])
  np.testing.assert_allclose(np.asarray(last[:, 0]), want, atol=1e-5 * np.abs(want).max(), rtol=0)
  for a, b in zip(jax.tree.leaves(last_cache), jax.tree.leaves(cache)):
    b = np.asarray(b)
    np.testing.assert_allclose(np.asarray(a), b, atol=1e-5 * max(np.abs(b).max(), 1.0), rtol=0)
  step = jax.jit(decode_step, static_argnums=0)
  layers = unstack_layers(config, params)
  positions = mask.sum(axis=1).astype(np.int32)  # the next position of each row
  for s in range(steps):
    hidden, cache = step(config, params, full[:, T + s], positions + s, cache, layers)
    got = np.asarray(to_logits(config, params, hidden))
    np.testing.assert_allclose(got, ref[:, T + s], atol=1e-4, rtol=0)
  assert int(cache.index) == T + steps and bool(np.all(np.asarray(cache.valid)[:, T:]))

  with pytest.raises(ValueError, match="cache_size=3 is below the prompt length 11"):
    prefill(config, params, prompt, mask, cache_size=3)


@pytest.mark.slow
def test_save_then_transformers_load_gives_same_logits(hf_case, tmp_path):
  _, _, model, path = hf_case
  config, params = load_pretrained(path)
  out = save_pretrained(config, params, tmp_path / "exported")
  reloaded = (
    transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    .float()
    .eval()
  )
  tokens, mask = hf_fixtures.ragged_batch(config.vocab_size, LENGTHS, seed=3)
  a = hf_fixtures.hf_logits(model, tokens, mask)
  b = hf_fixtures.hf_logits(reloaded, tokens, mask)
  assert _real_positions_max_abs(a, b, mask) == 0.0


@pytest.mark.slow
def test_bf16_forward_within_documented_bound(hf_case):
  family, tied, model, path = hf_case
  config32, params32 = load_pretrained(path, dtype="float32")
  config16, params16 = load_pretrained(path, dtype="bfloat16")
  assert params16["embed"].dtype == jnp.bfloat16
  tokens, mask = hf_fixtures.ragged_batch(config32.vocab_size, LENGTHS)
  ref = np.asarray(forward(config32, params32, tokens, mask))
  low = np.asarray(forward(config16, params16, tokens, mask))
  assert low.dtype == np.float32
  sel = mask.astype(bool)
  # Documented bound (docs/numerics.md): bf16 logits within 5% of the fp32 logit scale (max-abs),
  # and the same argmax on at least 90% of real positions.
  scale = float(np.max(np.abs(ref[sel])))
  assert _real_positions_max_abs(low, ref, mask) < 0.05 * scale
  agree = np.mean(np.argmax(low[sel], -1) == np.argmax(ref[sel], -1))
  assert agree >= 0.9


@pytest.mark.slow
@pytest.mark.parametrize("layer_loop,remat", [("unroll", False), ("unroll", True), ("scan", False)])
def test_response_logprob_gradients_match_transformers_float64(layer_loop, remat, tmp_path):
  """The update's path (`response_logprobs`: the decoder keeps the last R + 1 positions, so when
  unrolled its last layer runs the response positions alone) on a left-padded batch gives the
  gradients of a weighted sum of response log-probs that float64 autograd of transformers gives,
  each row run alone without padding (the sum over rows makes the batch's gradient the sum of
  the rows'; transformers' eager backward through pad queries would be NaN)."""
  model = hf_fixtures.make_hf_model("qwen3", False, seed=3)
  path = hf_fixtures.save_hf_model(model, tmp_path / "model")
  config, params = load_pretrained(path, dtype="float32")
  config = config.replace(layer_loop=layer_loop, remat=remat)
  lengths, R = [12, 9, 6], 5
  tokens, mask = hf_fixtures.ragged_batch(config.vocab_size, lengths, seed=8)
  w = np.random.default_rng(9).normal(size=(len(lengths), R))

  def loss(p):
    logp, _ = response_logprobs(config, p, tokens, mask, R)
    return jnp.sum(w.astype(np.float32) * logp)

  ours = dict(hf_io.to_hf_tensors(config, jax.jit(jax.grad(loss))(params)))

  model64 = model.double()
  model64.zero_grad(set_to_none=True)
  for row, n in enumerate(lengths):  # .backward() adds each row's gradients into .grad
    ids = torch.tensor(tokens[row : row + 1, -n:], dtype=torch.long)
    logp = torch.log_softmax(model64(input_ids=ids, use_cache=False).logits[0, -R - 1 : -1], -1)
    picked = torch.gather(logp, -1, ids[0, -R:, None])[:, 0]
    (torch.tensor(w[row]) * picked).sum().backward()
  want = {name: p.grad.numpy() for name, p in model64.named_parameters() if p.grad is not None}
  model.float()

  assert sorted(ours) == sorted(want)
  for name, ref in want.items():
    # float32 rounding of sums over 3 rows x 12 tokens: a few hundred eps of the largest entry.
    scale = float(np.max(np.abs(ref)))
    assert np.max(np.abs(ours[name] - ref)) < 2e-4 * scale, name


@pytest.mark.slow
@pytest.mark.parametrize("layer_loop", ["scan", "unroll"])
def test_parameter_gradients_match_transformers_float64(layer_loop, tmp_path):
  """Both layer loops (and the attention's written-out backward pass) give the gradients of a
  weighted sum of log-probs that float64 autograd of transformers gives, for every tensor. No
  padding: transformers' eager backward gives NaN through a query that sees no key (ours gives
  0; tests/unit/models/test_attention.py checks those rows against float64 NumPy)."""
  model = hf_fixtures.make_hf_model("qwen3", False, seed=3)
  path = hf_fixtures.save_hf_model(model, tmp_path / "model")
  config, params = load_pretrained(path, dtype="float32")
  config = config.replace(layer_loop=layer_loop)
  tokens, mask = hf_fixtures.ragged_batch(config.vocab_size, [11] * 4, seed=6)
  rng = np.random.default_rng(7)
  w = (rng.normal(size=(*tokens.shape, config.vocab_size)) * mask[..., None]).astype(np.float32)

  def loss(p):
    return jnp.sum(w * jax.nn.log_softmax(forward(config, p, tokens, mask), axis=-1))

  ours = dict(hf_io.to_hf_tensors(config, jax.jit(jax.grad(loss))(params)))

  model64 = model.double()
  model64.zero_grad(set_to_none=True)
  m = torch.tensor(mask, dtype=torch.long)
  logits = model64(
    input_ids=torch.tensor(tokens, dtype=torch.long),
    attention_mask=m,
    position_ids=(m.cumsum(-1) - 1).clamp(min=0),
    use_cache=False,
  ).logits
  (torch.tensor(w, dtype=torch.float64) * torch.log_softmax(logits, -1)).sum().backward()
  want = {name: p.grad.numpy() for name, p in model64.named_parameters()}
  model.float()  # the module fixture is shared: give it back in float32

  assert sorted(ours) == sorted(want)
  for name, ref in want.items():
    # float32 rounding of sums over 4 rows x 11 tokens: a few hundred eps of the largest entry.
    scale = float(np.max(np.abs(ref)))
    assert np.max(np.abs(ours[name] - ref)) < 2e-4 * scale, name


def test_layer_loop_resolves_by_backend_and_bad_names_are_refused():
  resolve = qwen.layer_loop_implementation
  config = ModelConfig.tiny()
  assert resolve(config, "cpu") == "unroll"
  assert resolve(config, "gpu") == "scan" and resolve(config, "tpu") == "scan"
  for name in ("scan", "unroll"):
    assert resolve(config.replace(layer_loop=name), "cpu") == name
    assert resolve(config.replace(layer_loop=name), "tpu") == name
  with pytest.raises(ValueError, match=r"layer_loop='python'.*choose one of.*unroll"):
    ModelConfig.tiny(layer_loop="python")
  from configs import alfworld, common
  from sdar_jax.run import config_validation

  run_config = alfworld.get_config("model=tiny,algo=sdar,local=True")
  assert config_validation.model_config_from(run_config).layer_loop == "auto"
  run_config = common.override(run_config, {"model.layer_loop": "scan"})
  assert config_validation.model_config_from(run_config).layer_loop == "scan"


def test_sharded_checkpoint_roundtrip(tmp_path):
  config = hf_fixtures.SMALL_QWEN3
  params = init_params(config, jax.random.key(1))
  out = save_pretrained(config, params, tmp_path / "sharded", max_shard_bytes=100_000)
  assert os.path.exists(os.path.join(out, "model.safetensors.index.json"))
  shards = [f for f in os.listdir(out) if f.endswith(".safetensors")]
  assert len(shards) > 1
  config2, params2 = load_pretrained(out)
  assert config2.head_dim == 16 and config2.num_layers == 2
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2
  )
  # transformers reads the same sharded directory and agrees with our forward.
  hf = (
    transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    .float()
    .eval()
  )
  tokens, mask = hf_fixtures.ragged_batch(256, [5, 3])
  np.testing.assert_allclose(
    np.asarray(forward(config, params, tokens, mask))[mask.astype(bool)],
    hf_fixtures.hf_logits(hf, tokens, mask)[mask.astype(bool)],
    atol=1e-4,
  )


def _small_dir(tmp_path, family="qwen2", tied=False):
  model = hf_fixtures.make_hf_model(family, tied, num_hidden_layers=1)
  return hf_fixtures.save_hf_model(model, tmp_path / "m")


def test_missing_unexpected_and_misshaped_tensors_are_named(tmp_path):
  path = _small_dir(tmp_path)
  f = hf_io.SafetensorsFile(os.path.join(path, "model.safetensors"))
  tensors = {n: np.array(f.get(n)) for n in f.names()}
  del f
  tensors.pop("model.layers.0.self_attn.k_proj.bias")
  tensors["model.layers.0.mlp.extra.weight"] = np.zeros((2, 2), np.float32)
  tensors["model.norm.weight"] = np.zeros((7,), np.float32)
  hf_io.write_safetensors(os.path.join(path, "model.safetensors"), tensors)
  with pytest.raises(ValueError) as err:
    load_pretrained(path)
  msg = str(err.value)
  assert "model.layers.0.self_attn.k_proj.bias" in msg
  assert "model.layers.0.mlp.extra.weight" in msg
  assert "model.norm.weight: checkpoint (7,), config expects (64,)" in msg


def test_unsupported_architecture_is_refused(tmp_path):
  path = _small_dir(tmp_path)
  cfg_path = os.path.join(path, "config.json")
  cfg = json.load(open(cfg_path))
  cfg["model_type"], cfg["architectures"] = "llama", ["LlamaForCausalLM"]
  json.dump(cfg, open(cfg_path, "w"))
  with pytest.raises(ValueError, match="Unsupported architecture.*llama"):
    load_pretrained(path)


def test_missing_weights_file_is_explained(tmp_path):
  path = _small_dir(tmp_path)
  os.remove(os.path.join(path, "model.safetensors"))
  with pytest.raises(FileNotFoundError, match="No model.safetensors"):
    load_pretrained(path)


def test_rope_theta_from_either_layout():
  base = hf_fixtures.hf_config("qwen3", False).to_dict()
  base.pop("rope_theta", None)
  base["rope_parameters"] = {"rope_theta": 5e6, "rope_type": "default"}
  assert ModelConfig.from_hf_config(base).rope_theta == 5e6
  base.pop("rope_parameters")
  base["rope_theta"] = 1234.0
  assert ModelConfig.from_hf_config(base).rope_theta == 1234.0
  base["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
  with pytest.raises(NotImplementedError, match="yarn"):
    ModelConfig.from_hf_config(base)


def test_presets_match_published_sizes():
  # Published parameter counts (billions, rounded as in the model names / model cards).
  expected = {
    "qwen2.5-0.5b": 0.49,
    "qwen2.5-1.5b": 1.54,
    "qwen2.5-3b": 3.09,
    "qwen2.5-7b": 7.62,
    "qwen3-0.6b": 0.60,
    "qwen3-1.7b": 1.72,
    "qwen3-4b": 4.02,
    "qwen3-8b": 8.19,
  }
  for name, billions in expected.items():
    assert abs(ModelConfig.preset(name).num_params / 1e9 - billions) < 0.01, name
  assert ModelConfig.preset("Qwen2.5-3B-Instruct").tie_word_embeddings
  assert ModelConfig.preset("qwen3-0.6b").head_dim * 16 != 1024
  with pytest.raises(ValueError, match="known presets"):
    ModelConfig.preset("qwen4-1b")


def test_init_params_std_and_structure():
  config = ModelConfig.tiny("qwen2", vocab_size=128, num_layers=2)
  params = init_params(config, jax.random.key(0))
  assert set(params["layers"]) >= {"q_bias", "k_bias", "v_bias"}
  assert "q_norm" not in params["layers"]
  assert abs(float(jnp.std(params["layers"]["up_proj"])) - 0.02) < 0.001
  assert float(jnp.min(params["final_norm"])) == 1.0
