"""The data that flows from the rollout to the update, and the padded lengths it comes in.

`TurnSample` is one turn of one episode on the host (ragged token lists); `TurnBatch` is a
fixed-shape batch of them as arrays, what the compiled update takes. Lengths round up to buckets
(`batch_bucket`, `prompt_bucket`, `new_tokens_bucket`) so the sampler and the update compile once
per bucket, not once per length. The rollout side (rollout/, sampling.py) and the update side
(train_step.py) both import this module; it imports neither.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax

Array = jax.Array

MIN_PROMPT_BUCKET = 16
# Prompt buckets: powers of two up to PROMPT_POW2_LIMIT, then multiples of PROMPT_FINE_STEP up to
# PROMPT_FINE_LIMIT, then multiples of PROMPT_FINE_LIMIT // 2: at most 25% padding past 256 tokens
# for a few more compiled shapes (a 300-token prompt runs at 320, not 512; a 600-token one at 640).
PROMPT_POW2_LIMIT = 256
PROMPT_FINE_STEP = 64
PROMPT_FINE_LIMIT = 1024
MIN_NEW_TOKENS_BUCKET = 16
# Row buckets: powers of two; above ROW_POW2_LIMIT rows a caller's `row_step` (the sampler's
# rollout.row_step) may round to a multiple of it instead, wherever that is smaller (640 episodes
# run 640 rows at a step of 64, not 1,024), for a few more compiled shapes.
ROW_POW2_LIMIT = 256


# ----------------------------------------------------------------------------------- buckets
def next_power_of_two(n: int) -> int:
  """The smallest power of two >= n (1 for n <= 1)."""
  return 1 << max(0, int(n) - 1).bit_length()


def batch_bucket(n: int, divisor: int = 1, row_step: int = 0) -> int:
  """Rows the compiled function runs for `n` real rows, a multiple of `divisor`: the next power of
  two, or above ROW_POW2_LIMIT rows with `row_step` > 0 the next multiple of `row_step` where that
  is fewer."""
  rows = next_power_of_two(max(n, divisor))
  if row_step > 0 and n > ROW_POW2_LIMIT:
    rows = min(rows, -(-n // row_step) * row_step)
  return -(-rows // divisor) * divisor


def prompt_bucket(n: int) -> int:
  """Padded prompt length: a power of two >= 16 up to 256, a multiple of 64 up to 1024, then a
  multiple of 512."""
  if n <= PROMPT_POW2_LIMIT:
    return max(MIN_PROMPT_BUCKET, next_power_of_two(n))
  step = PROMPT_FINE_STEP if n <= PROMPT_FINE_LIMIT else PROMPT_FINE_LIMIT // 2
  return -(-n // step) * step


def new_tokens_bucket(n: int) -> int:
  """Response slots (the sampler's output buffer and cache room) for `n` new tokens: a power of
  two >= 16."""
  return max(MIN_NEW_TOKENS_BUCKET, next_power_of_two(n))


# ----------------------------------------------------------------------------------- samples
@dataclasses.dataclass
class TurnSample:
  """One training sample: one turn of one episode, its prompt (with the history window) and the
  response the policy sampled for it (docs/reference.md §4.7)."""

  prompt_ids: list[int]  # the student's chat-templated prompt
  response_ids: list[int]  # the sampled response, up to and including the stop token
  logprobs: list[float]  # behaviour log-prob of each response token, from the sampler
  score: float  # episode return minus this turn's invalid-format penalty
  advantage: float  # GRPO advantage of `score` within its group
  group_id: int  # the GRPO group (episodes of one task)
  policy_version: int  # the iteration whose parameters sampled the response
  valid: bool  # the response parsed as a valid action
  task_type: str = "unknown"
  teacher_prompt_ids: list[int] | None = None  # skills block + the same prompt (teacher branch)
  episode: int = -1  # the episode's index among the process's episodes of the iteration
  turn: int = 0  # the turn's index within its episode
  won: bool = False  # whether its episode succeeded
  observation: str = ""  # the env's observation the prompt was built from (the turn's state)
  reward: float = 0.0  # the env's reward for this turn's action
  skills_in_prompt: bool = False  # the student's prompt held the skills (Skill-GRPO, UCOB's view)
  # a distillation row's per-token weights (UCOB's pairs, `algos.ucob`); None: a PPO row
  distill_weight: list[float] | None = None
  # whether a source gave the teacher a privileged context (sdar_jax.algos.contexts); without one
  # the teacher prompt is the student's and the sample is left out of the distillation term
  context: bool = True
  context_sources: tuple[str, ...] = ()  # the sources that gave it (algo.context's names)


@flax.struct.dataclass
class TurnBatch:
  """A fixed-shape batch of turn-samples: every array is [B, ...] for B turn-samples and R
  response slots.

      student_tokens [B, Ps+R]  student prompt LEFT-padded to Ps, then the response RIGHT-padded
                                to R
      teacher_tokens [B, Pt+R]  skills block + the same chat-templated prompt, left-padded to Pt,
                                then the SAME response tokens (a row whose sample has no
                                teacher context: response part of teacher_mask 0, left out of
                                the distillation term)
      *_mask                    1 = real token (left pads and right pads are 0)
      response_mask  [B, R]     response tokens up to and including the first stop token
      old_logp       [B, R]     behaviour log-probs from the sampler
      advantages     [B]        sequence-level GRPO advantages
      ref_logp       [B, R]     optional: reference-policy log-probs (KL term without ref params)
      teacher_logp   [B, R]     optional: teacher log-probs scored at θ_old ("rollout" source)
      distill_weight [B, R]     optional: per-token weights of a weighted distillation term
                                (UCOB); rows holding any are distillation rows, 0 elsewhere

  Response token r sits at position P+r of its row (P = Ps for the student, Pt for the teacher),
  so the two branches line up slot by slot. Rows whose masks are all zero pad a short batch: they
  add no tokens, no gradient and no metric weight.
  """

  student_tokens: Array
  student_mask: Array
  response_mask: Array
  old_logp: Array
  advantages: Array
  teacher_tokens: Array | None = None
  teacher_mask: Array | None = None
  ref_logp: Array | None = None
  teacher_logp: Array | None = None
  distill_weight: Array | None = None

  @property
  def batch_size(self) -> int:
    return self.advantages.shape[0]

  @property
  def response_len(self) -> int:
    return self.response_mask.shape[1]
