"""Shared by the warm-start tests: the agent loop that builds their prompts."""

import pytest

from envs.alfworld import AlfworldAdapter
from sdar_jax.core.sampling import SamplingParams
from sdar_jax.rollout.agent_loop import AgentLoop
from sdar_jax.text.chat_templates import ChatTemplate
from sdar_jax.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def loop():
  """A prompt builder as ALFWorld rollouts use it (no pool, no sampler): the bundled Qwen
  tokenizer, the qwen3 chat template, a history of 2 turns."""
  return AgentLoop(
    pool=None,
    adapter=AlfworldAdapter(),
    sampler=None,
    tokenizer=Tokenizer.bundled_qwen(),
    chat_template=ChatTemplate.builtin("qwen3"),
    sampling=SamplingParams(),
    max_turns=50,
    history_length=2,
  )
