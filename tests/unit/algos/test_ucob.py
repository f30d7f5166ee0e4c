"""UCOB's port (sdar_jax.algos.ucob) against NumPy versions of its source's own rules, written
here from TU2021/UCOB at commit d38292c:
- the loss: `compute_dsdar_topk_loss` in verl/trainer/ppo/sdar_utils.py, with the inputs the actor
  gives it (verl/workers/actor/dp_actor.py, `update_policy`: the teacher view's top-k logits and
  logsumexp, the student's logits gathered on the same ids, both views' log-probs of the sampled
  token, the per-token weights, the distillation rows' response mask), and verl's token-mean
  (`agg_loss` / `masked_mean` in verl/trainer/ppo/core_algos.py, verl/utils/torch_functional.py);
- the pairs: `_build_cbsd_auxiliary_batch` (turn granularity) of `UCOBTrajectoryCollector` in
  verl/trainer/main_ucob.py, with `_cbsd_effective_teaching_gap`, the weight of its
  `append_aux_row` and `_discounted_returns_from_trajectory_steps`;
and the update's row split: the distillation rows leave the PPO and KL terms."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdar_jax import algos
from sdar_jax.algos import ucob
from sdar_jax.core.batch import TurnSample


# ------------------------------------------------------------------ the source's loss, NumPy
def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _source_topk_loss(
  target_logits_k,
  target_logsumexp,
  reference_logits_k,
  reference_logsumexp,
  response_mask,
  target_log_probs,
  reference_log_probs,
  loss_weight,
  gate_beta=5.0,
  norm_to_one=True,
  clip_log_ratio=False,
):
  """compute_dsdar_topk_loss (TU2021/UCOB@d38292c, verl/trainer/ppo/sdar_utils.py) with
  gate_enable, no direction ids and loss_agg_mode "token-mean", in float64."""
  if norm_to_one:
    tgt = _log_softmax(target_logits_k)
    ref = _log_softmax(reference_logits_k)
  else:
    tgt = target_logits_k - target_logsumexp[..., None]
    ref = reference_logits_k - reference_logsumexp[..., None]
  ratio = ref - tgt
  if clip_log_ratio:
    ratio = np.clip(ratio, -5.0, 5.0)
  kl = (np.exp(ref) * ratio).sum(-1)
  gate = 1.0 / (1.0 + np.exp(-gate_beta * (reference_log_probs - target_log_probs)))
  weighted = kl * gate * loss_weight
  return (weighted * response_mask).sum() / (response_mask.sum() + 1e-8)


# Two rows of three positions over a vocabulary of 7, the teacher's top 3 (hand-made: the
# teacher's and the student's orders differ, row 1's last position is masked).
TEACHER_LOGITS = np.array(
  [
    [[2.0, 1.0, 0.5, -1.0, 0.0, -2.0, 0.3], [0.0, 3.0, 2.5, 1.0, -1.0, 0.0, 0.0],
     [1.0, 0.9, 4.0, -3.0, 0.5, 0.2, 2.0]],
    [[-1.0, 0.0, 0.0, 2.0, 2.2, 1.0, -0.5], [0.5, 0.5, 0.6, 0.4, 3.0, -2.0, 1.0],
     [9.0, -9.0, 0.0, 0.0, 0.0, 0.0, 0.0]],
  ]
)  # fmt: skip
STUDENT_LOGITS = np.array(
  [
    [[0.5, 2.0, 0.0, 0.0, 1.0, -1.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
     [0.0, 2.0, 1.0, 0.0, 3.0, 0.0, -1.0]],
    [[2.0, -1.0, 0.5, 0.0, 1.0, 0.3, 0.0], [0.0, 0.0, 0.0, 2.5, 1.0, 0.0, 0.0],
     [-9.0, 9.0, 0.0, 0.0, 0.0, 0.0, 0.0]],
  ]
)  # fmt: skip
SAMPLED = np.array([[1, 2, 6], [4, 4, 1]])  # the sampled token at each position
MASK = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
WEIGHT = np.array([[1.5, 3.0, 3.0], [0.25, 0.5, 0.5]])  # min(gap/τ, 2) x 2 on action tokens


def _source(student_logits, norm_to_one, clip_log_ratio=False, k=3):
  idx = np.argsort(-TEACHER_LOGITS, axis=-1, kind="stable")[..., :k]
  take = lambda x: np.take_along_axis(x, idx, axis=-1)  # noqa: E731
  lse = lambda x: np.log(np.exp(x).sum(-1))  # noqa: E731
  pick = lambda x: np.take_along_axis(_log_softmax(x), SAMPLED[..., None], -1)[..., 0]  # noqa: E731
  return _source_topk_loss(
    take(student_logits),
    lse(student_logits),
    take(TEACHER_LOGITS),
    lse(TEACHER_LOGITS),
    MASK,
    pick(student_logits),
    pick(TEACHER_LOGITS),
    WEIGHT,
    norm_to_one=norm_to_one,
    clip_log_ratio=clip_log_ratio,
  )


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _ours(student_logits, norm_to_one, clip_log_ratio=False, k=3):
  ls = jax.nn.log_softmax(student_logits, axis=-1)
  lt = jax.nn.log_softmax(jnp.asarray(TEACHER_LOGITS, jnp.float32), axis=-1)
  term = ucob.ucob_topk_term(
    ls, lt, top_k=k, norm_to_one=norm_to_one, clip_log_ratio=clip_log_ratio
  )
  pick = lambda x: jnp.take_along_axis(x, jnp.asarray(SAMPLED)[..., None], -1)[..., 0]  # noqa: E731
  loss, metrics = ucob.ucob_loss(
    pick(ls), pick(lt), MASK, topk_term=term, distill_weight=WEIGHT, beta=5.0
  )
  return loss, metrics


@pytest.mark.parametrize(
  "norm_to_one,clip_log_ratio", [(True, False), (False, False), (True, True)]
)
def test_the_loss_and_its_gradient_equal_the_sources(norm_to_one, clip_log_ratio):
  """Value and gradient w.r.t. the student's logits (the gate and the teacher held fixed, as the
  source detaches them) against the NumPy source and its central differences; the masked position
  (row 1, position 2: a teacher and a student sure of different tokens) adds nothing."""
  student = jnp.asarray(STUDENT_LOGITS, jnp.float32)
  loss, metrics = _ours(student, norm_to_one, clip_log_ratio)
  want = _source(STUDENT_LOGITS, norm_to_one, clip_log_ratio)
  assert float(loss) == pytest.approx(want, rel=1e-5)
  assert float(metrics["ucob/loss"]) == pytest.approx(want, rel=1e-5)

  grad = np.asarray(_grad(student, norm_to_one, clip_log_ratio))
  gate_fixed = dict(norm_to_one=norm_to_one, clip_log_ratio=clip_log_ratio)
  numeric = np.zeros_like(STUDENT_LOGITS)
  for i in np.ndindex(STUDENT_LOGITS.shape):
    up, down = STUDENT_LOGITS.copy(), STUDENT_LOGITS.copy()
    up[i] += 1e-5
    down[i] -= 1e-5
    # the gate reads the student's log-prob without gradient: hold it at the unperturbed value
    numeric[i] = (_gated(up, **gate_fixed) - _gated(down, **gate_fixed)) / 2e-5
  np.testing.assert_allclose(grad, numeric, atol=2e-5)
  assert not grad[1, 2].any()  # the masked position

  # the masked position's values do not reach the loss
  changed = STUDENT_LOGITS.copy()
  changed[1, 2] = np.arange(7.0)
  assert _source(changed, norm_to_one, clip_log_ratio) == pytest.approx(want, rel=1e-9)
  assert float(_ours(jnp.asarray(changed, jnp.float32), norm_to_one, clip_log_ratio)[0]) == (
    pytest.approx(float(loss), rel=1e-6)
  )


@functools.partial(jax.jit, static_argnums=(1, 2))
def _grad(student_logits, norm_to_one, clip_log_ratio):
  return jax.grad(lambda z: _ours(z, norm_to_one, clip_log_ratio)[0])(student_logits)


def _gated(student_logits, norm_to_one, clip_log_ratio):
  """The source's loss with the gate held at the unperturbed student's (detached in both)."""
  gate_student = STUDENT_LOGITS
  idx = np.argsort(-TEACHER_LOGITS, axis=-1, kind="stable")[..., :3]
  take = lambda x: np.take_along_axis(x, idx, axis=-1)  # noqa: E731
  lse = lambda x: np.log(np.exp(x).sum(-1))  # noqa: E731
  pick = lambda x: np.take_along_axis(_log_softmax(x), SAMPLED[..., None], -1)[..., 0]  # noqa: E731
  return _source_topk_loss(
    take(student_logits),
    lse(student_logits),
    take(TEACHER_LOGITS),
    lse(TEACHER_LOGITS),
    MASK,
    pick(gate_student),
    pick(TEACHER_LOGITS),
    WEIGHT,
    norm_to_one=norm_to_one,
    clip_log_ratio=clip_log_ratio,
  )


def test_renormalising_changes_the_term_and_k_equal_to_v_is_the_forward_kl():
  ls = jax.nn.log_softmax(jnp.asarray(STUDENT_LOGITS, jnp.float32))
  lt = jax.nn.log_softmax(jnp.asarray(TEACHER_LOGITS, jnp.float32))
  renormalised = ucob.ucob_topk_term(ls, lt, top_k=3, norm_to_one=True)
  truncated = ucob.ucob_topk_term(ls, lt, top_k=3, norm_to_one=False)
  assert not np.allclose(renormalised, truncated)
  full = np.sum(np.exp(lt) * (lt - ls), -1)  # KL(pT ‖ pθ) over the whole vocabulary
  for norm in (True, False):
    np.testing.assert_allclose(
      ucob.ucob_topk_term(ls, lt, top_k=7, norm_to_one=norm), full, atol=1e-5
    )


# ----------------------------------------------------------------- the source's pairs, Python
def _source_pairs(records, margin, max_pairs):
  """The turn-granularity branch of `_build_cbsd_auxiliary_batch` (TU2021/UCOB@d38292c), every
  record having both views' prompts (mixed rollout): [(winner, target, target branch, gap)]."""
  grouped = {}
  for i, r in enumerate(records):
    if not r["valid"]:
      continue
    grouped.setdefault((r["uid"], r["anchor"]), []).append(i)
  out = []
  for members in grouped.values():
    winner = max(members, key=lambda i: records[i]["return"])
    branch = "none" if records[winner]["branch"] == "good" else "good"
    mean = float(np.mean([records[i]["return"] for i in members]))
    targets = [i for i in members if i is not winner] or [winner]
    scored = []
    for t in targets:
      base = records[t]["return"] if t is not winner else mean
      raw = float(records[winner]["return"] - base)
      if raw <= margin:
        continue
      scored.append((raw, t))
    scored.sort(key=lambda item: item[0], reverse=True)
    if max_pairs > 0:
      scored = scored[:max_pairs]
    out += [(winner, t, branch, gap) for gap, t in scored]
  return out


def _sample(group, obs, ret, skills, valid=True, **kw):
  return TurnSample(
    prompt_ids=[1, 2] if not skills else [1, 9, 2],
    response_ids=[5, 6],
    logprobs=[-0.1, -0.2],
    score=0.0,
    advantage=0.0,
    group_id=group,
    policy_version=0,
    valid=valid,
    teacher_prompt_ids=[1, 9, 2] if not skills else [1, 2],
    observation=obs,
    skills_in_prompt=skills,
    reward=ret,  # a one-turn episode each: its return is its reward
    episode=kw.pop("episode"),
    **kw,
  )


def test_pairs_equal_the_sources_at_the_margin():
  """A margin of 0.125 (exact in binary, so a gap can equal it). State (0, "S"): winner 1.0 (with
  skills) against 0.875 (gap exactly the margin: filtered), 0.75, 0.5, 0.0 (all above: the two
  largest kept), an invalid 0.99 (left out). State (0, "T"): one turn alone (its gap to its own
  mean is 0). State (1, "S"): tied winners, the first wins; its target just above the margin
  (gap 0.1251) is taught the view with the skills."""
  rows = [
    (0, "S", 0.75, False),
    (0, "S", 1.0, True),
    (0, "S", 0.875, False),
    (0, "S", 0.99, False, False),
    (0, "S", 0.5, True),
    (0, "S", 0.0, False),
    (0, "T", 3.0, False),
    (1, "S", 0.25, False),
    (1, "S", 0.25, True),
    (1, "S", 0.1249, True),
  ]
  samples = [
    _sample(r[0], r[1], r[2], r[3], valid=r[4] if len(r) > 4 else True, episode=e)
    for e, r in enumerate(rows)
  ]
  returns = ucob.discounted_returns(samples, 0.95)
  np.testing.assert_allclose(returns, [r[2] for r in rows])
  pairs, stats = ucob.ucob_pairs(samples, returns, margin=0.125, max_pairs=2)
  records = [
    dict(uid=s.group_id, anchor=s.observation, valid=s.valid, branch="good" if s.skills_in_prompt else "none", **{"return": r})
    for s, r in zip(samples, returns)
  ]  # fmt: skip
  want = _source_pairs(records, margin=0.125, max_pairs=2)
  got = [(p.winner, p.target, "good" if p.skills else "none", p.gap) for p in pairs]
  assert [g[:3] for g in got] == [w[:3] for w in want]
  np.testing.assert_allclose([g[3] for g in got], [w[3] for w in want])
  assert [g[:3] for g in got] == [(1, 5, "none"), (1, 4, "none"), (7, 9, "good")]
  assert stats["raw"] == 4 + 1 + 2 and stats["margin_filtered"] == 1 + 1 + 1
  # with every pair kept, 0.75's gap (0.25) joins
  every, _ = ucob.ucob_pairs(samples, returns, margin=0.125, max_pairs=0)
  assert [(p.winner, p.target) for p in every] == [(1, 5), (1, 4), (1, 0), (7, 9)]


def test_a_distillation_row():
  """The target's prompt in the taught view (its own, or its other view's), the winner's prompt
  as the teacher's, the winner's response; weight min(max(gap/τ, 0), 2), doubled on the action
  span's tokens (bytes by token id: "<action>", "go", " to", "</action>", "<|end|>" skipped)."""
  cfg = algos.UCOB()
  winner = _sample(0, "S", 1.0, True, episode=0)
  winner = dataclasses.replace(winner, response_ids=[1, 2, 3, 4, 5], logprobs=[0.0] * 5)
  target = _sample(0, "S", 0.0, False, episode=1)
  table = {1: b"<action>", 2: b"go", 3: b" to", 4: b"</action>", 5: b""}
  row = ucob.distillation_row([winner, target], ucob.Pair(0, 1, False, 0.3), cfg, table.get)
  assert row.prompt_ids == target.prompt_ids and row.teacher_prompt_ids == winner.prompt_ids
  assert row.response_ids == winner.response_ids and row.advantage == 0.0
  np.testing.assert_allclose(row.distill_weight, [1.5, 3.0, 3.0, 1.5, 1.5])
  # taught the view with the skills: the target's other view; a large gap is capped at 2
  row = ucob.distillation_row([winner, target], ucob.Pair(0, 1, True, 5.0), cfg, table.get)
  assert row.prompt_ids == target.teacher_prompt_ids and row.distill_weight[1] == 4.0
  assert ucob.action_spans(b"think<action>open it") == [(13, 20)]  # unclosed: to the end
  assert ucob.action_spans(b"search[red shoes] then click[b1]") == [(0, 17), (23, 32)]


def test_returns_discount_each_episode_and_rows_interleave():
  turns = [(0, 0, 0.0), (0, 1, 0.0), (0, 2, 10.0), (1, 0, 10.0)]  # (episode, turn, reward)
  samples = [_sample(7, "S", r, False, episode=e, turn=t) for e, t, r in turns]
  np.testing.assert_allclose(ucob.discounted_returns(samples, 0.5), [2.5, 5.0, 10.0, 10.0])
  rows, extra = list("abcdef"), ["X", "Y"]
  assert ucob.interleave(rows, extra) == list("abcXdefY")
  assert ucob.interleave([], extra) == extra and ucob.interleave(rows, []) == rows


# --------------------------------------------------------------------- the update's row split
def test_the_distillation_rows_leave_the_ppo_and_kl_terms(tiny_config, tiny_params):
  """On one batch: UCOB's PPO and KL terms equal GRPO's on the same batch with the distillation
  rows' masks zeroed (the same token counts), and its term is averaged over those rows' tokens."""
  from sdar_jax.core.loss import loss_and_grads
  from tests.helpers import make_turn_batch

  batch = make_turn_batch(tiny_params, B=8, seed=3)
  weight = np.zeros(batch.response_mask.shape, np.float32)
  weight[5:] = np.asarray(batch.response_mask[5:]) * 1.5
  paired = batch.replace(distill_weight=weight)
  plain = batch.replace(response_mask=np.where(weight > 0, 0.0, batch.response_mask))
  ucob_algo = dataclasses.replace(algos.get_preset("ucob"), entropy_coef=0.0)
  grpo = dataclasses.replace(algos.get_preset("grpo"), entropy_coef=0.0)
  ref = jax.tree.map(lambda x: x * 1.03, tiny_params)

  @jax.jit
  def both(paired, plain):
    _, m_ucob = loss_and_grads(
      tiny_config, ucob_algo, tiny_params, paired, ref_params=ref, teacher_params=tiny_params
    )
    _, m_grpo = loss_and_grads(tiny_config, grpo, tiny_params, plain, ref_params=ref)
    return m_ucob, m_grpo

  m_ucob, m_grpo = jax.device_get(both(paired, plain))
  for key in ("actor/pg_loss", "actor/kl_loss", "train/tokens"):
    assert float(m_ucob[key]) == pytest.approx(float(m_grpo[key]), rel=1e-6, abs=1e-7), key
  assert float(m_ucob["train/distill_tokens"]) == float(np.asarray(batch.response_mask)[5:].sum())
  assert float(m_ucob["ucob/weight_mean"]) == pytest.approx(1.5)
  assert float(m_ucob["ucob/loss"]) > 0
