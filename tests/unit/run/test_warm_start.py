"""Expert warm start: samples are built exactly like rollout prompts (with the skill block for the
skill-following expert), SFT fits them, and the teacher-student gap is measured right."""

import jax
import numpy as np
import pytest

from envs.alfworld import ALFWORLD_FAMILY, build_prompt
from envs.alfworld.data import read_walkthroughs
from envs.skills import BLOCK_HEADER, SkillLibrary, SkillRetriever
from sdar_jax.core.batch import TurnSample
from sdar_jax.models import ModelConfig, forward, init_params
from sdar_jax.run.warm_start import (
  expert_response,
  expert_samples,
  expert_summary,
  expert_warm_start_data,
  gap_samples,
  split_held_out,
  teacher_student_gap_on_expert,
  warm_start,
  warm_start_loop,
)
from sdar_jax.text.chat_templates import ChatTemplate

RECORD = {
  "task": "put a mug in coffeemachine.",
  "task_type": "pick_and_place_simple",
  "gamefile": "train/pick_and_place_simple-Mug-None-CoffeeMachine-3/t/game.tw-pddl",
  "steps": [
    {
      "observation": "You are in the middle of a room. Your task is to: put a mug in coffeemachine.",
      "admissible_commands": ["go to shelf 1", "go to coffeemachine 1", "help"],
      "action": "go to shelf 1",
    },
    {
      "observation": "You arrive at shelf 1. On the shelf 1, you see a mug 2.",
      "admissible_commands": ["take mug 2 from shelf 1", "go to coffeemachine 1"],
      "action": "take mug 2 from shelf 1",
    },
  ],
}


def test_expert_samples_match_rollout_prompts(loop):
  tok = loop.tokenizer
  (end,) = tok.encode("<|im_end|>")
  samples = expert_samples([RECORD], loop, end_token_id=end)
  assert len(samples) == 2
  s0, s1 = RECORD["steps"]
  first = build_prompt(RECORD["task"], [], s0["observation"], s0["admissible_commands"], step=0)
  later = build_prompt(
    RECORD["task"],
    [(s0["observation"], s0["action"])],
    s1["observation"],
    s1["admissible_commands"],
    step=1,
  )
  for sample, user in zip(samples, (first, later)):
    text = ChatTemplate.builtin("qwen3").render([{"role": "user", "content": user}])
    assert sample.prompt_ids == tok.encode(text)
  assert "Action 1: 'go to shelf 1'" in tok.decode(samples[1].prompt_ids)
  assert samples[1].response_ids[-1] == end
  assert tok.decode(samples[1].response_ids[:-1]) == expert_response(RECORD["task"], s1["action"])
  assert tok.decode(samples[1].response_ids[:-1]).endswith(
    "<action>take mug 2 from shelf 1</action>"
  )


@pytest.mark.slow
def test_sft_lowers_the_expert_loss(loop):
  samples = expert_samples([RECORD], loop, end_token_id=151645)
  config = ModelConfig.tiny(
    "qwen3",
    vocab_size=151936,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    tie_word_embeddings=True,
  )
  params = init_params(config, jax.random.key(0))
  _, losses = warm_start(config, params, samples, steps=12, batch_size=2, lr=1e-2, progress=False)
  assert losses[0] > 11.0  # ~ln(151936) for a fresh model
  assert losses[-1] < 0.7 * losses[0]


def test_missing_walkthroughs_explain_the_fix(tmp_path):
  with pytest.raises(FileNotFoundError, match="envs.alfworld.generator"):
    read_walkthroughs(str(tmp_path / "walkthroughs" / "train.jsonl"))


# ------------------------------------------------------------------ the search expert's games
GENERAL_SKILLS = SkillLibrary.load("alfworld").general.raw


def _expert_record(mode, gamefile, actions=("go to fridge 1", "open fridge 1"), random_at=()):
  steps = [
    {
      "observation": RECORD["steps"][0]["observation"] if k == 0 else f"You arrive at place {k}.",
      "admissible_commands": ["go to fridge 1", "open fridge 1", "go to cabinet 1"],
      "action": action,
      "random": k in random_at,
    }
    for k, action in enumerate(actions)
  ]
  return {
    "task": "put a mug in coffeemachine.",
    "task_type": "pick_and_place_simple",
    "gamefile": gamefile,
    "mode": mode,
    "won": mode == "skills",
    "steps": steps,
  }


@pytest.fixture(scope="module")
def skill_loop(loop):
  return warm_start_loop(
    loop, SkillRetriever("alfworld", strategy="rules", rules_version="pre_fix")
  )


def _plain_prompt(tok, record, k):
  steps = record["steps"]
  history = [(s["observation"], s["action"]) for s in steps[:k]]
  user = build_prompt(
    record["task"], history, steps[k]["observation"], steps[k]["admissible_commands"], step=k
  )
  return tok.encode(ChatTemplate.builtin("qwen3").render([{"role": "user", "content": user}]))


def test_skill_expert_turns_get_the_teachers_skill_prompt(skill_loop):
  """Knowledge-free turns get the student prompt; skill-following turns get the skill block
  followed by that same prompt, as the teacher branch builds it; random turns are no targets."""
  tok = skill_loop.tokenizer
  plain = _expert_record("plain", "g1", random_at=(0,))
  skills = _expert_record("skills", "g2")
  samples = expert_samples([plain, skills], skill_loop, end_token_id=7)
  assert len(samples) == 3  # plain's random first turn is left out
  block = tok.encode(f"{BLOCK_HEADER}{GENERAL_SKILLS}\n\n")
  assert samples[0].prompt_ids == _plain_prompt(tok, plain, 1)
  assert "Action 1: 'go to fridge 1'" in tok.decode(samples[0].prompt_ids)  # still in history
  assert samples[1].prompt_ids == block + _plain_prompt(tok, skills, 0)
  assert samples[2].prompt_ids == block + _plain_prompt(tok, skills, 1)
  assert tok.decode(samples[2].response_ids[:-1]) == expert_response("", "open fridge 1")
  gap = gap_samples([plain, skills], skill_loop, end_token_id=7)
  assert [s.prompt_ids for s in gap] == [_plain_prompt(tok, skills, k) for k in (0, 1)]
  assert [s.teacher_prompt_ids for s in gap] == [samples[1].prompt_ids, samples[2].prompt_ids]
  assert [s.score for s in gap] == [1.0, 0.0]  # "go to" marks a search turn


def test_skill_expert_turns_need_a_loop_with_skills(loop):
  with pytest.raises(ValueError, match="warm_start_loop"):
    expert_samples([_expert_record("skills", "g")], loop, end_token_id=7)


def test_held_out_games_keep_both_modes_together():
  records = [_expert_record(m, f"g{g}") for g in range(10) for m in ("plain", "skills")]
  train, held = split_held_out(records, 0.2, seed=0)
  assert len(held) == 4 and len(train) == 16
  assert {r["gamefile"] for r in held}.isdisjoint({r["gamefile"] for r in train})
  assert sorted(r["mode"] for r in held) == ["plain", "plain", "skills", "skills"]
  assert split_held_out(records, 0.01, seed=0)[1]  # at least one game
  summary = expert_summary(records)
  assert summary["warm_start/expert_skills_success"] == 1.0
  assert summary["warm_start/expert_plain_success"] == 0.0
  assert summary["warm_start/expert_plain_steps"] == 2.0


def _tiny_config(vocab=151936):
  return ModelConfig.tiny(
    "qwen3",
    vocab_size=vocab,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    tie_word_embeddings=True,
  )


@pytest.mark.slow
def test_teacher_student_gap_matches_a_direct_forward():
  """The gap against full-sequence logits of each sample alone (no padding, no bucketing)."""
  config = _tiny_config(vocab=300)
  params = init_params(config, jax.random.key(1))
  rng = np.random.default_rng(0)
  samples = []
  for n in range(5):  # prompts and responses of different lengths, 10 and 19 tokens in all
    response = rng.integers(0, 300, 2 + n % 3).tolist()
    plain = rng.integers(0, 300, 10 - len(response)).tolist()
    skill = rng.integers(0, 300, 9).tolist() + plain
    samples.append(
      TurnSample(plain, response, [0.0] * len(response), float(n % 2), 0.0, 0, 0, True,
                 teacher_prompt_ids=skill)
    )  # fmt: skip

  def logp(prompt, response):
    logits = np.asarray(forward(config, params, np.asarray([prompt + response]))[0], np.float64)
    top = logits.max(axis=-1, keepdims=True)
    logprobs = logits - top - np.log(np.exp(logits - top).sum(axis=-1, keepdims=True))
    return [float(logprobs[len(prompt) + r - 1, t]) for r, t in enumerate(response)]

  diffs, search = [], []
  for s in samples:
    d = np.subtract(logp(s.teacher_prompt_ids, s.response_ids), logp(s.prompt_ids, s.response_ids))
    diffs += d.tolist()
    search += d.tolist() if s.score else []
  out = teacher_student_gap_on_expert(config, params, samples, batch_size=2)
  key = "warm_start/teacher_student_gap_on_expert"
  scale = np.mean(np.abs(diffs)) + 1e-3
  assert abs(out[key] - np.mean(diffs)) < 1e-4 * scale
  assert abs(out[f"{key}_search"] - np.mean(search)) < 1e-4 * scale
  assert out[f"{key}_tokens"] == len(diffs)


@pytest.mark.slow
def test_expert_games_on_the_real_engine_become_both_kinds_of_samples(alfworld_games, skill_loop):
  """Two generated games (of the run-wide game set), each played by both experts on the engine:
  SFT samples of one game with and without the skill block, gap samples from the held-out one."""
  import envs
  from envs.alfworld import collect_game_files

  two = ["pick_and_place_simple", "pick_heat_then_place_in_recep"]
  games = collect_game_files(alfworld_games, "train", task_types=two)
  pool = envs.EnvPool("alfworld", 4, {"game_files": games, "max_steps": 30}, num_workers=0)
  settings = {"expert_holdout": 0.5, "expert_epsilon": 0.0}
  samples, gap, metrics = expert_warm_start_data(
    settings, skill_loop, pool, 2, end_token_id=7, family=ALFWORLD_FAMILY
  )
  pool.close()
  tok = skill_loop.tokenizer
  block = tok.encode(f"{BLOCK_HEADER}{GENERAL_SKILLS}\n\n")
  with_block = [s for s in samples if s.prompt_ids[: len(block)] == block]
  assert 0 < len(with_block) < len(samples)  # both experts' turns of the training game
  assert list(gap) == ["skills"]  # no other block taught (warm_start.contexts empty)
  gap = gap["skills"]
  assert gap and all(s.teacher_prompt_ids == block + s.prompt_ids for s in gap)
  steps = 2 * (metrics["warm_start/expert_plain_steps"] + metrics["warm_start/expert_skills_steps"])
  assert len(samples) + len(gap) < steps  # the held-out game's plain turns are in neither
  assert metrics["warm_start/expert_skills_success"] == 1.0


def test_expert_response_keeps_each_environments_output_format():
  """ALFWorld / WebShop actions go in <action> tags; Search-QA's <search>/<answer> blocks stay as
  they are (its prompt asks for them bare). Each response projects back to its action, valid,
  under the environment's own projection; one that does not is refused."""
  from envs.alfworld.projection import project_action as alfworld
  from envs.search_qa.projection import project_action as search_qa
  from envs.webshop.projection import project_action as webshop

  for project, action, body in (
    (alfworld, "go to desk 1", "<action>go to desk 1</action>"),
    (webshop, "search[blue shoes]", "<action>search[blue shoes]</action>"),
    (search_qa, "<search>who wrote dune</search>", "<search>who wrote dune</search>"),
    (search_qa, "<answer>frank herbert</answer>", "<answer>frank herbert</answer>"),
  ):
    response = expert_response("", action, project)
    assert response == f"<think>I follow my plan.</think>\n{body}"
    assert project(response) == (action, True)
  with pytest.raises(ValueError, match=r"expert action 'look around' does not survive"):
    expert_response("", "look around", search_qa)  # Search-QA has no untagged actions
