"""`AlgoConfig`: every setting of a training algorithm in one frozen dataclass that checks itself.

It is the single schema of the algorithm: the presets (`sdar_jax.algos.presets`) are
`dataclasses.replace` of its defaults, a run config's `algo` section is generated from it
(configs/common.algo), the update reads it as a jit static (it is hashable), and the rollout side
reads its advantage / prompt fields. The update composes, per token batch:

    loss = pg_coef·PPO(advantage) + lam·distill − entropy_coef·H + kl_coef·KL(kl_kind)

Names (gate, form, distill, advantage, kl_kind, agg) are looked up in the registries of
`sdar_jax.algos` when the config is built, so a newly registered gate or loss term is selectable
by name with no other change (docs/extending.md).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

from sdar_jax.algos import ucob  # noqa: F401 (registers the "ucob" term and its hooks)
from sdar_jax.algos.advantages import ADVANTAGE_ESTIMATORS
from sdar_jax.algos.aggregation import AGG_MODES
from sdar_jax.algos.contexts import Hindsight, Sibling, context_names, context_problems
from sdar_jax.algos.distill import (
  DISTILL_LOSSES,
  HEAD_TERMS,
  SDAR_FORMS,
  VOCAB_FORMS,
  WEIGHTED_TERMS,
)
from sdar_jax.algos.gates import GATES
from sdar_jax.algos.hooks import METHOD_HOOKS
from sdar_jax.algos.losses import KL_PENALTIES
from sdar_jax.algos.opid import OPID, opid_problems
from sdar_jax.algos.reflection import Reflection, reflection_problems
from sdar_jax.algos.sdpo import SDPO, sdpo_problems
from sdar_jax.algos.sections import (
  EMA,
  GRSD,
  RETIRE_WINDOWS,
  RLSD,
  SECTIONS,
  UCOB,
  AgentOPSD,
  PPOClip,
  Retire,
  TeacherStage,
)
from sdar_jax.algos.skill_memory import SkillMemory, skill_memory_problems
from sdar_jax.algos.teacher_schedules import PASSED_TEACHER_WEIGHTS, TEACHER_WEIGHTS
from sdar_jax.algos.turn_credit import TURN_ADVANTAGES
from sdar_jax.config_keys import MOVED_ON, RENAMED_VALUES, translate_section

TEACHER_SOURCES = ("rollout", "update")
EMA_CADENCES = ("iteration", "update", "manual")
SKILL_PLACES = ("block", "message")  # algo.teacher_context: where the teacher prompt has skills
VIEWS = ("single", "mixed")  # algo.views: which prompt each training episode plays with


def _is_number(value: Any, low: float = float("-inf")) -> bool:
  """A real int or float (not a bool) that is >= low."""
  return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= low


@dataclasses.dataclass(frozen=True)
class AlgoConfig:
  """One algorithm of docs/reference.md §2 (defaults: plain GRPO with the reference's values).

  Invalid values raise ValueError listing every problem, one line each, as
  "algo.<field>=<value>: <problem>. Fix: <what to do>". The settings only one part of the
  objective reads are in sections (`algos.sections`: algo.ppo, .rlsd, .grsd, .agent_opsd,
  .retire, .ema); reward shaping is the rollout's (rollout.shaping).
  """

  name: str = "grpo"
  """The preset it started from (a label for logs; nothing reads it to decide anything)."""
  pg_coef: float = 1.0
  """Weight of the PPO policy-gradient term; 0 leaves the distillation term alone (OPSD)."""
  distill: str = "none"
  """Distillation term (`DISTILL_LOSSES`): "none", "sdar" (gated, uses beta / gate / form),
  "skill_sd" (c·ρ·k3) or "ucob" (UCOB's top-k term on its paired rows, `algos.ucob`). Any term
  needs the teacher's log-probs."""
  lam: float = 0.0
  """λ, the weight of the distillation term (SDAR 0.01; Skill-SD's c = 0.001)."""
  beta: float = 5.0
  """β, the sharpness of the SDAR gate σ(β·…); 0 makes every sigmoid gate 0.5."""
  gate: str = "gap"
  """SDAR gate (`GATES`): "gap" σ(βΔ), "entropy", "soft_or", "constant", the ln V versions
  "entropy_lnv" / "soft_or_lnv" (the entropy gates until 2026-12-04), and the paper's literal
  "entropy_paper" / "soft_or_paper" (sdar_jax/algos/gates.py)."""
  form: str = "reference"
  """SDAR per-token form (`SDAR_FORMS`): "reference" g·(sg(lT) − lθ), "reverse_kl" −g·sg(Δ)·lθ
  (sampled tokens), "vocab" Σ_v sg(pT(v)·g_v)·(sg(lT(v)) − lθ(v)) (every vocabulary entry gated
  by its own gap; needs teacher_source="update", `algos.vocab_distill_term`), "topk" the same sum
  over the teacher's `top_k` most likely tokens (`algos.topk_distill_term`)."""
  top_k: int = 32
  """Form "topk": how many of the teacher's most likely tokens each response position sums over
  (their own probabilities, not renormalised; capped at the vocabulary size, where "topk" equals
  "vocab"). Also the k of UCOB's term (distill="ucob"). Read by no other form."""
  vocab_chunk: int = 64
  """Forms "vocab" / "topk": response positions per chunk of the lm_head pass that forms both
  branches' [mb, chunk, V] log-softmax (scanned, each chunk recomputed in the backward pass), so
  no [mb, R, V] array is live at once; a response of at most this many slots (the offline demo's)
  is one chunk, the unchunked computation. 0 = never chunk."""
  advantage: str = "grpo"
  """Token-advantage estimator (`ADVANTAGE_ESTIMATORS`): "grpo", "rlsd" (teacher re-weighted
  per token), or a turn-level one of `algos.TURN_ADVANTAGES` ("agent_opsd", "agent_opsd_rms",
  "grsd": each turn-sample's advantage rewritten from its turn's teacher gap over the whole
  iteration before the updates; need teacher_source="rollout"). All but "grpo" read the teacher's
  log-probs (a newly registered token-level estimator that does too needs teacher=True)."""
  entropy_coef: float = 0.001
  """Weight of the entropy bonus (subtracted from the loss)."""
  kl_coef: float = 0.01
  """Weight of the KL penalty to the frozen initial policy (0 = no reference policy kept, unless
  `measure_kl`)."""
  measure_kl: bool = False
  """Log `actor/kl_loss` (kl_kind's estimate to the frozen initial policy) also at kl_coef 0: the
  initial params kept, one forward pass without gradient per micro-batch; the loss unchanged."""
  kl_kind: str = "low_var_kl"
  """KL estimator (`KL_PENALTIES`); "low_var_kl" is k3, clipped to [-10, 10] as verl."""
  agg: str = "token-mean"
  """How per-token losses are aggregated (`AGG_MODES`)."""
  ppo: PPOClip = dataclasses.field(default_factory=PPOClip)
  """PPO's ratio clip (`algo.ppo.clip_low`, `.clip_high`, `.clip_c`)."""
  rlsd: RLSD = dataclasses.field(default_factory=RLSD)
  """RLSD's settings (advantage "rlsd": `algo.rlsd.lam0`, `.warmdown_iterations`, `.clip_eps`)."""
  grsd: GRSD = dataclasses.field(default_factory=GRSD)
  """GRSD's settings (advantage "grsd": `algo.grsd.scale`, `.clip`, `.floor`)."""
  agent_opsd: AgentOPSD = dataclasses.field(default_factory=AgentOPSD)
  """AgentOPSD's settings (advantages "agent_opsd", "agent_opsd_rms": `algo.agent_opsd.lam`,
  `.band`, `.eps`, `.v0`)."""
  retire: Retire = dataclasses.field(default_factory=Retire)
  """RetireOPD's rule (`algo.retire.window`, `.progress`, `.competence`; window 0: never)."""
  ema: EMA = dataclasses.field(default_factory=EMA)
  """The EMA teacher's decay and cadence (teacher_weights="ema": `algo.ema.decay`, `.every`)."""
  ucob: UCOB = dataclasses.field(default_factory=UCOB)
  """UCOB's pairs and top-k term (distill="ucob": `algo.ucob.margin`, `.tau`, `.weight_max`,
  `.max_pairs`, `.action_weight`, `.gamma`, `.norm_to_one`, `.clip_log_ratio`)."""
  teacher_stage: TeacherStage = dataclasses.field(default_factory=TeacherStage)
  """A first stage that trains the frozen teacher (`algo.teacher_stage.preset`, `.iterations`; run by
  `python -m sdar_jax.train`, sdar_jax.run.stages)."""
  context: Any = "skills"
  """The teacher's privileged context (`algos.TEACHER_CONTEXTS`): one source name or several
  (a comma-separated string or a list), composed after the rollout in that order: "skills" (the
  retrieved skill block, the reference's), "sibling", "hindsight" or a registered one."""
  context_templates: str = ""
  """A template file replacing sections of sdar_jax/algos/context_templates.md ("": none)."""
  sibling: Sibling = dataclasses.field(default_factory=Sibling)
  """Source "sibling"'s settings (`algo.sibling.tokens`)."""
  hindsight: Hindsight = dataclasses.field(default_factory=Hindsight)
  """Source "hindsight"'s settings (`algo.hindsight.k`, `.outcome`, `.tokens`)."""
  reflection: Reflection = dataclasses.field(default_factory=Reflection)
  """Source "reflection"'s reflector, judge and reflection-training term (`algos.reflection`)."""
  skill_memory: SkillMemory = dataclasses.field(default_factory=SkillMemory)
  """Source "skill_memory"'s writer, retrieval and utility rules (`algos.skill_memory`)."""
  opid: OPID = dataclasses.field(default_factory=OPID)
  """OPID's analyzer and teacher-term weight (source and advantage "opid", `algos.opid`)."""
  sdpo: SDPO = dataclasses.field(default_factory=SDPO)
  """SDPO's loss (distill "sdpo": `algo.sdpo.top_k`, `.alpha`, `.is_clip`, `.add_tail`)."""
  skills_in_student: bool = False
  """Put the retrieved skills into the student's own prompt (Skill-GRPO); rollout."""
  teacher: bool | None = None
  """Score the teacher's log-probs. None (the default) resolves to whether a term reads them
  (distill != "none", or advantage "rlsd", "agent_opsd" or "grsd"); True also scores them for the
  teacher/* metrics alone; False is refused when a term needs them."""
  teacher_source: str = "rollout"
  """"rollout": teacher log-probs scored once per iteration at θ_old and kept through every
  mini-batch (the reference); "update": re-scored inside each update at the current weights."""
  teacher_weights: str = "current"
  """Whose weights the teacher branch runs: "current" (the policy being trained, given the skills:
  the reference) or "initial" (the frozen initial policy, the one the KL term reads, given the
  skills). Sharing weights lets the update close the teacher-student gap from the teacher's side
  too, by making the model ignore the skill block: on the demo, form "vocab" with λ = 1 drove
  both branches to the same broken policy; a frozen teacher is a fixed target. "ema": an
  exponential moving average of the policy (`algo.ema`), kept in the train state and
  checkpointed with it. "frozen": a trained teacher read once from `teacher_path` (RetireOPD's
  stage-1 teacher). "old": θ_old, the policy as it was before the iteration's first update,
  re-read by every update of the iteration (UCOB's reference view)."""
  teacher_path: str = ""
  """teacher_weights="frozen": the teacher's weights, a checkpoint folder (a run's checkpoints/ or
  its workdir: the latest step) or a Hugging Face folder (config.json + *.safetensors). Left
  empty when `teacher_stage` trains the teacher first (the stage sets it)."""
  teacher_context: str = "block"
  """Where the teacher's prompt holds the skills (`SKILL_PLACES`): "block", the privileged
  block in front of the student's prompt (SDAR), or "message", inside the user message as
  Skill-GRPO's student reads them (a teacher trained with the skills in its prompt: RetireOPD's
  stage-1 teacher)."""
  views: str = "single"
  """Which prompt each training episode plays with (`VIEWS`): "single" (the student's), or
  "mixed" (UCOB's rollout: in each GRPO group the first half plays without the skills, the rest
  with them inside the user message; each turn's teacher prompt is the other view's)."""
  hooks: str = ""
  """Method hooks this run asks for by name, comma-separated (`algos.METHOD_HOOKS`, e.g. a user's
  registered with `algos.register_hooks`); the built-in methods' hooks select themselves from the
  other fields."""
  temperature: float = 1.0
  """Logits are divided by it when tokens are scored; configs link it to rollout.temperature, so
  tokens are scored at the temperature they were sampled at."""
  recompute_old_logp: bool = False
  """Re-score the sampled tokens with a no-grad forward at θ_old after the rollout and use those
  as the old log-probs (the reference does); the sampler's own otherwise."""

  def __post_init__(self):
    if isinstance(self.context, list):  # a config's list of sources: hashable as a tuple
      object.__setattr__(self, "context", tuple(self.context))
    errors = []
    for name, cls in SECTIONS.items():  # a section given as a mapping (a config's ConfigDict)
      value = getattr(self, name)
      if isinstance(value, cls):
        continue
      try:
        items = dict(value.to_dict() if hasattr(value, "to_dict") else value)
      except (TypeError, ValueError):
        errors.append(
          f"algo.{name}={value!r}: must be a section. Fix: set its keys, e.g. "
          f"--config.algo.{name}.{dataclasses.fields(cls)[0].name}=..."
        )
        continue
      known = [f.name for f in dataclasses.fields(cls)]
      unknown = [k for k in items if k not in known]
      if unknown:
        errors += [
          f"algo.{name}.{k}: not a setting of algo.{name}. Fix: use one of {known}" for k in unknown
        ]
        continue
      object.__setattr__(self, name, cls(**items))
    problems = errors or self._problems()
    if problems:
      raise ValueError("\n".join(problems))

  @property
  def scores_teacher(self) -> bool:
    """Whether the teacher's log-probs are scored: `teacher` when set, else whether a term reads
    them (kept unresolved in the field, so a variant that adds or drops a term follows it)."""
    return self.terms_need_teacher if self.teacher is None else self.teacher

  @property
  def needs_ref_params(self) -> bool:
    """Whether the update reads the frozen initial policy: the KL term, or a frozen teacher."""
    # an EMA teacher starts from the params and lives in the train state (`keeps_ema`)
    return self.measures_kl or (self.scores_teacher and self.teacher_weights == "initial")

  @property
  def measures_kl(self) -> bool:
    """Whether the update computes the KL to the initial policy: as a term, or as a metric only."""
    return bool(self.kl_coef) or bool(self.measure_kl)

  @property
  def context_names(self) -> tuple[str, ...]:
    """`context` as a tuple of source names."""
    return context_names(self.context)

  @property
  def records_skill_block(self) -> bool:
    """Whether the rollout retrieves each turn's skill block for the teacher (source "skills")."""
    return self.scores_teacher and "skills" in self.context_names

  @property
  def context_beyond_skills(self) -> bool:
    """Whether a source other than the rollout's skill block gives the teacher's context (the
    token view then composes it on the evaluation's episodes as training does)."""
    return any(name != "skills" for name in self.context_names)

  @property
  def hook_names(self) -> tuple[str, ...]:
    """`hooks` as a tuple of names."""
    return tuple(n.strip() for n in str(self.hooks or "").split(",") if n.strip())

  @property
  def keeps_ema(self) -> bool:
    """Whether the train state carries an EMA of the params (the teacher's weights)."""
    return self.scores_teacher and self.teacher_weights == "ema"

  @property
  def vocab_distill(self) -> bool:
    """Whether the distillation term reads both branches' whole distributions (SDAR's forms
    "vocab" / "topk", UCOB's top-k term, SDPO's loss)."""
    head = self.distill in HEAD_TERMS or self.distill == "sdpo"
    return (self.distill == "sdar" and self.form in VOCAB_FORMS) or head

  @property
  def reads_distill_weight(self) -> bool:
    """Whether the distillation term reads the batch's per-token weights (UCOB): the rows that
    hold weights are distillation rows, left out of the PPO, entropy and KL terms."""
    return self.distill in WEIGHTED_TERMS

  @property
  def passes_teacher_params(self) -> bool:
    """Whether the trainer hands the teacher's weights over (teacher_weights "frozen": read from
    teacher_path; "old": copied before the iteration's first update)."""
    return self.scores_teacher and self.teacher_weights in PASSED_TEACHER_WEIGHTS

  @property
  def terms_need_teacher(self) -> bool:
    """Whether a loss term or the advantage estimator reads the teacher's log-probs."""
    return self.distill != "none" or self.advantage in ("rlsd", "opid", *TURN_ADVANTAGES)

  @property
  def turn_advantages(self) -> bool:
    """Whether the advantage estimator rewrites each turn-sample's advantage before the updates
    (AgentOPSD, GRSD: `algos.TURN_ADVANTAGES`)."""
    return self.advantage in TURN_ADVANTAGES

  @property
  def retires(self) -> bool:
    """Whether the distillation may be retired during the run (RetireOPD, retire.window >= 1)."""
    return self.retire.window > 0

  def retired(self) -> AlgoConfig:
    """This algorithm after RetireOPD's retirement: no distillation term, no teacher scored (so no
    turn-level teacher advantage either), nothing more to retire."""
    return dataclasses.replace(
      self,
      distill="none",
      lam=0.0,
      teacher=None,
      teacher_weights="current",
      advantage="grpo",
      retire=dataclasses.replace(self.retire, window=0),
      teacher_stage=TeacherStage(),
    )

  def _problems(self) -> list[str]:
    """Every invalid value, one "algo.<field>=<value>: <problem>. Fix: <fix>" line each."""
    out: list[str] = []

    def at(field: str) -> Any:  # "rlsd.lam0" reads self.rlsd.lam0
      node: Any = self
      for part in field.split("."):
        node = getattr(node, part)
      return node

    def bad(field: str, problem: str, fix: str) -> None:
      out.append(f"algo.{field}={at(field)!r}: {problem}. Fix: {fix}")

    for field, valid in (
      ("distill", DISTILL_LOSSES.names()),
      ("gate", GATES.names()),
      ("form", SDAR_FORMS.names()),
      ("advantage", ADVANTAGE_ESTIMATORS.names()),
      ("kl_kind", KL_PENALTIES.names()),
      ("agg", AGG_MODES.names()),
      ("teacher_source", sorted(TEACHER_SOURCES)),
      ("teacher_weights", sorted(TEACHER_WEIGHTS)),
    ):
      renamed = RENAMED_VALUES.get(f"algo.{field}", {})
      if getattr(self, field) in renamed:  # an old name of a value
        new = renamed[getattr(self, field)]
        bad(field, f"this value is now {new!r} ({MOVED_ON})", f"use algo.{field}={new!r}")
      elif getattr(self, field) not in valid:
        bad(
          field,
          "unknown name",
          f"use one of {valid}, or register yours in a module of your own and name it with "
          "--imports=your.module",
        )
    for field in (
      "pg_coef",
      "lam",
      "beta",
      "entropy_coef",
      "kl_coef",
    ):
      if not _is_number(getattr(self, field), low=0):
        bad(field, "must be a number >= 0", "set it to a value >= 0")
    if not _is_number(self.ppo.clip_low, low=0) or self.ppo.clip_low >= 1:
      bad(
        "ppo.clip_low",
        "must be in [0, 1) (a lower clip of 1 or more makes the ratio bound <= 0)",
        "use a value in [0, 1), the reference uses 0.2",
      )
    if not _is_number(self.ppo.clip_high, low=0):
      bad("ppo.clip_high", "must be a number >= 0", "use 0.2 (the reference)")
    if not _is_number(self.ppo.clip_c) or not self.ppo.clip_c > 1:
      bad("ppo.clip_c", "the dual-clip bound must be > 1", "use 3.0 (the reference)")
    if not _is_number(self.temperature) or not self.temperature > 0:
      bad(
        "temperature",
        "log-probs divide the logits by it; it must be > 0",
        "set rollout.temperature > 0 (algo.temperature follows it)",
      )
    if not _is_number(self.rlsd.lam0, low=0) or self.rlsd.lam0 > 1:
      bad(
        "rlsd.lam0",
        "RLSD mixes (1-λ)·A + λ·w·A, λ must be in [0, 1]",
        "use a value in [0, 1], the reference uses 0.5",
      )
    if not _is_number(self.rlsd.clip_eps, low=0):
      bad("rlsd.clip_eps", "must be a number >= 0", "use 0.2 (the reference)")
    for field, low in (("top_k", 1), ("vocab_chunk", 0)):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value < low:
        fix = (
          "use a positive number of tokens (32: UCOB's top 32)"
          if field == "top_k"
          else "use a positive number of response positions (64), or 0 for no chunking"
        )
        bad(field, f"must be an integer >= {low}", fix)
    if not _is_number(self.ema.decay, low=0) or self.ema.decay >= 1:
      bad(
        "ema.decay",
        "an EMA decay must be in [0, 1) (1 would never move the teacher)",
        "use e.g. 0.95 (SDPO's), or teacher_weights='initial' for a teacher that never moves",
      )
    if (
      self.teacher_weights == "ema"
      and self.ema.every == "update"
      and self.teacher_source != "update"
    ):
      bad(
        "teacher_source",
        "algo.ema.every='update' moves the EMA teacher inside the update, after every "
        "optimizer update, so the teacher must be scored there",
        "set --config.algo.teacher_source=update, or algo.ema.every='iteration'",
      )
    for name in self.hook_names:
      if name not in METHOD_HOOKS:
        bad(
          "hooks",
          f"{name!r} is not a registered method hook (registered: {METHOD_HOOKS.registered()})",
          "register it with @sdar_jax.algos.register_hooks in a module the run imports "
          "(--imports=your.module), or drop it",
        )
    if self.teacher_weights == "ema" and not self.scores_teacher:
      bad(
        "teacher_weights",
        "an EMA teacher with no term reading the teacher (algo.distill='none', advantage "
        f"{self.advantage!r}) would only cost memory",
        "set algo.distill='sdar' (or teacher=True), or teacher_weights='current'",
      )
    if self.ema.every not in EMA_CADENCES:
      bad(
        "ema.every",
        f"must be one of {list(EMA_CADENCES)}",
        "use 'iteration' (SDPO's) or 'update'",
      )
    opsd = self.agent_opsd
    if not _is_number(opsd.v0) or not 0 < opsd.v0 < 1:
      bad("agent_opsd.v0", "a success belief must be in (0, 1)", "use 0.5 (no prior)")
    if not _is_number(opsd.eps) or not 0 < opsd.eps < 0.5:
      bad("agent_opsd.eps", "the clamp of V must be in (0, 0.5)", "use AgentOPSD's 1e-6")
    if not _is_number(opsd.lam, low=0) or opsd.lam > 1:
      bad("agent_opsd.lam", "a mixing weight must be in [0, 1]", "use AgentOPSD's 0.5")
    if not _is_number(opsd.band, low=0) or opsd.band >= 1:
      bad(
        "agent_opsd.band",
        "the multiplier's band must be in [0, 1) (1 could zero an advantage)",
        "use AgentOPSD's 0.2",
      )
    for field in ("grsd.scale", "grsd.clip", "grsd.floor"):
      if not _is_number(at(field), low=0):
        bad(field, "must be a number >= 0", "use GRSD's launchers' 0.5 / 0.2 / 0.1")
    if self.turn_advantages and self.teacher_source != "rollout":
      bad(
        "teacher_source",
        f"algo.advantage={self.advantage!r} rewrites each turn's advantage from the teacher's "
        "log-probs at θ_old over the whole iteration, before the first update",
        "set --config.algo.teacher_source=rollout",
      )
    window = self.retire.window
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
      bad("retire.window", "must be an integer >= 0", "use 0 (never retire) or RetireOPD's 5")
    elif window and self.distill == "none":
      bad(
        "retire.window",
        "RetireOPD retires the distillation term, and algo.distill='none' has none",
        "set algo.distill='sdar' (preset retire_opd), or algo.retire.window=0",
      )
    elif window and self.teacher_source != "rollout":
      bad(
        "teacher_source",
        "RetireOPD's progress reads the teacher's gap on the rollouts, scored once per iteration",
        "set --config.algo.teacher_source=rollout",
      )
    if self.retire.windows not in RETIRE_WINDOWS:
      bad("retire.windows", f"must be one of {list(RETIRE_WINDOWS)}", "use 'fixed' (the paper's)")
    if not _is_number(self.retire.progress):
      bad("retire.progress", "must be a number", "use RetireOPD's 0.0")
    if not _is_number(self.retire.competence, low=0):
      bad("retire.competence", "must be a number >= 0", "use RetireOPD's 0.9")
    self._teacher_problems(bad)
    self._ucob_problems(bad, at)
    warmdown = self.rlsd.warmdown_iterations
    if self.advantage == "rlsd" and (not isinstance(warmdown, int) or warmdown < 1):
      bad(
        "rlsd.warmdown_iterations",
        "the RLSD schedule λ0·(1-k/K) needs K >= 1",
        "use a positive number of steps, the reference uses 100",
      )
    for field in ("skills_in_student", "recompute_old_logp", "teacher"):
      value = getattr(self, field)
      if not isinstance(value, bool) and not (field == "teacher" and value is None):
        bad(field, "must be True or False", "set it to True or False")
    if self.teacher is False and self.terms_need_teacher:
      bad(
        "teacher",
        f"algo.distill={self.distill!r} / algo.advantage={self.advantage!r} need teacher log-probs",
        "set --config.algo.teacher=True",
      )
    if self.vocab_distill and self.teacher_source != "update":
      bad(
        "teacher_source",
        f"algo.form={self.form!r} reads the teacher's whole [B, R, V] distribution, which is "
        "computed inside the update and never stored with the rollout",
        "set --config.algo.teacher_source=update",
      )
    if self.distill == "none" and _is_number(self.lam) and self.lam > 0:
      bad(
        "lam",
        "a distillation weight with algo.distill='none' has no effect",
        "set algo.distill to 'sdar' or 'skill_sd', or lam=0",
      )
    out += context_problems(self) + sdpo_problems(self) + reflection_problems(self)
    out += skill_memory_problems(self) + opid_problems(self)
    return out

  def _teacher_problems(self, bad) -> None:
    """The trained teacher's settings (its folder or its stage), its prompt, the views."""
    stage = self.teacher_stage
    if not isinstance(self.teacher_path, str):
      bad("teacher_path", "must be a folder (a string)", "name a checkpoint or Hugging Face folder")
    if self.teacher_weights == "frozen" and not self.teacher_path and not stage.preset:
      bad(
        "teacher_path",
        "algo.teacher_weights='frozen' reads the teacher's weights from a folder, and none is "
        "named (nor does algo.teacher_stage train one first)",
        "set --config.algo.teacher_path=<a checkpoint folder or a Hugging Face folder>, or "
        "--config.algo.teacher_stage.preset=<the preset that trains the teacher>",
      )
    if stage.preset:  # the preset itself is checked where the stage is built (run.stages)
      if not isinstance(stage.preset, str):
        bad("teacher_stage.preset", "must be a preset's name", "e.g. 'skill_grpo'")
      if self.teacher_weights != "frozen":
        bad(
          "teacher_stage.preset",
          "the first stage's checkpoint becomes the frozen teacher, read with "
          "algo.teacher_weights='frozen'",
          "set --config.algo.teacher_weights=frozen, or --config.algo.teacher_stage.preset=''",
        )
    steps = stage.iterations
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
      bad(
        "teacher_stage.iterations", "must be an integer >= 0", "use 0 (the run's train.iterations)"
      )
    if self.teacher_context not in SKILL_PLACES:
      bad("teacher_context", f"must be one of {list(SKILL_PLACES)}", "use 'block' (SDAR's)")
    if self.views not in VIEWS:
      bad("views", f"must be one of {list(VIEWS)}", "use 'single'")
    elif self.views == "mixed" and (self.skills_in_student or not self.scores_teacher):
      bad(
        "views",
        "algo.views='mixed' keeps each turn's other view as its teacher prompt, so it needs a "
        "teacher and a student prompt without skills of its own",
        "set algo.skills_in_student=False and a term that reads the teacher (distill='ucob')",
      )

  def _ucob_problems(self, bad, at) -> None:
    """UCOB's section, and what its term needs."""
    u = self.ucob
    for field, low in (("ucob.margin", 0), ("ucob.weight_max", 0), ("ucob.action_weight", 0)):
      if not _is_number(at(field), low=low):
        bad(field, f"must be a number >= {low}", "use UCOB's 0.05 / 2.0 / 2.0")
    if not _is_number(u.tau) or not u.tau > 0:
      bad("ucob.tau", "the weight divides the gap by it; it must be > 0", "use UCOB's 0.2")
    if not _is_number(u.gamma, low=0) or u.gamma > 1:
      bad("ucob.gamma", "a discount must be in [0, 1]", "use UCOB's 0.95")
    if not isinstance(u.max_pairs, int) or isinstance(u.max_pairs, bool) or u.max_pairs < 0:
      bad("ucob.max_pairs", "must be an integer >= 0", "use UCOB's 2 (0 keeps every pair)")
    for field in ("ucob.norm_to_one", "ucob.clip_log_ratio"):
      if not isinstance(at(field), bool):
        bad(field, "must be True or False", "set it to True or False")
    if self.distill == "ucob" and self.views != "mixed":
      bad(
        "views",
        "algo.distill='ucob' pairs turns played with and without the skills, so the rollout must "
        "play both views",
        "set --config.algo.views=mixed",
      )

  @classmethod
  def from_config(cls, algo: AlgoConfig | Mapping[str, Any], **overrides: Any) -> AlgoConfig:
    """From an `algo` config section (a ConfigDict or dict; missing keys take the defaults) or an
    AlgoConfig, with `overrides`. An unknown key is an error naming it and the closest field."""
    if isinstance(algo, AlgoConfig):
      values = dataclasses.asdict(algo)
    else:  # a saved section may hold keys that moved since (sdar_jax.config_keys)
      values = translate_section("algo", algo.to_dict() if hasattr(algo, "to_dict") else algo)
    values.update(overrides)
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = [key for key in values if key not in fields]
    if unknown:
      lines = []
      for key in unknown:
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        lines.append(f"algo.{key}: not an algorithm setting{hint}. Fix: use one of {fields}")
      raise ValueError("\n".join(lines))
    return cls(**values)
