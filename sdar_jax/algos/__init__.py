"""The objective library: pure, jittable GRPO / PPO / KL / entropy / SDAR gates and
distillation terms / baselines, each selectable by name (see the registries), and `AlgoConfig`,
the one schema of an algorithm, with the paper's methods as presets."""

from sdar_jax.algos.advantages import (
  ADVANTAGE_ESTIMATORS,
  ADVANTAGE_SCHEDULES,
  advantage_teacher_weight,
  apply_invalid_penalty,
  grpo_advantages,
  grpo_group_stats,
  rlsd_lambda,
  rlsd_token_advantages,
  token_advantages,
)
from sdar_jax.algos.aggregation import (
  AGG_MODES,
  agg_loss,
  masked_mean,
  seq_count,
  token_count,
)
from sdar_jax.algos.config import STEP_ANCHORS, TEACHER_SOURCES, AlgoConfig
from sdar_jax.algos.distill import (
  DISTILL_LOSSES,
  GATED_TERMS,
  SDAR_FORMS,
  VOCAB_FORMS,
  distill_loss,
  sdar_loss,
  skill_sd_loss,
  term_gate,
  term_metrics,
  topk_distill_term,
  vocab_distill_term,
)
from sdar_jax.algos.gates import BETA_FREE_GATES, GATES, compute_gate
from sdar_jax.algos.hooks import (
  METHOD_HOOKS,
  IterationView,
  MethodHooks,
  build_hooks,
  register_hooks,
)
from sdar_jax.algos.losses import (
  KL_PENALTIES,
  entropy_from_logits,
  entropy_loss,
  kl_loss,
  kl_penalty,
  policy_loss,
)
from sdar_jax.algos.presets import ALGO_PRESETS, get_preset
from sdar_jax.algos.registry import Registry
from sdar_jax.algos.retirement import Retirement, RetirementHooks
from sdar_jax.algos.teacher_schedules import TEACHER_WEIGHTS
from sdar_jax.algos.turn_credit import (
  TURN_ADVANTAGES,
  TurnTable,
  agent_opsd_advantages,
  agent_opsd_rms_advantages,
  grsd_advantages,
  register_turn_advantage,
  turn_rewrite,
)

__all__ = [
  "ADVANTAGE_ESTIMATORS",
  "ADVANTAGE_SCHEDULES",
  "AGG_MODES",
  "ALGO_PRESETS",
  "BETA_FREE_GATES",
  "DISTILL_LOSSES",
  "GATED_TERMS",
  "GATES",
  "KL_PENALTIES",
  "METHOD_HOOKS",
  "SDAR_FORMS",
  "STEP_ANCHORS",
  "TEACHER_SOURCES",
  "TEACHER_WEIGHTS",
  "TURN_ADVANTAGES",
  "VOCAB_FORMS",
  "AlgoConfig",
  "IterationView",
  "MethodHooks",
  "Registry",
  "Retirement",
  "RetirementHooks",
  "TurnTable",
  "agent_opsd_advantages",
  "agent_opsd_rms_advantages",
  "advantage_teacher_weight",
  "agg_loss",
  "apply_invalid_penalty",
  "build_hooks",
  "compute_gate",
  "distill_loss",
  "entropy_from_logits",
  "entropy_loss",
  "get_preset",
  "grpo_advantages",
  "grpo_group_stats",
  "grsd_advantages",
  "kl_loss",
  "kl_penalty",
  "masked_mean",
  "policy_loss",
  "register_hooks",
  "register_turn_advantage",
  "rlsd_lambda",
  "rlsd_token_advantages",
  "sdar_loss",
  "seq_count",
  "skill_sd_loss",
  "term_gate",
  "term_metrics",
  "token_advantages",
  "token_count",
  "turn_rewrite",
  "topk_distill_term",
  "vocab_distill_term",
]
