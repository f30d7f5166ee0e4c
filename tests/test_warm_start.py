"""Expert warm start: samples are built exactly like rollout prompts, and SFT fits them."""

import jax
import pytest

from envs.alfworld import build_prompt
from sdar_jax.models import ModelConfig, init_params
from sdar_jax.rollout.agent_loop import AgentLoop, AlfworldAdapter
from sdar_jax.sampling import SamplingParams
from sdar_jax.tokenizer import Tokenizer, apply_chat_template
from sdar_jax.warm_start import expert_response, expert_samples, read_walkthroughs, warm_start

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


@pytest.fixture(scope="module")
def loop():
  return AgentLoop(
    pool=None,
    adapter=AlfworldAdapter(),
    sampler=None,
    tokenizer=Tokenizer.bundled_qwen(),
    chat_template="qwen3",
    sampling=SamplingParams(),
    max_turns=50,
    history_length=2,
  )


def test_expert_samples_match_rollout_prompts(loop):
  tok = loop.tokenizer
  end = tok.token_to_id("<|im_end|>")
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
    text = apply_chat_template([{"role": "user", "content": user}], "qwen3")
    assert sample.prompt_ids == tok.encode(text)
  assert "Action 1: 'go to shelf 1'" in tok.decode(samples[1].prompt_ids)
  assert samples[1].response_ids[-1] == end
  assert tok.decode(samples[1].response_ids[:-1]) == expert_response(RECORD["task"], s1["action"])
  assert tok.decode(samples[1].response_ids[:-1]).endswith(
    "<action>take mug 2 from shelf 1</action>"
  )


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
