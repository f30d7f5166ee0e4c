"""Teacher context source "reflection": the teacher reads what was written about the group's own
episodes, after GRSD (arXiv 2607.28076; BinbZheng1/GRSD@393213a,
verl/trainer/ppo/grsd_reflect_ray_trainer.py `_reflect_and_build_priors`; docs/reference.md,
"GRSD with reflections").

Between the rollout and the teacher's context (the hook point `before_teacher_context`), once per
iteration:

1. a reflection per episode (template "reflect_user": the task, the outcome, the steps cut to
   `algo.reflection.max_turns` turns of at most `.obs_chars` / `.action_chars` characters), from
   the reflector `algo.reflection.reflector` (`sdar_jax.algos.reflectors`: "policy", "openai",
   "oracle"), one batched call; with `.every_episode` False only in the groups with both a success
   and a failure (the authors' external reflector, `SkillReflector`);
2. with `.judge` set, each reflection scored 0-3 (`parse_score` of the judge's reply; an empty
   reflection scores 0 without a call, a failed call leaves it out), and the scores normalised
   within each GRPO group over its scored reflections (`group_normalized`);
3. per group with both a success and a failure, one contrastive prior ("prior_user": the
   successes' reflections, then the failures'), written by the same reflector: the teacher's
   context on every turn of the group (template "reflection"). Other groups get none: their
   turns are left out of the distillation term and counted (reflection/groups_without_prior).

With `.loss_coef` > 0 and the "policy" reflector, the reflection tokens are trained after the
iteration's updates by one more pass of the update over them (`Iteration.update_on`), advantage =
loss_coef · normalised score: GRSD's separate α-weighted reflection GRPO step (α 0.01).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from sdar_jax.algos.contexts import ContextRequest, load_templates, register_context_source
from sdar_jax.algos.hooks import MethodHooks, register_hooks
from sdar_jax.algos.reflectors import KINDS, ORACLE_LABEL, Request, build_writer, parse_score

SOURCE = "reflection"
JUDGES = ("none",) + KINDS


@dataclasses.dataclass(frozen=True)
class Reflection:
  """Source "reflection"'s settings (algo.reflection); defaults: GRSD's reflect launcher."""

  reflector: str = "policy"
  """Who writes the reflections and priors: "policy", "openai" (an endpoint at `url`) or
  "oracle" (deterministic, from the episode and the environment's ground truth)."""
  judge: str = "none"
  """Who scores the reflections 0-3: "none" or a reflector kind (GRSD: "openai", a model behind
  an OpenAI-compatible endpoint)."""
  url: str = ""
  """The OpenAI-compatible API base of kind "openai" (e.g. http://127.0.0.1:8000/v1)."""
  model: str = ""
  """The model name sent to `url`."""
  judge_url: str = ""
  """The judge's API base ("": `url`)."""
  judge_model: str = ""
  """The judge's model name ("": `model`)."""
  api_key_env: str = "OPENAI_API_KEY"
  """The environment variable holding the endpoints' API key (unset: no key sent)."""
  timeout: float = 60.0
  """Seconds per endpoint request."""
  retries: int = 2
  """Endpoint retries after a failed request."""
  every_episode: bool = True
  """Reflect on every episode (GRSD's policy reflector, whose reflections are trained); False:
  only in the groups that get a prior (its external reflector)."""
  max_turns: int = 50
  """The trajectory's first turns shown to the reflector and the judge."""
  obs_chars: int = 400
  """Characters kept of each observation shown (the rest cut, marked)."""
  action_chars: int = 600
  """Characters kept of each action shown."""
  tokens: int = 512
  """New tokens of a reflection or a prior ("policy", "openai")."""
  temperature: float = 1.0
  """The reflector's sampling temperature."""
  judge_tokens: int = 16
  """New tokens of the judge's reply."""
  judge_temperature: float = 0.0
  """The judge's temperature."""
  loss_coef: float = 0.0
  """α of the reflection-training term (GRSD 0.01; needs reflector "policy" and a judge)."""


def reflection_problems(algo: Any) -> list[str]:
  """Every invalid algo.reflection value, one "algo.reflection.<key>=<value>: <problem>. Fix:
  <fix>" line each."""
  s, out = algo.reflection, []
  if s.reflector not in KINDS:
    out.append(f"algo.reflection.reflector={s.reflector!r}: not a reflector. Fix: use {KINDS}")
  if s.judge not in JUDGES:
    out.append(f"algo.reflection.judge={s.judge!r}: not a judge. Fix: use {JUDGES}")
  for key in ("max_turns", "obs_chars", "action_chars", "tokens", "judge_tokens"):
    v = getattr(s, key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
      out.append(f"algo.reflection.{key}={v!r}: must be an integer >= 1. Fix: a positive number")
  for key in ("timeout", "temperature", "judge_temperature", "loss_coef", "retries"):
    v = getattr(s, key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
      out.append(f"algo.reflection.{key}={v!r}: must be a number >= 0. Fix: a non-negative one")
  trains = isinstance(s.loss_coef, (int, float)) and s.loss_coef > 0
  if trains and (s.reflector != "policy" or s.judge == "none"):
    out.append(
      f"algo.reflection.loss_coef={s.loss_coef!r}: trains the policy's reflections on the "
      f"judge's score, but reflector={s.reflector!r}, judge={s.judge!r}. Fix: reflector "
      "'policy' with a judge, or loss_coef 0"
    )
  return out


def endpoint_problems(algo: Any) -> list[str]:
  """The run-level check (`run_problems`): an "openai" reflector or judge needs a URL."""
  s, out = algo.reflection, []
  if s.reflector == "openai" and not s.url:
    out.append(
      "algo.reflection.url='': reflector 'openai' needs the endpoint's API base. Fix: "
      "--config.algo.reflection.url=http://HOST:PORT/v1 (and .model)"
    )
  if s.judge == "openai" and not (s.judge_url or s.url):
    out.append(
      "algo.reflection.judge_url='': judge 'openai' needs the endpoint's API base. Fix: "
      "--config.algo.reflection.judge_url=http://HOST:PORT/v1 (and .judge_model)"
    )
  return out


# ------------------------------------------------------------------------------------ prompts
def _cut(text: Any, chars: int) -> str:
  text = str(text or "")
  return text if len(text) <= chars else text[:chars] + " ...[cut]"


def steps_text(ep: Any, settings: Reflection, templates: dict[str, str]) -> str:
  """The episode's first `max_turns` turns as template "reflection_step" lines."""
  return "\n".join(
    templates["reflection_step"].format(
      index=k,
      observation=_cut(t.observation, settings.obs_chars),
      action=_cut(t.action, settings.action_chars),
    )
    for k, t in enumerate(ep.turns[: settings.max_turns])
  )


def _task(ep: Any) -> str:
  return _cut(getattr(ep, "task", "") or (ep.turns[0].observation if ep.turns else ""), 1500)


def _outcome(ep: Any) -> str:
  return "succeeded" if ep.won else "failed"


def reflect_request(ep: Any, settings: Reflection, t: dict[str, str]) -> Request:
  steps = steps_text(ep, settings, t)
  user = t["reflect_user"].format(task=_task(ep), outcome=_outcome(ep), steps=steps)
  return Request("reflect", t["reflect_system"], user, episode=ep)


def prior_request(
  task: str, positives: Sequence[str], negatives: Sequence[str], t: dict[str, str]
) -> Request:
  def block(items):
    items = [t["prior_item"].format(index=k + 1, reflection=r) for k, r in enumerate(items)]
    return "\n\n".join(items) or "(none)"

  user = t["prior_user"].format(task=task, positives=block(positives), negatives=block(negatives))
  return Request(
    "prior", t["prior_system"], user, positives=tuple(positives), negatives=tuple(negatives)
  )


def judge_request(ep: Any, reflection: str, settings: Reflection, t: dict[str, str]) -> Request:
  user = t["judge_user"].format(
    task=_task(ep),
    outcome=_outcome(ep),
    steps=steps_text(ep, settings, t),
    reflection=_cut(reflection, 2000),
  )
  return Request("judge", t["judge_system"], user, episode=ep, reflection=reflection)


def group_normalized(scores, groups, valid, eps: float = 1e-6) -> np.ndarray:
  """GRSD's Norm_G: per group, (r − mean) / (std + eps) over its valid rows (population std);
  0 for invalid rows and for groups with fewer than 2 valid rows."""
  r = np.asarray(scores, np.float64)
  g, ok = np.asarray(groups), np.asarray(valid, bool)
  out = np.zeros_like(r)
  for group in np.unique(g):
    sel = (g == group) & ok
    if sel.sum() >= 2:
      out[sel] = (r[sel] - r[sel].mean()) / (r[sel].std() + eps)
  return out.astype(np.float32)


# ------------------------------------------------------------------------------------ one round
@dataclasses.dataclass
class ReflectionRound:
  """One iteration's reflections: per reflected episode (index into the episodes) its Written,
  score (None: not scored) and normalised score; per group with a prior its text."""

  written: dict[int, Any]
  scores: dict[int, float | None]
  advantages: dict[int, float]
  priors: dict[Any, str]
  metrics: dict[str, float]

  def training_rows(self, coef: float) -> list[dict[str, Any]]:
    """The reflection-training term's rows: every scored reflection that has token ids, with
    advantage coef · normalised score (a failed score: 0, kept as GRSD keeps it)."""
    rows = []
    for e, w in self.written.items():
      if w is None or w.response_ids is None or not w.response_ids or e not in self.scores:
        continue
      adv = coef * self.advantages.get(e, 0.0)
      score = float(self.scores[e] or 0.0)
      ids = {"prompt_ids": w.prompt_ids, "response_ids": w.response_ids, "logprobs": w.logprobs}
      rows.append({**ids, "advantage": float(adv), "score": score})
    return rows


def reflect_episodes(
  episodes: Sequence[Any], settings: Reflection, writer, judge, templates: dict[str, str]
) -> ReflectionRound:
  """Reflections, scores and priors of one iteration's episodes (module docstring), set on each
  episode as `reflection` (its text or None) and `reflection_prior` (its group's prior or None)."""
  groups: dict[Any, list[int]] = {}
  for e, ep in enumerate(episodes):
    ep.reflection, ep.reflection_prior = None, None
    if ep.env_error is None and ep.turns:
      groups.setdefault(ep.group_id, []).append(e)
  mixed = [
    g
    for g, m in groups.items()
    if any(episodes[e].won for e in m) and not all(episodes[e].won for e in m)
  ]
  chosen = [e for g, m in groups.items() for e in m if settings.every_episode or g in mixed]
  out = writer.write([reflect_request(episodes[e], settings, templates) for e in chosen])
  written = dict(zip(chosen, out))
  for e, w in written.items():
    episodes[e].reflection = None if w is None else w.text
  scores: dict[int, float | None] = {}
  if judge is not None:
    asked = [e for e in chosen if written[e] is not None and written[e].text.strip()]
    for e in chosen:
      if written[e] is not None:
        scores[e] = 0.0  # an empty reflection: the lowest score, no call (GRSD)
    replies = judge.write(
      [judge_request(episodes[e], written[e].text, settings, templates) for e in asked]
    )
    for e, reply in zip(asked, replies):
      score = None if reply is None else parse_score(reply.text)
      scores[e] = None if score is None else float(score)
  keys = list(scores)
  valid = [scores[e] is not None for e in keys]
  norm = group_normalized(
    [scores[e] or 0.0 for e in keys], [episodes[e].group_id for e in keys], valid
  )
  advantages = {e: float(a) for e, a in zip(keys, norm)}
  asks, prior_groups = [], []
  for g in mixed:
    pos = [written[e].text for e in groups[g] if episodes[e].won and written.get(e)]
    neg = [written[e].text for e in groups[g] if not episodes[e].won and written.get(e)]
    if pos and neg:
      prior_groups.append(g)
      asks.append(prior_request(_task(episodes[groups[g][0]]), pos, neg, templates))
  priors = {}
  for g, w in zip(prior_groups, writer.write(asks)):
    if w is not None and w.text.strip():
      priors[g] = w.text.strip()
  for g, members in groups.items():
    for e in members:
      episodes[e].reflection_prior = priors.get(g)
  judged = [s for s in scores.values() if s is not None]
  kinds = (settings.reflector, settings.judge)
  metrics = {
    "reflection/episodes": float(len(chosen)),
    "reflection/failed": float(sum(w is None for w in out)),
    "reflection/groups": float(len(groups)),
    "reflection/groups_with_prior": float(len(priors)),
    "reflection/groups_without_prior": float(len(groups) - len(priors)),
    "reflection/oracle": float("oracle" in kinds),
  }
  if judge is not None:
    metrics["reflection/judge_score_mean"] = float(np.mean(judged)) if judged else 0.0
    metrics["reflection/judge_failed"] = float(len(scores) - len(judged))
  return ReflectionRound(written, scores, advantages, priors, metrics)


# ------------------------------------------------------------------------------------ source
@register_context_source(SOURCE)
def reflection_source(request: ContextRequest) -> list[str | None]:
  """The group's contrastive prior (template "reflection") on every turn of the episode, or None
  on every turn when its group got none. The prior is written by `ReflectionHooks` before the
  contexts are composed."""
  ep = request.episode
  if not hasattr(ep, "reflection_prior"):
    raise RuntimeError(
      "teacher context source 'reflection': the episode has no prior; the reflection hook "
      "(before_teacher_context) did not run. Fix: train through sdar_jax.run.trainer, or call "
      "sdar_jax.algos.reflection.reflect_episodes on the episodes first"
    )
  if ep.reflection_prior is None:
    return [None] * len(ep.turns)
  text = request.templates["reflection"].format(prior=ep.reflection_prior) + "\n\n"
  return [text] * len(ep.turns)


# ------------------------------------------------------------------------------------ hooks
def writers(settings: Reflection, generate=None):
  """(reflector, judge or None) from the settings; `generate` serves kind "policy"."""
  common = {"api_key_env": settings.api_key_env, "timeout": settings.timeout, "generate": generate}
  writer = build_writer(
    settings.reflector, url=settings.url, model=settings.model, retries=settings.retries,
    max_new_tokens=settings.tokens, temperature=settings.temperature, **common,
  )  # fmt: skip
  if settings.judge == "none":
    return writer, None
  judge = build_writer(
    settings.judge, url=settings.judge_url or settings.url, retries=settings.retries,
    model=settings.judge_model or settings.model, max_new_tokens=settings.judge_tokens,
    temperature=settings.judge_temperature, **common,
  )  # fmt: skip
  return writer, judge


class ReflectionHooks(MethodHooks):
  """Before the teacher's contexts: `reflect_episodes` (its perf/reflection_* timing and
  tokens); after the updates: the reflection-training term when `loss_coef` > 0."""

  def __init__(self):
    self.round: ReflectionRound | None = None

  def before_teacher_context(self, view):
    s = view.algo.reflection
    templates = load_templates(view.algo.context_templates)
    writer, judge = writers(s, generate=getattr(view, "generate", None))
    start = time.perf_counter()
    self.round = reflect_episodes(view.episodes, s, writer, judge, templates)
    metrics = dict(self.round.metrics)
    metrics["perf/reflection_seconds"] = time.perf_counter() - start
    metrics["perf/reflection_tokens"] = float(
      sum(len(w.response_ids or []) for w in self.round.written.values() if w is not None)
    )
    return metrics

  def before_evaluation_contexts(self, algo, episodes):
    """No prior: an evaluation plays each game once, so no group holds a success beside a
    failure (GRSD's prior is written for such groups only)."""
    for ep in episodes:
      ep.reflection_prior = None

  def after_updates(self, view):
    s, done = view.algo.reflection, self.round
    self.round = None
    if not s.loss_coef or done is None or SOURCE not in view.algo.context_names:
      return None
    rows = done.training_rows(float(s.loss_coef))
    if not rows:
      return {"reflection/train_rows": 0.0}
    return {"reflection/train_rows": float(len(rows)), **view.update_on(rows, "reflection")}

  def run_problems(self, config) -> list[str]:
    return endpoint_problems(config.algo)


@register_hooks("reflection")
def _reflection_hooks(algo) -> MethodHooks | None:
  return ReflectionHooks() if SOURCE in algo.context_names else None


__all__ = [
  "ORACLE_LABEL",
  "Reflection",
  "ReflectionHooks",
  "ReflectionRound",
  "group_normalized",
  "reflect_episodes",
  "reflection_problems",
]
