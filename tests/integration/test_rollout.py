"""Host side of an iteration: scoring turn-samples, packing batches, the replay queue, and the
invariant that ties the sampler to the update (importance ratio exactly 1 at staleness 0)."""

import dataclasses
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from sdar_jax.core.batch import TurnSample, batch_bucket, new_tokens_bucket, prompt_bucket
from sdar_jax.core.sampling import Sampler, SamplingParams
from sdar_jax.core.train_state import make_optimizer
from sdar_jax.core.train_step import TrainStep
from sdar_jax.models import init_params
from sdar_jax.rollout import ReplayQueue, episodes_to_samples, pack_batch, plan_minibatches
from sdar_jax.rollout.trajectory import Episode, Turn
from sdar_jax.text.chat_templates import ChatTemplate
from tests import hf_fixtures
from tests.helpers import QWEN_VOCAB_DECODER, sample_and_pack


def _turn(n_resp=3, valid=True, version=0, prompt=(5, 6, 7)):
  return Turn(
    prompt_ids=list(prompt),
    response_ids=list(range(1, n_resp + 1)),
    logprobs=[-1.0] * n_resp,
    action="look",
    valid=valid,
    policy_version=version,
    teacher_prompt_ids=[9, 9] + list(prompt),
  )


def test_episode_scores_and_grpo_advantages_by_hand():
  # Group 0: a won episode (2 turns, one invalid) and a lost one (1 turn); group 1: one lost
  # episode alone; a failed env is left out.
  eps = [
    Episode(0, task_id=3, group_id=0, reward=10.0, won=True, turns=[_turn(), _turn(valid=False)]),
    Episode(1, task_id=3, group_id=0, reward=0.0, turns=[_turn()]),
    Episode(2, task_id=4, group_id=1, reward=0.0, turns=[_turn(valid=False)]),
    Episode(3, task_id=4, group_id=1, reward=10.0, turns=[_turn()], env_error="crashed"),
  ]
  samples = episodes_to_samples(eps, invalid_penalty=0.1)
  scores = [s.score for s in samples]
  np.testing.assert_allclose(scores, [10.0, 9.9, 0.0, -0.1], atol=1e-6)
  g0 = np.array([10.0, 9.9, 0.0])
  expected = (g0 - g0.mean()) / (g0.std(ddof=1) + 1e-6)
  np.testing.assert_allclose([s.advantage for s in samples[:3]], expected, rtol=1e-5)
  # Group 1 keeps one sample once the failed env is dropped: mean 0, std 1 (docs/reference.md §2.1).
  assert samples[3].advantage == pytest.approx(-0.1 / (1 + 1e-6), rel=1e-6)


def test_inadmissible_actions_lose_their_own_penalty_once():
  """A well-formed action the env did not list loses inadmissible_penalty; a format-invalid turn
  loses only the format penalty, an unchecked turn (admissible None) nothing; off by default."""

  def turn(valid=True, admissible=None):
    t = _turn(valid=valid)
    t.admissible = admissible
    return t

  turns = [turn(admissible=True), turn(admissible=False), turn(False, False), turn()]
  eps = [Episode(0, task_id=0, group_id=0, reward=10.0, won=True, turns=turns)]
  scores = [s.score for s in episodes_to_samples(eps, invalid_penalty=0.1, inadmissible_penalty=1)]
  np.testing.assert_allclose(scores, [10.0, 9.0, 9.9, 10.0], atol=1e-6)
  default = [s.score for s in episodes_to_samples(eps, invalid_penalty=0.1)]
  np.testing.assert_allclose(default, [10.0, 10.0, 9.9, 10.0], atol=1e-6)
  assert eps[0].admissible_turns == (1, 3)


def test_unlisted_actions_keep_blame_but_get_no_credit():
  """inadmissible_no_credit: a well-formed action the env did not list has its advantage capped
  at 0 (won episode: 0 instead of positive; lost episode: the negative advantage stays); every
  other turn, and every score, is as without it."""

  def turn(valid=True, admissible=True):
    t = _turn(valid=valid)
    t.admissible = admissible
    return t

  won = [turn(), turn(admissible=False), turn(False, False)]
  lost = [turn(), turn(admissible=False)]
  eps = [
    Episode(0, task_id=0, group_id=0, reward=10.0, won=True, turns=won),
    Episode(1, task_id=0, group_id=0, reward=0.0, turns=lost),
  ]
  plain = episodes_to_samples(eps, invalid_penalty=0.1)
  capped = episodes_to_samples(eps, invalid_penalty=0.1, inadmissible_no_credit=True)
  scores = np.array([10.0, 10.0, 9.9, 0.0, 0.0])
  advantages = (scores - scores.mean()) / (scores.std(ddof=1) + 1e-6)
  np.testing.assert_allclose([s.advantage for s in plain], advantages, rtol=1e-5)
  advantages[1] = 0.0  # the won episode's unlisted, well-formed turn
  np.testing.assert_allclose([s.advantage for s in capped], advantages, rtol=1e-5, atol=1e-7)
  assert capped[4].advantage < 0  # the lost episode's unlisted turn keeps its blame
  assert [s.score for s in capped] == [s.score for s in plain]


def test_step_level_advantage_by_hand():
  """step_adv_coef: each turn adds w x (its discounted return - the mean return of its group's
  turns from the same state). Worked with γ = 0.5, w = 1, a win worth 10 on the last turn:
  A: S -> X -> Y, wins on its 3rd turn: returns 2.5, 5, 10
  B: S (format-invalid, -0.3) -> Y, wins on its 2nd: returns -0.3 + 0.5 x 10 = 4.7, 10
  C: S -> X, lost: returns 0, 0
  D: S, another group, wins at once: 10 (alone in its group's state S).
  State S (group 0): mean (2.5 + 4.7 + 0) / 3 = 2.4 -> A +0.1, B +2.3, C -2.4; state X: mean 2.5
  -> A +2.5, C -2.5; state Y: both 10 -> 0; D: 0."""

  def turn(obs, reward=0.0, valid=True, prompt=None):
    t = _turn(valid=valid, prompt=prompt or (ord(obs),))
    t.observation, t.reward = obs, reward
    return t

  eps = [
    Episode(0, 0, 0, reward=10.0, won=True, turns=[turn("S"), turn("X"), turn("Y", 10.0)]),
    Episode(1, 0, 0, reward=10.0, won=True, turns=[turn("S", valid=False), turn("Y", 10.0)]),
    Episode(2, 0, 0, reward=0.0, turns=[turn("S"), turn("X", prompt=(8,))]),
    Episode(3, 1, 1, reward=10.0, won=True, turns=[turn("S", 10.0)]),
  ]
  kw = dict(invalid_penalty=0.3, step_gamma=0.5, norm_adv_by_std=False)
  plain = np.array([s.advantage for s in episodes_to_samples(eps, **kw)])
  stepped = np.array([s.advantage for s in episodes_to_samples(eps, step_adv_coef=1.0, **kw)])
  by_hand = [0.1, 2.5, 0.0, 2.3, 0.0, -2.4, -2.5, 0.0]
  np.testing.assert_allclose(stepped - plain, by_hand, atol=1e-5)
  half = np.array([s.advantage for s in episodes_to_samples(eps, step_adv_coef=0.5, **kw)])
  np.testing.assert_allclose(half - plain, np.multiply(by_hand, 0.5), atol=1e-5)
  # "prompt" anchors: C's X turn has its own prompt, so A's and C's X turns are alone (0 each)
  by_prompt = episodes_to_samples(eps, step_adv_coef=1.0, step_anchor="prompt", **kw)
  np.testing.assert_allclose(
    np.array([s.advantage for s in by_prompt]) - plain,
    [0.1, 0.0, 0.0, 2.3, 0.0, -2.4, 0.0, 0.0],
    atol=1e-5,
  )
  # with norm_adv_by_std (the default), each state's deviations are divided by their std
  kw["norm_adv_by_std"] = True
  plain = np.array([s.advantage for s in episodes_to_samples(eps, **kw)])
  stepped = np.array([s.advantage for s in episodes_to_samples(eps, step_adv_coef=1.0, **kw)])
  s_std, x_std = np.std([2.5, 4.7, 0.0], ddof=1), np.std([5.0, 0.0], ddof=1)
  by_hand = [0.1 / s_std, 2.5 / x_std, 0.0, 2.3 / s_std, 0.0, -2.4 / s_std, -2.5 / x_std, 0.0]
  np.testing.assert_allclose(stepped - plain, by_hand, atol=1e-5)
  with pytest.raises(ValueError, match=r"rollout.shaping.step_anchor='state'.*Fix"):
    episodes_to_samples(eps, step_adv_coef=1.0, step_anchor="state")


def test_alfworld_admissibility_is_membership_in_the_listed_commands():
  from envs.alfworld.adapter import AlfworldAdapter
  from envs.base import EpisodeView

  view = EpisodeView("t", "look_at_obj_in_light", "", "obs", ["go to shelf 1", "look"], [])
  adapter = AlfworldAdapter()
  assert adapter.is_admissible("go to shelf 1", view) is True
  assert adapter.is_admissible(" Go to Shelf 1 ", view) is True  # projection lower-cases
  assert adapter.is_admissible("go to cabinet 1", view) is False
  assert adapter.is_admissible("look", dataclasses.replace(view, admissible=[])) is None


def test_single_sample_group_uses_mean_zero_std_one():
  eps = [Episode(0, task_id=0, group_id=7, reward=10.0, turns=[_turn()])]
  (s,) = episodes_to_samples(eps, invalid_penalty=0.1)
  assert s.advantage == pytest.approx(10.0 / (1.0 + 1e-6))


def test_rollout_does_not_import_the_update():
  """The rollout side reaches the update only through sdar_jax.core.batch (a fresh interpreter)."""
  code = (
    "import sys, sdar_jax.rollout; "
    "print(sorted(m for m in sys.modules if m.startswith('sdar_jax.')))"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
  )
  loaded = out.stdout
  assert "sdar_jax.core.batch" in loaded
  for update_side in ("train_step", "train_state", "trainer", "checkpoint", "warm_start"):
    assert f"'sdar_jax.{update_side}'" not in loaded, update_side


def test_bucket_sizes():
  # prompts: powers of two from 16 up to 256, multiples of 64 up to 1024, then multiples of 512
  cases = {1: 16, 16: 16, 17: 32, 256: 256, 257: 320, 300: 320, 512: 512, 513: 576, 641: 704}
  cases.update({1024: 1024, 1025: 1536, 1537: 2048})
  assert {n: prompt_bucket(n) for n in cases} == cases
  assert [new_tokens_bucket(n) for n in (0, 16, 17, 100)] == [16, 16, 32, 128]
  # rows: a power of two, rounded up to a multiple of the mesh's batch divisor
  assert [batch_bucket(n, d) for n, d in ((5, 1), (5, 4), (3, 8), (9, 6))] == [8, 8, 8, 18]


def test_pack_batch_aligns_student_and_teacher_responses():
  samples = [
    TurnSample(
      prompt_ids=[11, 12, 13],
      response_ids=[21, 22],
      logprobs=[-0.5, -0.25],
      score=1,
      advantage=0.5,
      group_id=0,
      policy_version=0,
      valid=True,
      teacher_prompt_ids=[1, 2, 3, 4, 11, 12, 13],
    ),
    TurnSample(
      prompt_ids=[14],
      response_ids=[31, 32, 33, 34],
      logprobs=[-1, -2, -3, -4],
      score=0,
      advantage=-0.5,
      group_id=0,
      policy_version=0,
      valid=True,
      teacher_prompt_ids=[1, 2, 3, 4, 14],
    ),
  ]
  b = pack_batch(samples, batch_size=4, with_teacher=True, pad_id=0)
  Ps, Pt, R = prompt_bucket(3), prompt_bucket(7), new_tokens_bucket(4)
  assert b.student_tokens.shape == (4, Ps + R) and b.teacher_tokens.shape == (4, Pt + R)
  # Response token r sits at P + r in both branches.
  np.testing.assert_array_equal(b.student_tokens[0, Ps - 3 : Ps + 2], [11, 12, 13, 21, 22])
  np.testing.assert_array_equal(
    b.teacher_tokens[0, Pt - 7 : Pt + 2], [1, 2, 3, 4, 11, 12, 13, 21, 22]
  )
  np.testing.assert_array_equal(b.student_tokens[1, Ps : Ps + 4], b.teacher_tokens[1, Pt : Pt + 4])
  np.testing.assert_array_equal(
    b.response_mask[:, :5], [[1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [0] * 5, [0] * 5]
  )
  np.testing.assert_array_equal(b.old_logp[1, :4], [-1, -2, -3, -4])
  np.testing.assert_array_equal(b.advantages, [0.5, -0.5, 0, 0])
  assert b.student_mask[0].sum() == 5 and b.teacher_mask[1].sum() == 9
  assert b.student_mask[2:].sum() == 0  # padding rows carry no tokens
  with pytest.raises(ValueError, match="do not fit"):
    pack_batch(samples * 3, batch_size=4, with_teacher=False)


def test_plan_minibatches_covers_every_sample_once():
  samples = list(range(10))
  plan = plan_minibatches(samples, 4, rng=np.random.default_rng(0))
  assert [len(mb) for mb in plan] == [4, 4, 2]
  assert sorted(x for mb in plan for x in mb) == samples


def test_length_order_fills_mini_batches_with_samples_of_similar_length():
  from sdar_jax.rollout.batching import minibatch_permutation

  def sample(prompt, response, teacher):
    return TurnSample([1] * prompt, [2] * response, [-1.0] * response, 0, 0, 0, 0, True,
                      teacher_prompt_ids=[3] * teacher)  # fmt: skip

  # teacher / student prompt lengths of turns 1..4 of two episodes, played one after the other
  samples = [sample(p, r, p + 200) for p, r in ((90, 9), (200, 5), (300, 7), (400, 3))] * 2
  rollout = plan_minibatches(samples, 2)
  by_length = plan_minibatches(samples, 2, order="length")
  assert [[len(s.prompt_ids) for s in mb] for mb in by_length] == [[90, 90], [200, 200],
                                                                    [300, 300], [400, 400]]  # fmt: skip
  assert sorted(map(id, (s for mb in by_length for s in mb))) == sorted(map(id, samples))

  def padded(plan):  # prompt tokens the update computes, student and teacher rows
    return sum(
      len(mb) * (prompt_bucket(max(len(s.prompt_ids) for s in mb))
                 + prompt_bucket(max(len(s.teacher_prompt_ids) for s in mb)))
      for mb in plan
    )  # fmt: skip

  # rollout order pairs turns 1-2 and 3-4 of an episode: each pads to its longer turn
  assert padded(rollout) == 2 * 2 * ((256 + 448) + (448 + 640))
  assert padded(by_length) == 2 * ((128 + 320) + (256 + 448) + (320 + 512) + (448 + 640))
  # teacher length first, then student prompt, then response; ties keep the rollout order
  lengths = np.asarray([[5, 1, 9], [4, 1, 9], [4, 2, 9], [9, 9, 1], [4, 1, 9]])
  assert minibatch_permutation(lengths, "length").tolist() == [3, 1, 4, 2, 0]
  assert minibatch_permutation(lengths, "rollout").tolist() == [0, 1, 2, 3, 4]
  with pytest.raises(ValueError, match=r"train.minibatch_order='size'.*Fix: use one of"):
    plan_minibatches(samples, 2, order="size")


def test_replay_queue_drops_stale_samples():
  q = ReplayQueue(max_staleness=1)

  def mk(version):
    return TurnSample([1], [2], [-1.0], 0, 0, 0, policy_version=version, valid=True)

  q.put([mk(0), mk(1), mk(2)])
  taken = q.take(None, current_version=2)
  assert [s.policy_version for s in taken] == [1, 2]
  assert q.dropped_stale == 1
  with pytest.raises(ValueError, match="max_staleness"):
    ReplayQueue(max_staleness=-1)


@pytest.mark.slow
def test_sampler_logprobs_equal_update_logprobs():
  """The invariant of docs/design.md (Invariants): the sampler's behaviour log-probs equal the
  train step's log-probs of the same tokens, so the PPO ratio is exactly 1 at staleness 0."""
  config = hf_fixtures.SMALL_QWEN3
  params = init_params(config, jax.random.key(0), std=0.2)
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(1, 256, n)) for n in (5, 17, 9)]
  sampling = SamplingParams(max_new_tokens=12, temperature=0.8, stop_token_ids=(3,))
  batch, out = sample_and_pack(config, params, prompts, sampling, jax.random.key(1))
  step = TrainStep(config, {"temperature": 0.8, "kl_coef": 0.0}, make_optimizer(1e-3))
  scored = np.asarray(step.score_student(params, batch))
  mask = batch.response_mask.astype(bool)
  assert mask.sum() == sum(len(t) for t in out.tokens)
  np.testing.assert_allclose(scored[mask], batch.old_logp[mask], atol=1e-4)


@pytest.mark.slow
def test_agent_loop_survives_a_crashing_env():
  """A crashed env ends only its own episode (marked, never trained on); the others play on."""
  from envs import EnvPool
  from envs.alfworld import AlfworldAdapter
  from sdar_jax.rollout import AgentLoop
  from sdar_jax.text.tokenizer import Tokenizer

  config = QWEN_VOCAB_DECODER
  params = init_params(config, jax.random.key(0))
  kwargs = [{"max_steps": 3}, {"max_steps": 3, "fail_on_step": 2}, {"max_steps": 3}]
  with EnvPool("dummy", 3, env_kwargs=kwargs, num_workers=0) as pool:
    loop = AgentLoop(
      pool,
      AlfworldAdapter(),
      Sampler(config),
      Tokenizer.bundled_qwen(),
      ChatTemplate.builtin("qwen3"),
      SamplingParams(max_new_tokens=6, temperature=1.0),
      max_turns=3,
    )
    episodes = loop.run(params, tasks=[0, 1, 2], group_ids=[5, 5, 6], rng=jax.random.key(1))
  crashed = episodes[1]
  assert crashed.env_error and "fail on step 2" in crashed.env_error
  assert len(crashed.turns) == 2  # the turn whose step crashed is still recorded
  for ep in (episodes[0], episodes[2]):
    assert ep.env_error is None and len(ep.turns) == 3  # max_steps reached (no win)
    for turn in ep.turns:
      assert 1 <= len(turn.response_ids) == len(turn.logprobs) <= 6
    assert sum(turn.reward for turn in ep.turns) == ep.reward  # each step's reward on its turn
  samples = episodes_to_samples(episodes)
  assert len(samples) == 6 and {s.group_id for s in samples} == {5, 6}


# ------------------------------------------------------------------- prompts of the two branches
_HEAT_TASK = "heat some egg and put it in garbagecan."


def _qwen3_prompt(user: str) -> str:
  """The Qwen3 chat template written out by hand (one user turn, thinking off)."""
  return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def _view(history_steps: int = 0, gamefile: str = ""):
  from sdar_jax.rollout.agent_loop import EpisodeView

  return EpisodeView(
    task=_HEAT_TASK,
    task_type="pick_heat_then_place_in_recep",
    gamefile=gamefile,
    observation="You arrive at countertop 1. On the countertop 1, you see a egg 1.",
    admissible=["go to microwave 1", "take egg 1 from countertop 1", "look"],
    history=[(f"You see nothing special at step {k}.", "look") for k in range(history_steps)],
  )


def _prompt_loop(**kwargs):
  from envs.alfworld import AlfworldAdapter
  from envs.skills import SkillRetriever
  from sdar_jax.rollout import AgentLoop
  from sdar_jax.text.tokenizer import Tokenizer

  defaults = {
    "pool": None,
    "adapter": AlfworldAdapter(),
    "sampler": None,
    "tokenizer": Tokenizer.bundled_qwen(),
    "chat_template": ChatTemplate.builtin("qwen3"),
    "sampling": SamplingParams(max_new_tokens=4),
    "max_turns": 3,
    "retriever": SkillRetriever("alfworld", strategy="rules", rules_version="post_fix"),
  }
  defaults.update(kwargs)
  return AgentLoop(**defaults)


def _skill_file(name: str) -> str:
  from envs.skills import skills_dir

  with open(os.path.join(skills_dir("alfworld"), name)) as f:
    return f.read().strip()


def test_teacher_prompt_is_the_skill_block_before_the_whole_student_prompt():
  from envs.alfworld import build_prompt
  from envs.skills import BLOCK_HEADER

  loop = _prompt_loop(with_teacher=True)
  view = _view(history_steps=2, gamefile="/d/pick_heat_then_place_in_recep-Egg-1/game.tw-pddl")
  student, teacher = loop.build_prompts(view, sample_id=0, where="test")
  user = build_prompt(view.task, view.history, view.observation, view.admissible, step=2)
  text = _qwen3_prompt(user)
  tok = loop.tokenizer
  assert student == tok.encode(text)  # no skills in the student prompt
  block = f"{BLOCK_HEADER}{_skill_file('general_skills.md')}\n\n{_skill_file('heat.md')}\n\n"
  assert teacher == tok.encode(block + text)  # the block, then the student's prompt
  assert BLOCK_HEADER.strip() not in tok.decode(student)


def test_left_truncation_cuts_the_teacher_prompt_like_the_student_prompt(caplog):
  from envs.alfworld import build_prompt
  from envs.skills import BLOCK_HEADER

  loop = _prompt_loop(with_teacher=True, max_prompt_len=48, truncation="left")
  view = _view(history_steps=3)
  with caplog.at_level("WARNING"):
    student, teacher = loop.build_prompts(view, sample_id=0, where="env 0 turn 3")
    loop.build_prompts(view, sample_id=1, where="env 1 turn 3")
  tok = loop.tokenizer
  full = tok.encode(
    _qwen3_prompt(build_prompt(view.task, view.history, view.observation, view.admissible, step=3))
  )
  assert len(full) > 48 and student == full[-48:]
  # The teacher sees the skills and then exactly the tokens the student kept, not the lost task
  # line ("Your task is to: heat some egg ...", at the start of the full prompt).
  skills = f"{_skill_file('general_skills.md')}\n\n{_skill_file('heat.md')}"
  assert teacher == tok.encode(f"{BLOCK_HEADER}{skills}\n\n") + student
  assert _HEAT_TASK in tok.decode(full) and _HEAT_TASK not in tok.decode(teacher)
  # One warning for the first cut, naming both lengths and the fix; both cuts are counted.
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert len(warnings) == 1 and loop.truncated_prompts == 2
  assert f"{len(full)} tokens" in warnings[0] and "last 48" in warnings[0]
  assert "env 0 turn 3" in warnings[0] and "max_prompt_len" in warnings[0]


@pytest.mark.parametrize("rules_version", ["pre_fix", "post_fix"])
def test_skill_grpo_student_skills_follow_the_keyword_rule_over_the_user_message(rules_version):
  from envs.alfworld import build_prompt
  from envs.skills import BLOCK_HEADER, SkillRetriever

  # The game file says "cool" but the message says "heat": the keyword rule reads the message
  # only (the reference's Skill-GRPO), whatever the teacher retriever's rules_version.
  retriever = SkillRetriever("alfworld", strategy="rules", rules_version=rules_version)
  loop = _prompt_loop(skills_in_student=True, retriever=retriever)
  view = _view(gamefile="/d/pick_cool_then_place_in_recep-Egg-1/game.tw-pddl")
  view.observation = f"You are in the middle of a room. Your task is to: {_HEAT_TASK}"
  student, teacher = loop.build_prompts(view, sample_id=0, where="test")
  user = build_prompt(view.task, [], view.observation, view.admissible)
  block = f"{BLOCK_HEADER}{_skill_file('general_skills.md')}\n\n{_skill_file('heat.md')}\n\n"
  assert student == loop.tokenizer.encode(_qwen3_prompt(block + user))
  assert teacher is None


def test_a_trained_teachers_prompt_and_ucobs_two_views():
  """teacher_context="message": the teacher reads the skills inside its user message, as the
  Skill-GRPO student it was trained as (RetireOPD's stage 2). Mixed views (UCOB): the first half
  of each group plays without the skills and keeps the prompt with them as its teacher's, the
  rest the other way round (a group of one: every other episode)."""
  from envs.alfworld import build_prompt
  from envs.skills import BLOCK_HEADER
  from sdar_jax.rollout.agent_loop import skills_views

  view = _view(gamefile="/d/pick_heat_then_place_in_recep-Egg-1/game.tw-pddl")
  view.observation = f"You are in the middle of a room. Your task is to: {_HEAT_TASK}"
  user = build_prompt(view.task, [], view.observation, view.admissible)
  block = f"{BLOCK_HEADER}{_skill_file('general_skills.md')}\n\n{_skill_file('heat.md')}\n\n"
  plain = _prompt_loop().tokenizer.encode(_qwen3_prompt(user))
  skilled = _prompt_loop().tokenizer.encode(_qwen3_prompt(block + user))
  trained = _prompt_loop(with_teacher=True, teacher_context="message")
  assert trained.build_prompts(view, sample_id=0, where="test") == (plain, skilled)
  mixed = _prompt_loop(with_teacher=True, mixed_views=True)
  assert mixed.build_prompts(view, sample_id=0, where="test", skills=False) == (plain, skilled)
  assert mixed.build_prompts(view, sample_id=0, where="test", skills=True) == (skilled, plain)
  assert skills_views([5, 5, 5, 5, 6, 6, 6, 7]) == [0, 0, 1, 1, 0, 1, 1, 1]
  with pytest.raises(ValueError, match="mixed_views"):
    _prompt_loop(mixed_views=True)


@pytest.mark.slow
def test_truncated_prompts_are_marked_on_turns_and_counted_in_the_metrics():
  from envs import EnvPool
  from sdar_jax.observe.metrics import rollout_metrics

  config = QWEN_VOCAB_DECODER
  params = init_params(config, jax.random.key(0))
  with EnvPool("dummy", 2, env_kwargs={"max_steps": 2}, num_workers=0) as pool:
    loop = _prompt_loop(
      pool=pool,
      sampler=Sampler(config),
      sampling=SamplingParams(max_new_tokens=4, temperature=1.0),
      max_turns=2,
      max_prompt_len=40,
      truncation="left",
      retriever=None,
      progress=False,
    )
    episodes = loop.run(params, tasks=[0, 1], group_ids=[0, 1], rng=jax.random.key(1))
  turns = [t for ep in episodes for t in ep.turns]
  assert len(turns) == 4 and loop.truncated_prompts == 4
  for turn in turns:
    assert len(turn.prompt_ids) == 40 and turn.prompt_truncated_from > 40
  assert rollout_metrics(episodes)["episode/truncated_prompts"] == 4.0
  assert rollout_metrics(episodes, prefix="val")["val/truncated_prompts"] == 4.0
  episodes[0].env_error = "crashed"  # a failed episode's cut prompts still count
  assert rollout_metrics(episodes)["episode/truncated_prompts"] == 4.0


# ------------------------------------------------------------------------ validation episodes
def _split_paths(per_type: int = 10) -> list[str]:
  from envs.alfworld.tasks import TASK_TYPES

  return sorted(
    f"/data/valid_seen/{task_type}-Obj-{k}/trial_T0/game.tw-pddl"
    for task_type in TASK_TYPES
    for k in range(per_type)
  )


def test_validation_games_come_from_the_whole_split():
  from envs.alfworld.tasks import task_type_from_path
  from sdar_jax.rollout import validation_tasks

  paths = _split_paths()
  first = validation_tasks(len(paths), 12, seed=1000)
  assert len(first) == len(set(first)) == 12 and all(0 <= i < len(paths) for i in first)
  # The first 12 sorted paths hold two task types; a shuffled draw of 12 spans most of the six.
  assert len({task_type_from_path(p) for p in paths[:12]}) == 2
  assert len({task_type_from_path(paths[i]) for i in first}) >= 4
  assert validation_tasks(len(paths), 12, seed=1000) == first  # deterministic for a seed
  others = [validation_tasks(len(paths), 12, seed=s) for s in (1001, 1002)]
  assert all(o != first for o in others)
  assert sorted(validation_tasks(len(paths), 100, seed=0)) == list(range(len(paths)))
  assert validation_tasks(len(paths), 0, seed=0) == []
  with pytest.raises(ValueError, match="no games"):
    validation_tasks(0, 4, seed=0)


def test_validation_tasks_minus_one_is_the_whole_split_in_the_seeded_order():
  from sdar_jax.rollout import validation_tasks

  every = validation_tasks(30, -1, seed=1000)
  assert sorted(every) == list(range(30))
  assert every[:12] == validation_tasks(30, 12, seed=1000)  # the same draw, continued
  with pytest.raises(ValueError, match="-1 \\(the whole split\\)"):
    validation_tasks(30, -2, seed=1000)
