"""SDAR's successors as settings of the same update: AgentOPSD's and GRSD's turn advantages against
NumPy reimplementations (loops over groups, episodes and turns, float64) on ragged mini-batches and
uneven groups, and RetireOPD's retirement rule on a scripted sequence of metrics and across a
resume."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from sdar_jax import algos
from sdar_jax.algos import AlgoConfig, Retirement, get_preset
from sdar_jax.core.batch import TurnSample
from sdar_jax.rollout.batching import episodes_to_samples, pack_batch, plan_minibatches
from sdar_jax.rollout.trajectory import Episode, Turn
from sdar_jax.rollout.turn_advantages import apply_turn_advantages


# ------------------------------------------------------------------------- NumPy references
def _rms_normalise(x, groups, eps=1e-6):
  out = np.zeros_like(x)
  for g in np.unique(groups):
    idx = np.flatnonzero(groups == g)
    out[idx] = x[idx] / (np.sqrt(np.mean(x[idx] ** 2)) + eps)
  return out


def np_agent_opsd(adv, gap_sum, groups, episodes, turns, v0=0.5, eps=1e-4):
  raw = np.zeros(len(adv))
  for e in np.unique(episodes):
    idx = np.flatnonzero(episodes == e)
    idx = idx[np.argsort(turns[idx])]
    logit = math.log(v0 / (1 - v0))
    before = min(max(v0, eps), 1 - eps)
    for i in idx:
      logit += gap_sum[i]
      now = min(max(1.0 / (1.0 + math.exp(-logit)), eps), 1 - eps)
      raw[i] = np.sign(adv[i]) * abs(now - before)
      before = now
  return _rms_normalise(raw, groups)


def np_grsd(adv, gap_mean, groups, won, scale=0.5, clip=3.0, floor=0.1):
  out = np.zeros(len(adv))
  for g in np.unique(groups):
    idx = np.flatnonzero(groups == g)
    e = np.expm1(np.clip(np.sign(adv[idx]) * gap_mean[idx], -20, 20))
    d = np.abs(e).mean()
    q = e / d if d > 0 else np.zeros_like(e)
    mixed = float(won[idx].any() and not won[idx].all())
    out[idx] = adv[idx] * np.maximum(1 + scale * np.clip(q, -clip, clip) * mixed, floor)
  return out


# ---------------------------------------------------------------------------- the batch
# (group, won, turns): a mixed group whose episodes have 3, 1 and 2 turns, a group of all wins,
# a group of all losses, and a one-turn episode alone in its group.
EPISODES = [
  (10, True, 3),
  (10, False, 1),
  (10, False, 2),
  (11, True, 2),
  (11, True, 1),
  (12, False, 2),
  (12, False, 2),
  (13, True, 1),
]


def _samples(rng) -> tuple[list[TurnSample], dict[int, np.ndarray]]:
  """Turn-samples of EPISODES with ragged responses (1..9 tokens), GRPO-like advantages (the
  all-wins and all-losses groups: 0 but for one invalid turn each), and each sample's teacher
  log-probs (by id)."""
  samples, teacher = [], {}
  for e, (group, won, turns) in enumerate(EPISODES):
    for k in range(turns):
      n = int(rng.integers(1, 10))
      prompt = list(rng.integers(3, 50, size=int(rng.integers(2, 20))))
      if group in (11, 12):
        adv = -0.3 if k == 1 else 0.0  # an invalid turn's penalty in an otherwise tied group
      else:
        adv = 0.9 if won else -0.6
      s = TurnSample(
        prompt_ids=prompt,
        response_ids=list(rng.integers(3, 50, size=n)),
        logprobs=list(-rng.uniform(0.0, 3.0, size=n)),
        score=float(won),
        advantage=adv,
        group_id=group,
        policy_version=0,
        valid=True,
        teacher_prompt_ids=[7] * int(rng.integers(1, 8)) + prompt,
        episode=e,
        turn=k,
        won=won,
      )
      samples.append(s)
      teacher[id(s)] = np.asarray(s.logprobs) + rng.normal(0.0, 1.5, size=n)
  teacher[id(samples[0])][0] += 40.0  # a gap large enough to reach AgentOPSD's clamp of V
  return samples, teacher


def _batches(samples, teacher, size, order):
  out = []
  for mb in plan_minibatches(samples, size, order=order):
    b = pack_batch(mb, size, True)
    lt = np.full(b.old_logp.shape, 55.0, np.float32)  # padding slots: must be masked out
    for i, s in enumerate(mb):
      lt[i, : len(s.response_ids)] = teacher[id(s)]
    out.append((mb, b.replace(teacher_logp=lt)))
  return out


@pytest.mark.parametrize("advantage", ["agent_opsd", "grsd"])
@pytest.mark.parametrize("order", ["rollout", "length"])
def test_turn_advantages_equal_numpy_on_ragged_batches_and_uneven_groups(advantage, order):
  rng = np.random.default_rng(3)
  samples, teacher = _samples(rng)
  algo = get_preset(advantage)
  packed = _batches(samples, teacher, 4, order)  # 14 samples: 4 + 4 + 4 + 2 (two padding rows)
  batches, metrics = apply_turn_advantages(algo, [b for _, b in packed], samples, True, order)

  adv = np.asarray([s.advantage for s in samples])
  groups = np.asarray([s.group_id for s in samples])
  gaps = [teacher[id(s)] - np.asarray(s.logprobs) for s in samples]
  if advantage == "agent_opsd":
    want = np_agent_opsd(
      adv,
      np.asarray([g.sum() for g in gaps]),
      groups,
      np.asarray([s.episode for s in samples]),
      np.asarray([s.turn for s in samples]),
    )
  else:
    want = np_grsd(
      adv, np.asarray([g.mean() for g in gaps]), groups, np.asarray([s.won for s in samples])
    )
  got = {}
  for (mb, _), b in zip(packed, batches):
    a = np.asarray(b.advantages)
    assert a.shape == (4,) and np.all(a[len(mb) :] == 0.0)  # padding rows stay 0
    got.update({id(s): a[i] for i, s in enumerate(mb)})
  got = np.asarray([got[id(s)] for s in samples])
  # values are O(1) (AgentOPSD: within-group z-scores; GRSD: A times a factor <= 2.5)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
  # the groups without both outcomes: AgentOPSD gives 0 where A = 0, GRSD keeps A as it was
  tied = np.isin(groups, [11, 12])
  if advantage == "grsd":
    np.testing.assert_allclose(got[tied], adv[tied], rtol=1e-6)
    assert got[groups == 13] == pytest.approx(adv[groups == 13])  # a lone episode is not mixed
  else:  # A = 0 gives 0, and every turn keeps GRPO's sign
    assert np.all(got[tied & (adv == 0)] == 0.0)
    assert np.all(np.sign(got) * np.sign(adv) >= 0)
  assert metrics["turn_adv/abs_mean"] == pytest.approx(np.abs(want).mean(), rel=1e-5)
  assert 0.0 <= metrics["turn_adv/sign_flips"] <= 1.0


def test_agent_opsd_by_hand():
  """V_0 = 0.5. Episode 0 (won, group 0): δ = (ln 3, −ln 3) moves V to 0.75, then back to 0.5:
  raw 0.25 and 0.25. Episode 1 (lost, group 0, one turn): δ = ln 3, raw −0.25. The group's RMS is
  0.25, so the advantages are (1, 1, −1). Episode 2 (won, alone in group 1): δ = 0, so 0."""
  out = algos.agent_opsd_advantages(
    np.asarray([0.7, 0.7, -1.4, 2.0]),
    np.asarray([math.log(3.0), -math.log(3.0), math.log(3.0), 0.0]),
    np.asarray([0, 0, 0, 1]),
    np.asarray([0, 0, 1, 2]),
    np.asarray([1, 2, 0, 0]),
  )
  np.testing.assert_allclose(np.asarray(out), [1.0, 1.0, -1.0, 0.0], rtol=1e-5, atol=1e-6)


def test_grsd_by_hand():
  """A mixed group of two turns with q = ±ln 2: expm1 gives 1 and −0.5, their mean |.| 0.75, so
  q̃ = 4/3 and −2/3; factors 1 + 0.5·q̃ = 5/3 and 2/3."""
  out = algos.grsd_advantages(
    np.asarray([1.0, -1.0]),
    np.asarray([math.log(2.0), math.log(2.0)]),  # the lost turn's q is −ln 2
    np.asarray([0, 0]),
    np.asarray([1.0, 0.0]),
  )
  np.testing.assert_allclose(np.asarray(out), [5.0 / 3.0, -2.0 / 3.0], rtol=1e-6)


def test_episodes_to_samples_records_episode_turn_and_outcome():
  def turn(n):
    return Turn([1, 2], [3] * n, [-0.1] * n, "go", True, 0)

  won = Episode(0, 0, 5, turns=[turn(2), turn(0), turn(1)], reward=1.0, won=True)
  lost = Episode(1, 0, 5, turns=[turn(1)], reward=0.0)
  samples = episodes_to_samples([won, lost])
  # the empty response (turn 1) is no sample; turns keep their index in the episode
  assert [(s.episode, s.turn, s.won) for s in samples] == [
    (0, 0, True),
    (0, 2, True),
    (1, 0, False),
  ]


def test_turn_estimators_need_the_teacher_at_theta_old():
  for name in ("agent_opsd", "grsd"):
    preset = get_preset(name)
    assert preset.scores_teacher and preset.turn_advantages
    with pytest.raises(ValueError, match="algo.teacher_source='step'.*teacher_source=rollout"):
      dataclasses.replace(preset, teacher_source="step")
  with pytest.raises(ValueError, match="algo.agent_opsd_v0=1.0"):
    dataclasses.replace(get_preset("agent_opsd"), agent_opsd_v0=1.0)
  with pytest.raises(ValueError, match="algo.retire_window=5: RetireOPD retires"):
    AlgoConfig(retire_window=5)
  retired = get_preset("retire_opd").retired()
  assert not retired.scores_teacher and retired.lam == 0.0 and not retired.retires


# ------------------------------------------------------------------------------ RetireOPD
# (reverse KL of the iteration, validation success rate) for iterations 1..9; W = 2, teacher 0.5.
# K_{t−2} vs K_t: progress > 0 until t = 7; competence (SR_t + SR_{t−1}) / 1.0 is >= 0.9 at t = 5
# and 6 (while progress is still positive), below it at t = 7, and 1.0 at t = 8: retired at 8.
SCRIPT = [
  (1.0, 0.1),
  (0.8, 0.2),
  (0.6, 0.3),
  (0.5, 0.5),
  (0.45, 0.6),
  (0.5, 0.3),
  (0.55, 0.4),
  (0.6, 0.6),
  (0.2, 0.9),
]


def _rule():
  rule = Retirement(window=2, progress_at_most=0.0, competence_at_least=0.9)
  rule.teacher_success = 0.5
  return rule


def _play(rule, steps, retired_at=None):
  for t, (kl, sr) in steps:
    if not rule.retired:
      rule.record_kl(kl)
    rule.record_success(sr)
    rule.check(t)
  return rule


def test_retirement_on_a_scripted_sequence():
  rule = _rule()
  seen = []
  for t, (kl, sr) in enumerate(SCRIPT, start=1):
    if not rule.retired:
      rule.record_kl(kl)
    rule.record_success(sr)
    seen.append((t, rule.progress(), rule.competence(), rule.check(t)))
  assert [t for t, *_, now in seen if now] == [8] and rule.retired_at == 8
  assert seen[2][1] is None  # before 2W = 4 iterations there is no progress
  t4 = seen[3]
  assert t4[1] == pytest.approx((0.9 - 0.55) / 0.9) and t4[2] == pytest.approx(0.8)
  assert seen[4][2] >= 0.9 and seen[4][1] > 0  # competent but still progressing: kept
  assert seen[6][1] < 0 and seen[6][2] < 0.9  # no progress but not yet competent: kept
  m = rule.metrics()
  assert m["retire/active"] == 0.0 and m["retire/retired_at"] == 8.0


@pytest.mark.parametrize("stop", range(0, len(SCRIPT) + 1))
def test_retirement_across_a_resume(stop):
  """A rule rebuilt from its checkpointed state (JSON, as the loop state is saved) after any
  iteration retires at the same iteration as one that never stopped."""
  steps = list(enumerate(SCRIPT, start=1))
  first = _play(_rule(), steps[:stop])
  saved = json.loads(json.dumps(first.state_dict()))
  resumed = Retirement(window=2, progress_at_most=0.0, competence_at_least=0.9)
  resumed.load_state_dict(saved)
  assert _play(resumed, steps[stop:]).retired_at == 8


def test_retirement_edge_cases():
  rule = Retirement(window=1)
  rule.teacher_success = 0.0  # a teacher that never succeeds: any student success is competent
  rule.record_success(0.0)
  rule.record_success(0.1)
  rule.record_kl(0.0)
  rule.record_kl(0.5)
  assert rule.progress() is None  # K_{t−W} = 0: undefined, never retires on it
  rule.record_kl(0.5)
  assert rule.progress() == 0.0 and rule.competence() > 1e6 and rule.check(3)
  with pytest.raises(ValueError, match="window"):
    Retirement(window=0)


def test_retire_opd_refuses_a_run_that_cannot_measure_the_teacher():
  from configs import alfworld, common
  from sdar_jax.run.setup import retirement_problems

  config = alfworld.get_config("model=tiny,algo=retire_opd,local=True")
  # the teacher's with-skills evaluation is played at the start whatever eval.skills says
  assert config.eval.skills == "without" and retirement_problems(config) == []
  bad = common.override(config, {"train.eval_before_train": False, "train.eval_every": 0})
  problems = retirement_problems(bad)
  assert [p.split("=")[0] for p in problems] == ["train.eval_before_train", "train.eval_every"]
  assert all("algo.retire_window=5" in p and "Fix: set --config." in p for p in problems)
  assert retirement_problems(alfworld.get_config("model=tiny,algo=sdar,local=True")) == []
