"""The sections of `AlgoConfig` that only one part of the objective reads: PPO's ratio clip and
each method's own settings (`algo.ppo.*`, `algo.rlsd.*`, `algo.grsd.*`, `algo.agent_opsd.*`,
`algo.retire.*`, `algo.ema.*`, `algo.ucob.*`, `algo.teacher_stage.*`). Frozen and hashable like `AlgoConfig`, which checks their values
(`AlgoConfig._problems`); docs/reference.md §2 and §11 give each method's source."""

from __future__ import annotations

import dataclasses

from sdar_jax.algos.contexts import Hindsight, Sibling
from sdar_jax.algos.opid import OPID
from sdar_jax.algos.reflection import Reflection
from sdar_jax.algos.sdpo import SDPO
from sdar_jax.algos.skill_memory import SkillMemory


@dataclasses.dataclass(frozen=True)
class PPOClip:
  """The PPO ratio's clip (docs/reference.md §1.3)."""

  clip_low: float = 0.2
  """ratio >= 1 − clip_low; in [0, 1)."""
  clip_high: float = 0.2
  """ratio <= 1 + clip_high."""
  clip_c: float = 3.0
  """Dual-clip bound c > 1 for negative advantages."""


@dataclasses.dataclass(frozen=True)
class RLSD:
  """RLSD's token advantages A·((1 − λ) + λ·clip(exp(sign(A)·(lT − lold)), 1 ± clip_eps))."""

  lam0: float = 0.5
  """The initial teacher weight λ0 in [0, 1]; it decays linearly to 0."""
  warmdown_iterations: int = 100
  """Training iterations over which λ decays from lam0 to 0."""
  clip_eps: float = 0.2
  """The teacher weight exp(sign(A)·(lT − lold)) is clipped to [1 − eps, 1 + eps]."""


@dataclasses.dataclass(frozen=True)
class GRSD:
  """GRSD's turn advantages A' = A·max(1 + scale·clip(q̃·m, −clip, clip)·m, floor)."""

  scale: float = 0.5
  """GRSD's λ."""
  clip: float = 0.2
  """GRSD's G_HAT_MAX: every launcher's 0.2 keeps the factor in [0.9, 1.1] (the function's
  default is 3)."""
  floor: float = 0.1
  """The smallest factor a turn's advantage is multiplied by (keeps its sign)."""


@dataclasses.dataclass(frozen=True)
class AgentOPSD:
  """AgentOPSD's turn advantages A' = A·((1 − lam) + lam·m), m = clip(1 + band·sign(A)·z,
  1 − band, 1 + band)."""

  lam: float = 0.5
  """The launcher's mult_lambda, in [0, 1]."""
  band: float = 0.2
  """The multiplier's band b, in [0, 1)."""
  eps: float = 1e-6
  """V is clamped to [eps, 1 − eps] (and eps is added to the episode's std), in (0, 0.5);
  `agent_opsd_rms` uses 1e-4."""
  v0: float = 0.5
  """`agent_opsd_rms` only: the fixed success belief V_0 every episode starts from, in (0, 1)
  (`agent_opsd` starts from the group's success rate)."""


@dataclasses.dataclass(frozen=True)
class Retire:
  """RetireOPD's rule (`algos.Retirement`)."""

  window: int = 0
  """W: 0 never retires the distillation; W >= 1 retires it (λ = 0 and the teacher no longer
  scored for the rest of the run) once progress ≤ `progress` and competence ≥ `competence`, both
  measured over windows of W iterations, checked at each evaluation."""
  progress: float = 0.0
  """Retire once progress_t = (K_{t−W} − K_t) / K_{t−W} is at most this (K: the mean reverse KL
  −(lT − lθ) of the last W iterations' rollouts)."""
  competence: float = 0.9
  """Retire once competence_t = (SR_t + SR_{t−1}) / (2·SR_teacher) is at least this (SR:
  validation success rate; SR_teacher: the frozen teacher's, with its skills, at the start)."""
  windows: str = "fixed"
  """How K is averaged (`RETIRE_WINDOWS`): "fixed" (the paper's: non-overlapping blocks of W
  iterations, 1..W, W+1..2W, ...; K_t is the last complete block's mean, K_{t−W} the block
  before it) or "sliding" (the last W iterations and the W before them, at every check; this
  repository's rule until 2026-12-07)."""


@dataclasses.dataclass(frozen=True)
class EMA:
  """The EMA teacher (algo.teacher_weights="ema"): ema ← decay·ema + (1 − decay)·params."""

  decay: float = 0.95
  """In [0, 1) (0: the teacher is the policy as last updated); 0.95 is SDPO's
  teacher_update_rate 0.05. The EMA starts from the params."""
  every: str = "iteration"
  """When it moves (`EMA_CADENCES`): "iteration" (SDPO's: once per training iteration, after its
  updates, if at least one was applied), "update" (after every applied optimizer update; needs
  teacher_source="update") or "manual" (only when a method hook asks,
  `IterationView.move_teacher_ema`)."""


@dataclasses.dataclass(frozen=True)
class UCOB:
  """UCOB's paired-view distillation (TU2021/UCOB@d38292c, `algorithm.ucob.cbsd` of
  verl/trainer/config/ucob_trainer.yaml and its ALFWorld launcher; `algos.ucob`)."""

  margin: float = 0.05
  """A pair distils only when the winner's return exceeds its target's baseline by more than
  this (cbsd.margin)."""
  tau: float = 0.2
  """A pair's weight is min(max(gap / tau, 0), weight_max) (cbsd.tau), tau > 0."""
  weight_max: float = 2.0
  """The largest pair weight (cbsd.weight_max)."""
  max_pairs: int = 2
  """Pairs kept per (GRPO group, state), largest gaps first; 0 keeps them all
  (cbsd.max_pairs_per_group)."""
  action_weight: float = 2.0
  """The weight's factor on the tokens of the response's action span; the others keep 1
  (cbsd.action_weight)."""
  gamma: float = 0.95
  """γ of the discounted returns the pairs compare (algorithm.gamma), in [0, 1]."""
  norm_to_one: bool = True
  """Renormalise the teacher view's top-k probabilities, and the student's on the same tokens,
  to sum to one (cbsd.topk_norm_to_one); False keeps the full-vocabulary log-probs."""
  clip_log_ratio: bool = False
  """Clamp log pT − log pθ to [−5, 5] inside the sum (cbsd.topk_clip_log_ratio)."""
  memory: bool = False
  """The good view's skills from the evolving skill memory (`algo.skill_memory`, retrieved per
  turn by the upper-confidence rule, written from the run's episodes) in place of env.skills'
  static ones (`algos.skill_memory_source.MemoryRetriever`); needs views "mixed"."""


@dataclasses.dataclass(frozen=True)
class TeacherStage:
  """A first stage that trains the frozen teacher (RetireOPD's stage 1): `python -m
  sdar_jax.train` trains preset `preset` in <workdir>/teacher, then this run with its final
  checkpoint as the teacher (`algo.teacher_weights="frozen"`, `algo.teacher_path`;
  sdar_jax.run.stages)."""

  preset: str = ""
  """The preset the first stage trains ("" = no first stage); its method settings replace this
  run's, the settings both presets share (temperature, KL, PPO clip, ...) are this run's."""
  iterations: int = 0
  """The first stage's iterations; 0 = this run's train.iterations."""


# AlgoConfig field -> its section's class
SECTIONS: dict[str, type] = {
  "ppo": PPOClip,
  "rlsd": RLSD,
  "grsd": GRSD,
  "agent_opsd": AgentOPSD,
  "retire": Retire,
  "ema": EMA,
  "ucob": UCOB,
  "teacher_stage": TeacherStage,
  # the teacher context sources' settings (sdar_jax.algos.contexts)
  "sibling": Sibling,
  "hindsight": Hindsight,
  "reflection": Reflection,  # source "reflection" (sdar_jax.algos.reflection)
  "skill_memory": SkillMemory,  # source "skill_memory" (sdar_jax.algos.skill_memory)
  "opid": OPID,  # OPID's source and advantage (sdar_jax.algos.opid)
  # SDPO's loss (sdar_jax.algos.sdpo)
  "sdpo": SDPO,
}
RETIRE_WINDOWS = ("fixed", "sliding")
