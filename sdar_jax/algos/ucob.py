"""UCOB's paired-view top-k distillation (arXiv 2606.29502; TU2021/UCOB@d38292c), without its
evolving skill memory: the static skills are its "good" view (docs/reference.md §11.5).

Three parts, each ported from the code at that commit:
- the rollout (sdar_jax.rollout.agent_loop with algo.views="mixed"): in every GRPO group the
  first half of the episodes plays without the skills, the rest with the skills inside the user
  message, and each turn keeps the other view's prompt as its teacher prompt
  (`_rollout_skill_mask`, `vanilla_multi_turn_loop` in verl/trainer/main_ucob.py);
- the pairs (`ucob_pairs`, `distillation_row`; host side, after the rollout, `UcobPairs`): the
  valid turns of a GRPO group that acted from the same observation are compared on their
  discounted returns; the best one (the winner) is distilled into the opposite view of each other
  turn whose return it beats by more than the margin, at most `max_pairs` of them per state,
  largest gaps first (`_build_cbsd_auxiliary_batch`, turn granularity): one distillation row per
  pair, its student prompt the other turn's prompt in the opposite view, its teacher prompt the
  winner's own, its response the winner's, each token weighted min(gap/τ, weight_max), times
  `action_weight` on the action span;
- the loss (`ucob_topk_term`, `ucob_loss`; in the update, `compute_dsdar_topk_loss` in
  verl/trainer/ppo/sdar_utils.py): on the distillation rows only, per position
  σ(β·(lT(y) − sg(lθ(y)))) · Σ_{v ∈ top-k(pT)} p̂T(v)·(log p̂T(v) − log p̂θ(v)) · weight, with
  p̂ the teacher's top k renormalised to one (and the student's on the same tokens), token-mean
  over the distillation rows' tokens. The PPO, entropy and KL terms leave those rows out
  (sdar_jax.core.loss: a batch's `distill_weight`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sdar_jax.algos.aggregation import agg_loss, masked_mean
from sdar_jax.algos.distill import DISTILL_LOSSES
from sdar_jax.algos.gates import compute_gate
from sdar_jax.algos.hooks import MethodHooks, register_hooks

Array = jax.Array
ArrayLike = jax.typing.ArrayLike

CLIP_LOG_RATIO = 5.0  # topk_clip_log_ratio clamps log pT − log pθ to ±5


# ----------------------------------------------------------------------------------- the loss
def ucob_topk_term(
  student_log_softmax: ArrayLike,
  teacher_log_softmax: ArrayLike,
  *,
  top_k: int,
  norm_to_one: bool = True,
  clip_log_ratio: bool = False,
) -> Array:
  """Σ_{v ∈ K} pT(v)·(log pT(v) − log pθ(v)) per position, K the teacher's `top_k` most likely
  tokens: [B, R, V] x 2 -> [B, R], ungated and unweighted.

  `norm_to_one`: both distributions restricted to K and renormalised to one there (UCOB's
  setting): a KL between two distributions over K, whose gradient reaches the student only through
  its logits on K. Otherwise the full-vocabulary log-probs on K (a truncated forward KL)."""
  ls = jnp.asarray(student_log_softmax, jnp.float32)
  lt = jax.lax.stop_gradient(jnp.asarray(teacher_log_softmax, jnp.float32))
  lt_k, idx = jax.lax.top_k(lt, min(int(top_k), lt.shape[-1]))
  ls_k = jnp.take_along_axis(ls, idx, axis=-1)
  if norm_to_one:
    lt_k = lt_k - jax.nn.logsumexp(lt_k, axis=-1, keepdims=True)
    ls_k = ls_k - jax.nn.logsumexp(ls_k, axis=-1, keepdims=True)
  ratio = lt_k - ls_k
  if clip_log_ratio:
    ratio = jnp.clip(ratio, -CLIP_LOG_RATIO, CLIP_LOG_RATIO)
  return jnp.sum(jnp.exp(lt_k) * ratio, axis=-1)


def ucob_loss(
  student_logp: ArrayLike,
  teacher_logp: ArrayLike,
  mask: ArrayLike,
  *,
  topk_term: ArrayLike,
  distill_weight: ArrayLike,
  beta: ArrayLike,
  gate: str = "gap",
  entropy: ArrayLike | None = None,
  vocab_size: int | None = None,
  agg: str = "token-mean",
  denom: ArrayLike | None = None,
  num_seqs: ArrayLike | None = None,
) -> tuple[Array, dict[str, Array]]:
  """UCOB's term (not multiplied by its coefficient): agg(g·topk_term·distill_weight, mask), g =
  gate(β, lT(y) − sg(lθ(y))) of the sampled token y once per position (UCOB: σ(5·Δ)).

  `mask` holds the distillation rows' response tokens and `denom` / `num_seqs` their counts over
  the whole mini-batch (micro-batch shares add up, `aggregation`). Metrics: ucob/loss,
  ucob/gate_mean, ucob/gate_active_ratio, ucob/topk_kl (the ungated term), ucob/weight_mean."""
  ls = jax.lax.stop_gradient(jnp.asarray(student_logp, jnp.float32))
  lt = jax.lax.stop_gradient(jnp.asarray(teacher_logp, jnp.float32))
  g = compute_gate(gate, beta=beta, gap=lt - ls, entropy=entropy, vocab_size=vocab_size)
  weight = jax.lax.stop_gradient(jnp.asarray(distill_weight, jnp.float32))
  term = jnp.asarray(topk_term, jnp.float32)
  loss = agg_loss(g * term * weight, mask, agg, denom, num_seqs)
  metrics = {
    "ucob/loss": loss,
    "ucob/gate_mean": masked_mean(g, mask, denom),
    "ucob/gate_active_ratio": masked_mean((g > 0.5).astype(jnp.float32), mask, denom),
    "ucob/topk_kl": masked_mean(term, mask, denom),
    "ucob/weight_mean": masked_mean(weight, mask, denom),
  }
  return loss, jax.lax.stop_gradient(metrics)


@DISTILL_LOSSES.register("ucob")
def _ucob(
  *,
  student_logp,
  teacher_logp,
  mask,
  beta,
  gate="gap",
  entropy=None,
  vocab_size=None,
  vocab_term=None,
  distill_weight=None,
  agg="token-mean",
  denom=None,
  num_seqs=None,
  **unused,
):
  del unused
  if vocab_term is None or distill_weight is None:
    raise ValueError(
      "algo.distill='ucob' needs vocab_term=[B, R] (`ucob_topk_term` of both branches' "
      "log-softmax) and distill_weight=[B, R] (the batch's distillation rows, algos.ucob)"
    )
  return ucob_loss(
    student_logp,
    teacher_logp,
    mask,
    topk_term=vocab_term,
    distill_weight=distill_weight,
    beta=beta,
    gate=gate,
    entropy=entropy,
    vocab_size=vocab_size,
    agg=agg,
    denom=denom,
    num_seqs=num_seqs,
  )


# ---------------------------------------------------------------------------------- the pairs
@dataclasses.dataclass(frozen=True)
class Pair:
  """One distillation: the winner's response, taught to `target`'s context in the view `skills`
  (True: with the skills), with the return gap that weights it."""

  winner: int
  target: int  # the winner itself when its state had no other valid turn
  skills: bool
  gap: float


def discounted_returns(samples: Sequence[Any], gamma: float) -> np.ndarray:
  """Each turn-sample's return Σ_k γ^(k−t)·r_k over its episode's turns from its own on (r: the
  env's reward for the turn's action, no penalty), as `_discounted_returns_from_trajectory_steps`.
  Episodes are told apart by (group_id, episode); a turn without a sample adds nothing."""
  rewards: dict[tuple[int, int], dict[int, float]] = {}
  for s in samples:
    rewards.setdefault((s.group_id, s.episode), {})[int(s.turn)] = float(s.reward)
  returns: dict[tuple[int, int], dict[int, float]] = {}
  for key, by_turn in rewards.items():
    running, out = 0.0, {}
    for t in range(max(by_turn), -1, -1):
      running = by_turn.get(t, 0.0) + gamma * running
      out[t] = running
    returns[key] = out
  return np.asarray(
    [returns[(s.group_id, s.episode)][int(s.turn)] for s in samples], np.float64
  ).reshape(-1)


def ucob_pairs(
  samples: Sequence[Any], returns: Sequence[float], *, margin: float, max_pairs: int
) -> tuple[list[Pair], dict[str, float]]:
  """The iteration's pairs and their counts. Valid turns (`valid`, a response) are grouped by
  (group_id, observation) in order of appearance; in each group the winner is the first turn with
  the highest return, the view to teach is the opposite of the winner's, and every other turn of
  the group is a target with baseline its own return (none other: the winner itself, baseline the
  group's mean return); a target counts when return gap > `margin`, and the `max_pairs` largest
  gaps are kept (0: all; ties keep their order)."""
  groups: dict[tuple[int, str], list[int]] = {}
  for i, s in enumerate(samples):
    if s.valid and len(s.response_ids):
      groups.setdefault((s.group_id, s.observation), []).append(i)
  pairs: list[Pair] = []
  stats = {"raw": 0.0, "margin_filtered": 0.0, "skills_to_plain": 0.0, "plain_to_skills": 0.0}
  for members in groups.values():
    best = max(returns[i] for i in members)
    winner = next(i for i in members if returns[i] == best)
    teach_skills = not samples[winner].skills_in_prompt
    targets = [i for i in members if i != winner] or [winner]
    mean = float(np.mean([returns[i] for i in members]))
    scored = []
    for target in targets:
      stats["raw"] += 1.0
      gap = float(returns[winner] - (returns[target] if target != winner else mean))
      if gap <= margin:
        stats["margin_filtered"] += 1.0
        continue
      scored.append((gap, target))
    scored.sort(key=lambda item: -item[0])  # stable: equal gaps keep their order
    for gap, target in scored[:max_pairs] if max_pairs > 0 else scored:
      pairs.append(Pair(winner, target, teach_skills, gap))
      stats["plain_to_skills" if teach_skills else "skills_to_plain"] += 1.0
  return pairs, stats


# The action span of a response, the patterns UCOB's `_find_action_spans` looks for in order:
# closed tags, else an unclosed tag to the end, else WebShop's search[...] / click[...].
_CLOSED_SPANS = tuple(
  re.compile(p, re.IGNORECASE | re.DOTALL)
  for p in (
    rb"<action\b[^>]*>(.*?)</action>",
    rb"<code\b[^>]*>(.*?)</code>",
    rb"<search\b[^>]*>(.*?)</search>",
    rb"<answer\b[^>]*>(.*?)</answer>",
    rb"\[action>(.*?)</action>\]?",
    rb"action>(.*?)</action>",
  )
)
_OPEN_SPANS = tuple(
  re.compile(rb"<" + tag + rb"\b[^>]*>(.*)$", re.IGNORECASE | re.DOTALL)
  for tag in (b"action", b"code", b"search", b"answer")
)
_WEBSHOP_SPAN = re.compile(rb"(?:search|click)\[[^\]\n]*\]", re.IGNORECASE)


def action_spans(text: bytes) -> list[tuple[int, int]]:
  """The merged (start, end) byte spans of the action in a response's text."""
  spans = [m.span(1) for p in _CLOSED_SPANS for m in p.finditer(text) if m.end(1) > m.start(1)]
  for pattern in _OPEN_SPANS:
    if spans:
      break
    m = pattern.search(text)
    if m is not None and m.end(1) > m.start(1):
      spans.append(m.span(1))
  if not spans:
    spans = [m.span() for m in _WEBSHOP_SPAN.finditer(text)]
  merged: list[tuple[int, int]] = []
  for start, end in sorted(spans):
    if merged and start <= merged[-1][1]:
      merged[-1] = (merged[-1][0], max(merged[-1][1], end))
    else:
      merged.append((start, end))
  return merged


def action_token_mask(
  response_ids: Sequence[int], token_bytes: Callable[[int], bytes]
) -> np.ndarray:
  """1 for each response token whose bytes overlap the action span, else 0 (all 0 when the
  response has no span)."""
  pieces = [token_bytes(int(i)) for i in response_ids]
  ends = np.cumsum([len(p) for p in pieces])
  starts = ends - np.asarray([len(p) for p in pieces])
  spans = action_spans(b"".join(pieces))
  out = np.zeros(len(pieces), np.float32)
  for k, (a, b) in enumerate(zip(starts, ends)):
    out[k] = float(b > a and any(a < e and b > s for s, e in spans))
  return out


def distillation_row(samples: Sequence[Any], pair: Pair, cfg, token_bytes: Callable[[int], bytes]):
  """The turn-sample of `pair`: the target's prompt in the taught view, the winner's own prompt as
  the teacher's and the winner's response, each token weighted min(max(gap/τ, 0), weight_max)
  times (1 + (action_weight − 1)·[token in the action span]); no advantage (no PPO term)."""
  winner, target = samples[pair.winner], samples[pair.target]
  own = target.skills_in_prompt == pair.skills
  prompt = target.prompt_ids if own else target.teacher_prompt_ids
  weight = min(max(pair.gap / cfg.tau, 0.0), cfg.weight_max)
  weights = np.full(len(winner.response_ids), weight, np.float64)
  if cfg.action_weight != 1.0:
    weights *= 1.0 + (cfg.action_weight - 1.0) * action_token_mask(winner.response_ids, token_bytes)
  return dataclasses.replace(
    winner,
    prompt_ids=list(prompt),
    teacher_prompt_ids=list(winner.prompt_ids),
    advantage=0.0,
    skills_in_prompt=pair.skills,
    distill_weight=[float(w) for w in weights],
  )


def interleave(rows: list, extra: list) -> list:
  """`extra` spread evenly among `rows` (UCOB's `_concat_interleaved_batches`: position p of the
  n + m holds the next extra row while fewer than ⌊(p + 1)·m / (n + m)⌋ have been placed)."""
  out, r, e = [], 0, 0
  total = len(rows) + len(extra)
  for p in range(total):
    if e < ((p + 1) * len(extra)) // total or r >= len(rows):
      out.append(extra[e])
      e += 1
    else:
      out.append(rows[r])
      r += 1
  return out


def _token_bytes(tokenizer) -> Callable[[int], bytes]:
  """id -> the bytes it adds to the decoded text; end-of-sequence tokens and ids past the
  tokenizer's vocabulary add none (UCOB decodes with skip_special_tokens)."""
  table = tokenizer.all_token_bytes()
  skip = set(tokenizer.eos_token_ids)
  return lambda i: b"" if i in skip or not 0 <= i < len(table) else table[i]


class UcobPairs(MethodHooks):
  """After the rollout: the iteration's pairs as distillation rows, spread among its turn-samples
  (each process pairs its own groups, which never span processes)."""

  def __init__(self, algo):
    self.cfg = algo.ucob

  def after_rollout(self, view):
    samples = list(view.samples)
    returns = discounted_returns(samples, self.cfg.gamma)
    pairs, stats = ucob_pairs(
      samples, returns, margin=self.cfg.margin, max_pairs=self.cfg.max_pairs
    )
    token_bytes = _token_bytes(view.tokenizer)
    rows = [distillation_row(samples, p, self.cfg, token_bytes) for p in pairs]
    view.samples = interleave(samples, rows)
    raw = max(stats["raw"], 1.0)
    skills = [s.won for s in samples if s.skills_in_prompt]
    plain = [s.won for s in samples if not s.skills_in_prompt]
    return {
      "ucob/pairs": float(len(pairs)),
      "ucob/pairs_considered": stats["raw"],
      "ucob/margin_filtered_ratio": stats["margin_filtered"] / raw,
      "ucob/skills_to_plain": stats["skills_to_plain"],
      "ucob/plain_to_skills": stats["plain_to_skills"],
      "ucob/gap_mean": float(np.mean([p.gap for p in pairs])) if pairs else 0.0,
      "ucob/skills_share": len(skills) / max(len(samples), 1),  # turns played with the skills
      "ucob/turns_with_skills_won": float(np.mean(skills)) if skills else 0.0,
      "ucob/turns_without_skills_won": float(np.mean(plain)) if plain else 0.0,
    }

  def run_problems(self, config) -> list[str]:
    group = config.env.group_size
    if isinstance(group, int) and group < 2:
      problem = (
        f"env.group_size={group!r}: algo.distill='ucob' pairs turns of the two halves of a GRPO "
        "group (one plays without the skills, one with them). Fix: use env.group_size >= 2 "
        "(UCOB's launcher: 8)"
      )
      return [problem]
    return []


@register_hooks("ucob_pairs")
def _ucob_hooks(algo) -> MethodHooks | None:
  return UcobPairs(algo) if algo.distill == "ucob" else None
