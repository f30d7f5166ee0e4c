"""Expert warm start: supervised fine-tuning on the planner's walkthroughs before RL.

The offline ALFWorld generator exports, for every game, the planner's winning actions with the
observation and admissible commands at each step (`walkthroughs/<split>.jsonl`). Each step becomes
one turn-sample exactly as the agent loop would build it — the same prompt (task, history window,
observation, admissible actions, chat template) — with the response
``<think>...</think>\\n<action>ACTION</action><|im_end|>``. A few hundred steps of next-token
likelihood on these responses give a small model the output format and the first moves, so the RL
that follows starts from a policy that sometimes wins (a random policy never does, and GRPO then
has no signal). The reference trains from instruction-tuned checkpoints instead; this is for
models that start from scratch (the offline demo) or for ablations.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from sdar_jax.models import ModelConfig, Params
from sdar_jax.rollout.agent_loop import AgentLoop, EpisodeView
from sdar_jax.rollout.batching import TurnSample, pack_batch
from sdar_jax.train_step import response_logprobs


def expert_response(task: str, action: str) -> str:
  """The target text of one expert step: a one-line reasoning, then the action in its tags
  (short on purpose: the response bucket, and so the cost of every SFT step, follows its length)."""
  del task  # the prompt states it; repeating it would double the target length
  return f"<think>I follow my plan.</think>\n<action>{action}</action>"


def read_walkthroughs(path: str) -> list[dict[str, Any]]:
  if not os.path.exists(path):
    raise FileNotFoundError(
      f"No expert walkthroughs at {path!r}: generate games with `python -m envs.alfworld.generator "
      f"--out DIR` (it writes DIR/walkthroughs/<split>.jsonl) or set warm_start.steps=0."
    )
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def expert_samples(
  records: Sequence[dict[str, Any]], loop: AgentLoop, end_token_id: int
) -> list[TurnSample]:
  """One sample per expert step, its prompt built by `loop` as during rollouts."""
  samples = []
  for r, record in enumerate(records):
    history: list[tuple[str, str]] = []
    for k, step in enumerate(record["steps"]):
      view = EpisodeView(
        task=record["task"],
        task_type=record.get("task_type", "unknown"),
        gamefile=record.get("gamefile", ""),
        observation=step["observation"],
        admissible=list(step.get("admissible_commands", [])),
        history=list(history),
      )
      prompt, _ = loop.build_prompts(view, sample_id=(r, k), where=f"walkthrough {r} step {k}")
      response = loop.tokenizer.encode(expert_response(record["task"], step["action"]))
      response.append(end_token_id)
      samples.append(
        TurnSample(
          prompt_ids=prompt,
          response_ids=response,
          logprobs=[0.0] * len(response),
          score=0.0,
          advantage=0.0,
          group_id=r,
          policy_version=0,
          valid=True,
          task_type=view.task_type,
        )
      )
      history.append((step["observation"], step["action"]))
  return samples


def _nll(config: ModelConfig, params: Params, batch) -> tuple[jax.Array, jax.Array]:
  logp, _ = response_logprobs(
    config, params, batch.student_tokens, batch.student_mask, batch.response_len
  )
  mask = batch.response_mask
  tokens = jnp.maximum(mask.sum(), 1.0)
  return -(logp * mask).sum() / tokens, tokens


def make_sft_step(config: ModelConfig, optimizer: optax.GradientTransformation):
  """A jitted (params, opt_state, batch) -> (params, opt_state, loss) likelihood step."""

  @jax.jit
  def step(params, opt_state, batch):
    (loss, _), grads = jax.value_and_grad(lambda p: _nll(config, p, batch), has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


def warm_start(
  config: ModelConfig,
  params: Params,
  samples: Sequence[TurnSample],
  *,
  steps: int,
  batch_size: int,
  lr: float,
  seed: int = 0,
  shard_batch=lambda b: b,
  progress: bool = True,
) -> tuple[Params, list[float]]:
  """`steps` AdamW updates on random mini-batches of the expert samples; returns the new params
  and the loss of every step."""
  from tqdm import tqdm

  if not samples:
    raise ValueError("warm start: no expert samples (empty walkthrough file?).")
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(lr, weight_decay=0.0))
  opt_state = optimizer.init(params)
  step = make_sft_step(config, optimizer)
  rng = np.random.default_rng(seed)
  losses = []
  for _ in tqdm(range(steps), desc="warm start (expert SFT)", leave=False, disable=not progress):
    pick = rng.choice(len(samples), size=min(batch_size, len(samples)), replace=False)
    batch = shard_batch(pack_batch([samples[i] for i in pick], batch_size, with_teacher=False))
    params, opt_state, loss = step(params, opt_state, batch)
    losses.append(float(loss))
  return params, losses
