"""Episodes -> scored turn-samples (GRPO advantages) -> fixed-shape `TurnBatch` arrays.

One training sample per turn (docs/reference.md §4.7): that turn's prompt (with its history
window) and that turn's response. Every turn of an episode carries the episode return, minus the
invalid-format penalty of that turn (docs/reference.md §4.4) and, when `inadmissible_penalty` > 0,
minus that penalty for a well-formed action the env did not list as admissible (not in the
reference, where such an action is valid; for small policies, whose wasted turns are mostly
inadmissible commands); advantages are normalised over all turn-samples of a GRPO group
(docs/reference.md §2.1), and, when `step_adv_coef` > 0, a step-level advantage compares the
turns a group took from the same state (GiGPO's; `episodes_to_samples`).

Shapes are bucketed (`sdar_jax.core.batch`) so the compiled update sees a bounded set of shapes, and
a mini-batch that is not full is padded with rows whose masks are all zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sdar_jax import algos
from sdar_jax.core.batch import TurnBatch, TurnSample, new_tokens_bucket, prompt_bucket
from sdar_jax.rollout.shaping import STEP_ANCHORS
from sdar_jax.rollout.trajectory import Episode, Turn


def episodes_to_samples(
  episodes: Sequence[Episode],
  invalid_penalty: float = 0.1,
  norm_adv_by_std: bool = True,
  eps: float = 1e-6,
  inadmissible_penalty: float = 0.0,
  inadmissible_no_credit: bool = False,
  step_adv_coef: float = 0.0,
  step_gamma: float = 0.95,
  step_anchor: str = "observation",
) -> list[TurnSample]:
  """Turn-samples of every finished episode with GRPO advantages. Episodes whose env failed are
  left out (their return is unknown), and so are turns with an empty response. A turn whose
  well-formed action the env did not list (`Turn.admissible` False) also loses
  `inadmissible_penalty`; turns with a format penalty or no admissibility check do not. With
  `inadmissible_no_credit`, such a turn's advantage is capped at 0: the env answered it with
  "Nothing happens.", so a won episode's success is not its doing, while a lost episode's turns
  keep their negative advantage (the turn was spent).

  With `step_adv_coef` w > 0, each turn's advantage also gets w times a step-level advantage
  (GiGPO's, inherited by the authors' code from verl-agent; not in the SDAR table): the turn's
  discounted return from that turn on, Σ_k γ^(k−t)·r_k with `step_gamma` γ over the env's
  rewards r_k, less the turn's own penalties (verl-agent discounts the raw rewards, then
  subtracts each turn's penalty from its own return), less the mean return of the turns of the same GRPO group
  that acted from the same state (`step_anchor`: "observation", the env's observation text, or
  "prompt", the identical student prompt, history window included), divided by their standard
  deviation when `norm_adv_by_std` (as the episode level); a state visited once gets 0.
  The episode-level part says which episodes won; the step-level part says which action, from a
  state several episodes shared, led to the win sooner."""
  rows = [
    (e, k, ep, turn)
    for e, ep in enumerate(episodes)
    if ep.env_error is None
    for k, turn in enumerate(ep.turns)
    if turn.response_ids
  ]
  where = [(e, k) for e, k, _, _ in rows]
  rows = [(ep, turn) for _, _, ep, turn in rows]
  if not rows:
    return []
  penalties = (invalid_penalty, inadmissible_penalty)
  rewards = np.asarray([ep.reward for ep, _ in rows], np.float32)
  scores = rewards - np.asarray([_turn_penalty(turn, *penalties) for _, turn in rows], np.float32)
  _, group_index = np.unique(np.asarray([ep.group_id for ep, _ in rows]), return_inverse=True)
  advantages = _group_advantages(scores, group_index, norm_adv_by_std, eps)
  if step_adv_coef:
    step = _step_advantages(episodes, rows, step_gamma, step_anchor, penalties)
    # a state played once has nothing to be compared with: 0
    advantages = advantages + step_adv_coef * _group_advantages(*step, norm_adv_by_std, eps, 0.0)
  if inadmissible_no_credit:
    unlisted = np.asarray([turn.admissible is False and turn.valid for _, turn in rows])
    advantages = np.where(unlisted, np.minimum(advantages, 0.0), advantages)
  return [
    TurnSample(
      prompt_ids=turn.prompt_ids,
      response_ids=turn.response_ids,
      logprobs=turn.logprobs,
      score=float(s),
      advantage=float(a),
      group_id=ep.group_id,
      policy_version=turn.policy_version,
      valid=turn.valid,
      task_type=ep.task_type,
      teacher_prompt_ids=turn.teacher_prompt_ids,
      episode=e,
      turn=k,
      won=bool(ep.won),
      observation=turn.observation,
      reward=float(turn.reward),
      skills_in_prompt=bool(turn.skills_in_prompt),
      context=turn.teacher_context,
      context_sources=turn.context_sources,
    )
    for (ep, turn), (e, k), s, a in zip(rows, where, scores, advantages)
  ]


def _group_advantages(
  values: np.ndarray, index: np.ndarray, norm_by_std: bool, eps: float, alone: float | None = None
) -> np.ndarray:
  """GRPO advantages of `values` within the groups `index` (0..n-1); a group of one sample gets
  `alone` when given (GRPO's own rule, mean 0 and std 1, otherwise)."""
  index = np.asarray(index, np.int32)
  num_groups = int(index.max()) + 1
  out = np.asarray(
    algos.grpo_advantages(values, index, norm_by_std=norm_by_std, eps=eps, num_groups=num_groups)
  )
  if alone is not None:
    out = np.where(np.bincount(index, minlength=num_groups)[index] > 1, out, alone)
  return out


def _step_advantages(
  episodes: Sequence[Episode],
  rows: list,
  gamma: float,
  anchor: str,
  penalties: tuple[float, float],
) -> tuple[np.ndarray, np.ndarray]:
  """(discounted return of each row's turn, index of its state) for `_group_advantages`: two
  turns share a state when they belong to one GRPO group and have the same `anchor`."""
  if anchor not in STEP_ANCHORS:
    raise ValueError(
      f"rollout.shaping.step_anchor={anchor!r}: unknown. Fix: use one of {list(STEP_ANCHORS)}"
    )
  returns = np.asarray(
    [
      r
      for ep in episodes
      if ep.env_error is None
      for r in _discounted_returns(ep, gamma, *penalties)
    ],
    np.float32,
  )
  states: dict[tuple, int] = {}
  index = [
    states.setdefault(
      (ep.group_id, turn.observation if anchor == "observation" else tuple(turn.prompt_ids)),
      len(states),
    )
    for ep, turn in rows
  ]
  return returns, np.asarray(index)


def _turn_penalty(turn: Turn, invalid_penalty: float, inadmissible_penalty: float) -> float:
  """What a turn loses from its reward: `invalid_penalty` for a malformed response (the
  reference's format penalty), else `inadmissible_penalty` for a well-formed command the env did
  not list (`Turn.admissible` False; None, no check, costs nothing)."""
  if not turn.valid:
    return invalid_penalty
  return inadmissible_penalty if turn.admissible is False else 0.0


def _discounted_returns(
  ep: Episode, gamma: float, invalid_penalty: float, inadmissible_penalty: float
) -> list[float]:
  """Σ_k γ^(k−t)·r_k − penalty_t for each turn t of `ep` that has a response (the rows of
  `episodes_to_samples`): r_k the env's reward for turn k, penalty_t turn t's own `_turn_penalty`
  (GiGPO: `compute_step_discounted_returns` on the env's rewards, then
  `apply_invalid_action_penalty` on each turn's own return; a later turn's penalty is not
  discounted into an earlier turn's return)."""
  out, running = [], 0.0
  for turn in reversed(ep.turns):
    running = turn.reward + gamma * running
    if turn.response_ids:
      out.append(running - _turn_penalty(turn, invalid_penalty, inadmissible_penalty))
  return out[::-1]


MINIBATCH_ORDERS = ("rollout", "length")


def minibatch_permutation(lengths: np.ndarray, order: str = "rollout") -> np.ndarray:
  """The order in which turn-samples fill the mini-batches, from their lengths [N, 3] (student
  prompt, response, teacher prompt; 0 where there is none).

  "rollout": as played (episode by episode, turn by turn; the reference). "length": shortest
  first by teacher prompt, then student prompt, then response (a stable sort), so each mini-batch
  holds samples of similar length and pads to its own, smaller bucket: the same samples and the
  same number of updates per iteration (each with other samples), less padding computed (the prompts of one rollout span a few
  hundred tokens as the history fills).
  """
  if order not in MINIBATCH_ORDERS:
    raise ValueError(
      f"train.minibatch_order={order!r}: unknown. Fix: use one of {list(MINIBATCH_ORDERS)}"
    )
  lengths = np.asarray(lengths, np.int64).reshape(-1, 3)
  if order == "rollout":
    return np.arange(len(lengths))
  return np.lexsort((lengths[:, 1], lengths[:, 0], lengths[:, 2]))  # last key sorts first


def sample_lengths(samples: Sequence[TurnSample], with_teacher: bool) -> np.ndarray:
  """[N, 3] lengths of each sample: student prompt, response, teacher prompt (0 without)."""
  lengths = np.zeros((len(samples), 3), np.int64)
  for i, s in enumerate(samples):
    teacher = len(s.teacher_prompt_ids) if with_teacher and s.teacher_prompt_ids else 0
    lengths[i] = (len(s.prompt_ids), len(s.response_ids), teacher)
  return lengths


def plan_minibatches(
  samples: Sequence[TurnSample],
  mini_batch_size: int,
  rng: np.random.Generator | None = None,
  order: str = "rollout",
) -> list[list[TurnSample]]:
  """Splits the samples into mini-batches of `mini_batch_size` (the last may be short; `pack_batch`
  pads it), in `minibatch_permutation`'s `order`. With `rng`, the order is shuffled instead (the
  reference does not shuffle)."""
  if mini_batch_size < 1:
    raise ValueError(f"train.mini_batch_size={mini_batch_size} must be >= 1.")
  lengths = sample_lengths(samples, True) if order == "length" else np.zeros((len(samples), 3))
  permutation = minibatch_permutation(lengths, order)
  if rng is not None:
    rng.shuffle(permutation)
  return [
    [samples[i] for i in permutation[k : k + mini_batch_size]]
    for k in range(0, len(samples), mini_batch_size)
  ]


def _place_prompt_and_response(
  tokens: np.ndarray,
  mask: np.ndarray,
  row: int,
  prompt: Sequence[int],
  prompt_len: int,
  response: Sequence[int],
) -> None:
  """Writes `prompt` left-padded to `prompt_len`, then `response`, into row `row`."""
  tokens[row, prompt_len - len(prompt) : prompt_len] = prompt
  mask[row, prompt_len - len(prompt) : prompt_len] = 1
  tokens[row, prompt_len : prompt_len + len(response)] = response
  mask[row, prompt_len : prompt_len + len(response)] = 1


def pack_batch(
  samples: Sequence[TurnSample],
  batch_size: int,
  with_teacher: bool,
  pad_id: int = 0,
  distill_weights: bool = False,
) -> TurnBatch:
  """A TurnBatch of exactly `batch_size` rows (numpy arrays; the step places them on the mesh).

  Student rows: prompt left-padded to Ps, response right-padded to R; teacher rows: the teacher
  prompt left-padded to Pt, then the same response. Ps, Pt, R are bucketed lengths.
  `distill_weights`: also the [B, R] `distill_weight` of a weighted distillation term (each
  sample's `distill_weight`, 0 for the samples without: the PPO rows).
  """
  if not samples:
    raise ValueError("pack_batch needs at least one sample.")
  if len(samples) > batch_size:
    raise ValueError(f"{len(samples)} samples do not fit a batch of {batch_size}.")
  if with_teacher and any(s.teacher_prompt_ids is None for s in samples):
    raise ValueError(
      "The algorithm needs teacher log-probs but some samples have no teacher "
      "prompt; the rollout must build teacher prompts (AgentLoop(with_teacher=True))."
    )
  Ps = prompt_bucket(max(len(s.prompt_ids) for s in samples))
  R = new_tokens_bucket(max(len(s.response_ids) for s in samples))
  B = batch_size
  student = np.full((B, Ps + R), pad_id, np.int32)
  student_mask = np.zeros((B, Ps + R), np.int32)
  response_mask = np.zeros((B, R), np.float32)
  old_logp = np.zeros((B, R), np.float32)
  advantages = np.zeros((B,), np.float32)
  teacher = teacher_mask = weight = None
  if distill_weights:
    weight = np.zeros((B, R), np.float32)
  if with_teacher:
    Pt = prompt_bucket(max(len(s.teacher_prompt_ids) for s in samples))
    teacher = np.full((B, Pt + R), pad_id, np.int32)
    teacher_mask = np.zeros((B, Pt + R), np.int32)
  for i, s in enumerate(samples):
    n = len(s.response_ids)
    if len(s.logprobs) != n:
      raise ValueError(f"sample {i}: {n} response tokens but {len(s.logprobs)} log-probs.")
    _place_prompt_and_response(student, student_mask, i, s.prompt_ids, Ps, s.response_ids)
    if with_teacher:
      _place_prompt_and_response(teacher, teacher_mask, i, s.teacher_prompt_ids, Pt, s.response_ids)
      if not s.context:  # no privileged context: out of the distillation term (core.loss)
        teacher_mask[i, Pt:] = 0
    response_mask[i, :n] = 1.0
    old_logp[i, :n] = s.logprobs
    advantages[i] = s.advantage
    if weight is not None and s.distill_weight is not None:
      if len(s.distill_weight) != n:
        raise ValueError(f"sample {i}: {n} response tokens but {len(s.distill_weight)} weights.")
      weight[i, :n] = s.distill_weight
  return TurnBatch(
    student_tokens=student,
    student_mask=student_mask,
    response_mask=response_mask,
    old_logp=old_logp,
    advantages=advantages,
    teacher_tokens=teacher,
    teacher_mask=teacher_mask,
    distill_weight=weight,
  )
