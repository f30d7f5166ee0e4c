"""The sections of `AlgoConfig` that only one part of the objective reads: PPO's ratio clip and
each method's own settings (`algo.ppo.*`, `algo.rlsd.*`, `algo.grsd.*`, `algo.agent_opsd.*`,
`algo.retire.*`, `algo.ema.*`). Frozen and hashable like `AlgoConfig`, which checks their values
(`AlgoConfig._problems`); docs/reference.md §2 and §11 give each method's source."""

from __future__ import annotations

import dataclasses

from sdar_jax.algos.contexts import Hindsight, Sibling
from sdar_jax.algos.sdpo import SDPO


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


# AlgoConfig field -> its section's class
SECTIONS: dict[str, type] = {
  "ppo": PPOClip,
  "rlsd": RLSD,
  "grsd": GRSD,
  "agent_opsd": AgentOPSD,
  "retire": Retire,
  "ema": EMA,
  # the teacher context sources' settings (sdar_jax.algos.contexts)
  "sibling": Sibling,
  "hindsight": Hindsight,
  # SDPO's loss (sdar_jax.algos.sdpo)
  "sdpo": SDPO,
}
