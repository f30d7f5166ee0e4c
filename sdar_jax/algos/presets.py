"""One flat config dict per method of the paper's table (docs/reference.md §2, §6).

Every preset has the same keys (`PRESET_KEYS`), so a config system can start from
`get_preset(name)` and override single fields. The train step composes, per token batch:

    loss = pg_coef·PPO(advantage) + lam·distill − entropy_coef·H + kl_coef·KL(kl_kind)

with `advantage` "grpo" or "rlsd" (λ_k = rlsd_lambda(step, rlsd_lam0, rlsd_warmdown_steps)),
`distill` "none" | "sdar" (beta, gate, form) | "skill_sd". `teacher` says whether the method
needs teacher log-probs; `skills_in_student` is a rollout option (Skill-GRPO).
"""

from __future__ import annotations

import copy
from typing import Any

_BASE: dict[str, Any] = dict(
  name="grpo",
  pg_coef=1.0,
  distill="none",
  lam=0.0,
  beta=5.0,
  gate="gap",
  form="reference",
  advantage="grpo",
  rlsd_lam0=0.5,
  rlsd_warmdown_steps=100,
  rlsd_clip_eps=0.2,
  entropy_coef=0.001,
  kl_coef=0.01,
  kl_kind="low_var_kl",
  clip_low=0.2,
  clip_high=0.2,
  clip_c=3.0,
  agg="token-mean",
  norm_adv_by_std=True,
  invalid_penalty=0.1,
  skills_in_student=False,
  teacher=False,
)
PRESET_KEYS: tuple[str, ...] = tuple(_BASE)


def _preset(name: str, **overrides: Any) -> dict[str, Any]:
  unknown = set(overrides) - set(_BASE)
  if unknown:
    raise KeyError(f"preset {name!r} sets unknown keys {sorted(unknown)}")
  return {**_BASE, "name": name, **overrides}


_SDAR = dict(distill="sdar", lam=0.01, beta=5.0, gate="gap", form="reference", teacher=True)

ALGO_PRESETS: dict[str, dict[str, Any]] = {
  p["name"]: p
  for p in (
    _preset("grpo"),
    _preset("sdar", **_SDAR),
    # OPSD: SDAR's term alone; advantages computed but the PPO term weighs 0 (docs/reference.md §2.2).
    _preset("opsd", **{**_SDAR, "pg_coef": 0.0}),
    # GRPO+OPSD: β = 0 makes the gap gate exactly 0.5 (docs/reference.md §2.3).
    _preset("grpo_opsd", **{**_SDAR, "beta": 0.0}),
    # RLSD: no extra term, teacher re-weighted token advantages λ0 = 0.5 -> 0 over 100 steps.
    _preset("rlsd", advantage="rlsd", teacher=True),
    # Skill-SD: + c·ρ·k3 with c = 0.001 (docs/reference.md §2.5).
    _preset("skill_sd", distill="skill_sd", lam=0.001, teacher=True),
    # Skill-GRPO: plain GRPO with skills inside the student prompt (docs/reference.md §2.6).
    _preset("skill_grpo", skills_in_student=True),
    # Gate / form ablations of SDAR (gates: sdar_jax.algos.gates). The entropy and soft-OR gates
    # are our sound designs; the *_paper presets run the paper's formulas as written.
    _preset("sdar_entropy", **{**_SDAR, "gate": "entropy"}),
    _preset("sdar_soft_or", **{**_SDAR, "gate": "soft_or"}),
    _preset("sdar_entropy_paper", **{**_SDAR, "gate": "entropy_paper"}),
    _preset("sdar_soft_or_paper", **{**_SDAR, "gate": "soft_or_paper"}),
    _preset("sdar_constant", **{**_SDAR, "gate": "constant"}),
    _preset("sdar_reverse_kl", **{**_SDAR, "form": "reverse_kl"}),
  )
}


def get_preset(name: str) -> dict[str, Any]:
  """A fresh copy of preset `name`."""
  try:
    return copy.deepcopy(ALGO_PRESETS[name])
  except KeyError:
    raise ValueError(f"unknown algo preset {name!r}; valid names: {sorted(ALGO_PRESETS)}") from None
