"""Model FLOPs of the update, a forward pass and the sampler's decode loop, from the formula of a
`ModelConfig` (not from XLA's cost analysis, which counts a scanned loop body once): one function
each, used by the TPU planner (`sdar_jax.run.tpu_plan`) and the benchmarks (bench/train_step.py,
bench/gpu_check.py). Pure arithmetic on ints: nothing is compiled or allocated.

A forward over rows x T tokens costs 2 x (matmul parameters of the decoder layers) per token, plus
4 x T x heads x head_dim per token per layer for the two attention products (a convention: the
full T x T score matrix, masked; the "xla" path over a sequence of 64 tokens or more forms only
its causal query blocks, (n + 1) / 2n of that with n blocks, `attention.causal_xla_attention`, so
there the formula counts more attention work than runs), plus 2 x hidden x vocab for each position
that goes through the lm_head. The update is 3 student forwards (forward + backward), the reference forward
when the KL term reads reference params, and the teacher forward when it runs inside the update.
Rematerialisation recomputes one more student forward on the hardware; these are model FLOPs,
without it.
"""

from __future__ import annotations

from sdar_jax.models.config import ModelConfig


def forward_flops(config: ModelConfig, rows: int, length: int, head_positions: int) -> int:
  """Model FLOPs of one forward over rows x length tokens with `head_positions` positions per row
  through the lm_head (the formula above). Every layer is counted at every position, as the
  scanned layers of TPU / GPU run them; unrolled (CPU), the update's last layer skips the prompt
  positions (`sdar_jax.models.qwen.apply`'s `keep_last`), so there this counts more than is run."""
  L, D, N, K, H, F, V = (
    config.num_layers,
    config.hidden_size,
    config.num_heads,
    config.num_kv_heads,
    config.head_dim,
    config.intermediate_size,
    config.vocab_size,
  )
  layer_matmul_params = D * N * H + 2 * D * K * H + N * H * D + 3 * D * F
  tokens = rows * length
  layers = 2 * layer_matmul_params * L * tokens
  attention = 4 * length * N * H * L * tokens
  head = 2 * D * V * rows * head_positions
  return layers + attention + head


def update_flops(
  config: ModelConfig,
  batch_size: int,
  prompt_len: int,
  response_len: int,
  *,
  with_ref: bool,
  teacher_prompt_len: int | None = None,
) -> dict[str, int]:
  """Model FLOPs of one update: student forward + backward (3 forwards), the reference forward
  when the KL term reads reference params, and the teacher forward when it runs inside the update
  (`teacher_prompt_len` given)."""
  student = forward_flops(config, batch_size, prompt_len + response_len, response_len)
  out = {"student_fwd_bwd": 3 * student}
  if with_ref:
    out["reference_fwd"] = student
  if teacher_prompt_len is not None:
    out["teacher_fwd"] = forward_flops(
      config, batch_size, teacher_prompt_len + response_len, response_len
    )
  return out


def decode_flops(config: ModelConfig, rows: int, cache_size: int, steps: int) -> int:
  """Model FLOPs of `steps` decode steps of `rows` rows: one token per row and step through the
  layers and the lm_head, attending over the whole cache of `cache_size` slots (masked), as the
  sampler's loop does."""
  L, N, H = config.num_layers, config.num_heads, config.head_dim
  one_token = forward_flops(config, 1, 1, 1) - 4 * N * H * L  # layers + lm_head, no attention
  return rows * steps * (one_token + 4 * cache_size * N * H * L)
