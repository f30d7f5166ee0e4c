"""The teacher's privileged context, composed once per iteration after the rollout from the
finished episodes and their GRPO groups (`TEACHER_CONTEXTS`, selected by `algo.context`).

A source is `fn(request: ContextRequest) -> list[str | None]`: for each turn of
`request.episode`, the text the teacher reads before the student's prompt, or None (no context
from this source). `compose_teacher_contexts` joins the texts of the selected sources in their
order and sets each turn's `teacher_prompt_ids` = encode(context) + the student's prompt ids and
`teacher_context` = whether any source gave one; a turn without one gets the student's prompt as
its teacher prompt and is left out of the distillation term (`TurnSample.context`). The student's
prompt is never touched. Built in: "skills" (the retrieved skill block the rollout recorded on
each turn: today's teacher), "sibling" (a successful episode of the same group, not the sample's
own, as a worked example) and "hindsight" (the turn's own next K observations and, optionally,
its episode's outcome). Templates: context_templates.md beside this module. Writing a source:
docs/extending.md. Episodes and turns are duck-typed (`sdar_jax.rollout.trajectory`); nothing here
imports the layers above.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from sdar_jax.algos.registry import Registry

TEMPLATES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "context_templates.md")
_MARKER = re.compile(r"^\[\[(\w+)\]\]\s*$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Sibling:
  """Source "sibling": the group's first successful episode in rollout order other than the
  sample's own, its observations and actions as a worked example."""

  tokens: int = 512
  """Token budget of the example's steps (its first `tokens` tokens are kept)."""


@dataclasses.dataclass(frozen=True)
class Hindsight:
  """Source "hindsight": the turn's own future in its episode (SDPO's feedback: k=1, no
  outcome)."""

  k: int = 1
  """How many of the observations that followed the turn's action are shown (>= 1)."""
  outcome: bool = False
  """Also state how the episode ended (success or failure, and its return)."""
  tokens: int = 256
  """Token budget of the observations shown (their first `tokens` tokens are kept)."""


@dataclasses.dataclass
class ContextRequest:
  """What a source sees of one episode: the episode, the other finished episodes of its GRPO group
  (rollout order, env failures left out), the run's AlgoConfig, the templates and `cut`."""

  episode: Any
  group: list[Any]  # the group's other episodes
  algo: Any
  templates: dict[str, str]
  cut: Callable[[str, int], str]  # cut(text, tokens): the text's first `tokens` tokens


ContextSource = Callable[[ContextRequest], "list[str | None]"]
TEACHER_CONTEXTS: Registry[ContextSource] = Registry("teacher context source")


def register_context_source(name: str) -> Callable[[ContextSource], ContextSource]:
  """Registers `fn(request) -> [context text or None per turn]` as teacher context `name`
  (selectable with --config.algo.context=name)."""
  return TEACHER_CONTEXTS.register(name)


def context_names(context: Any) -> tuple[str, ...]:
  """algo.context as a tuple of names: one name, a comma-separated string or a sequence."""
  if isinstance(context, str):
    return tuple(n.strip() for n in context.split(",") if n.strip())
  if isinstance(context, Sequence):
    return tuple(str(n).strip() for n in context)
  return ()


def load_templates(path: str = "") -> dict[str, str]:
  """The templates of context_templates.md, with those of the file at `path` (same form) in their
  place when given."""
  out = _parse(_read(TEMPLATES_FILE))
  if path:
    if not os.path.exists(path):
      raise FileNotFoundError(
        f"algo.context_templates={path!r}: no such file. Fix: give the path of a template file "
        f"in the form of {TEMPLATES_FILE}, or unset it"
      )
    own = _parse(_read(path))
    unknown = sorted(set(own) - set(out))
    if unknown:
      raise ValueError(
        f"algo.context_templates={path!r}: unknown sections {unknown}. Fix: use the sections "
        f"{sorted(out)}"
      )
    out.update(own)
  return out


@functools.lru_cache(maxsize=8)
def _cached_templates(path: str, stamp: int) -> dict[str, str]:
  """`load_templates(path)`, read once per path and modification time (callers only read it)."""
  del stamp
  return load_templates(path)


def _read(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def _parse(text: str) -> dict[str, str]:
  parts = _MARKER.split(text)
  return {parts[i]: parts[i + 1].strip("\n") for i in range(1, len(parts) - 1, 2)}


# ------------------------------------------------------------------------------------ sources
@register_context_source("skills")
def skills_source(request: ContextRequest) -> list[str | None]:
  """The skill block the rollout retrieved for each turn (`Turn.skill_block`; None when the
  rollout recorded none)."""
  return [getattr(t, "skill_block", None) for t in request.episode.turns]


@register_context_source("sibling")
def sibling_source(request: ContextRequest) -> list[str | None]:
  """The group's first successful episode in rollout order other than this one (the same text on
  every turn), or None on every turn when the group has no other success."""
  won = [ep for ep in request.group if ep.won and ep.turns]
  if not won:
    return [None] * len(request.episode.turns)
  t = request.templates
  steps = "\n".join(
    t["sibling_step"].format(observation=turn.observation, action=turn.action)
    for turn in won[0].turns
  )
  text = t["sibling"].format(steps=request.cut(steps, request.algo.sibling.tokens)) + "\n\n"
  return [text] * len(request.episode.turns)


@register_context_source("hindsight")
def hindsight_source(request: ContextRequest) -> list[str | None]:
  """Per turn: the next `algo.hindsight.k` observations of its episode (the one its action led to
  first) and, with `outcome`, how the episode ended; None for a turn with neither."""
  ep, settings, t = request.episode, request.algo.hindsight, request.templates
  after = [turn.observation for turn in ep.turns[1:]]
  final = getattr(ep, "final_observation", "")
  if final:
    after.append(final)
  outcome = None
  if settings.outcome:
    result = "succeeded" if ep.won else "failed"
    outcome = t["hindsight_outcome"].format(result=result, reward=float(ep.reward))
  out: list[str | None] = []
  for k in range(len(ep.turns)):
    seen = after[k : k + settings.k]
    lines = "\n".join(t["hindsight_step"].format(observation=o) for o in seen)
    lines = request.cut(lines, settings.tokens)
    lines = "\n".join(part for part in (lines, outcome) if part)
    out.append(t["hindsight"].format(lines=lines) + "\n\n" if lines else None)
  return out


@register_context_source("sibling_or_hindsight")
def sibling_or_hindsight_source(request: ContextRequest) -> list[str | None]:
  """SDPO's reprompt: the "sibling" demonstration where the group has another success, the
  "hindsight" feedback (algo.hindsight) only where it has none."""
  sibling = sibling_source(request)
  return sibling if any(t is not None for t in sibling) else hindsight_source(request)


# ------------------------------------------------------------------------------------ compose
def compose_teacher_contexts(
  episodes: Sequence[Any],
  algo: Any,
  encode: Callable[[str], list[int]],
  decode: Callable[[list[int]], str],
  templates: dict[str, str] | None = None,
) -> dict[str, float]:
  """Sets every turn-sample's teacher prompt from `algo.context`'s sources (module docstring);
  returns additive counts for `context_metrics`: "turn_samples", "with_context", and per source
  "<name>/with_context" and "<name>/tokens". Episodes whose env failed are skipped, as are turns
  with no response (they are no turn-samples)."""
  names = context_names(algo.context)
  if templates is None:
    path = algo.context_templates
    stamp = os.stat(path).st_mtime_ns if path and os.path.exists(path) else 0
    templates = _cached_templates(path, stamp)

  def cut(text: str, tokens: int) -> str:
    ids = encode(text)
    return text if len(ids) <= tokens else decode(ids[:tokens])

  groups: dict[Any, list[int]] = {}
  for e, ep in enumerate(episodes):
    if ep.env_error is None:
      groups.setdefault(ep.group_id, []).append(e)
  counts = {"turn_samples": 0.0, "with_context": 0.0}
  for name in names:
    counts[f"{name}/with_context"] = counts[f"{name}/tokens"] = 0.0
  for members in groups.values():
    for e in members:
      ep = episodes[e]
      request = ContextRequest(ep, [episodes[o] for o in members if o != e], algo, templates, cut)
      texts = {name: TEACHER_CONTEXTS.get(name)(request) for name in names}
      for k, turn in enumerate(ep.turns):
        if not turn.response_ids:
          continue
        counts["turn_samples"] += 1
        if list(names) == ["skills"] and _placed_at_rollout(turn):
          # the skills sit elsewhere than before the prompt (UCOB's other view, the message of a
          # teacher trained with them): the rollout built the teacher prompt; it stays
          counts["with_context"] += 1
          counts["skills/with_context"] += 1
          counts["skills/tokens"] += len(turn.teacher_prompt_ids) - len(turn.prompt_ids)
          turn.teacher_context, turn.context_sources = True, ("skills",)
          continue
        given = [(n, texts[n][k]) for n in names if texts[n][k] is not None]
        for n, text in given:
          counts[f"{n}/with_context"] += 1
          counts[f"{n}/tokens"] += len(encode(text))
        turn.teacher_context = bool(given)
        turn.context_sources = tuple(n for n, _ in given)
        counts["with_context"] += bool(given)
        context = encode("".join(text for _, text in given)) if given else []
        turn.teacher_prompt_ids = context + list(turn.prompt_ids)
  return counts


def _placed_at_rollout(turn: Any) -> bool:
  """Whether the rollout built this turn's teacher prompt with the skills placed other than as a
  block before the student prompt (no block recorded, a teacher prompt of its own)."""
  teacher = turn.teacher_prompt_ids
  return (
    getattr(turn, "skill_block", None) is None
    and teacher is not None
    and list(teacher) != list(turn.prompt_ids)
  )


def context_metrics(counts: dict[str, float]) -> dict[str, float]:
  """context/* metrics from `compose_teacher_contexts`' counts (summed over processes): the share
  of turn-samples with a context, overall and per source, the mean context tokens per source
  (over the turn-samples it gave one) and how many turn-samples had none."""
  n = max(counts["turn_samples"], 1.0)
  out = {
    "context/with_context_share": counts["with_context"] / n,
    "context/without_context": counts["turn_samples"] - counts["with_context"],
  }
  for key, value in counts.items():
    if key.endswith("/with_context"):
      name = key.split("/")[0]
      out[f"context/{name}/share"] = value / n
      out[f"context/{name}/tokens_mean"] = counts[f"{name}/tokens"] / max(value, 1.0)
  return out


def context_problems(algo: Any) -> list[str]:
  """Every invalid context setting of `algo`, one "algo.<key>=<value>: <problem>. Fix: <fix>"
  line each (`AlgoConfig._problems`)."""
  out: list[str] = []
  names = context_names(algo.context)
  if not names:
    out.append(
      f"algo.context={algo.context!r}: no source named. Fix: name one or more of "
      f"{TEACHER_CONTEXTS.names()}, e.g. --config.algo.context=skills or =sibling,hindsight"
    )
  for name in names:
    if name not in TEACHER_CONTEXTS:
      out.append(
        f"algo.context={algo.context!r}: {name!r} is not a teacher context source. Fix: use "
        f"{TEACHER_CONTEXTS.names()}, or register yours with "
        "@sdar_jax.algos.register_context_source in a module the run imports (--imports=...)"
      )
  if len(set(names)) < len(names):
    out.append(f"algo.context={algo.context!r}: a source named twice. Fix: name each once")
  for field, low in (("sibling.tokens", 1), ("hindsight.k", 1), ("hindsight.tokens", 1)):
    section, key = field.split(".")
    value = getattr(getattr(algo, section), key)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
      out.append(
        f"algo.{field}={value!r}: must be an integer >= {low}. Fix: use a positive number "
        + ("of observations (1: SDPO's feedback)" if key == "k" else "of tokens")
      )
  if not isinstance(algo.hindsight.outcome, bool):
    out.append(
      f"algo.hindsight.outcome={algo.hindsight.outcome!r}: must be True or False. Fix: set it "
      "to True or False"
    )
  if not isinstance(algo.context_templates, str):
    out.append(
      f"algo.context_templates={algo.context_templates!r}: must be a file path. Fix: give the "
      "path of a template file, or '' for the built-in templates"
    )
  return out
