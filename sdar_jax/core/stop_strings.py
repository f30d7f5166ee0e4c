"""Stop strings as tables the sampler's compiled loop reads: an Aho-Corasick automaton over the
stop strings' UTF-8 bytes (`aho_corasick`), lifted on the host to a [state, token] table
(`stop_string_table`: the state after a token's bytes and whether a stop string completed inside
them), so a stop string is detected inside the loop exactly, also when it spans several tokens.
numpy only, on the host; `sdar_jax.core.sampling` places the table and steps it per token.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Sequence

import numpy as np

from sdar_jax.core.batch import next_power_of_two

MIN_STATE_BUCKET = 16  # the table's state axis is at least this, then a power of two


def aho_corasick(patterns: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
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
  delta, accept = aho_corasick([s.encode("utf-8") for s in stop_strings])
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
def cached_stop_table(tokenizer, vocab_size: int, stop_strings: tuple[str, ...]) -> np.ndarray:
  """`stop_string_table` of a tokenizer's first `vocab_size` tokens, its states padded to a power
  of two (at least MIN_STATE_BUCKET: fewer compilations), cached."""
  token_bytes = tokenizer.all_token_bytes(size=vocab_size)
  states = 1 + sum(len(s.encode("utf-8")) for s in stop_strings)
  return stop_string_table(
    token_bytes, stop_strings, max(MIN_STATE_BUCKET, next_power_of_two(states))
  )
