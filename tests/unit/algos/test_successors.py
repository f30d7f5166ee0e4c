"""SDAR's successors as settings of the same update: AgentOPSD's (as published and our RMS form) and
GRSD's turn advantages against NumPy versions of their sources' rules (loops over groups, episodes
and turns, float64) on the issue's worked cases and on ragged mini-batches of uneven groups with
shuffled turns; RetireOPD's retirement rule on a scripted sequence of metrics and across a
resume."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from sdar_jax import algos
from sdar_jax.algos import AlgoConfig, Retirement, TurnTable, get_preset
from sdar_jax.core.batch import TurnSample
from sdar_jax.rollout.batching import episodes_to_samples, pack_batch, plan_minibatches
from sdar_jax.rollout.trajectory import Episode, Turn
from sdar_jax.rollout.turn_advantages import apply_turn_advantages


# ------------------------------------------------------------------------- NumPy references
def np_agent_opsd(adv, gap_sum, groups, episodes, turns, won, lam=0.5, band=0.2, eps=1e-6):
  """ZethWang/AgentOPSD@0c478b2, verl/trainer/ppo/opsd_utils.py: `compute_group_mean_v0` (V_0 the
  group's mean return over its episodes, clamped to [1e-4, 1 − 1e-4]; here the success rate) and
  `compute_opsd_turn_advantage` on its belief_mult + signed path (launcher
  examples/agentopsd_trainer/run_alfworld_3b.sh: mult_lambda 0.5; defaults mult_band 0.2,
  belief_gate, mult_signed, belief_decay_gamma 1, eps 1e-6)."""
  v0 = {}
  for g in np.unique(groups):
    outcome = {e: w for e, w, gg in zip(episodes, won, groups) if gg == g}  # one per episode
    v0[g] = min(max(float(np.mean(list(outcome.values()))), 1e-4), 1 - 1e-4)
  out = np.zeros(len(adv))
  for e in np.unique(episodes):
    idx = np.flatnonzero(episodes == e)
    idx = idx[np.argsort(turns[idx], kind="stable")]
    start = v0[groups[idx[0]]]
    logit = math.log(start / (1 - start)) + np.cumsum(gap_sum[idx])
    v = np.clip(1 / (1 + np.exp(-logit)), eps, 1 - eps)
    q = v - np.concatenate([[start], v[:-1]])
    std = q.std() if len(q) > 1 else 0.0  # population std; 0 for a one-turn episode
    z = (q - q.mean()) / (std + eps)
    m = np.clip(1 + band * np.sign(adv[idx]) * z, 1 - band, 1 + band)
    out[idx] = adv[idx] * ((1 - lam) + lam * m)
  return out


def np_agent_opsd_rms(adv, gap_sum, groups, episodes, turns, v0=0.5, eps=1e-4):
  """Ours (not a source's): |V_k − V_{k−1}| from a fixed V_0, signed by A, over the group's RMS."""
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
  out = np.zeros_like(raw)
  for g in np.unique(groups):
    idx = np.flatnonzero(groups == g)
    out[idx] = raw[idx] / (np.sqrt(np.mean(raw[idx] ** 2)) + 1e-6)
  return out


def np_grsd(adv, gap_mean, groups, won, lam=0.5, g_hat_max=0.2, floor=0.1, eps=1e-6):
  """BinbZheng1/GRSD@393213a, verl/trainer/ppo/grsd_utils.py `compute_grsd_turn_advantage` (eta 0;
  every launcher's G_HAT_MAX 0.2), with m_x from grsd_ray_trainer.py `_build_group_priors` (a
  group holding both a success and a failure)."""
  out = np.zeros(len(adv))
  for g in np.unique(groups):
    idx = np.flatnonzero(groups == g)
    m = float(won[idx].any() and not won[idx].all())
    q_exp = np.expm1(np.clip(np.sign(adv[idx]) * gap_mean[idx], -20, 20))
    mean_abs = (np.abs(q_exp) * m).sum() / max(m * len(idx), 1.0)  # over valid rows only
    g_hat = np.clip(q_exp / (mean_abs + eps) * m, -g_hat_max, g_hat_max)
    out[idx] = adv[idx] * np.maximum(1 + lam * g_hat * m, floor)
  return out


def _table(adv, gap_sum, tokens, groups, episodes, turns, won):
  return TurnTable(
    advantage=np.asarray(adv, np.float64),
    gap_sum=np.asarray(gap_sum, np.float64),
    gap_mean=np.asarray(gap_sum, np.float64) / np.asarray(tokens, np.float64),
    group=np.asarray(groups),
    episode=np.asarray(episodes),
    turn=np.asarray(turns),
    won=np.asarray(won, np.float64),
  )


# ------------------------------------------------------------------------ the worked cases
# (A, group, episode, turn, won, Σ gap, tokens) per turn-sample, with the advantages each source's
# rule gives (computed by hand from the rules above).
CASE_1 = (
  [0.577350, 0.577350, 0.577350, -1.154701, -1.154701, 0.577350],
  [0, 0, 0, 0, 0, 0],
  [0, 0, 0, 1, 1, 2],
  [0, 1, 2, 0, 1, 0],
  [1, 1, 1, 0, 0, 1],
  [-0.5, 0.2, 1.0, -1.0, -0.3, 0.4],
  [5, 4, 10, 8, 3, 6],
)
CASE_1_AGENT_OPSD = [0.519615, 0.579144, 0.635085, -1.270170, -1.039232, 0.577350]
CASE_1_GRSD = [0.519615, 0.635085, 0.635085, -1.270171, -1.270171, 0.635085]
CASE_2 = (
  [0, 0, 0, 0.707107, 0.707107, -0.707107, -0.707107, -0.707107],
  [0, 0, 0, 1, 1, 1, 1, 1],
  [0, 0, 1, 2, 2, 3, 3, 3],
  [1, 0, 0, 1, 0, 2, 0, 1],
  [0, 0, 0, 1, 1, 0, 0, 0],
  [0.3, -0.2, 0.1, 2.0, -1.5, -0.4, 0.9, -2.2],
  [3, 3, 4, 6, 5, 2, 7, 4],
)
CASE_2_AGENT_OPSD = [0, 0, 0, 0.777818, 0.636396, -0.693653, -0.636396, -0.777818]
CASE_2_GRSD = [0, 0, 0, 0.777818, 0.636396, -0.777818, -0.636396, -0.777818]


@pytest.mark.parametrize(
  "case, agent_opsd, grsd",
  [(CASE_1, CASE_1_AGENT_OPSD, CASE_1_GRSD), (CASE_2, CASE_2_AGENT_OPSD, CASE_2_GRSD)],
)
def test_worked_cases(case, agent_opsd, grsd):
  adv, groups, episodes, turns, won, gap_sum, tokens = map(np.asarray, case)
  table = _table(adv, gap_sum, tokens, groups, episodes, turns, won)
  np.testing.assert_allclose(algos.agent_opsd_advantages(table), agent_opsd, rtol=0, atol=1e-5)
  np.testing.assert_allclose(algos.grsd_advantages(table), grsd, rtol=0, atol=1e-5)
  # the NumPy versions of the sources' rules give the same figures
  want = np_agent_opsd(adv, gap_sum, groups, episodes, turns, won)
  np.testing.assert_allclose(want, agent_opsd, rtol=0, atol=1e-5)
  np.testing.assert_allclose(np_grsd(adv, gap_sum / tokens, groups, won), grsd, rtol=0, atol=1e-5)


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
  log-probs (by id), in shuffled order (an episode's turns out of order)."""
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
  return [samples[i] for i in rng.permutation(len(samples))], teacher


def _batches(samples, teacher, size, order):
  out = []
  for mb in plan_minibatches(samples, size, order=order):
    b = pack_batch(mb, size, True)
    lt = np.full(b.old_logp.shape, 55.0, np.float32)  # padding slots: must be masked out
    for i, s in enumerate(mb):
      lt[i, : len(s.response_ids)] = teacher[id(s)]
    out.append((mb, b.replace(teacher_logp=lt)))
  return out


@pytest.mark.parametrize("advantage", ["agent_opsd", "agent_opsd_rms", "grsd"])
@pytest.mark.parametrize("order", ["rollout", "length"])
def test_turn_advantages_equal_numpy_on_ragged_batches_and_uneven_groups(advantage, order):
  rng = np.random.default_rng(3)
  samples, teacher = _samples(rng)
  algo = get_preset(advantage)
  packed = _batches(samples, teacher, 4, order)  # 14 samples: 4 + 4 + 4 + 2 (two padding rows)
  batches, metrics = apply_turn_advantages(
    algos.turn_rewrite(algo), [b for _, b in packed], samples, True, order
  )

  adv = np.asarray([s.advantage for s in samples])
  groups = np.asarray([s.group_id for s in samples])
  episodes = np.asarray([s.episode for s in samples])
  turns = np.asarray([s.turn for s in samples])
  won = np.asarray([s.won for s in samples], np.float64)
  gaps = [teacher[id(s)] - np.asarray(s.logprobs) for s in samples]
  gap_sum = np.asarray([g.sum() for g in gaps])
  if advantage == "agent_opsd":
    want = np_agent_opsd(adv, gap_sum, groups, episodes, turns, won)
  elif advantage == "agent_opsd_rms":
    want = np_agent_opsd_rms(adv, gap_sum, groups, episodes, turns)
  else:
    want = np_grsd(adv, np.asarray([g.mean() for g in gaps]), groups, won)
  got = {}
  for (mb, _), b in zip(packed, batches):
    a = np.asarray(b.advantages)
    assert a.shape == (4,) and np.all(a[len(mb) :] == 0.0)  # padding rows stay 0
    got.update({id(s): a[i] for i, s in enumerate(mb)})
  got = np.asarray([got[id(s)] for s in samples])
  # values are O(1): A times a factor in [0.9, 1.1] (AgentOPSD, GRSD), or RMS-scaled (ours)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
  tied = np.isin(groups, [11, 12])  # the groups without both outcomes
  if advantage == "agent_opsd_rms":  # A = 0 gives 0, and every turn keeps GRPO's sign
    assert np.all(got[tied & (adv == 0)] == 0.0)
  else:  # the published rules scale A within [1 − λb, 1 + λb] = [0.9, 1.1], A = 0 stays 0
    assert np.all(np.abs(got) <= 1.1 * np.abs(adv) + 1e-6)
    assert np.all(np.abs(got) >= 0.9 * np.abs(adv) - 1e-6)
  if advantage == "grsd":  # GRSD leaves groups without both outcomes, and a lone episode, alone
    np.testing.assert_allclose(got[tied], adv[tied], rtol=1e-6)
    assert got[groups == 13] == pytest.approx(adv[groups == 13])
  if advantage == "agent_opsd":  # a one-turn episode (z = 0) keeps A exactly
    lone = np.flatnonzero(groups == 13)
    np.testing.assert_allclose(got[lone], adv[lone], rtol=1e-6)
  assert np.all(np.sign(got) * np.sign(adv) >= 0)
  assert metrics["turn_adv/abs_mean"] == pytest.approx(np.abs(want).mean(), rel=1e-5)
  assert metrics["turn_adv/sign_flips"] == 0.0


def test_agent_opsd_rms_by_hand():
  """V_0 = 0.5. Episode 0 (won, group 0): δ = (ln 3, −ln 3) moves V to 0.75, then back to 0.5:
  raw 0.25 and 0.25. Episode 1 (lost, group 0, one turn): δ = ln 3, raw −0.25. The group's RMS is
  0.25, so the advantages are (1, 1, −1). Episode 2 (won, alone in group 1): δ = 0, so 0."""
  ln3 = math.log(3.0)
  table = _table(
    [0.7, 0.7, -1.4, 2.0], [ln3, -ln3, ln3, 0.0], [1] * 4, [0, 0, 0, 1], [0, 0, 1, 2],
    [1, 2, 0, 0], [1, 1, 0, 1],
  )  # fmt: skip
  out = algos.agent_opsd_rms_advantages(table)
  np.testing.assert_allclose(np.asarray(out), [1.0, 1.0, -1.0, 0.0], rtol=1e-5, atol=1e-6)


def test_grsd_by_hand():
  """A mixed group of two turns with q = ±ln 2: expm1 gives 1 and −0.5, their mean |.| 0.75, so
  q̃ = 4/3 and −2/3 (over 0.75 + 1e-6). The launchers' clip 0.2 makes the factors 1 ± 0.5·0.2 =
  1.1 and 0.9; the function's default clip 3 would give 1 + 0.5·q̃ = 5/3 and 2/3."""
  ln2 = math.log(2.0)
  table = _table([1.0, -1.0], [ln2, ln2], [1, 1], [0, 0], [0, 1], [0, 0], [1, 0])
  np.testing.assert_allclose(np.asarray(algos.grsd_advantages(table)), [1.1, -0.9], rtol=1e-6)
  wide = np.asarray(algos.grsd_advantages(table, clip=3.0))
  np.testing.assert_allclose(wide, [5.0 / 3.0, -2.0 / 3.0], rtol=3e-6)


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
  for name in ("agent_opsd", "agent_opsd_rms", "grsd"):
    preset = get_preset(name)
    assert preset.scores_teacher and preset.turn_advantages
    with pytest.raises(ValueError, match="algo.teacher_source='update'.*teacher_source=rollout"):
      dataclasses.replace(preset, teacher_source="update")
  with pytest.raises(ValueError, match="algo.agent_opsd.v0=1.0"):
    dataclasses.replace(get_preset("agent_opsd_rms"), agent_opsd={"v0": 1.0})
  with pytest.raises(ValueError, match=r"algo.agent_opsd.lam=1.5: .*Fix: use AgentOPSD's 0.5"):
    dataclasses.replace(get_preset("agent_opsd"), agent_opsd={"lam": 1.5})
  with pytest.raises(ValueError, match=r"algo.agent_opsd.band=1.0: .*\[0, 1\)"):
    dataclasses.replace(get_preset("agent_opsd"), agent_opsd={"band": 1.0})
  with pytest.raises(ValueError, match="algo.retire.window=5: RetireOPD retires"):
    AlgoConfig(retire={"window": 5})
  retired = get_preset("retire_opd").retired()
  assert not retired.scores_teacher and retired.lam == 0.0 and not retired.retires


# ------------------------------------------------------------------------------ RetireOPD
# The sliding windows (algo.retire.windows="sliding", this repository's rule until 2026-12-07):
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


def _rule(windows="sliding"):
  rule = Retirement(window=2, progress_at_most=0.0, competence_at_least=0.9, windows=windows)
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


@pytest.mark.parametrize("stop", range(len(SCRIPT) + 1))
def test_retirement_across_a_resume(stop):
  """A rule rebuilt from its checkpointed state (JSON, as the loop state is saved) after any
  iteration retires at the same iteration as one that never stopped."""
  steps = list(enumerate(SCRIPT, start=1))
  first = _play(_rule(), steps[:stop])
  saved = json.loads(json.dumps(first.state_dict()))
  resumed = Retirement(window=2, progress_at_most=0.0, competence_at_least=0.9, windows="sliding")
  resumed.load_state_dict(saved)
  assert _play(resumed, steps[stop:]).retired_at == 8


# The paper's fixed, non-overlapping windows (the default): W = 2, so K is the mean of iterations
# 1-2, 3-4, 5-6, and progress compares the last two complete windows. Teacher 0.5, a validation
# after every iteration. RETIRES: K = 0.8, 0.55, 0.6: the window 5-6 no longer falls, and
# (0.45 + 0.45) / (2 x 0.5) = 0.9 is competent: retired at 6 (not at 5: windows 1-2 and 3-4 are
# still the last complete ones, and they fell). KEEPS: K = 0.8, 0.55, 0.45 falls at every
# window, so it never retires, although the sliding windows see K_{2-3} = K_{4-5} = 0.6 at t = 5.
RETIRES = [(1.0, 0.2), (0.6, 0.2), (0.6, 0.2), (0.5, 0.2), (0.5, 0.45), (0.7, 0.45)]
KEEPS = [(1.0, 0.5), (0.6, 0.5), (0.6, 0.5), (0.5, 0.5), (0.7, 0.5), (0.2, 0.5)]


def _fixed_play(rule, steps):
  seen = []
  for t, (kl, sr) in steps:
    if not rule.retired:
      rule.record_kl(kl, t)
    rule.record_success(sr)
    seen.append((t, rule.progress(), rule.competence(), rule.check(t)))
  return seen


def test_retirement_on_the_papers_windows():
  rule = _rule("fixed")
  seen = _fixed_play(rule, enumerate(RETIRES, start=1))
  assert [t for t, *_, now in seen if now] == [6] and rule.retired_at == 6
  assert seen[2][1] is None  # one window complete: no progress yet
  assert seen[3][1] == pytest.approx((0.8 - 0.55) / 0.8)
  assert seen[4][1] == seen[3][1] and seen[4][2] == pytest.approx(0.65)  # mid-window: unchanged
  assert seen[5][1] == pytest.approx((0.55 - 0.6) / 0.55) and seen[5][2] == pytest.approx(0.9)
  assert rule.metrics()["retire/kl"] == pytest.approx(0.6)

  kept = _rule("fixed")
  seen = _fixed_play(kept, enumerate(KEEPS, start=1))
  assert not kept.retired and all(p is None or p > 0 for _, p, _, _ in seen)
  sliding = _rule("sliding")
  for t, (kl, sr) in enumerate(KEEPS, start=1):
    sliding.record_kl(kl)
    sliding.record_success(sr)
    sliding.check(t)
  assert sliding.retired_at == 5  # the sliding rule would have retired it


@pytest.mark.parametrize("stop", range(len(RETIRES) + 1))
def test_the_papers_windows_across_a_resume(stop):
  steps = list(enumerate(RETIRES, start=1))
  first = _rule("fixed")
  _fixed_play(first, steps[:stop])
  resumed = _rule("fixed")
  resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
  _fixed_play(resumed, steps[stop:])
  assert resumed.retired_at == 6


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
  from sdar_jax.run.setup import method_problems

  config = alfworld.get_config("model=tiny,algo=retire_opd,local=True")
  # the teacher's with-skills evaluation is played at the start whatever eval.skills says
  assert config.eval.skills == "without" and method_problems(config) == []
  bad = common.override(config, {"train.eval_before_train": False, "train.eval_every": 0})
  problems = method_problems(bad)
  assert [p.split("=")[0] for p in problems] == ["train.eval_before_train", "train.eval_every"]
  assert all("algo.retire.window=5" in p and "Fix: set --config." in p for p in problems)
  assert method_problems(alfworld.get_config("model=tiny,algo=sdar,local=True")) == []


def test_retirement_hooks_skip_a_validation_whose_episodes_were_all_lost(caplog):
  """A validation whose every episode failed (its env workers gone) logs no success rate: the
  rule skips it instead of counting a success of 0, so the competence after it is the same as
  if it had not been played."""
  import types

  from sdar_jax.algos.retirement import RetirementHooks

  hooks = RetirementHooks(get_preset("retire_opd"))
  view = types.SimpleNamespace(iteration=0)
  start = {"val/success_rate": 0.25, "val_with_skill/success_rate": 0.5}
  assert hooks.at_evaluation(view, start, True) == {"retire/teacher_success": 0.5}
  hooks.at_evaluation(types.SimpleNamespace(iteration=4), {"val/success_rate": 0.5}, False)
  assert hooks.rule.competence() == pytest.approx((0.5 + 0.25) / (2 * 0.5))
  lost = {"val/env_failures": 64.0}
  assert hooks.at_evaluation(types.SimpleNamespace(iteration=8), lost, False) is None
  assert hooks.rule.competence() == pytest.approx(0.75)  # unchanged: no 0 recorded
  assert "after iteration 8 has no success rate" in caplog.text
