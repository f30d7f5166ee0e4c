"""The sampler against independent truth: transformers' greedy generate, log_softmax of our
full-sequence forward, the model's own next-token distribution, brute-force stop matching."""

import warnings

import jax
import numpy as np
import pytest
import scipy.stats
import torch

from sdar_jax.core import sharding
from sdar_jax.core.batch import batch_bucket
from sdar_jax.core.sampling import (
  Sampler,
  SamplingParams,
  generate,
  get_sampler,
  num_compilations,
)
from sdar_jax.core.stop_strings import stop_string_table
from sdar_jax.core.token_choice import categorical
from sdar_jax.models import forward, load_pretrained
from sdar_jax.text.tokenizer import Tokenizer
from tests import hf_fixtures

LENGTHS = [11, 4, 7, 1, 9]  # ragged, left-padded; 5 rows run in a batch bucket of 8
NEW = 12
GREEDY = SamplingParams(max_new_tokens=NEW, temperature=0.0, stop_token_ids=())


def _prompts(vocab, lengths, seed=0):
  tokens, _ = hf_fixtures.ragged_batch(vocab, lengths, seed)
  return [tokens[i, tokens.shape[1] - n :].tolist() for i, n in enumerate(lengths)]


def _left_pad(rows):
  T = max(len(r) for r in rows)
  tokens = np.zeros((len(rows), T), np.int32)
  mask = np.zeros((len(rows), T), np.int32)
  for i, r in enumerate(rows):
    tokens[i, T - len(r) :] = r
    mask[i, T - len(r) :] = 1
  return tokens, mask


def logprob_atol(config, params, prompts, ulps: float = 8.0) -> float:
  """Tolerance for the log-probs of one model computed by two different programs (batched vs
  alone, shared vs unshared prefix, sharded vs one device). A log-prob is logit - logsumexp, a
  difference of terms as large as the logits, and float32 rounds those by a few ulp of their size
  whichever program computes them (up to 3.3 eps times the largest |logit| measured here, on
  several XLA CPU instruction sets), so the bound is a few eps times the largest |logit|, not a
  fraction of the smaller log-prob."""
  tokens, mask = _left_pad(prompts)
  logits = np.asarray(forward(config, params, tokens, mask))
  return ulps * float(np.finfo(np.float32).eps) * float(np.max(np.abs(logits[mask > 0])))


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def model(request, tmp_path_factory):
  hf = hf_fixtures.make_hf_model(request.param, tied=request.param == "qwen2", seed=3)
  path = hf_fixtures.save_hf_model(hf, tmp_path_factory.mktemp(request.param))
  config, params = load_pretrained(path)
  return hf, config, params


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
  hf = hf_fixtures.make_hf_model("qwen3", tied=False, seed=5)
  config, params = load_pretrained(hf_fixtures.save_hf_model(hf, tmp_path_factory.mktemp("q3")))
  return config, params


def _hf_greedy(hf, prompts, new, eos=None):
  tokens, mask = _left_pad(prompts)
  threads = torch.get_num_threads()
  torch.set_num_threads(1)  # tiny model: threads only add spin-waiting on a busy CPU
  try:
    with torch.no_grad():
      out = hf.generate(
        torch.tensor(tokens, dtype=torch.long),
        attention_mask=torch.tensor(mask),
        max_new_tokens=new,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
      )
  finally:
    torch.set_num_threads(threads)
  return out[:, tokens.shape[1] :].numpy()


# ----------------------------------------------------------------------------------- greedy
@pytest.mark.slow
def test_greedy_equals_transformers_generate(model):
  hf, config, params = model
  prompts = _prompts(config.vocab_size, LENGTHS)
  result = generate(config, params, prompts, GREEDY)
  expected = _hf_greedy(hf, prompts, NEW)
  assert result.tokens == expected.tolist()
  assert result.finish_reasons == ["length"] * len(prompts)

  # With a stop token: the first occurrence in row 0's continuation ends row 0 (kept), and every
  # other row wherever transformers stops it.
  stop = expected[0, 4]
  stopped = generate(config, params, prompts, SamplingParams(NEW, 0.0, stop_token_ids=(stop,)))
  hf_stop = _hf_greedy(hf, prompts, NEW, eos=int(stop))
  for row, hf_row, reason in zip(stopped.tokens, hf_stop.tolist(), stopped.finish_reasons):
    hits = [i for i, t in enumerate(hf_row) if t == stop]
    cut = hits[0] + 1 if hits else NEW
    assert row == hf_row[:cut]
    assert reason == ("stop_token" if hits else "length")
  assert len(stopped.tokens[0]) <= 5


@pytest.mark.slow
def test_logprobs_equal_log_softmax_of_forward(model):
  _, config, params = model
  prompts = _prompts(config.vocab_size, LENGTHS, seed=1)
  for sp in (GREEDY, SamplingParams(NEW, temperature=0.7, stop_token_ids=())):
    result = generate(config, params, prompts, sp, jax.random.key(1))
    tokens, mask = _left_pad([p + t for p, t in zip(prompts, result.tokens)])
    logits = np.asarray(forward(config, params, tokens, mask), np.float64)
    logp = jax.nn.log_softmax(logits / (sp.temperature or 1.0), axis=-1)
    T = tokens.shape[1]
    for i, gen in enumerate(result.tokens):
      assert len(gen) == NEW and len(result.logprobs[i]) == NEW
      positions = np.arange(T - NEW - 1, T - 1)  # logits at t predict token t + 1
      want = np.asarray(logp)[i, positions, gen]
      np.testing.assert_allclose(result.logprobs[i], want, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_batch_equals_one_by_one(model):
  _, config, params = model
  prompts = _prompts(config.vocab_size, LENGTHS, seed=2)
  batch = generate(config, params, prompts, GREEDY)
  atol = logprob_atol(config, params, prompts)
  for i, p in enumerate(prompts):
    alone = generate(config, params, [p], GREEDY)
    assert alone.tokens[0] == batch.tokens[i]
    np.testing.assert_allclose(alone.logprobs[0], batch.logprobs[i], atol=atol)


# --------------------------------------------------------------------------- prefix sharing
@pytest.mark.slow
def test_group_prefix_sharing_prefills_once_and_changes_nothing(qwen3):
  config, params = qwen3
  distinct = _prompts(config.vocab_size, [6, 3, 9], seed=3)
  prompts = [distinct[i % 3] for i in range(12)]  # 3 groups of 4 copies, interleaved
  sp = SamplingParams(NEW, temperature=1.0, stop_token_ids=())
  shared = generate(config, params, prompts, sp, jax.random.key(7))
  unshared = generate(config, params, prompts, sp, jax.random.key(7), share_prefix=False)
  assert shared.num_prefill_rows == 3 and unshared.num_prefill_rows == 12
  assert shared.tokens == unshared.tokens
  atol = logprob_atol(config, params, distinct)
  np.testing.assert_allclose(shared.logprobs, unshared.logprobs, atol=atol)
  assert len({tuple(t) for t in shared.tokens[0::3]}) > 1  # copies sample independently


# ------------------------------------------------------------------------------ distribution
@pytest.fixture(scope="module")
def tiny_vocab(tmp_path_factory):
  hf = hf_fixtures.make_hf_model(
    "qwen3", tied=False, seed=12, vocab_size=24, num_hidden_layers=1, num_key_value_heads=1
  )
  config, params = load_pretrained(hf_fixtures.save_hf_model(hf, tmp_path_factory.mktemp("tiny")))
  prompt = [23, 22, 16, 23, 21]  # a high-entropy next-token distribution for this model
  logits = np.asarray(forward(config, params, np.asarray([prompt], np.int32)), np.float64)[0, -1]
  return config, params, prompt, logits


def _softmax(x):
  e = np.exp(x - np.max(x))
  return e / e.sum()


def _draw(config, params, prompt, n, seed, **kw):
  sp = SamplingParams(max_new_tokens=1, stop_token_ids=(), **kw)
  result = generate(config, params, [prompt] * n, sp, jax.random.key(seed))
  assert result.num_prefill_rows == 1
  return np.asarray([t[0] for t in result.tokens])


def _chi2_pvalue(samples, probs):
  """Chi-square goodness of fit, categories with expected count < 5 pooled."""
  counts = np.bincount(samples, minlength=probs.size).astype(float)
  expected = probs * samples.size
  small = expected < 5
  if small.any():
    counts = np.append(counts[~small], counts[small].sum())
    expected = np.append(expected[~small], expected[small].sum())
  if expected[-1] == 0:  # impossible tokens: none may be drawn, and they are no category
    assert counts[-1] == 0
    counts, expected = counts[:-1], expected[:-1]
  return scipy.stats.chisquare(counts, expected * counts.sum() / expected.sum()).pvalue


N_DRAWS = 4096


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_temperature_sampling_matches_model_distribution(tiny_vocab, temperature):
  config, params, prompt, logits = tiny_vocab
  probs = _softmax(logits / temperature)
  assert probs.max() < 0.9 and (probs > 0.01).sum() >= 6  # a distribution worth testing
  samples = _draw(
    config, params, prompt, N_DRAWS, seed=int(temperature * 10), temperature=temperature
  )
  assert _chi2_pvalue(samples, probs) > 1e-3
  other = _softmax(logits / (1.0 if temperature != 1.0 else 0.7))
  assert _chi2_pvalue(samples, other) < 1e-6  # the test can tell the temperatures apart


def test_top_k_cuts_to_the_k_most_likely(tiny_vocab):
  config, params, prompt, logits = tiny_vocab
  k = 4
  keep = np.argsort(-logits)[:k]
  samples = _draw(config, params, prompt, N_DRAWS, seed=2, temperature=1.0, top_k=k)
  assert set(samples.tolist()) <= set(keep.tolist())
  probs = np.zeros_like(logits)
  probs[keep] = _softmax(logits[keep])
  assert _chi2_pvalue(samples, probs) > 1e-3


@pytest.mark.parametrize("top_k", [0, 6])
def test_top_p_cuts_to_the_nucleus(tiny_vocab, top_k):
  config, params, prompt, logits = tiny_vocab
  top_p, T = 0.6, 0.7
  order = np.argsort(-logits)
  if top_k:
    order = order[:top_k]
  p = _softmax(logits[order] / T)
  nucleus = order[(np.cumsum(p) - p) < top_p]  # smallest prefix whose mass reaches top_p
  assert 1 < nucleus.size < order.size
  samples = _draw(config, params, prompt, N_DRAWS, seed=3, temperature=T, top_p=top_p, top_k=top_k)
  assert set(samples.tolist()) <= set(nucleus.tolist())
  probs = np.zeros_like(logits)
  probs[nucleus] = _softmax(logits[nucleus] / T)
  assert _chi2_pvalue(samples, probs) > 1e-3


def test_blocked_inverse_cdf_draws_the_distribution():
  """Mass in a few tokens spread over blocks (incl. the last, partial block), zeros elsewhere."""
  V, n = 1000, 20000  # 4 blocks of 256, the last one partial
  probs = np.zeros(V)
  probs[[0, 300, 301, 511, 512, 999]] = [0.05, 0.3, 0.1, 0.2, 0.15, 0.2]
  with np.errstate(divide="ignore"):
    logits = np.log(probs).astype(np.float32)
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(4), i))(np.arange(n))
  samples = np.asarray(jax.jit(categorical)(keys, np.broadcast_to(logits, (n, V))))
  assert set(samples.tolist()) <= set(np.flatnonzero(probs).tolist())
  assert _chi2_pvalue(samples, probs) > 1e-3
  swapped = probs.copy()
  swapped[[300, 999]] = probs[[999, 300]]
  assert _chi2_pvalue(samples, swapped) < 1e-6  # the test can tell 0.3 from 0.2


# ---------------------------------------------------------------------------------- stops
def test_stop_token_ends_only_its_sequences(qwen3):
  config, params = qwen3
  prompts = _prompts(config.vocab_size, LENGTHS, seed=4)
  free = generate(config, params, prompts, GREEDY).tokens
  # A token that occurs in some continuations but not all.
  counts = np.zeros(config.vocab_size, int)
  for row in free:
    counts[sorted(set(row))] += 1
  stop = int(np.flatnonzero((counts > 0) & (counts < len(free)))[0])
  result = generate(config, params, prompts, SamplingParams(NEW, 0.0, stop_token_ids=(stop, 10**6)))
  for row, got, reason in zip(free, result.tokens, result.finish_reasons):
    cut = row.index(stop) + 1 if stop in row else NEW
    assert got == row[:cut]
    assert reason == ("stop_token" if stop in row else "length")
  assert "length" in result.finish_reasons and "stop_token" in result.finish_reasons


def _first_completion(token_bytes, row, strings):
  """Index of the token after which the text first contains a stop string (brute force)."""
  text = b""
  for i, t in enumerate(row):
    text += token_bytes[t]
    if any(s.encode() in text for s in strings):
      return i
  return None


def test_stop_strings_end_only_their_sequences(qwen3):
  config, params = qwen3
  tok = Tokenizer.bundled_qwen()
  token_bytes = tok.all_token_bytes(config.vocab_size)
  prompts = _prompts(config.vocab_size, LENGTHS, seed=5)
  free = generate(config, params, prompts, GREEDY).tokens
  # A stop string that spans a token boundary in row 1: last byte of token 5 + token 6 + 1 byte.
  row = free[1]
  spanning = (token_bytes[row[5]][-1:] + token_bytes[row[6]] + token_bytes[row[7]][:1]).decode(
    "latin-1"
  )
  other = token_bytes[free[3][9]].decode("latin-1")
  for strings in [(spanning,), (spanning, other)]:
    if any(not s.isascii() for s in strings):
      pytest.skip("random continuation produced non-ASCII bytes; pick another seed")
    sp = SamplingParams(NEW, 0.0, stop_token_ids=(), stop_strings=strings)
    result = generate(config, params, prompts, sp, tokenizer=tok)
    for r, got, reason in zip(free, result.tokens, result.finish_reasons):
      at = _first_completion(token_bytes, r, strings)
      assert got == (r if at is None else r[: at + 1])
      assert reason == ("length" if at is None else "stop_string")
    assert "length" in result.finish_reasons
    assert result.finish_reasons[1] == "stop_string" and len(result.tokens[1]) <= 8


def test_stop_string_table_equals_brute_force():
  rng = np.random.default_rng(0)
  alphabet = b"ab<>/"
  token_bytes = [b""] + [bytes(rng.choice(list(alphabet), rng.integers(1, 5))) for _ in range(60)]
  strings = ("</a>", "abab", "b>", "<<")
  table = stop_string_table(token_bytes, strings)
  for _ in range(300):
    row = rng.integers(0, len(token_bytes), 12).tolist()
    state, stopped_at = 0, None
    for i, t in enumerate(row):
      code = table[state, t]
      state = code >> 1
      if code & 1:
        stopped_at = i
        break
    assert stopped_at == _first_completion(token_bytes, row, strings)


# ----------------------------------------------------------------------------------- mesh
@pytest.mark.slow
@pytest.mark.parametrize("shape", [(8, 1, 1), (4, 1, 2)])
def test_mesh_equals_one_device(qwen3, shape):
  config, params = qwen3
  prompts = _prompts(config.vocab_size, LENGTHS, seed=6)
  sp = SamplingParams(NEW, temperature=1.0, stop_token_ids=())
  mesh = sharding.make_mesh(shape)
  atol = logprob_atol(config, params, prompts)
  for p in (GREEDY, sp):
    single = generate(config, params, prompts, p, jax.random.key(2))
    with warnings.catch_warnings():
      warnings.simplefilter("error")  # every axis divides here: no replication fallback
      sharded = generate(
        config,
        sharding.shard_params(params, config, mesh),
        prompts,
        p,
        jax.random.key(2),
        mesh=mesh,
      )
    assert sharded.tokens == single.tokens
    np.testing.assert_allclose(sharded.logprobs, single.logprobs, atol=atol)
    assert sharded.shapes["batch"] % sharding.batch_divisor(mesh) == 0


# ------------------------------------------------------------------------- shapes & errors
@pytest.mark.slow
def test_buckets_bound_compilations(qwen3):
  config, params = qwen3
  sampler = Sampler(config)
  sp = SamplingParams(5, 0.0, stop_token_ids=())
  first = sampler.generate(params, _prompts(config.vocab_size, [3, 9, 2]), sp)
  assert sampler.num_compilations == 1
  assert all(len(t) == 5 for t in first.tokens) and first.finish_reasons == ["length"] * 3
  # Same buckets (batch 4, prompt 16, new 16): no new compilation.
  sampler.generate(
    params, _prompts(config.vocab_size, [14, 1, 5, 7], seed=1), SamplingParams(9, 0.0)
  )
  assert sampler.num_compilations == 1
  sampler.generate(params, _prompts(config.vocab_size, [20]), sp)  # prompt bucket 32
  assert sampler.num_compilations == 2
  before = num_compilations()
  generate(config, params, _prompts(config.vocab_size, [3]), sp)
  generate(config, params, _prompts(config.vocab_size, [4], seed=9), sp)
  assert num_compilations() - before <= 1
  assert get_sampler(config) is get_sampler(config)


def test_row_buckets_worked_by_hand():
  # powers of two; with a row step, above 256 rows the next multiple of the step where it is fewer
  assert [batch_bucket(n) for n in (1, 5, 257, 640, 1000)] == [1, 8, 512, 1024, 1024]
  assert [batch_bucket(n, row_step=64) for n in (5, 256, 257, 300, 640, 641)] == [
    8, 256, 320, 320, 640, 704,
  ]  # fmt: skip
  assert batch_bucket(1000, row_step=512) == 1024  # 1,024 rows either way
  assert batch_bucket(300, row_step=500) == 500 and batch_bucket(300, row_step=600) == 512
  assert batch_bucket(300, divisor=8, row_step=100) == 304  # then a multiple of the batch shards


@pytest.mark.slow
def test_a_row_step_runs_fewer_rows_and_changes_no_token(qwen3):
  # 260 rows: 512 as a power of two, 264 at a step of 8; the same tokens (each row draws from its
  # own key, by its index) and the same log-probs up to the rounding of two programs
  config, params = qwen3
  prompts = _prompts(config.vocab_size, [6, 3, 9, 4] * 65, seed=4)
  sp = SamplingParams(4, temperature=1.0, stop_token_ids=())
  pow2 = Sampler(config).generate(params, prompts, sp, jax.random.key(3), share_prefix=False)
  stepped = Sampler(config, row_step=8).generate(
    params, prompts, sp, jax.random.key(3), share_prefix=False
  )
  assert (pow2.shapes["batch"], stepped.shapes["batch"]) == (512, 264)
  assert stepped.tokens == pow2.tokens
  atol = logprob_atol(config, params, prompts[:4])
  np.testing.assert_allclose(stepped.logprobs, pow2.logprobs, atol=atol)


def test_prompt_errors_name_the_problem(qwen3):
  config, params = qwen3
  sampler = Sampler(config, max_prompt_len=8)
  with pytest.raises(ValueError, match=r"prompts\[1\] has 9 tokens.*max_prompt_len=8"):
    sampler.generate(params, [[1, 2], list(range(1, 10))], GREEDY)
  with pytest.raises(ValueError, match=r"prompts\[0\] is empty"):
    sampler.generate(params, [[]], GREEDY)
  with pytest.raises(ValueError, match="outside the vocabulary"):
    sampler.generate(params, [[config.vocab_size]], GREEDY)
  with pytest.raises(ValueError, match="rng"):
    sampler.generate(params, [[1]], SamplingParams(4, temperature=1.0))
  with pytest.raises(TypeError, match="tuple of strings"):
    SamplingParams(stop_strings="</action>")
  assert sampler.generate(params, [[1, 2]], SamplingParams(0)).tokens == [[]]
  with pytest.raises(TypeError, match="token-id lists"):
    sampler.generate(params, "a prompt", GREEDY)
  as_array = sampler.generate(params, np.asarray([[5, 6, 7]]), GREEDY)
  assert as_array.tokens == sampler.generate(params, [[5, 6, 7]], GREEDY).tokens
