"""The objective library: pure, jittable GRPO / PPO / KL / entropy / SDAR gates and
distillation terms / baselines, each selectable by name (see the registries), and `AlgoConfig`,
the one schema of an algorithm, with the paper's methods as presets."""

from sdar_jax.algos.advantages import (
  ADVANTAGE_ESTIMATORS,
  ADVANTAGE_SCHEDULES,
  advantage_clip_eps,
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
from sdar_jax.algos.config import EMA_CADENCES, TEACHER_SOURCES, AlgoConfig
from sdar_jax.algos.contexts import (
  TEACHER_CONTEXTS,
  ContextRequest,
  Hindsight,
  Sibling,
  compose_teacher_contexts,
  context_metrics,
  register_context_source,
)
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
from sdar_jax.algos.presets import ALGO_PRESETS, PRESET_RUN_SETTINGS, get_preset
from sdar_jax.algos.reflection import Reflection, reflect_episodes
from sdar_jax.algos.registry import Registry
from sdar_jax.algos.retirement import Retirement, RetirementHooks
from sdar_jax.algos.sdpo import SDPO, sdpo_divergence, sdpo_loss
from sdar_jax.algos.sections import (
  EMA,
  GRSD,
  RLSD,
  SECTIONS,
  UCOB,
  AgentOPSD,
  PPOClip,
  Retire,
  TeacherStage,
)
from sdar_jax.algos.skill_memory import SkillMemory
from sdar_jax.algos.skill_memory_source import memory_round
from sdar_jax.algos.teacher_schedules import PASSED_TEACHER_WEIGHTS, TEACHER_WEIGHTS
from sdar_jax.algos.turn_credit import (
  TURN_ADVANTAGES,
  TurnTable,
  agent_opsd_advantages,
  agent_opsd_rms_advantages,
  grsd_advantages,
  register_turn_advantage,
  turn_rewrite,
)
from sdar_jax.algos.ucob import (
  UcobPairs,
  discounted_returns,
  ucob_loss,
  ucob_pairs,
  ucob_topk_term,
)

__all__ = [
  # teacher context sources (sdar_jax.algos.contexts)
  "TEACHER_CONTEXTS",
  "ContextRequest",
  "Hindsight",
  "Sibling",
  "compose_teacher_contexts",
  "context_metrics",
  "register_context_source",
  # source "reflection": reflector, judge, GRSD's prior (sdar_jax.algos.reflection)
  "Reflection",
  "reflect_episodes",
  # source "skill_memory": UCOB's evolving skill memory (sdar_jax.algos.skill_memory)
  "SkillMemory",
  "memory_round",
  # SDPO's loss (sdar_jax.algos.sdpo)
  "SDPO",
  "sdpo_divergence",
  "sdpo_loss",
  "ADVANTAGE_ESTIMATORS",
  "ADVANTAGE_SCHEDULES",
  "AGG_MODES",
  "ALGO_PRESETS",
  "BETA_FREE_GATES",
  "DISTILL_LOSSES",
  "EMA",
  "EMA_CADENCES",
  "GATED_TERMS",
  "GATES",
  "GRSD",
  "KL_PENALTIES",
  "METHOD_HOOKS",
  "PASSED_TEACHER_WEIGHTS",
  "PRESET_RUN_SETTINGS",
  "RLSD",
  "SDAR_FORMS",
  "SECTIONS",
  "TEACHER_SOURCES",
  "TEACHER_WEIGHTS",
  "TURN_ADVANTAGES",
  "UCOB",
  "VOCAB_FORMS",
  "AgentOPSD",
  "AlgoConfig",
  "IterationView",
  "MethodHooks",
  "PPOClip",
  "Registry",
  "Retire",
  "Retirement",
  "RetirementHooks",
  "TeacherStage",
  "TurnTable",
  "UcobPairs",
  "advantage_clip_eps",
  "advantage_teacher_weight",
  "agent_opsd_advantages",
  "agent_opsd_rms_advantages",
  "agg_loss",
  "apply_invalid_penalty",
  "build_hooks",
  "compute_gate",
  "discounted_returns",
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
  "topk_distill_term",
  "turn_rewrite",
  "ucob_loss",
  "ucob_pairs",
  "ucob_topk_term",
  "vocab_distill_term",
]
