"""Teacher context sources on a real rollout and in the update: the student's prompt ids and
sampled tokens are the same with every source on and off (one rollout, same key; Skill-GRPO,
which puts skills in the student's prompt by design, is exempt), a turn-sample without a context
is packed with the response part of its teacher mask 0 and leaves the distillation term (the term
is additive over rows: all = without the row + the row alone), and `sdar` with each source trains
one iteration on the suite's tiny run config."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os

import jax
import numpy as np
import pytest

from sdar_jax import algos
from sdar_jax.core.batch import TurnSample
from sdar_jax.core.loss import loss_and_grads
from sdar_jax.core.sampling import Sampler, SamplingParams
from sdar_jax.models import init_params
from sdar_jax.rollout import pack_batch
from tests.helpers import (
  ONE_ITERATION,
  QWEN_VOCAB_DECODER,
  TINY_CONFIG,
  make_turn_batch,
  tiny_run_config,
)

SOURCES = ("skills", "sibling", "hindsight", "skills,sibling,hindsight")


def _loop(pool, with_teacher: bool):
  from envs.alfworld import AlfworldAdapter
  from envs.skills import SkillRetriever
  from sdar_jax.rollout import AgentLoop
  from sdar_jax.text.chat_templates import ChatTemplate
  from sdar_jax.text.tokenizer import Tokenizer

  return AgentLoop(
    pool=pool,
    adapter=AlfworldAdapter(),
    sampler=Sampler(QWEN_VOCAB_DECODER),
    tokenizer=Tokenizer.bundled_qwen(),
    chat_template=ChatTemplate.builtin("qwen3"),
    sampling=SamplingParams(max_new_tokens=4, temperature=1.0),
    max_turns=2,
    max_prompt_len=4096,
    retriever=SkillRetriever("alfworld", strategy="rules") if with_teacher else None,
    with_teacher=with_teacher,
    progress=False,
  )


@pytest.mark.slow
def test_the_students_prompts_and_tokens_are_the_same_with_every_source_on_and_off():
  from envs import EnvPool

  params = init_params(QWEN_VOCAB_DECODER, jax.random.key(0))
  played = {}
  with EnvPool("dummy", 4, env_kwargs={"max_steps": 2}, num_workers=0) as pool:
    for with_teacher in (False, True):
      loop = _loop(pool, with_teacher)
      played[with_teacher] = loop.run(params, [0, 0, 1, 1], [0, 0, 1, 1], jax.random.key(1))
  tokenizer = loop.tokenizer

  def student(episodes):
    return [(t.prompt_ids, t.response_ids, t.logprobs) for ep in episodes for t in ep.turns]

  plain = student(played[False])
  assert plain and all(t.teacher_prompt_ids is None for ep in played[False] for t in ep.turns)
  for context in SOURCES:
    episodes = copy.deepcopy(played[True])
    algo = dataclasses.replace(algos.get_preset("sdar"), context=context)
    algos.compose_teacher_contexts(episodes, algo, tokenizer.encode, tokenizer.decode)
    assert student(episodes) == plain, context  # the student's side is untouched
    for turn in (t for ep in episodes for t in ep.turns):
      n = len(turn.prompt_ids)
      assert turn.teacher_prompt_ids[-n:] == turn.prompt_ids
      assert (len(turn.teacher_prompt_ids) > n) == turn.teacher_context
  # the skills source composes the very prompt the rollout built for the teacher
  composed = copy.deepcopy(played[True])
  algos.compose_teacher_contexts(
    composed, algos.get_preset("sdar"), tokenizer.encode, tokenizer.decode
  )
  assert [t.teacher_prompt_ids for ep in composed for t in ep.turns] == [
    t.teacher_prompt_ids for ep in played[True] for t in ep.turns
  ]


def test_a_sample_without_a_context_is_packed_with_its_teacher_response_masked():
  def sample(context: bool) -> TurnSample:
    return TurnSample(
      prompt_ids=[5, 6],
      response_ids=[7, 8, 9],
      logprobs=[-1.0] * 3,
      score=0.0,
      advantage=0.0,
      group_id=0,
      policy_version=0,
      valid=True,
      teacher_prompt_ids=[4, 5, 6] if context else [5, 6],
      context=context,
    )

  batch = pack_batch([sample(True), sample(False)], 2, with_teacher=True)
  r = batch.response_len
  assert batch.teacher_mask[0, -r:].tolist()[:3] == [1, 1, 1]
  assert batch.teacher_mask[1, -r:].sum() == 0
  assert batch.teacher_mask[1, :-r].sum() == 2  # its prompt is still there (the student's)


def test_rows_without_a_context_leave_the_distillation_term():
  params = init_params(TINY_CONFIG, jax.random.key(0), std=0.1)
  base = make_turn_batch(params, seed=0)
  rng = np.random.default_rng(3)
  teacher = np.asarray(base.old_logp) + rng.normal(0.0, 0.5, base.old_logp.shape)
  base = base.replace(teacher_logp=teacher.astype(np.float32))
  algo = dataclasses.replace(algos.get_preset("opsd"), kl_coef=0.0, entropy_coef=0.0)
  step = jax.jit(lambda batch: loss_and_grads(TINY_CONFIG, algo, params, batch))
  r = base.response_len

  def without(rows):
    mask = np.asarray(base.teacher_mask).copy()
    mask[rows, -r:] = 0
    return step(base.replace(teacher_mask=mask))

  everyone = np.arange(base.batch_size)
  _, all_in = step(base)
  _, first_out = without([0])
  _, first_alone = without(everyone[1:])
  grads, none_in = without(everyone)
  loss = lambda m: float(m["train/loss"])
  assert loss(all_in) != 0.0
  assert loss(all_in) == pytest.approx(loss(first_out) + loss(first_alone), rel=1e-5, abs=1e-7)
  assert loss(none_in) == 0.0
  assert all(float(np.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads))


@pytest.mark.slow
def test_sdar_trains_one_iteration_with_the_sibling_and_hindsight_sources(tmp_path):
  from sdar_jax.run import trainer

  workdir = str(tmp_path / "contexts")
  overrides = {
    **ONE_ITERATION,
    "train.eval_every": 1,  # and the token view shows the composed context
    "algo.context": "sibling,hindsight",
    "algo.hindsight.outcome": True,
  }
  trainer.run(tiny_run_config(1, "sdar", **overrides), workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    (row,) = [r for r in map(json.loads, f) if "train/loss" in r]
  assert row["step"] == 1 and row["train/skipped_update"] == 0.0
  assert math.isfinite(row["sdar/loss"])
  # with the outcome every turn-sample has a hindsight context; a sibling needs a group success
  assert row["context/hindsight/share"] == 1.0 and row["context/with_context_share"] == 1.0
  assert 0.0 <= row["context/sibling/share"] <= 1.0
  assert row["context/hindsight/tokens_mean"] > 0 and "context/without_context" in row
  assert math.isfinite(row["context/hindsight/teacher_old_gap"])
  views = [os.path.join(root, f) for root, _, files in os.walk(workdir) for f in files]
  (view,) = [f for f in views if f.endswith("tokens.html")]
  with open(view, encoding="utf-8") as f:
    assert "[Hindsight: what this episode went on to show" in f.read()


def test_the_gap_per_source_is_token_weighted_over_the_samples_it_gave_a_context():
  from sdar_jax.rollout.turn_advantages import context_gap_metrics

  def sample(n: int, sources: tuple[str, ...]) -> TurnSample:
    return TurnSample(
      prompt_ids=[5],
      response_ids=[7] * n,
      logprobs=[-1.0] * n,
      score=0.0,
      advantage=0.0,
      group_id=0,
      policy_version=0,
      valid=True,
      teacher_prompt_ids=[4, 5],
      context_sources=sources,
    )

  samples = [sample(1, ("sibling",)), sample(2, ("sibling", "hindsight")), sample(3, ())]
  batches = []
  for part, gaps in ((samples[:2], [0.5, 2.0]), (samples[2:], [9.0])):
    b = pack_batch(part, 2, with_teacher=True)
    teacher = np.asarray(b.old_logp) + np.asarray(gaps + [0.0] * (2 - len(gaps)))[:, None]
    batches.append(b.replace(teacher_logp=teacher.astype(np.float32)))
  got = context_gap_metrics(batches, samples, ["sibling", "hindsight"], True)
  # sibling: 1 token at +0.5 and 2 tokens at +2.0; hindsight: the 2 tokens at +2.0
  assert got["context/sibling/teacher_old_gap"] == pytest.approx((0.5 + 4.0) / 3)
  assert got["context/hindsight/teacher_old_gap"] == pytest.approx(2.0)


@pytest.mark.slow
def test_sdpo_trains_one_iteration(tmp_path):
  from sdar_jax.run import trainer

  workdir = str(tmp_path / "sdpo")
  overrides = {**ONE_ITERATION, "algo.sdpo.top_k": 8}
  trainer.run(tiny_run_config(1, "sdpo", **overrides), workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    (row,) = [r for r in map(json.loads, f) if "train/loss" in r]
  assert row["step"] == 1 and row["train/skipped_update"] == 0.0
  assert math.isfinite(row["sdpo/loss"]) and row["sdpo/loss"] >= 0.0
  assert 0.0 < row["sdpo/ratio_mean"] <= 2.0
  assert row["context/with_context_share"] == 1.0  # a demonstration or else the feedback
