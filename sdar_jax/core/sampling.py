"""Rollout sampler: batched generation with a KV cache in one jitted loop, with exact log-probs.

    from sdar_jax.core.sampling import generate, SamplingParams
    result = generate(config, params, prompts, SamplingParams(max_new_tokens=64), jax.random.key(0))
    result.tokens[i], result.logprobs[i], result.finish_reasons[i]

One call = one compiled function: prefill the distinct prompts once (left-padded), gather their
KV cache rows to every sample (group prefix sharing: a GRPO group of 8 copies of a prompt is
prefilled once), then a `lax.while_loop` decodes one token per step for the whole batch and exits
as soon as every row has stopped. Nothing leaves the device per token: stop tokens are a [V]
table and stop strings are an Aho-Corasick automaton over bytes, lifted on the host to a
[state, token] table, so a stop string is detected inside the loop exactly (also when it spans
several tokens; only generated text is matched, not the prompt).

Shapes are bucketed so a run compiles a bounded number of times: the batch and the number of
distinct prompts round up to a power of two (and to a multiple of the mesh's batch divisor),
the prompt length to `batch.prompt_bucket` (a power of two of at least 16 up to 256, then a
multiple of 64 up to 1024, then of 512), and `max_new_tokens` to a power of two (at least 16; the
loop still stops at the exact count). Greedy vs sampling, top_k (its value), top_p on/off and stop
strings on/off are compile-time choices; temperature, top_p's value, max_new_tokens and the stop
sets are runtime values. `Sampler.num_compilations` counts traces.

The model does the decoding: `models.qwen.prefill` runs the distinct prompts and returns their
`KVCache` (the model owns its layout), and each loop step is one `models.qwen.decode_step`. The
per-layer weights are sliced once per call (`unstack_layers`), which holds one extra copy of the
decoder weights while generating (a scan over the stacked layers would copy every weight slice at
every step on CPU).

Log-probs: the log-prob of each sampled token is `log_softmax(logits / temperature)[token]` of the
unfiltered distribution (`log_softmax(logits)` when greedy, temperature 0). That is the quantity
the train step recomputes for the same tokens, so the importance ratio is 1 at staleness 0.
top-k / top-p only restrict which tokens can be drawn; they do not renormalise the returned
log-prob (training uses top_p=1, top_k off, where the two coincide).

Random numbers: row i of the padded batch draws step t with one uniform from
`fold_in(fold_in(rng, i), t)` (inverse-CDF sampling, `_categorical`), so a row's samples do not
depend on the batch bucket or the device mesh (they do depend on the row's index in the batch).
`generate(..., row_ids=...)` names each prompt's stream instead (`fold_in(fold_in(rng, id), t)`):
the agent loop's overlapped mode passes each half's rows the indices they would have in the
serial loop's one batch, so both draw the same tokens.

Several processes (sdar_jax.infra.multihost): `generate` is a collective that every process calls
with its own prompts (none is allowed); they become that process's rows of one global batch, and
prompt i of process p draws as row (the prompts of processes 0..p-1) + i of the batch one process
would have built, so the samples do not depend on the number of processes.

Length: one compiled loop (prefill, prefix sharing, decode, sampling rules, the in-loop stop
automaton) and its host-side tables; the model step itself is models/qwen.py's decode_step.

Why one file of ~580 lines: the sampler's parts (stop-string automaton, filtered sampling, prefix
sharing, the compiled prefill + decode loop, bucketing and compile counting) share one state and
one set of shapes; split, each piece would need the others' internals.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import threading
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding

from sdar_jax.core import sharding
from sdar_jax.core.batch import batch_bucket, new_tokens_bucket, next_power_of_two, prompt_bucket
from sdar_jax.infra import multihost
from sdar_jax.models.config import ModelConfig
from sdar_jax.models.qwen import (
  KVCache,
  Params,
  decode_step,
  logits_from_hidden,
  prefill,
  unstack_layers,
)

QWEN_STOP_TOKEN_IDS = (151645, 151643)  # <|im_end|>, <|endoftext|>
FINISH_REASONS = ("length", "stop_token", "stop_string")  # index = the code the loop returns

_MIN_STATE_BUCKET = 16


# ------------------------------------------------------------------------------------ parameters
@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """How to sample. temperature 0 = greedy; top_k 0 or -1 = off; top_p 1 = off."""

  max_new_tokens: int = 512
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  stop_token_ids: tuple[int, ...] = QWEN_STOP_TOKEN_IDS
  stop_strings: tuple[str, ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "stop_token_ids", tuple(int(i) for i in self.stop_token_ids))
    if isinstance(self.stop_strings, str):
      raise TypeError(
        f"stop_strings={self.stop_strings!r} is a str; pass a tuple of strings, "
        f"e.g. ({self.stop_strings!r},)."
      )
    object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
    if int(self.max_new_tokens) < 0:
      raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 0.")
    if not self.temperature >= 0:
      raise ValueError(f"temperature={self.temperature} must be >= 0 (0 = greedy).")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1 = off).")
    if int(self.top_k) < -1:
      raise ValueError(f"top_k={self.top_k} must be >= 0 (0 or -1 = off).")
    for s in self.stop_strings:
      if not isinstance(s, str) or not s:
        raise ValueError(f"stop_strings contains {s!r}; each stop string must be a non-empty str.")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


@dataclasses.dataclass
class GenerationResult:
  """Per prompt: generated ids (prompt excluded, cut after the first stop, which is kept), the
  log-prob of each generated id, and why it ended ("stop_token" | "stop_string" | "length")."""

  tokens: list[list[int]]
  logprobs: list[list[float]]
  finish_reasons: list[str]
  num_prefill_rows: int = 0  # distinct prompts actually prefilled (after prefix sharing)
  shapes: dict[str, int] = dataclasses.field(default_factory=dict)  # the buckets used


# ------------------------------------------------------------------------------- stop strings
def _aho_corasick(patterns: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
  """Byte automaton of several patterns: delta [S, 256] (complete transition table) and
  accept [S] (a pattern ends at this state, directly or through a failure link). State 0 = start."""
  goto: list[dict[int, int]] = [{}]
  accept = [False]
  for pattern in patterns:
    s = 0
    for b in pattern:
      if b not in goto[s]:
        goto.append({})
        accept.append(False)
        goto[s][b] = len(goto) - 1
      s = goto[s][b]
    accept[s] = True
  delta = np.zeros((len(goto), 256), np.int32)
  fail = [0] * len(goto)
  queue = collections.deque()
  for b, t in goto[0].items():
    delta[0, b] = t
    queue.append(t)
  while queue:  # breadth first: a failure target is always shallower, hence already complete
    s = queue.popleft()
    accept[s] = accept[s] or accept[fail[s]]
    delta[s] = delta[fail[s]]
    for b, t in goto[s].items():
      if s:
        fail[t] = int(delta[fail[s], b])
      delta[s, b] = t
      queue.append(t)
  return delta, np.asarray(accept, bool)


def stop_string_table(
  token_bytes: Sequence[bytes], stop_strings: Sequence[str], num_states: int | None = None
) -> np.ndarray:
  """[states, vocab] int32: `code >> 1` = automaton state after a token's bytes, `code & 1` = a
  stop string completed while consuming them. Vectorised over the vocabulary; the Python loop
  runs over byte positions only (tokens sorted by length, so position j touches only the tokens
  longer than j). `num_states` pads the state axis (padding rows are never reached)."""
  delta, accept = _aho_corasick([s.encode("utf-8") for s in stop_strings])
  S, V = delta.shape[0], len(token_bytes)
  num_states = S if num_states is None else num_states
  if num_states < S:
    raise ValueError(f"num_states={num_states} is below the automaton's {S} states.")
  lengths = np.fromiter((len(b) for b in token_bytes), np.int64, V)
  order = np.argsort(-lengths, kind="stable")
  sorted_len = lengths[order]
  width = max(1, int(sorted_len[0]) if V else 1)
  data = np.zeros((V, width), np.uint8)
  flat = np.frombuffer(b"".join(token_bytes[i] for i in order), np.uint8)
  rows = np.repeat(np.arange(V), sorted_len)
  starts = np.repeat(np.cumsum(sorted_len) - sorted_len, sorted_len)
  data[rows, np.arange(flat.size) - starts] = flat

  state = np.broadcast_to(np.arange(S, dtype=np.int32)[:, None], (S, V)).copy()
  hit = np.zeros((S, V), bool)
  for j in range(int(sorted_len[0]) if V else 0):
    n = int(np.searchsorted(-sorted_len, -j, side="left"))  # tokens with length > j
    nxt = delta[state[:, :n], data[:n, j][None, :]]
    state[:, :n] = nxt
    hit[:, :n] |= accept[nxt]
  table = np.zeros((num_states, V), np.int32)
  table[:S, order] = state * 2 + hit
  return table


@functools.lru_cache(maxsize=32)
def _cached_stop_table(tokenizer, vocab_size: int, stop_strings: tuple[str, ...]) -> np.ndarray:
  token_bytes = tokenizer.all_token_bytes(size=vocab_size)
  states = 1 + sum(len(s.encode("utf-8")) for s in stop_strings)
  return stop_string_table(
    token_bytes, stop_strings, max(_MIN_STATE_BUCKET, next_power_of_two(states))
  )


# -------------------------------------------------------------------------------- token choice
def _filter_top_k_top_p(
  scaled: jax.Array, top_k: int, use_top_p: bool, top_p: jax.Array
) -> jax.Array:
  """Masks to -inf what top-k (then top-p over the renormalised top-k set) excludes. Ties at the
  cut-off value are kept, so a few more than k tokens can survive on exact ties."""
  if top_k > 0:
    vals = lax.top_k(scaled, top_k)[0]  # [B, k], descending
  else:
    vals = -jnp.sort(-scaled, axis=-1)
  cut = vals[:, -1:]
  if use_top_p:
    probs = jax.nn.softmax(vals, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each sorted token
    keep = before < top_p  # the smallest prefix whose mass reaches top_p (the first always kept)
    cut = jnp.min(jnp.where(keep, vals, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(scaled >= cut, scaled, -jnp.inf)


def _argmax(x: jax.Array) -> jax.Array:
  """First index of the maximum along the last axis (as jnp.argmax, NaN-free input): two plain
  reductions, several times faster on XLA:CPU than argmax's variadic (value, index) reduce."""
  iota = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  best = jnp.max(x, axis=-1, keepdims=True)
  return jnp.min(jnp.where(x == best, iota, x.shape[-1]), axis=-1)


_SAMPLE_BLOCK = 256


def _categorical(keys: jax.Array, logits: jax.Array) -> jax.Array:
  """One draw per row from softmax(logits) [B, V] (-inf = impossible) by inverting the CDF with
  one uniform per row. Blocked: prefix sums over V/256 block masses pick the block, then over the
  256 tokens inside it, so each row costs one exp pass over V instead of Gumbel-max's V random
  numbers and 2V logarithms (about 5x cheaper on CPU). Never returns a zero-probability token."""
  B, V = logits.shape
  nb = -(-V // _SAMPLE_BLOCK)
  probs = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))  # unnormalised, max term 1
  probs = jnp.pad(probs, ((0, 0), (0, nb * _SAMPLE_BLOCK - V))).reshape(B, nb, _SAMPLE_BLOCK)
  mass = jnp.sum(probs, axis=-1)  # [B, nb]
  upto = jnp.cumsum(mass, axis=-1)
  target = jax.vmap(jax.random.uniform)(keys) * upto[:, -1]  # in [0, total)

  def last_positive(x):  # index of the last entry > 0 (rounding can overshoot past it)
    return jnp.max(jnp.where(x > 0, lax.broadcasted_iota(jnp.int32, x.shape, 1), 0), axis=-1)

  block = jnp.minimum(jnp.sum(upto <= target[:, None], axis=-1), last_positive(mass))
  before = jnp.take_along_axis(upto - mass, block[:, None], axis=1)[:, 0]
  inside = jnp.take_along_axis(probs, block[:, None, None], axis=1)[:, 0]  # [B, 256]
  index = jnp.sum(jnp.cumsum(inside, axis=-1) <= (target - before)[:, None], axis=-1)
  index = jnp.minimum(index, last_positive(inside))
  return (block * _SAMPLE_BLOCK + index).astype(jnp.int32)


def _choose(
  logits: jax.Array,
  keys: jax.Array,
  temperature: jax.Array,
  top_p: jax.Array,
  greedy: bool,
  top_k: int,
  use_top_p: bool,
) -> tuple[jax.Array, jax.Array]:
  """Next token [B] and its log-prob [B] under the unfiltered softmax(logits / temperature)."""
  scaled = logits if greedy else logits / temperature
  if greedy:
    token = _argmax(logits)
  elif top_k > 0 or use_top_p:
    token = _categorical(keys, _filter_top_k_top_p(scaled, top_k, use_top_p, top_p))
  else:
    token = _categorical(keys, scaled)
  # log_softmax at the chosen token only: no [B, V] log-prob array per step.
  picked = jnp.take_along_axis(scaled, token[:, None], axis=-1)[:, 0]
  return token, picked - jax.nn.logsumexp(scaled, axis=-1)


# ------------------------------------------------------------------------------------ sampler
class Sampler:
  """Generation for one model config (and optionally one mesh); caches compiled functions.

  `max_prompt_len` bounds the prompt length (default: the config's max_position_embeddings).
  `tokenizer` supplies token bytes for stop strings (default: the bundled Qwen tokenizer).
  """

  def __init__(
    self,
    config: ModelConfig,
    mesh: Mesh | None = None,
    tokenizer=None,
    max_prompt_len: int | None = None,
  ):
    self.config = config
    self.mesh = mesh
    self._tokenizer = tokenizer
    self.max_prompt_len = int(max_prompt_len or config.max_position_embeddings)
    self.num_compilations = 0
    self._divisor = 1 if mesh is None else sharding.batch_divisor(mesh)
    # Several processes: every call is a collective over the global mesh (see the module doc).
    self.collective = mesh is not None and multihost.is_multiprocess()
    if self.collective:  # fails now, with the fix, if the batch rows cannot split by process
      multihost.process_rows(sharding.batch_sharding(mesh, 1), (self._divisor,))
    self._device_cache: dict[Any, Any] = {}
    # Held by each `generate`: a run's rollout thread (asynchronous training) and its main thread
    # (evaluation) share one Sampler; the trainer also holds it around each update so that two
    # multi-device programs never run at once (sdar_jax.run.trainer).
    self.lock = threading.RLock()
    self._run_jit = sharding.with_kernel_mesh(
      jax.jit(
        self._run,
        static_argnames=("new_bucket", "greedy", "top_k", "use_top_p", "use_stop_strings"),
      ),
      mesh,
      config,
    )

  @property
  def tokenizer(self):
    if self._tokenizer is None:
      from sdar_jax.text.tokenizer import Tokenizer

      self._tokenizer = Tokenizer.bundled_qwen()
    return self._tokenizer

  # ---------------------------------------------------------------------------- compiled body
  def _constrain(self, x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
    if self.mesh is None:
      return x
    spec = sharding.logical_to_spec(axes, x.shape, self.mesh, name="kv_cache")
    return lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

  def _run(
    self,
    params: Params,
    prompt_tokens,
    prompt_mask,
    row_source,
    real_rows,
    row_ids,
    max_new,
    temperature,
    top_p,
    is_stop,
    stop_table,
    rng,
    *,
    new_bucket: int,
    greedy: bool,
    top_k: int,
    use_top_p: bool,
    use_stop_strings: bool,
  ):
    self.num_compilations += 1  # runs once per trace, i.e. per compilation
    config = self.config
    B = row_source.shape[0]
    P = prompt_tokens.shape[1]
    logging.getLogger(__name__).info(
      "compiling the sampler for %d rows (%d distinct prompts) x %d prompt tokens + %d new "
      "(compilation %d) ...",
      B,
      prompt_tokens.shape[0],
      P,
      new_bucket,
      self.num_compilations,
    )
    choose = functools.partial(
      _choose, temperature=temperature, top_p=top_p, greedy=greedy, top_k=top_k, use_top_p=use_top_p
    )

    # Prefill the distinct prompts once, into a cache with room for the new tokens; only the
    # last position needs logits (left padding), so only its hidden state is computed.
    h, cache = prefill(config, params, prompt_tokens, prompt_mask, P + new_bucket, last_only=True)
    first_logits = logits_from_hidden(config, params, h[:, -1])
    # Broadcast to every sample of each prompt (group prefix sharing).
    first_logits = jnp.take(first_logits, row_source, axis=0)
    cache = cache.take_rows(row_source)
    cache = KVCache(
      tuple(self._constrain(k, KVCache.KEY_AXES) for k in cache.k),
      tuple(self._constrain(v, KVCache.VALUE_AXES) for v in cache.v),
      cache.valid,
      cache.index,
    )
    layers = unstack_layers(config, params)  # once per call, not per step

    row_keys = jax.vmap(lambda i: jax.random.fold_in(rng, i))(row_ids)
    step_keys = lambda step: jax.vmap(jax.random.fold_in, (0, None))(row_keys, step)

    def record(step, token, logp, state, out):
      """Stores the step's token for the rows still running and updates their stop status."""
      tokens, logps, done, length, reason = out
      active = ~done
      token = jnp.where(active, token, 0)
      logp = jnp.where(active, logp, 0.0)
      tokens = lax.dynamic_update_slice(tokens, token[:, None], (0, step))
      logps = lax.dynamic_update_slice(logps, logp[:, None], (0, step))
      hit_token = is_stop[token]
      if use_stop_strings:
        code = stop_table[state, token]
        hit_string, state = (code & 1).astype(jnp.bool_), code >> 1
      else:
        hit_string = jnp.zeros_like(hit_token)
      stopped = active & (hit_token | hit_string)
      reason = jnp.where(stopped, jnp.where(hit_token, 1, 2), reason)
      length = length + active.astype(jnp.int32)
      done = done | stopped | (step + 1 >= max_new)
      return state, (tokens, logps, done, length, reason)

    out = (
      jnp.zeros((B, new_bucket), jnp.int32),
      jnp.zeros((B, new_bucket), jnp.float32),
      ~real_rows,
      jnp.zeros((B,), jnp.int32),
      jnp.zeros((B,), jnp.int32),
    )
    token, logp = choose(first_logits, step_keys(0))
    state, out = record(0, token, logp, jnp.zeros((B,), jnp.int32), out)
    position = jnp.sum(cache.valid, axis=-1, dtype=jnp.int32)  # the prompt's real tokens

    def cond(carry):
      step, out = carry[0], carry[-1]
      return (step < max_new) & ~jnp.all(out[2])

    def body(carry):
      step, cache, token, position, state, out = carry
      h, cache = decode_step(config, params, token, position, cache, layers)
      token, logp = choose(logits_from_hidden(config, params, h), step_keys(step))
      state, out = record(step, token, logp, state, out)
      return step + 1, cache, token, position + 1, state, out

    carry = (jnp.int32(1), cache, token, position, state, out)
    out = lax.while_loop(cond, body, carry)[-1]
    tokens, logps, _, length, reason = out
    # Rows stay where their prompts were placed (each process reads back its own rows).
    tokens, logps = (self._constrain(x, ("batch", None)) for x in (tokens, logps))
    length, reason = (self._constrain(x, ("batch",)) for x in (length, reason))
    return tokens, logps, length, reason

  # ------------------------------------------------------------------------------- host side
  def _device_table(self, key, make):
    if key not in self._device_cache:
      self._device_cache[key] = jax.device_put(make(), self._replicated())
    return self._device_cache[key]

  def _replicated(self):
    return None if self.mesh is None else sharding.replicated(self.mesh)

  def _put_batch(self, array: np.ndarray):
    if self.mesh is None:
      return jnp.asarray(array)
    return jax.device_put(array, sharding.batch_sharding(self.mesh, array.ndim))

  def _check_prompts(self, prompts) -> list[tuple[int, ...]]:
    if isinstance(prompts, np.ndarray) and prompts.ndim == 2:
      prompts = list(prompts)
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
      raise TypeError(
        "prompts must be a list of token-id lists (tokenize text first), got "
        f"{type(prompts).__name__}."
      )
    V = self.config.vocab_size
    out = []
    for i, p in enumerate(prompts):
      p = tuple(int(t) for t in np.asarray(p, np.int64).reshape(-1))
      if not p:
        raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token.")
      if len(p) > self.max_prompt_len:
        raise ValueError(
          f"prompts[{i}] has {len(p)} tokens, more than max_prompt_len={self.max_prompt_len}. "
          "Fix: shorten the prompt (e.g. keep fewer history turns) or raise max_prompt_len."
        )
      bad = [t for t in p if not 0 <= t < V]
      if bad:
        raise ValueError(f"prompts[{i}] has token id {bad[0]} outside the vocabulary [0, {V}).")
      out.append(p)
    return out

  def generate(
    self,
    params: Params,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingParams = SamplingParams(),
    rng: jax.Array | None = None,
    share_prefix: bool = True,
    row_ids: Sequence[int] | None = None,
  ) -> GenerationResult:
    """Samples continuations of `prompts` (token-id lists of any lengths). Identical prompts
    are prefilled once when `share_prefix` (the result does not depend on it). `row_ids` (one
    int in [0, 2**31) per prompt; default: the prompt's row in the batch, see the module doc)
    name each prompt's random stream; with several processes the caller keeps them distinct over
    all processes. One call at a time per Sampler (`lock`); the result is on the host when it
    returns."""
    with self.lock:
      return self._generate(params, prompts, sampling, rng, share_prefix, row_ids)

  def _generate(
    self,
    params: Params,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingParams,
    rng: jax.Array | None,
    share_prefix: bool,
    row_ids: Sequence[int] | None = None,
  ) -> GenerationResult:
    prompts = self._check_prompts(prompts)
    n = len(prompts)
    ids = _check_row_ids(row_ids, n)
    if sampling.max_new_tokens == 0 or (n == 0 and not self.collective):
      return GenerationResult([[] for _ in prompts], [[] for _ in prompts], ["length"] * n)
    if rng is None:
      if not sampling.greedy:
        raise ValueError(
          "Sampling with temperature > 0 needs an rng key: pass rng=jax.random.key(seed)."
        )
      rng = jax.random.key(0)

    # Distinct prompts and which one each row starts from.
    first_index: dict[tuple[int, ...], int] = {}
    source = []
    for i, p in enumerate(prompts):
      source.append(first_index.setdefault(p, len(first_index)) if share_prefix else i)
    unique = list(first_index) if share_prefix else prompts
    if self.collective:
      return self._generate_process_rows(params, prompts, unique, source, sampling, rng, ids)
    U = batch_bucket(len(unique), self._divisor)
    B = batch_bucket(n, self._divisor)
    P = prompt_bucket(max(len(p) for p in unique))
    N = new_tokens_bucket(sampling.max_new_tokens)
    tokens, mask = _left_padded(unique, U, P)
    row_source = np.zeros((B,), np.int32)
    row_source[:n] = source
    real_rows = np.arange(B) < n
    row_ids = np.arange(B, dtype=np.int32)
    if ids is not None:  # padding rows keep their index: they never draw a token
      row_ids[:n] = ids
    out = self._launch(
      params,
      [self._put_batch(a) for a in (tokens, mask, row_source, real_rows, row_ids)],
      N,
      sampling,
      rng,
    )
    tokens_out, logps_out, length, reason = jax.device_get(out)
    shapes = {"batch": B, "prefill_rows": U, "prompt_len": P, "new_tokens": N}
    return _result(tokens_out, logps_out, length, reason, n, len(unique), shapes)

  def _generate_process_rows(
    self,
    params: Params,
    prompts: list[tuple[int, ...]],
    unique: list[tuple[int, ...]],
    source: list[int],
    sampling: SamplingParams,
    rng: jax.Array,
    ids: np.ndarray | None = None,
  ) -> GenerationResult:
    """`generate` of several processes: this process's prompts in its rows of the global batch
    (every process calls it; the batch is sized for the busiest process)."""
    n = len(prompts)
    longest = max((len(p) for p in unique), default=1)
    sizes = multihost.allgather_ints([n, len(unique), longest])  # [processes, 3]
    if not sizes[:, 0].any():
      return GenerationResult([], [], [])
    processes, index = sizes.shape[0], jax.process_index()
    B = batch_bucket(processes * int(sizes[:, 0].max()), self._divisor)
    U = batch_bucket(processes * int(sizes[:, 1].max()), self._divisor)
    P = prompt_bucket(int(sizes[:, 2].max()))
    N = new_tokens_bucket(sampling.max_new_tokens)
    row_sharding = sharding.batch_sharding(self.mesh, 1)
    prompt_sharding = sharding.batch_sharding(self.mesh, 2)
    my_rows = multihost.process_rows(row_sharding, (B,))
    my_prompt_rows = multihost.process_rows(prompt_sharding, (U, P))
    tokens, mask = _left_padded(unique, len(my_prompt_rows), P)
    row_source = np.full((len(my_rows),), my_prompt_rows[0], np.int32)
    row_source[:n] = my_prompt_rows[np.asarray(source, np.int64)]
    real_rows = np.arange(len(my_rows)) < n
    # the one-process row index: the lower processes' prompts come first
    row_ids = (int(sizes[:index, 0].sum()) + np.arange(len(my_rows))).astype(np.int32)
    if ids is not None:  # the caller's ids, distinct over the processes
      row_ids[:n] = ids
    placed = [
      multihost.put_rows(tokens, prompt_sharding, (U, P)),
      multihost.put_rows(mask, prompt_sharding, (U, P)),
      *(multihost.put_rows(a, row_sharding, (B,)) for a in (row_source, real_rows, row_ids)),
    ]
    out = self._launch(params, placed, N, sampling, rng)
    tokens_out, logps_out, length, reason = (multihost.get_rows(x, my_rows) for x in out)
    shapes = {"batch": B, "prefill_rows": U, "prompt_len": P, "new_tokens": N}
    return _result(tokens_out, logps_out, length, reason, n, len(unique), shapes)

  def _launch(self, params: Params, placed: list, N: int, sampling: SamplingParams, rng):
    """The compiled prefill + decode on placed (prompt tokens, prompt mask, row source, real
    rows, row ids); returns (tokens, log-probs, lengths, finish codes) on the devices."""
    V = self.config.vocab_size
    is_stop = self._device_table(
      ("stop_ids", sampling.stop_token_ids),
      lambda: np.isin(np.arange(V), np.asarray(sampling.stop_token_ids, np.int64)),
    )
    use_strings = bool(sampling.stop_strings)
    if use_strings:
      stop_table = self._device_table(
        ("stop_strings", sampling.stop_strings),
        lambda: _cached_stop_table(self.tokenizer, V, sampling.stop_strings),
      )
    else:
      stop_table = self._device_table("no_stop_strings", lambda: np.zeros((1, 1), np.int32))
    top_k = int(sampling.top_k) if sampling.top_k > 0 else 0
    top_k = min(top_k, V)

    if self.mesh is not None:
      params = sharding.shard_params(params, self.config, self.mesh)
    return self._run_jit(
      params,
      *placed,
      np.int32(sampling.max_new_tokens),
      np.float32(sampling.temperature or 1.0),
      np.float32(sampling.top_p),
      is_stop,
      stop_table,
      rng,
      new_bucket=N,
      greedy=sampling.greedy,
      top_k=0 if sampling.greedy else top_k,
      use_top_p=not sampling.greedy and sampling.top_p < 1.0,
      use_stop_strings=use_strings,
    )

  __call__ = generate


def _check_row_ids(row_ids: Sequence[int] | None, n: int) -> np.ndarray | None:
  """`row_ids` as int32, or None; a ValueError naming the problem when they cannot name streams."""
  if row_ids is None:
    return None
  ids = np.asarray(row_ids, np.int64).reshape(-1)
  if ids.size != n:
    raise ValueError(
      f"row_ids has {ids.size} entries for {n} prompts. Fix: pass one id per prompt, or None."
    )
  if ids.size and not (0 <= ids.min() and ids.max() < 2**31):
    raise ValueError(
      f"row_ids holds {int(ids.min() if ids.min() < 0 else ids.max())}, outside [0, 2**31). "
      "Fix: use small non-negative ints, e.g. episode indices."
    )
  return ids.astype(np.int32)


def _left_padded(prompts: Sequence[tuple[int, ...]], rows: int, length: int):
  """[rows, length] prompt tokens and mask, each prompt left-padded; rows past the prompts are
  dummies with one real token (which keeps them well defined)."""
  tokens = np.zeros((rows, length), np.int32)
  mask = np.zeros((rows, length), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, length - len(p) :] = p
    mask[i, length - len(p) :] = 1
  mask[len(prompts) :, -1] = 1
  return tokens, mask


def _result(tokens_out, logps_out, length, reason, n: int, prefill_rows: int, shapes):
  """The GenerationResult of the first `n` rows of the loop's host outputs."""
  return GenerationResult(
    tokens=[tokens_out[i, : length[i]].tolist() for i in range(n)],
    logprobs=[logps_out[i, : length[i]].tolist() for i in range(n)],
    finish_reasons=[FINISH_REASONS[int(reason[i])] for i in range(n)],
    num_prefill_rows=prefill_rows,
    shapes=shapes,
  )


# --------------------------------------------------------------------------- functional wrapper
_SAMPLERS: dict[Any, Sampler] = {}


def get_sampler(
  config: ModelConfig, mesh: Mesh | None = None, tokenizer=None, max_prompt_len: int | None = None
) -> Sampler:
  """The cached Sampler for (config, mesh, tokenizer, max_prompt_len)."""
  key = (config, mesh, tokenizer, max_prompt_len)
  if key not in _SAMPLERS:
    _SAMPLERS[key] = Sampler(config, mesh, tokenizer, max_prompt_len)
  return _SAMPLERS[key]


def generate(
  config: ModelConfig,
  params: Params,
  prompts: Sequence[Sequence[int]],
  sampling: SamplingParams = SamplingParams(),
  rng: jax.Array | None = None,
  *,
  mesh: Mesh | None = None,
  tokenizer=None,
  max_prompt_len: int | None = None,
  share_prefix: bool = True,
) -> GenerationResult:
  """`Sampler.generate` with a cached Sampler per (config, mesh, tokenizer, max_prompt_len)."""
  sampler = get_sampler(config, mesh, tokenizer, max_prompt_len)
  return sampler.generate(params, prompts, sampling, rng, share_prefix=share_prefix)


def num_compilations() -> int:
  """Compilations of every cached Sampler so far (all configs and meshes)."""
  return sum(s.num_compilations for s in _SAMPLERS.values())
