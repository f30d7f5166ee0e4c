"""OPID, ours after the authors' code (arXiv 2606.26790; jinyangwu/OPID@37a15a5,
gigpo/core_gigpo.py `compute_opid_advantage_components`, opid/analysis.py, opid/prompting.py,
examples/opid_trainer/run_alfworld_opid_guide.sh; docs/reference.md, "OPID").

Once per iteration, between the rollout and the teacher's contexts (`before_teacher_context`),
each finished episode is analysed by the reflector `algo.opid.reflector` (the authors' LLM
analyzer: one JSON per episode, `episode_skill` and at most `max_step_skills` `step_skills` keyed
by 0-based step): the teacher context source "opid" gives each turn its step skill where it has
one, else the episode skill (the code's `skill_teacher_mode` "step_priority"); an episode whose
analysis fails gives none. The teacher shares the policy's weights and is scored once per
iteration before the updates (teacher_source "rollout"), so its log-probs are
log π_θold(y_t | skill + prompt, y_<t): the code's re-scoring of the original responses under the
augmented prompts. The token advantage (estimator "opid", `opid_token_advantages`) is

  A_t = A_GRPO + w · (log π_θold(y_t | skill, o) − log π_θold(y_t | o)) · m_t

with w = `algo.opid.teacher_adv_w` (the launcher's episode- and step-skill weights, both 0.001),
and 0 for the turns without a skill (the code's critical-step masks).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from sdar_jax.algos.advantages import ADVANTAGE_ESTIMATORS, ADVANTAGE_SCHEDULES
from sdar_jax.algos.contexts import ContextRequest, load_templates, register_context_source
from sdar_jax.algos.hooks import MethodHooks, register_hooks
from sdar_jax.algos.reflection import steps_text
from sdar_jax.algos.reflectors import KINDS, ORACLE_LABEL, Request, build_writer, oracle_reflection

SOURCE = "opid"


@dataclasses.dataclass(frozen=True)
class OPID:
  """OPID's settings (algo.opid); defaults: the authors' ALFWorld launcher."""

  teacher_adv_w: float = 0.001
  """w of the teacher term (episode_skill_teacher_advantage_w = step_skill_teacher_advantage_w =
  0.001 in the launcher: one weight here, each turn reads one skill)."""
  reflector: str = "openai"
  """Who analyses each episode: "openai" (the authors': an endpoint, algo.reflection.url /
  .model), "policy" (the policy itself) or "oracle" (rules, no model: tests and the demo)."""
  max_step_skills: int = 5
  """Step skills kept per episode (analysis_max_step_skills_per_traj, launcher 5)."""
  tokens: int = 4096
  """New tokens of an analysis (analysis_max_completion_tokens, launcher 4096)."""


def opid_problems(algo: Any) -> list[str]:
  """Every invalid algo.opid value, one "<key>=<value>: <problem>. Fix: <fix>" line each."""
  s, out = algo.opid, []
  if s.reflector not in KINDS:
    out.append(f"algo.opid.reflector={s.reflector!r}: not a reflector. Fix: use one of {KINDS}")
  for key, low in (("max_step_skills", 0), ("tokens", 1)):
    v = getattr(s, key)
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
      out.append(f"algo.opid.{key}={v!r}: must be a whole number >= {low}. Fix: e.g. 5")
  if not isinstance(s.teacher_adv_w, (int, float)) or s.teacher_adv_w < 0:
    out.append(f"algo.opid.teacher_adv_w={s.teacher_adv_w!r}: must be >= 0. Fix: e.g. 0.001")
  return out


# ------------------------------------------------------------------------------------ advantage
def opid_token_advantages(seq_adv, teacher_logp, old_logp, mask, weight) -> jax.Array:
  """[B, R]: A · m + w · (teacher − old) · m, no gradient (`compute_teacher_token_advantage` with
  normalize False and no clip, the launcher's, then `compute_opid_advantage_components` with
  step_advantage_w 0). A row without a skill has teacher = old (core.loss), so its term is 0."""
  m = jnp.asarray(mask, jnp.float32)
  gap = jax.lax.stop_gradient(
    jnp.asarray(teacher_logp, jnp.float32) - jnp.asarray(old_logp, jnp.float32)
  )
  a = jax.lax.stop_gradient(jnp.asarray(seq_adv, jnp.float32))[..., None]
  adv = a * m + weight * jnp.where(m != 0, gap, 0.0) * m  # NaN/inf in padding must not leak
  return jnp.where(m != 0, adv, 0.0)


@ADVANTAGE_SCHEDULES.register(SOURCE)
def _opid_weight(algo, iteration) -> jax.Array:
  del iteration
  return jnp.asarray(algo.opid.teacher_adv_w, jnp.float32)


@ADVANTAGE_ESTIMATORS.register(SOURCE)
def _opid(seq_adv, mask, *, teacher_logp=None, old_logp=None, teacher_weight=0.0, clip_eps=0.2):
  del clip_eps
  if teacher_logp is None or old_logp is None:
    raise ValueError("advantage 'opid' needs teacher_logp and old_logp")
  return opid_token_advantages(seq_adv, teacher_logp, old_logp, mask, teacher_weight)


# ------------------------------------------------------------------------------------ analysis
def analysis_request(ep: Any, algo: Any, t: dict[str, str]) -> Request:
  """The authors' analysis prompt (`_build_analysis_prompt`, template "opid_user") on `ep`."""
  outcome = "success" if ep.won else "failure"
  user = t["opid_user"].format(
    episode_skill=t[f"opid_{outcome}"],
    most=algo.opid.max_step_skills,
    task=getattr(ep, "task", "") or "(not available)",
    outcome=outcome,
    candidates=list(range(len(ep.turns))),
    steps=steps_text(ep, algo.reflection, t),
  )
  return Request("reflect", "", user, episode=ep)


def parse_analysis(text: str | None, turns: int, most: int) -> tuple[str, dict[int, str]] | None:
  """(episode_skill, {step: skill}) from an analysis (its first JSON object; `_parse_analysis_
  response`): step keys read as integers, those outside the episode dropped, the first `most`
  kept; None without a JSON object or an episode_skill (the code drops such an episode)."""
  if not text:
    return None
  start, end = text.find("{"), text.rfind("}")
  try:
    parsed = json.loads(text[start : end + 1]) if 0 <= start < end else None
  except ValueError:
    parsed = None
  if not isinstance(parsed, dict) or not str(parsed.get("episode_skill", "")).strip():
    return None
  steps: dict[int, str] = {}
  raw = parsed.get("step_skills") or {}
  for key, skill in raw.items() if isinstance(raw, dict) else ():
    try:
      k = int(key)
    except (TypeError, ValueError):
      continue
    if 0 <= k < turns and str(skill).strip() and len(steps) < most:
      steps[k] = str(skill).strip()
  return str(parsed["episode_skill"]).strip(), steps


def oracle_analysis(ep: Any, most: int) -> str:
  """The oracle's analysis JSON: the episode skill from `oracle_reflection`'s lessons, a step
  skill at each of the first `most` turns whose action changed nothing (do the environment's next
  planned step, or not this action)."""
  lessons = [line.split(". ", 1)[-1] for line in oracle_reflection(ep).splitlines()[1:]]
  steps = {}
  for k, turn in enumerate(ep.turns):
    after = ep.turns[k + 1].observation if k + 1 < len(ep.turns) else ""
    if len(steps) < most and re.match(r"\s*nothing happens", after, re.IGNORECASE):
      steps[str(k)] = f"Do not `{turn.action}` here: it changes nothing."
  skill = {
    "episode_summary": f"The attempt {'succeeded' if ep.won else 'failed'}.",
    "episode_skill": " ".join(lessons) or "Act on the objects the task names.",
    "step_skills": steps,
  }
  return f"{ORACLE_LABEL}\n{json.dumps(skill, ensure_ascii=False)}"


def analyse_episodes(episodes: Sequence[Any], algo: Any, templates, generate=None) -> dict:
  """Analyses every finished episode and sets its `opid_blocks` (per turn: the step skill's
  block, template "opid_step", else the episode skill's, "opid_episode"; None for all its turns
  when its analysis failed). Returns the round's metrics."""
  s, r = algo.opid, algo.reflection
  eps = [ep for ep in episodes if ep.env_error is None and ep.turns]
  if s.reflector == "oracle":
    texts = [oracle_analysis(ep, s.max_step_skills) for ep in eps]
  else:
    writer = build_writer(
      s.reflector, url=r.url, model=r.model, api_key_env=r.api_key_env, timeout=r.timeout,
      retries=r.retries, max_new_tokens=s.tokens, temperature=r.temperature, generate=generate,
    )  # fmt: skip
    written = writer.write([analysis_request(ep, algo, templates) for ep in eps])
    texts = [w.text if w is not None else None for w in written]
  failed = step_turns = turns = 0
  for ep in episodes:
    ep.opid_blocks = [None] * len(ep.turns)
  for ep, text in zip(eps, texts):
    parsed = parse_analysis(text, len(ep.turns), s.max_step_skills)
    turns += len(ep.turns)
    if parsed is None:
      failed += 1
      continue
    episode_skill, steps = parsed
    step_turns += len(steps)
    ep.opid_blocks = [
      templates["opid_step"].format(skill=steps[k]) + "\n\n"
      if k in steps
      else templates["opid_episode"].format(skill=episode_skill) + "\n\n"
      for k in range(len(ep.turns))
    ]
  return {
    "opid/episodes": float(len(eps)),
    "opid/failed": float(failed),
    "opid/step_skills_applied": float(step_turns),
    "opid/step_skill_step_ratio": step_turns / turns if turns else 0.0,
  }


# ------------------------------------------------------------------------------------ source
@register_context_source(SOURCE)
def opid_source(request: ContextRequest) -> list[str | None]:
  """Per turn: its hindsight skill block (step skill, else episode skill), or None."""
  ep = request.episode
  if not hasattr(ep, "opid_blocks"):
    raise RuntimeError(
      "teacher context source 'opid': the episode has not been analysed; the OPID hook "
      "(before_teacher_context) did not run. Fix: train through sdar_jax.run.trainer, or call "
      "sdar_jax.algos.opid.analyse_episodes first"
    )
  return list(ep.opid_blocks)


class OPIDHooks(MethodHooks):
  """The per-iteration analysis before the teacher's contexts."""

  def before_teacher_context(self, view):
    templates = load_templates(view.algo.context_templates)
    start = time.perf_counter()
    metrics = analyse_episodes(view.episodes, view.algo, templates, getattr(view, "generate", None))
    metrics["perf/opid_seconds"] = time.perf_counter() - start
    return metrics

  def before_evaluation_contexts(self, algo, episodes):
    """No block: OPID's skills are mined by its analyzer (a model call per episode) from the
    iteration's episodes; evaluation episodes are not analysed, so the token view shows none."""
    for ep in episodes:
      ep.opid_blocks = [None] * len(ep.turns)

  def run_problems(self, config) -> list[str]:
    if config.algo.opid.reflector == "openai" and not config.algo.reflection.url:
      problem = (
        "algo.reflection.url='': OPID's analyzer 'openai' needs the endpoint's API base. Fix: "
        "--config.algo.reflection.url=http://HOST:PORT/v1 (and .model), or "
        "--config.algo.opid.reflector=policy"
      )
      return [problem]
    return []


@register_hooks(SOURCE)
def _opid_hooks(algo) -> MethodHooks | None:
  return OPIDHooks() if SOURCE in algo.context_names else None


__all__ = ["OPID", "OPIDHooks", "analyse_episodes", "opid_source", "opid_token_advantages"]
