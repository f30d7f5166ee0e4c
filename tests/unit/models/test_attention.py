"""The attention implementations of `ModelConfig.attention` (models/attention.py) against float64
NumPy and against each other: the chunked online softmax and its hand-written backward pass, the
cuDNN path's left-padding rotation (run through JAX's reference implementation on CPU), the
splash kernel's wrapper (run in the Pallas interpreter), and xla vs chunked for the whole model:
logits, parameter gradients and the sampler's log-probs.

Float bounds are a few float32 eps times the size of what is summed (the values, the per-row
gradient magnitudes, the largest logit), never a fraction of a result that may cancel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdar_jax.core import sharding
from sdar_jax.core.sampling import Sampler, SamplingParams
from sdar_jax.core.scoring import response_logprobs
from sdar_jax.models import ModelConfig, attention, forward, init_params
from sdar_jax.run import config_validation
from tests.helpers import SMALL_SHAPE

EPS = float(np.finfo(np.float32).eps)
T = 37  # not a multiple of any block length below
# Each call is compiled as one program: run op by op, every operation would compile on its own.
_chunked = jax.jit(attention.chunked_attention, static_argnums=4)
_xla = jax.jit(attention.xla_attention)


def _key_valid(T: int) -> np.ndarray:
  """Rows of every padding pattern a batch has: left padding; none; left padding, a response,
  right padding (an update row); a single real token; no real token (a padded batch row)."""
  valid = np.ones((5, T), bool)
  valid[0, :9] = False
  valid[2, :4] = False
  valid[2, 29:] = False
  valid[3, :-1] = False
  valid[4, :] = False
  return valid


def _qkv(seed: int, B: int, N: int, K: int, H: int, spread: float = 1.5):
  rng = np.random.default_rng(seed)
  q = (spread * rng.normal(size=(B, T, N, H))).astype(np.float32)
  k = (spread * rng.normal(size=(B, K, H, T))).astype(np.float32)  # the cache layout
  v = rng.normal(size=(B, K, T, H)).astype(np.float32)
  return q, k, v


def _reference(q, k, v, valid):
  """float64 causal attention over the real keys (as `_attention` with the causal mask): output
  [B, T, N, H], probabilities [B, N, T, S], and which queries see a key. A query that sees none
  gets the mean of the values (what a masked softmax over all-equal scores gives)."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  T, N, H = q.shape[1:]
  K = k.shape[1]
  kv_of = np.arange(N) // (N // K)
  scores = np.einsum("btnh,bnhs->bnts", q, k[:, kv_of]) / np.sqrt(H)
  seen = np.tril(np.ones((T, T), bool))[None] & valid[:, None, :]  # [B, T, S]
  scores = np.where(seen[:, None], scores, -np.inf)
  sees_any = seen.any(-1)  # [B, T]
  scores = np.where(sees_any[:, None, :, None], scores, 0.0)  # blind rows: uniform
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = np.einsum("bnts,bnsh->btnh", probs, v[:, kv_of])
  return out, probs, sees_any


def _score_size(q, k) -> float:
  """The largest |score| any rounding of q.k can reach: max_h-summed |q||k| / sqrt(H)."""
  H = q.shape[-1]
  return float(np.max(np.abs(q)) * np.max(np.abs(k)) * H / np.sqrt(H))


# ----------------------------------------------------------------------------- attention alone
@pytest.mark.parametrize("heads", [(4, 2), (4, 4), (3, 1)], ids=["gqa", "mha", "mqa"])
@pytest.mark.parametrize("block", [4, 8, 13, 64])
def test_chunked_attention_equals_float64_reference(heads, block):
  N, K = heads
  q, k, v = _qkv(0, 5, N, K, 8)
  valid = _key_valid(T)
  want, _, _ = _reference(q, k, v, valid)
  got = np.asarray(_chunked(q, k, v, jnp.asarray(valid), block))
  xla = np.asarray(_xla(q, k, v, np.tril(np.ones((T, T), bool))[None] & valid[:, None]))
  # Output = a convex combination of values: rounding of the scores (relative to their size)
  # moves the weights, rounding of the sum moves it by a few eps of max|v|.
  tol = 8 * EPS * float(np.max(np.abs(v))) * (1 + _score_size(q, k))
  assert np.max(np.abs(got - want)) < tol
  assert np.max(np.abs(xla - want)) < tol  # the reference is the function `_attention` computes


def _gradient_sizes(q, k, v, w, valid):
  """Elementwise sizes (float64) of the sums that make up d(sum(w * out))/d(q, k, v): each
  gradient entry is bounded by the same sum taken over absolute values."""
  q64, k64, v64, w64 = (np.asarray(a, np.float64) for a in (q, k, v, w))
  B, T, N, H = q.shape
  K = k.shape[1]
  G = N // K
  kv_of = np.arange(N) // G
  out, probs, _ = _reference(q, k, v, valid)
  dp = np.einsum("btnh,bnsh->bnts", np.abs(w64), np.abs(v64[:, kv_of]))
  delta = np.einsum("btnh,btnh->bnt", np.abs(w64), np.abs(out))
  ds = probs * (dp + delta[..., None]) / np.sqrt(H)
  dq = np.einsum("bnts,bnhs->btnh", ds, np.abs(k64[:, kv_of]))
  dk = np.einsum("bnts,btnh->bnhs", ds, np.abs(q64)).reshape(B, K, G, H, T).sum(2)
  dv = np.einsum("bnts,btnh->bnsh", probs, np.abs(w64)).reshape(B, K, G, T, H).sum(2)
  return dq, dk, dv


@pytest.mark.parametrize("block", [8, 13])
def test_chunked_attention_gradients_equal_autodiff_of_xla(block):
  q, k, v = _qkv(1, 5, 4, 2, 8)
  valid = _key_valid(T)
  w = np.random.default_rng(2).normal(size=q.shape).astype(np.float32)
  mask = jnp.asarray(np.tril(np.ones((T, T), bool))[None] & valid[:, None])

  def xla_loss(q, k, v):
    return jnp.sum(attention.xla_attention(q, k, v, mask) * w)

  def chunked_loss(q, k, v):
    return jnp.sum(attention.chunked_attention(q, k, v, jnp.asarray(valid), block) * w)

  want = jax.jit(jax.grad(xla_loss, argnums=(0, 1, 2)))(q, k, v)
  got = jax.jit(jax.grad(chunked_loss, argnums=(0, 1, 2)))(q, k, v)
  sizes = _gradient_sizes(q, k, v, w, valid)
  for name, a, b, size in zip("qkv", got, want, sizes):
    tol = 16 * EPS * float(np.max(size)) * (1 + _score_size(q, k))
    assert np.max(np.abs(np.asarray(a) - np.asarray(b))) < tol, name
    assert np.all(np.isfinite(np.asarray(a))), name


def _reference_gradients(q, k, v, w, valid):
  """float64 d(sum(w * out))/d(q, k, v) of `_reference`, through the softmax's Jacobian
  (dS = P * (dP - sum_s(dP * P))); a query that sees no key has constant scores, so no gradient
  reaches q or k from it."""
  q64, k64, v64, w64 = (np.asarray(a, np.float64) for a in (q, k, v, w))
  B, T, N, H = q.shape
  K = k.shape[1]
  G = N // K
  kv_of = np.arange(N) // G
  _, probs, sees_any = _reference(q, k, v, valid)
  dp = np.einsum("btnh,bnsh->bnts", w64, v64[:, kv_of])
  ds = probs * (dp - np.sum(dp * probs, axis=-1, keepdims=True))
  ds = np.where(sees_any[:, None, :, None], ds, 0.0) / np.sqrt(H)
  dq = np.einsum("bnts,bnhs->btnh", ds, k64[:, kv_of])
  dk = np.einsum("bnts,btnh->bnhs", ds, q64).reshape(B, K, G, H, T).sum(2)
  dv = np.einsum("bnts,btnh->bnsh", probs, w64).reshape(B, K, G, T, H).sum(2)
  return dq, dk, dv


@pytest.mark.parametrize("heads", [(4, 2), (4, 4), (3, 1)], ids=["gqa", "mha", "mqa"])
def test_xla_attention_gradients_equal_float64_reference(heads):
  """`_attention`'s written-out backward pass (normalised after the value product, dS from
  rowsum(dO * O)) against the float64 softmax Jacobian, on every padding pattern of a batch."""
  N, K = heads
  q, k, v = _qkv(3, 5, N, K, 8)
  valid = _key_valid(T)
  w = np.random.default_rng(4).normal(size=q.shape).astype(np.float32)
  mask = jnp.asarray(np.tril(np.ones((T, T), bool))[None] & valid[:, None])
  got = jax.jit(
    jax.grad(lambda *a: jnp.sum(attention.xla_attention(*a, mask) * w), argnums=(0, 1, 2))
  )(q, k, v)
  want = _reference_gradients(q, k, v, w, valid)
  sizes = _gradient_sizes(q, k, v, w, valid)
  for name, a, b, size in zip("qkv", got, want, sizes):
    tol = 16 * EPS * float(np.max(size)) * (1 + _score_size(q, k))
    assert np.max(np.abs(np.asarray(a, np.float64) - b)) < tol, name


@pytest.mark.parametrize("blocks", [1, 3, 5])
@pytest.mark.parametrize("tail", [37, 20], ids=["all-queries", "last-20-queries"])
def test_causal_xla_attention_blocks_equal_float64_reference(blocks, tail):
  """Query blocks over their causal key prefixes (`causal_xla_attention`, also for the last
  `tail` of T positions, as the update's last layer runs them): the float64 output and gradients
  at every query that sees a key, on every padding pattern; finite everywhere."""
  q, k, v = _qkv(5, 5, 4, 2, 8)
  valid = _key_valid(T)
  w = np.random.default_rng(6).normal(size=q.shape).astype(np.float32)
  want, _, sees_any = _reference(q, k, v, valid)
  w = w * sees_any[..., None, None]  # blind queries' outputs differ by design; nothing reads them
  rows = slice(T - tail, T)

  def loss(q, k, v):
    out = attention.causal_xla_attention(q[:, rows], k, v, jnp.asarray(valid), blocks)
    return jnp.sum(out * w[:, rows]), out

  (_, got), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  tol = 8 * EPS * float(np.max(np.abs(v))) * (1 + _score_size(q, k))
  assert np.max(np.abs(np.asarray(got) - want[:, rows])[sees_any[:, rows]]) < tol
  assert np.all(np.isfinite(np.asarray(got)))
  # the gradients of the tail's loss: the reference's with the other queries' weights zeroed
  w_tail = np.zeros_like(w)
  w_tail[:, rows] = w[:, rows]
  want_grads = _reference_gradients(q, k, v, w_tail, valid)
  sizes = _gradient_sizes(q, k, v, w_tail, valid)
  for name, a, b, size in zip("qkv", grads, want_grads, sizes):
    tol = 16 * EPS * float(np.max(size)) * (1 + _score_size(q, k))
    assert np.max(np.abs(np.asarray(a, np.float64) - b)) < tol, name


def test_cudnn_path_rotation_equals_reference_at_every_query_that_sees_a_key():
  # The cuDNN path turns left padding into right padding by rotating each row; JAX's reference
  # implementation of the same call (implementation="xla") checks the rotation on CPU.
  q, k, v = _qkv(3, 5, 4, 2, 8)
  valid = _key_valid(T)
  want, _, sees_any = _reference(q, k, v, valid)
  fused = jax.jit(functools.partial(attention.fused_gpu_attention, implementation="xla"))
  got = np.asarray(fused(q, k, v, jnp.asarray(valid)))
  tol = 8 * EPS * float(np.max(np.abs(v))) * (1 + _score_size(q, k))
  assert np.max(np.abs(got - want)[sees_any]) < tol
  assert np.all(np.isfinite(got))


def test_splash_wrapper_equals_reference_at_real_queries():
  # The TPU kernel itself, run by the Pallas interpreter on CPU: padding as segment ids, the
  # sequence padded to the kernel's 128 lanes, grouped-query heads.
  q, k, v = _qkv(4, 5, 4, 2, 8)
  valid = _key_valid(T)
  want, _, _ = _reference(q, k, v, valid)
  got = np.asarray(attention.splash_attention(q, k, v, jnp.asarray(valid), interpret=True))
  tol = 8 * EPS * float(np.max(np.abs(v))) * (1 + _score_size(q, k))
  assert np.max(np.abs(got - want)[valid]) < tol
  assert np.all(np.isfinite(got))


def test_splash_wrapper_under_shard_map_on_a_mesh_equals_reference():
  # On a data/fsdp/tensor mesh in context the kernel runs under shard_map: rows over fsdp, kv
  # heads over tensor (4 CPU devices, Pallas interpreter).
  q, k, v = (a[:4] for a in _qkv(4, 5, 4, 2, 8))
  valid = _key_valid(T)[:4]
  want, _, _ = _reference(q, k, v, valid)
  mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "tensor": 2}, devices=jax.devices()[:4])
  splash = jax.jit(functools.partial(attention.splash_attention, interpret=True))
  with jax.set_mesh(mesh):
    assert "manual_computation" in splash.lower(q, k, v, valid).as_text()  # shard_map
    got = np.asarray(splash(q, k, v, valid))
  tol = 8 * EPS * float(np.max(np.abs(v))) * (1 + _score_size(q, k))
  assert np.max(np.abs(got - want)[valid]) < tol


def test_kernel_mesh_is_in_context_only_for_splash_on_several_devices():
  mesh = sharding.make_mesh({"data": 2}, devices=jax.devices()[:2])
  splash, xla = ModelConfig.tiny(attention="splash"), ModelConfig.tiny(attention="xla")
  mesh_size = jax.jit(lambda x: x + jax.sharding.get_abstract_mesh().size)
  assert sharding.with_kernel_mesh(mesh_size, mesh, xla) is mesh_size
  assert sharding.with_kernel_mesh(mesh_size, None, splash) is mesh_size
  wrapped = sharding.with_kernel_mesh(mesh_size, mesh, splash)
  assert int(wrapped(jnp.zeros((), jnp.int32))) == 2  # traced with the mesh in context
  assert "2" in wrapped.lower(jnp.zeros((), jnp.int32)).as_text()
  assert int(mesh_size(jnp.zeros((), jnp.int32))) == 0  # no mesh outside
  # The trainer's process-wide version (warm start and diagnostics jit the model themselves).
  assert not sharding.set_kernel_mesh(mesh, xla)
  assert jax.sharding.get_abstract_mesh().empty
  try:
    assert sharding.set_kernel_mesh(mesh, splash)
    assert int(jax.jit(lambda x: x + jax.sharding.get_abstract_mesh().size)(0)) == 2
  finally:
    jax.set_mesh(None)


# ------------------------------------------------------------------------------ which one runs
def test_auto_resolves_by_backend_dtype_and_length():
  bf16 = ModelConfig.tiny(dtype="bfloat16", head_dim=64)
  fp32 = ModelConfig.tiny(dtype="float32", head_dim=64)
  resolve = attention.attention_implementation
  assert resolve(bf16, 4096, "tpu") == "splash"
  assert resolve(bf16, 100, "gpu") == "cudnn"
  assert resolve(fp32, 100, "gpu") == "xla"  # cuDNN's fused kernel takes bf16 / fp16 only
  assert resolve(fp32, 4096, "gpu") == "chunked"
  assert resolve(bf16.replace(head_dim=256), 100, "gpu") == "xla"
  assert resolve(fp32, attention.CHUNKED_FROM - 1, "cpu") == "xla"
  assert resolve(fp32, attention.CHUNKED_FROM, "cpu") == "chunked"
  for name in ("xla", "chunked", "cudnn", "splash"):
    assert resolve(fp32.replace(attention=name), 10, "cpu") == name


def test_bad_attention_names_the_value_and_the_choices():
  with pytest.raises(ValueError, match=r"attention='flash'.*choose one of.*chunked"):
    ModelConfig.tiny(attention="flash")
  with pytest.raises(ValueError, match=r"attention_block=0"):
    ModelConfig.tiny(attention_block=0)


def test_config_key_reaches_the_model_config():
  from configs import alfworld, common

  config = alfworld.get_config("model=tiny,algo=sdar,local=True")
  assert config.model.attention == "auto"
  config = common.override(config, {"model.attention": "chunked"})
  assert config_validation.model_config_from(config).attention == "chunked"


# ------------------------------------------------------------------------------- whole model
CASES = ["qwen2", "qwen3"]


def _model(family: str, attention: str) -> ModelConfig:
  # several blocks per sequence
  return ModelConfig.tiny(family, **SMALL_SHAPE, attention=attention, attention_block=8)


def wide_params(family: str):
  """Weights drawn as tests/hf_fixtures.py draws them: matrices ~ N(0, 0.08), the embedding and
  the output head ~ N(0, 0.5), so the next-token distributions are far from uniform."""
  params = init_params(_model(family, "xla"), jax.random.key(7), std=0.08)
  wide = 0.5 / 0.08
  return {**params, "embed": params["embed"] * wide, "lm_head": params["lm_head"] * wide}


@pytest.fixture(scope="module", params=CASES)
def family_params(request):
  return request.param, wide_params(request.param)


def _update_rows(seed: int = 0, prompt: int = 20, response: int = 8):
  """Update rows: a left-padded prompt, then a response right-padded to `response` slots."""
  rng = np.random.default_rng(seed)
  B = 4
  tokens = rng.integers(1, 256, size=(B, prompt + response)).astype(np.int32)
  mask = np.zeros_like(tokens)
  for i, (p, r) in enumerate([(20, 8), (5, 3), (13, 8), (1, 1)]):
    mask[i, prompt - p : prompt + r] = 1
  tokens *= mask
  return tokens, mask, response


def test_model_logits_xla_equal_chunked(family_params):
  family, params = family_params
  tokens, mask, _ = _update_rows()
  xla = np.asarray(forward(_model(family, "xla"), params, tokens, mask))
  chunked = np.asarray(forward(_model(family, "chunked"), params, tokens, mask))
  # A logit sums D products through two layers; both programs round those alike up to the
  # attention's order of summation: a few eps of the largest logit.
  scale = float(np.max(np.abs(xla[mask > 0])))
  assert scale > 3.0  # far from uniform
  assert np.max(np.abs(chunked - xla)[mask > 0]) < 16 * EPS * scale
  assert np.all(np.isfinite(chunked))


@pytest.mark.slow
def test_model_gradients_xla_equal_chunked(family_params):
  family, params = family_params
  tokens, mask, R = _update_rows(seed=1)
  weights = np.random.default_rng(3).normal(size=(tokens.shape[0], R)).astype(np.float32)
  weights *= mask[:, -R:]

  def loss(params, tokens, mask, weights, config):
    logp, _ = response_logprobs(config, params, tokens, mask, R)
    return jnp.sum(weights * logp)

  grad = jax.jit(jax.grad(loss), static_argnums=4)
  want = grad(params, tokens, mask, weights, _model(family, "xla"))
  got = grad(params, tokens, mask, weights, _model(family, "chunked"))
  # Each gradient entry sums the rows' contributions: bound it by the sum of their magnitudes.
  per_row = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0, 0, None)), static_argnums=4)(
    params, tokens[:, None], mask[:, None], weights[:, None], _model(family, "xla")
  )
  for (path, a), b, rows in zip(
    jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), jax.tree.leaves(per_row)
  ):
    tol = 64 * EPS * float(np.max(np.sum(np.abs(np.asarray(rows)), axis=0)))
    assert np.max(np.abs(np.asarray(a) - np.asarray(b))) <= tol, jax.tree_util.keystr(path)


@pytest.mark.slow
def test_sampler_logprobs_xla_equal_chunked(family_params):
  family, params = family_params
  rng = np.random.default_rng(4)
  prompts = [rng.integers(1, 256, size=n).tolist() for n in (19, 4, 11, 1)]
  sampling = SamplingParams(max_new_tokens=10, temperature=1.0, stop_token_ids=())
  results = {}
  for implementation in ("xla", "chunked"):
    sampler = Sampler(_model(family, implementation), max_prompt_len=32)
    results[implementation] = sampler.generate(params, prompts, sampling, jax.random.key(5))
  xla, chunked = results["xla"], results["chunked"]
  assert chunked.tokens == xla.tokens
  # A log-prob is logit - logsumexp: a few eps of the largest logit.
  rows = [p + t for p, t in zip(prompts, xla.tokens)]
  width = max(map(len, rows))
  tokens = np.array([[0] * (width - len(r)) + r for r in rows], np.int32)
  mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows], np.int32)
  logits = np.asarray(forward(_model(family, "xla"), params, tokens, mask))
  tol = 16 * EPS * float(np.max(np.abs(logits[mask > 0])))
  for a, b in zip(chunked.logprobs, xla.logprobs):
    assert np.max(np.abs(np.asarray(a) - np.asarray(b))) < tol


# ------------------------------------------------------------------------------------- memory
@pytest.mark.slow
def test_chunked_gradient_keeps_no_t_by_t_scores_inside_a_layer_scan():
  # Under a differentiated scan over layers, loop-invariant mask work could be hoisted out and
  # kept for every block pair (T x T again); XLA's compiled memory shows whether it is.
  B, T, N, K, H = 2, 1024, 4, 2, 16
  sds = jax.ShapeDtypeStruct
  q, k, v = (
    sds((B, T, N, H), jnp.float32),
    sds((B, K, H, T), jnp.float32),
    sds((B, K, T, H), jnp.float32),
  )
  valid = sds((B, T), jnp.bool_)
  scales = sds((2, N, H), jnp.float32)  # two "layers"

  def temporaries(attend) -> int:
    def loss(scales, q, k, v, valid):
      def layer(x, s):
        return attend(x * s, k, v, valid), None

      return jnp.sum(jax.lax.scan(layer, q, scales)[0])

    compiled = jax.jit(jax.grad(loss)).lower(scales, q, k, v, valid).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  def xla(q, k, v, valid):
    return attention.xla_attention(q, k, v, jnp.tril(jnp.ones((T, T), bool))[None] & valid[:, None])

  scores = B * N * T * T * 4  # one layer's float32 scores
  assert temporaries(xla) > scores
  assert temporaries(lambda *a: attention.chunked_attention(*a, block=256)) < 0.5 * scores


# ------------------------------------------------------------------------ on a GPU (gpu_check)
needs_gpu = pytest.mark.skipif(
  jax.default_backend() != "gpu", reason="needs a GPU: bench/gpu_check.sh runs these there"
)
EPS_BF16 = float(jnp.finfo(jnp.bfloat16).eps)


def _bf16_qkv(seed: int):
  """bf16 inputs cuDNN takes (head_dim 64), and the same values in float32."""
  q, k, v = _qkv(seed, 5, 4, 2, 64, spread=0.5)
  q16, k16, v16 = (jnp.asarray(a, jnp.bfloat16) for a in (q, k, v))
  return (q16, k16, v16), tuple(np.asarray(a, np.float32) for a in (q16, k16, v16))


@needs_gpu
def test_cudnn_attention_equals_float64_reference_on_gpu():
  (q16, k16, v16), (q, k, v) = _bf16_qkv(5)
  valid = _key_valid(T)
  want, _, sees_any = _reference(q, k, v, valid)
  got = np.asarray(attention.fused_gpu_attention(q16, k16, v16, jnp.asarray(valid)), np.float64)
  # bf16 probabilities times values, then a bf16 output: each rounds by eps_bf16 / 2 of max|v|.
  assert np.max(np.abs(got - want)[sees_any]) < 4 * EPS_BF16 * float(np.max(np.abs(v)))
  assert np.all(np.isfinite(got))


@needs_gpu
def test_cudnn_attention_gradients_equal_float32_autodiff_on_gpu():
  (q16, k16, v16), (q, k, v) = _bf16_qkv(6)
  valid = _key_valid(T)
  sees_any = _reference(q, k, v, valid)[2]
  w = np.random.default_rng(7).normal(size=q.shape).astype(np.float32) * sees_any[..., None, None]
  mask = jnp.asarray(np.tril(np.ones((T, T), bool))[None] & valid[:, None])

  def cudnn_loss(q, k, v):
    out = attention.fused_gpu_attention(q, k, v, jnp.asarray(valid))
    return jnp.sum(out.astype(jnp.float32) * w)

  def xla_loss(q, k, v):
    return jnp.sum(attention.xla_attention(q, k, v, mask) * w)

  got = jax.grad(cudnn_loss, argnums=(0, 1, 2))(q16, k16, v16)
  want = jax.grad(xla_loss, argnums=(0, 1, 2))(q, k, v)
  sizes = _gradient_sizes(q, k, v, w, valid)
  for name, a, b, size in zip("qkv", got, want, sizes):
    diff = np.abs(np.asarray(a, np.float32) - np.asarray(b))
    assert np.max(diff) < 8 * EPS_BF16 * float(np.max(size)), name


@needs_gpu
@pytest.mark.parametrize("family", CASES)
def test_model_logits_xla_equal_cudnn_on_gpu(family):
  tokens, mask, _ = _update_rows()

  def model(attention):
    return _model(family, attention).replace(dtype="bfloat16", head_dim=64)

  params = init_params(model("xla"), jax.random.key(8), std=0.08)
  xla = np.asarray(forward(model("xla"), params, tokens, mask))
  cudnn = np.asarray(forward(model("cudnn"), params, tokens, mask))
  # bf16 activations through two layers: a few bf16 eps of the largest logit.
  scale = float(np.max(np.abs(xla[mask > 0])))
  assert np.max(np.abs(cudnn - xla)[mask > 0]) < 16 * EPS_BF16 * scale
