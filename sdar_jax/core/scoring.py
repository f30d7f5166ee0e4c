"""Scores of response tokens, for the update and the token view: one implementation of each.

Holds the response positions' hidden states and log-probs (`response_hidden`, `response_logprobs`),
and the chunked two-branch head (`two_branch_scores`): the student's and the teacher's [B, R, V]
log-softmax at the sampling temperature, formed chunk by chunk from [B, R, D] hidden states, with
the sampled tokens' log-probs, the student's entropy and what a caller's `extras` add (the update:
SDAR's vocabulary terms; the token view, through `score_responses`: the teacher's top tokens and
`vocab_drive`). Inputs are a `ModelConfig`, params and token / hidden arrays; outputs are float32
arrays [B, R] (or [B, R, k]). Traceable except `score_responses`, which jits; no files, no loss.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sdar_jax import algos
from sdar_jax.models import ModelConfig, Params, apply, logits_from_hidden, positions_from_mask

Array = jax.Array
Extras = Callable[[Array, Array, Array, Array], dict[str, Array]]

VIEW_TOP = 3  # the teacher's most likely tokens the token view lists at each position
VIEW_CHUNK = 64  # response positions per lm_head pass of the view (bounds its [B, c, V] arrays)


# --------------------------------------------------------------------------------- log-probs
def scaled_logits(config: ModelConfig, temperature: float, params: Params, hidden: Array) -> Array:
  """Float32 logits [..., V] of hidden states [..., D], divided by `temperature` unless it is 1."""
  logits = logits_from_hidden(config, params, hidden)
  return logits if temperature == 1.0 else logits / temperature


def log_softmax(config: ModelConfig, temperature: float, params: Params, hidden: Array) -> Array:
  return jax.nn.log_softmax(scaled_logits(config, temperature, params, hidden), axis=-1)


def _picked(log_probs: Array, targets: Array) -> Array:
  return jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]


def token_logprob_and_entropy(
  config: ModelConfig,
  temperature: float,
  with_entropy: bool,
  params: Params,
  hidden: Array,
  targets: Array,
) -> tuple[Array, Array | None]:
  """log p(target) of each hidden state's next-token distribution at `temperature` (and its
  entropy): the lm_head applied to response positions only."""
  logits = scaled_logits(config, temperature, params, hidden)
  picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  logp = picked - jax.nn.logsumexp(logits, axis=-1)
  return logp, (algos.entropy_from_logits(logits) if with_entropy else None)


def response_hidden(
  config: ModelConfig, params: Params, tokens: Array, mask: Array, response_len: int
) -> tuple[Array, Array]:
  """The hidden states [B, R, D] that predict the last `response_len` tokens of `tokens`
  [B, P+R], and those tokens [B, R]. The decoder keeps only the last R + 1 positions (the last
  prompt position and the response's), so its last layer skips the rest of the prompt."""
  prompt_len = tokens.shape[1] - response_len
  if prompt_len < 1:
    raise ValueError(
      f"tokens of length {tokens.shape[1]} leave no prompt before a response of "
      f"{response_len} slots; the first response token needs a preceding position."
    )
  hidden, _ = apply(
    config, params, tokens, positions_from_mask(mask), mask, keep_last=response_len + 1
  )
  return hidden[:, :response_len], tokens[:, prompt_len:]


def response_logprobs(
  config: ModelConfig,
  params: Params,
  tokens: Array,
  mask: Array,
  response_len: int,
  temperature: float = 1.0,
  with_entropy: bool = False,
) -> tuple[Array, Array | None]:
  """Log-probs [B, R] (and entropies [B, R]) of the last `response_len` tokens of `tokens`
  [B, P+R] (left-padded prompt, then the response), float32; lm_head on R positions only."""
  hidden, targets = response_hidden(config, params, tokens, mask, response_len)
  head = functools.partial(token_logprob_and_entropy, config, temperature, with_entropy)
  if config.remat:  # keep only the [B, R, D] hidden states, recompute the [B, R, V] logits
    head = jax.checkpoint(head)
  return head(params, hidden, targets)


# ----------------------------------------------------------------------- the two-branch head
def _two_branch_head(config, temperature, extras, params, teacher_params, hidden, targets, th):
  """One chunk's scores (see `two_branch_scores`)."""
  ls = log_softmax(config, temperature, params, hidden)
  out = {"student": _picked(ls, targets), "entropy": -jnp.sum(jnp.exp(ls) * ls, axis=-1)}
  if th is None:
    return out
  lt = jax.lax.stop_gradient(log_softmax(config, temperature, teacher_params, th))
  out["teacher"] = _picked(lt, targets)
  if extras is not None:
    out.update(extras(ls, lt, targets, out["entropy"]))
  return out


def two_branch_scores(
  config: ModelConfig,
  temperature: float,
  params: Params,
  hidden: Array,
  targets: Array,
  teacher_params: Params | None = None,
  teacher_hidden: Array | None = None,
  *,
  extras: Extras | None = None,
  chunk: int | None = None,
  remat: bool = False,
) -> dict[str, Array]:
  """Per response position [B, R]: "student" (log-prob of `targets`) and "entropy" from the
  student's log-softmax of `hidden` [B, R, D] at `temperature`; with `teacher_hidden`, "teacher"
  (without gradient) and `extras(student_lsm, teacher_lsm, targets, entropy)`'s arrays.

  Positions go in chunks of `chunk` (None: all at once; the last chunk zero-padded and sliced
  off), mapped with `lax.map`, so one chunk's [B, chunk, V] arrays are live at a time; `remat`
  checkpoints the head, so the backward pass recomputes them from the hidden states."""
  R = hidden.shape[1]
  chunk = R if not chunk else min(chunk, R)
  num = -(-R // chunk)
  head = functools.partial(_two_branch_head, config, temperature, extras, params, teacher_params)
  body = jax.checkpoint(lambda xs: head(*xs)) if remat else (lambda xs: head(*xs))
  if num == 1:
    return body((hidden, targets, teacher_hidden))

  def split(x):  # [B, R, ...] -> [num, B, chunk, ...]
    x = jnp.pad(x, [(0, 0), (0, num * chunk - R)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape(x.shape[0], num, chunk, *x.shape[2:]).swapaxes(0, 1)

  xs = (split(hidden), split(targets), None if teacher_hidden is None else split(teacher_hidden))
  outs = jax.lax.map(body, xs)
  return {
    k: v.swapaxes(0, 1).reshape(v.shape[1], num * chunk, *v.shape[3:])[:, :R]
    for k, v in outs.items()
  }


def sdar_vocab_extras(algo, vocab_size: int) -> Extras:
  """The update's extras for SDAR's forms "vocab" / "topk": the gated term at each position
  ("term", `algos.vocab_distill_term` / `topk_distill_term`; the gate reads the entropy without
  gradient); for UCOB's term, its ungated top-k KL at each position (`algos.ucob_topk_term`)."""

  def extras(ls, lt, targets, entropy):
    del targets
    if algo.distill == "ucob":
      u = algo.ucob
      term = algos.ucob_topk_term(
        ls, lt, top_k=algo.top_k, norm_to_one=u.norm_to_one, clip_log_ratio=u.clip_log_ratio
      )
      return {"term": term}
    gated = dict(
      beta=algo.beta,
      gate=algo.gate,
      entropy=jax.lax.stop_gradient(entropy),
      vocab_size=vocab_size,
    )
    if algo.distill == "sdpo":  # SDPO's divergence (algos.sdpo), not a gated term
      s = algo.sdpo
      term = algos.sdpo_divergence(ls, lt, top_k=s.top_k, alpha=s.alpha, add_tail=s.add_tail)
      return {"term": term}
    if algo.form == "topk":
      return {"term": algos.topk_distill_term(ls, lt, top_k=algo.top_k, **gated)}
    return {"term": algos.vocab_distill_term(ls, lt, **gated)}

  return extras


# --------------------------------------------------------------------------------- the view
def vocab_drive(
  student_log_softmax: jax.typing.ArrayLike,
  teacher_log_softmax: jax.typing.ArrayLike,
  targets: jax.typing.ArrayLike,
  *,
  beta: float,
  gate: str,
  entropy: jax.typing.ArrayLike | None = None,
  vocab_size: int | None = None,
  top_k: int | None = None,
) -> dict[str, Array]:
  """What drives the gradient of SDAR's form "vocab" (`top_k` None: `algos.vocab_distill_term`)
  or "topk" (`algos.topk_distill_term`) at each position: [..., V] x 2 and sampled tokens [...]
  -> dict of [...] arrays.

  The term's gradient w.r.t. the student's (temperature-scaled) logits z is −w + W·pθ, with
  w_v = pT(v)·g_v (each entry gated by its own gap, 0 outside the teacher's top k) and W = Σ_v w_v;
  a descent step moves z along d = w − W·pθ (Σ_v d_v = 0). Returned: "drive" ½‖d‖₁ (the mass
  moved, in [0, W]), "push" d_y at the sampled token y, "sampled_weight" w_y, "total_weight" W,
  "preferred" argmax_v w_v and "preferred_weight" its w.
  """
  ls = jnp.asarray(student_log_softmax, jnp.float32)
  lt = jnp.asarray(teacher_log_softmax, jnp.float32)
  targets = jnp.asarray(targets, jnp.int32)
  if top_k is None:
    lt_k, ls_k, idx = lt, ls, None
  else:
    lt_k, idx = jax.lax.top_k(lt, min(int(top_k), lt.shape[-1]))
    ls_k = jnp.take_along_axis(ls, idx, axis=-1)
  if entropy is not None:
    entropy = jnp.asarray(entropy, jnp.float32)[..., None]
  g = algos.compute_gate(gate, beta=beta, gap=lt_k - ls_k, entropy=entropy, vocab_size=vocab_size)
  w = jnp.exp(lt_k) * g
  total = jnp.sum(w, axis=-1)
  p_k = jnp.exp(ls_k)
  drive = 0.5 * jnp.sum(jnp.abs(w - total[..., None] * p_k), axis=-1)
  if idx is None:
    w_y = jnp.take_along_axis(w, targets[..., None], axis=-1)[..., 0]
    best = jnp.argmax(w, axis=-1)
  else:  # the entries outside the top k have w = 0 and d_v = −W·pθ(v)
    drive = drive + 0.5 * total * jnp.maximum(1.0 - jnp.sum(p_k, axis=-1), 0.0)
    w_y = jnp.sum(jnp.where(idx == targets[..., None], w, 0.0), axis=-1)
    best = jnp.take_along_axis(idx, jnp.argmax(w, axis=-1)[..., None], axis=-1)[..., 0]
  p_y = jnp.exp(jnp.take_along_axis(ls, targets[..., None], axis=-1)[..., 0])
  return {
    "drive": drive,
    "push": w_y - total * p_y,
    "sampled_weight": w_y,
    "total_weight": total,
    "preferred": best,
    "preferred_weight": jnp.max(w, axis=-1),
  }


def _view_extras(vocab_size: int, form: str, top_k: int, gate: str, beta: float) -> Extras:
  """The token view's extras: the teacher's top VIEW_TOP ("top_ids", "top_probs") and, for the
  forms "vocab" / "topk", `vocab_drive`'s arrays under "drive/<name>"."""

  def extras(ls, lt, targets, entropy):
    top_lp, top_ids = jax.lax.top_k(lt, VIEW_TOP)
    out = {"top_ids": top_ids, "top_probs": jnp.exp(top_lp)}
    if form in algos.VOCAB_FORMS:
      drive = vocab_drive(
        ls,
        lt,
        targets,
        beta=beta,
        gate=gate,
        entropy=entropy,
        vocab_size=vocab_size,
        top_k=top_k if form == "topk" else None,
      )
      out.update({f"drive/{k}": v for k, v in drive.items()})
    return out

  return extras


_VIEW_FNS: dict[Any, Callable] = {}


def _view_fn(config: ModelConfig, options: tuple, with_teacher: bool, chunk: int) -> Callable:
  """The view's jitted pass for one model, options and branch set (compiled once per shape)."""
  key = (config, options, with_teacher, chunk)
  if key not in _VIEW_FNS:
    temperature, form, top_k, gate, beta = options
    extras = _view_extras(config.vocab_size, form, top_k, gate, beta)

    def run(params, teacher_params, arrays, response_len):
      student_tokens, student_mask, teacher_tokens, teacher_mask = arrays
      hidden, targets = response_hidden(config, params, student_tokens, student_mask, response_len)
      teacher_hidden = None
      if with_teacher:
        teacher_hidden, _ = response_hidden(
          config, teacher_params, teacher_tokens, teacher_mask, response_len
        )
      return two_branch_scores(
        config,
        temperature,
        params,
        hidden,
        targets,
        teacher_params,
        teacher_hidden,
        extras=extras,
        chunk=chunk,
      )

    _VIEW_FNS[key] = jax.jit(run, static_argnums=(3,))
  return _VIEW_FNS[key]


def score_responses(
  config: ModelConfig,
  algo,
  params: Params,
  arrays: tuple[Array, Array, Array | None, Array | None],
  response_len: int,
  teacher_params: Params | None = None,
  chunk: int = VIEW_CHUNK,
) -> dict[str, Any]:
  """The token view's scores of a packed batch, `arrays` = (student tokens, student mask, teacher
  tokens, teacher mask; the teacher's None: no teacher), as the update scores them, in one jitted
  `two_branch_scores` pass: numpy [B, R] "student", "entropy" and, with a teacher, "teacher",
  "gate" (algo.gate at algo.beta), "top_ids" / "top_probs" [B, R, VIEW_TOP] and, for the forms
  "vocab" / "topk", "drive/<name>" (`vocab_drive`). The teacher runs on `teacher_params`
  (default: `params`)."""
  with_teacher = arrays[2] is not None
  options = (
    float(algo.temperature),
    str(algo.form),
    int(algo.top_k),
    str(algo.gate),
    float(algo.beta),
  )
  score = _view_fn(config, options, with_teacher, int(chunk))
  teacher = params if teacher_params is None else teacher_params
  got = {k: np.asarray(v) for k, v in score(params, teacher, arrays, response_len).items()}
  if with_teacher:
    got["gate"] = np.asarray(
      algos.compute_gate(
        algo.gate,
        beta=algo.beta,
        gap=got["teacher"] - got["student"],
        entropy=got["entropy"],
        vocab_size=config.vocab_size,
      )
    )
  return got
