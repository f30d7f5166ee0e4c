"""Rollout sampler: batched generation with a KV cache in one jitted loop, with exact log-probs.

    from sdar_jax.core.sampling import generate, SamplingParams
    result = generate(config, params, prompts, SamplingParams(max_new_tokens=64), jax.random.key(0))
    result.tokens[i], result.logprobs[i], result.finish_reasons[i]

Holds `SamplingParams`, `GenerationResult` and `Sampler`: one compiled function per bucket shape
that prefills the distinct prompts once (GRPO prefix sharing), then decodes one token per step for
the whole batch in a `lax.while_loop` until every row has stopped; stop tokens and stop strings
(`core.stop_strings`) are checked inside the loop, tokens are picked by `core.token_choice`. Input:
prompt ids (per process, a collective with several); output: ids, the log-prob of each under the
unfiltered softmax(logits / temperature) (the update's quantity) and why each row ended. Counts its
compilations. No env, no files. docs/design.md, "The sampler", explains buckets, random streams
and processes.
"""

from __future__ import annotations

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

from sdar_jax.core import sharding, token_choice
from sdar_jax.core.batch import batch_bucket, new_tokens_bucket, prompt_bucket
from sdar_jax.core.stop_strings import cached_stop_table
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


# ------------------------------------------------------------------------------------ sampler
class Sampler:
  """Generation for one model config (and optionally one mesh); caches compiled functions.

  `max_prompt_len` bounds the prompt length (default: the config's max_position_embeddings).
  `tokenizer` supplies token bytes for stop strings (default: the bundled Qwen tokenizer).
  `row_step` > 0: a call of more than 256 rows runs at the next multiple of it rather than the
  next power of two where that is fewer rows (core.batch.batch_bucket); 0: powers of two.
  """

  def __init__(
    self,
    config: ModelConfig,
    mesh: Mesh | None = None,
    tokenizer=None,
    max_prompt_len: int | None = None,
    row_step: int = 0,
  ):
    self.config = config
    self.mesh = mesh
    self._tokenizer = tokenizer
    self.max_prompt_len = int(max_prompt_len or config.max_position_embeddings)
    self.row_step = int(row_step)
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
      token_choice.choose,
      temperature=temperature,
      top_p=top_p,
      greedy=greedy,
      top_k=top_k,
      use_top_p=use_top_p,
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
    U = batch_bucket(len(unique), self._divisor, self.row_step)
    B = batch_bucket(n, self._divisor, self.row_step)
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
    B = batch_bucket(processes * int(sizes[:, 0].max()), self._divisor, self.row_step)
    U = batch_bucket(processes * int(sizes[:, 1].max()), self._divisor, self.row_step)
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
        lambda: cached_stop_table(self.tokenizer, V, sampling.stop_strings),
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
