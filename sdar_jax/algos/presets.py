"""The paper's methods (docs/reference.md §2, §6) as `AlgoConfig`s: each preset is
`dataclasses.replace` of the defaults (plain GRPO with the reference's values), so a preset states
only how it differs. `get_preset(name)` returns one; override fields with `dataclasses.replace`
or, in a run config, `--config.algo.<field>=...`.
"""

from __future__ import annotations

import dataclasses

from sdar_jax.algos.config import AlgoConfig
from sdar_jax.algos.reflection import Reflection
from sdar_jax.algos.sections import EMA, UCOB, AgentOPSD, Retire, TeacherStage
from sdar_jax.algos.skill_memory import SkillMemory

BASE = AlgoConfig()
_SDAR = {"distill": "sdar", "lam": 0.01, "beta": 5.0, "gate": "gap", "form": "reference"}


def _preset(name: str, **changes) -> AlgoConfig:
  # teacher=None: whether the teacher is scored follows from the preset's own terms
  return dataclasses.replace(BASE, name=name, teacher=None, **changes)


ALGO_PRESETS: dict[str, AlgoConfig] = {
  preset.name: preset
  for preset in (
    _preset("grpo"),
    _preset("sdar", **_SDAR),
    # OPSD: SDAR's term alone; advantages computed but the PPO term weighs 0 (docs/reference.md §2.2).
    _preset("opsd", **{**_SDAR, "pg_coef": 0.0}),
    # GRPO+OPSD: β = 0 makes the gap gate exactly 0.5 (docs/reference.md §2.3).
    _preset("grpo_opsd", **{**_SDAR, "beta": 0.0}),
    # RLSD: no extra term, teacher re-weighted token advantages λ0 = 0.5 -> 0 over 100 steps.
    _preset("rlsd", advantage="rlsd"),
    # Skill-SD: + c·ρ·k3 with c = 0.001 (docs/reference.md §2.5).
    _preset("skill_sd", distill="skill_sd", lam=0.001),
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
    # Ours: the gate over the whole vocabulary (form "vocab", a gated forward KL from the
    # teacher's distribution) with the teacher on the frozen initial policy; λ = 0.5 measured on
    # the offline ALFWorld demo (0.2 gained less; the shared-weights teacher collapsed).
    _preset(
      "sdar_vocab",
      **{
        **_SDAR,
        "form": "vocab",
        "lam": 0.5,
        "teacher_source": "update",
        "teacher_weights": "initial",
      },
    ),
    # Ours, after UCOB's top-k distillation (not UCOB's loss: docs/reference.md §11.5): the vocab
    # form over the teacher's 32 most likely tokens at each position (algo.top_k), same teacher
    # and λ as sdar_vocab.
    _preset(
      "sdar_topk",
      **{
        **_SDAR,
        "form": "topk",
        "top_k": 32,
        "lam": 0.5,
        "teacher_source": "update",
        "teacher_weights": "initial",
      },
    ),
    # SDAR's successors, each a setting of the same update (docs/reference.md §11).
    # RetireOPD (arXiv 2609.20784; no public code) in its two stages: stage 1 trains a
    # skill-conditioned teacher with the reward (`skill_grpo`, as many iterations as stage 2 unless
    # algo.teacher_stage.iterations says), stage 2 distils SDAR's term from that frozen teacher (the
    # skills inside its user message, as it was trained) and retires the term for good once the
    # reverse KL to it stops falling over fixed windows of W iterations and the student's
    # validation success nears the teacher's (algos.Retirement; W = 5, progress <= 0, competence
    # >= 0.9: our choices where the paper's text was not at hand, docs/reference.md §11.4).
    _preset(
      "retire_opd",
      **{
        **_SDAR,
        "teacher_weights": "frozen",
        "teacher_context": "message",
        "teacher_stage": TeacherStage(preset="skill_grpo"),
        "retire": Retire(window=5),
      },
    ),
    # UCOB as published (TU2021/UCOB@d38292c, its ALFWorld launcher), its evolving skill memory
    # giving the "good" view's skills (the policy writes them): mixed rollouts, the better view's response
    # distilled into the other view's context over the teacher view's top 32 renormalised, gated
    # once per position, coefficient 0.1, on GiGPO's advantages (`PRESET_RUN_SETTINGS`).
    _preset(
      "ucob",
      distill="ucob",
      lam=0.1,
      beta=5.0,
      gate="gap",
      top_k=32,
      entropy_coef=0.0,
      views="mixed",
      teacher_source="update",
      teacher_weights="old",
      ucob=UCOB(memory=True),  # the good view's skills from the evolving memory (policy-written)
      # and UCOB's reflection training: the policy's skill-writing tokens on the skills' utilities
      skill_memory=SkillMemory(train=True),
    ),
    # AgentOPSD as published: GRPO's advantage scaled by a bounded factor from the z-scored
    # increments of a per-episode success belief that starts at the group's success rate.
    _preset("agent_opsd", advantage="agent_opsd"),
    # Ours, after AgentOPSD's anchoring ablation: the belief increment's magnitude in place of
    # GRPO's, signed by A, scaled by the group's RMS, from V_0 = 0.5.
    _preset("agent_opsd_rms", advantage="agent_opsd_rms", agent_opsd=AgentOPSD(eps=1e-4)),
    # GRSD's advantage rule as published (its launchers' G_HAT_MAX 0.2): GRPO's advantage scaled
    # by the teacher's turn-mean gap within [0.9, 1.1], in mixed groups only. Its teacher reads a
    # reflection prior; ours reads the skills.
    _preset("grsd", advantage="grsd"),
    # GRSD as its reflect launcher runs it (docs/reference.md, "GRSD with reflections"): the
    # policy reflects on each episode, writes its group's DO/AVOID prior (the teacher's context,
    # mixed groups only), and its reflection tokens get GRPO at α 0.01 on a judge's 0-3 score
    # (an OpenAI-compatible endpoint: algo.reflection.judge_url / .judge_model).
    _preset(
      "grsd_reflect",
      advantage="grsd",
      context="reflection",
      reflection=Reflection(reflector="policy", judge="openai", loss_coef=0.01),
    ),
    # The repository's ablation: an external model (algo.reflection.url / .model) writes the
    # reflections, only in mixed groups, and the prior; nothing is judged or trained on them.
    _preset(
      "grsd_reflect_external",
      advantage="grsd",
      context="reflection",
      reflection=Reflection(
        reflector="openai", every_episode=False, temperature=0.0, tokens=1024, obs_chars=1200
      ),
    ),
    # Ours, after SDPO (arXiv 2601.20802; lasgroup/SDPO@0e6d510; docs/reference.md, "SDPO"): its
    # self-distillation loss in place of the policy gradient (top-100 divergence with a tail
    # bucket, α = 0.5, importance ratio clipped at 2), the teacher an EMA of the policy at 0.05
    # per iteration, reprompted with a success of the group, else the feedback of the next
    # observation.
    _preset(
      "sdpo",
      distill="sdpo",
      lam=1.0,
      pg_coef=0.0,
      kl_coef=0.0,
      entropy_coef=0.0,
      teacher_source="update",
      teacher_weights="ema",
      ema=EMA(decay=0.95),
      context="sibling_or_hindsight",
    ),
    # Ours, after OPID (arXiv 2606.26790; jinyangwu/OPID@37a15a5; docs/reference.md, "OPID"):
    # GRPO's advantage plus 0.001 x the shift of θ_old's log-prob of each response token under a
    # hindsight skill mined from its own finished episode (an analyzer endpoint by default).
    # ℓ_old as verl's actor recomputes it: the shift then compares two passes of one scorer.
    _preset("opid", advantage="opid", context="opid", recompute_old_logp=True),
  )
}


# What a preset sets outside the `algo` section, as dotted run-config keys (configs/common.base
# applies them with the preset): UCOB trains on GiGPO's advantages (adv_estimator gigpo,
# step_advantage_w 1.0, mode mean_norm: no division by the std, γ 0.95).
PRESET_RUN_SETTINGS: dict[str, dict[str, object]] = {
  "ucob": {
    "rollout.shaping.step_adv_coef": 1.0,
    "rollout.shaping.norm_adv_by_std": False,
    "rollout.shaping.step_gamma": 0.95,
    "rollout.shaping.step_anchor": "observation",
  },
}


def get_preset(name: str) -> AlgoConfig:
  """Preset `name` (immutable: derive variants with `dataclasses.replace`)."""
  try:
    return ALGO_PRESETS[name]
  except KeyError:
    raise ValueError(
      f"unknown algo {name!r}. Fix: use one of the presets {sorted(ALGO_PRESETS)}"
    ) from None
