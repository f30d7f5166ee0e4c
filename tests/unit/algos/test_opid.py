"""OPID (`sdar_jax.algos.opid`): the token advantage against a NumPy transcription of the authors'
rule (jinyangwu/OPID@37a15a5 gigpo/core_gigpo.py: `episode_norm_reward` across steps,
`compute_teacher_token_advantage`, `compute_opid_advantage_components`, the launcher's settings),
the analysis parser, and the per-turn skill blocks (step skill first, the episode skill else)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from sdar_jax.algos import get_preset
from sdar_jax.algos.advantages import grpo_advantages, token_advantages
from sdar_jax.algos.contexts import load_templates
from sdar_jax.algos.opid import (
  OPID,
  analyse_episodes,
  analysis_request,
  opid_source,
  parse_analysis,
)
from sdar_jax.algos.reflectors import Written
from sdar_jax.rollout.trajectory import Episode, Turn

T = load_templates()


# ------------------------------------------------------------------------------ authors' rule
def _authors_opid(scores, index, old, episode_teacher, step_teacher, mask, q_ep, q_step, w_ep,
                  w_step, remove_std, eps=1e-6):  # fmt: skip
  """compute_opid_advantage_components with step_advantage_w 0, normalize_teacher_adv False and
  clip_teacher_adv None; scores: each step sample's episode score (its token rewards' sum)."""
  groups: dict = {}
  for i, s in enumerate(scores):  # compute_mean_std_cross_steps=True: every step sample counts
    groups.setdefault(index[i], []).append(s)
  adv = np.zeros(len(scores), np.float64)
  for i, s in enumerate(scores):
    g = groups[index[i]]
    mean, std = (0.0, 1.0) if len(g) == 1 else (np.mean(g), np.std(g, ddof=1))  # torch.std
    adv[i] = s - mean if remove_std else (s - mean) / (std + eps)
  episode = adv[:, None] * mask
  d_ep = (episode_teacher - old) * mask * q_ep[:, None]
  d_step = (step_teacher - old) * mask * q_step[:, None]
  return episode + w_ep * d_ep + w_step * d_step


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_token_advantage_matches_the_authors_rule(norm_by_std):
  rng = np.random.default_rng(0)
  n, r = 9, 5
  index = np.array([0, 0, 0, 0, 1, 1, 1, 2, 0])  # group 2: one step sample (mean 0, std 1)
  scores = rng.choice([0.0, 1.0, -0.1], n)
  mask = (rng.random((n, r)) < 0.8).astype(np.float32)
  old = rng.normal(-2.0, 1.0, (n, r)).astype(np.float32)
  teacher = old + rng.normal(0.0, 0.5, (n, r)).astype(np.float32)
  # step_priority: a row reads its step skill or its episode skill or (analysis failed) none
  kind = np.array(["step", "ep", "ep", "none", "step", "ep", "ep", "ep", "none"])
  q_ep, q_step = (kind == "ep").astype(np.float32), (kind == "step").astype(np.float32)
  w = OPID().teacher_adv_w  # the launcher's 0.001 for both
  want = _authors_opid(scores, index, old, teacher, teacher, mask, q_ep, q_step, w, w,
                       remove_std=not norm_by_std)  # fmt: skip
  # ours: a row without a skill reads teacher = old (core.loss), the GRPO advantage per sample
  ours_teacher = np.where((q_ep + q_step)[:, None] > 0, teacher, old)
  seq = grpo_advantages(scores, index, norm_by_std=norm_by_std)
  got = token_advantages("opid", seq, mask, teacher_logp=ours_teacher, old_logp=old,
                         teacher_weight=w)  # fmt: skip
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_token_advantage_ignores_padding_values():
  mask = np.array([[1.0, 0.0]], np.float32)
  old = np.array([[-1.0, np.nan]], np.float32)
  teacher = np.array([[-0.5, -np.inf]], np.float32)
  got = np.asarray(token_advantages("opid", np.array([2.0]), mask, teacher_logp=teacher,
                                    old_logp=old, teacher_weight=0.1))  # fmt: skip
  np.testing.assert_allclose(got, [[2.0 + 0.1 * 0.5, 0.0]])


def test_the_preset_reads_the_teacher_at_theta_old():
  p = get_preset("opid")
  assert p.advantage == "opid" and p.context == "opid" and p.scores_teacher
  assert p.teacher_source == "rollout" and p.teacher_weights == "current"  # θ_old, shared weights
  assert p.distill == "none" and p.kl_coef == 0.01 and p.kl_kind == "low_var_kl"
  assert p.recompute_old_logp  # ℓ_old re-scored at θ_old, as verl's actor does
  assert p.opid.teacher_adv_w == 0.001 and p.opid.max_step_skills == 5
  with pytest.raises(ValueError, match="algo.opid.reflector"):
    dataclasses.replace(p, opid=OPID(reflector="gpt"))


# ------------------------------------------------------------------------------ analysis
def test_parse_analysis_reads_the_authors_json():
  text = 'x {"episode_summary": "s", "episode_skill": "E", "step_skills": {"0": "a", "b": "c", "7": "z", "2": "d"}} y'
  assert parse_analysis(text, turns=3, most=5) == ("E", {0: "a", 2: "d"})
  assert parse_analysis(text, turns=3, most=1) == ("E", {0: "a"})
  assert parse_analysis('{"episode_skill": ""}', 3, 5) is None
  assert parse_analysis("no json", 3, 5) is None and parse_analysis(None, 3, 5) is None


def _turn(obs, action):
  return Turn([1, 2], [3, 4], [-0.5, -0.5], action, True, 0, observation=obs)


def _episodes():
  won = Episode(0, 0, 0, task="put a apple in fridge", won=True, reward=1.0)
  won.turns = [_turn("You are in a room.", "go to fridge 1"), _turn("You see a apple 1.", "put")]
  lost = Episode(1, 0, 0, task="put a apple in fridge", won=False)
  lost.turns = [_turn("You are in a room.", "open drawer 9"), _turn("Nothing happens.", "look")]
  return [won, lost]


def test_oracle_analysis_gives_step_skills_first_then_the_episode_skill():
  algo = dataclasses.replace(get_preset("opid"), opid=OPID(reflector="oracle"))
  eps = _episodes()
  metrics = analyse_episodes(eps, algo, T)
  assert metrics["opid/episodes"] == 2.0 and metrics["opid/failed"] == 0.0
  won, lost = eps
  assert all("Episode-Level Skill" in b for b in won.opid_blocks)
  # the lost episode's first action changed nothing: its turn 0 reads a step skill
  assert "Critical-Step Skill" in lost.opid_blocks[0] and "open drawer 9" in lost.opid_blocks[0]
  assert "Episode-Level Skill" in lost.opid_blocks[1]
  assert (
    metrics["opid/step_skills_applied"] == 1.0 and metrics["opid/step_skill_step_ratio"] == 0.25
  )
  assert opid_source(type("R", (), {"episode": lost})()) == lost.opid_blocks


def test_a_failed_analysis_gives_no_context_and_the_prompt_is_the_authors(monkeypatch):
  from sdar_jax.algos import opid

  algo = dataclasses.replace(get_preset("opid"), opid=OPID(reflector="policy"))
  eps = _episodes()
  req = analysis_request(eps[1], algo, T)
  assert req.system == "" and "episode_success: failure" in req.user
  assert "avoidance rules" in req.user and "at most 5 critical step(s)" in req.user
  assert "Candidate step indices: [0, 1]" in req.user and "Step 1. Did: look" in req.user
  reply = json.dumps({"episode_summary": "", "episode_skill": "E", "step_skills": {"1": "S"}})

  class Writer:
    def write(self, requests):
      return [Written(reply), None]

  monkeypatch.setattr(opid, "build_writer", lambda *a, **k: Writer())
  metrics = analyse_episodes(eps, algo, T)
  assert metrics["opid/failed"] == 1.0 and eps[1].opid_blocks == [None, None]
  assert "[E]" in eps[0].opid_blocks[0] and "[S]" in eps[0].opid_blocks[1]


def test_evaluation_episodes_get_no_hindsight_block_and_no_analyzer_call():
  """The token view of an evaluation: OPID's hook marks every turn block-less (its analyzer is
  not called on validation episodes); the contexts compose without a round."""
  from sdar_jax.algos.contexts import compose_teacher_contexts
  from sdar_jax.algos.opid import OPIDHooks

  algo, eps = get_preset("opid"), _episodes()
  OPIDHooks().before_evaluation_contexts(algo, eps)
  assert [ep.opid_blocks for ep in eps] == [[None] * len(ep.turns) for ep in eps]
  compose_teacher_contexts(eps, algo, lambda s: list(s.encode()), bytes.decode, T)  # no raise
