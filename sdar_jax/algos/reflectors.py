"""The text writers that teacher context source "reflection" calls (`sdar_jax.algos.reflection`):
a reflector writes a reflection on one episode and a group's contrastive prior from reflections,
a judge scores a reflection (its text read by `parse_score`). Each is one of three kinds:

* "policy": the policy being trained, through the in-process sampler, one batched call per
  stage (`generate` is handed in by the trainer's iteration view: `Iteration.generate`); its
  prompt and response ids and log-probs are kept, so the reflection tokens can be trained.
* "openai": an OpenAI-compatible chat-completions endpoint at a URL the user gives
  (`sdar_jax.infra.chat_endpoint`: standard library only; timeouts, retries; a request that
  fails is dropped, and when every request of a call fails the run stops with one message naming
  the URL).
* "oracle": a deterministic writer from the episode record and what the environment knows:
  where the task's objects were seen, which actions changed nothing, and the environment's own
  plan when the episode recorded it (`info["expert_plan"]`). It reads what no policy can; its
  texts start with ORACLE_LABEL. It serves the demo's scale, where a 1M-parameter policy writes
  no usable text.

A writer is `write(requests) -> [Written | None]` (None: that request failed).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

from sdar_jax.infra.chat_endpoint import ChatEndpoint, EndpointError

KINDS = ("policy", "openai", "oracle")
ORACLE_LABEL = "[oracle: written from the episode record and the environment's ground truth]"


@dataclasses.dataclass
class Request:
  """One text to write: `kind` "reflect" (on `episode`), "prior" (from `positives` and
  `negatives`, the group's reflections) or "judge" (a score of `reflection` on `episode`); the
  chat prompt's `system` and `user` text (what "policy" and "openai" read)."""

  kind: str
  system: str
  user: str
  episode: Any = None
  reflection: str = ""
  positives: tuple[str, ...] = ()
  negatives: tuple[str, ...] = ()


@dataclasses.dataclass
class Written:
  """A written text; from "policy" also its chat prompt's ids, the response ids and their
  sampling log-probs."""

  text: str
  prompt_ids: list[int] | None = None
  response_ids: list[int] | None = None
  logprobs: list[float] | None = None


def parse_score(text: str | None) -> int | None:
  """A judge's reply as a score: its first digit 0-3 (GRSD's `ReflectionJudge._parse_score`);
  None when it holds none."""
  if text is None:
    return None
  found = re.search(r"[0-3]", text)
  return None if found is None else int(found.group(0))


# ------------------------------------------------------------------------------------ writers
@dataclasses.dataclass
class PolicyWriter:
  """Kind "policy": `generate(conversations, max_new_tokens, temperature)` -> per conversation
  (prompt ids, response ids, log-probs, text), one batched sampler call."""

  generate: Callable[..., list]
  max_new_tokens: int = 512
  temperature: float = 1.0
  name: str = "policy"

  def write(self, requests: Sequence[Request]) -> list[Written | None]:
    if not requests:
      return []
    chats = [_chat(r) for r in requests]
    out = self.generate(chats, self.max_new_tokens, self.temperature)
    return [Written(text.strip(), list(p), list(ids), list(lp)) for p, ids, lp, text in out]


@dataclasses.dataclass
class EndpointWriter:
  """Kind "openai": one chat completion per request, the endpoint's concurrency at a time."""

  endpoint: ChatEndpoint
  max_new_tokens: int = 512
  temperature: float = 0.0
  name: str = "openai"

  def write(self, requests: Sequence[Request]) -> list[Written | None]:
    if not requests:
      return []
    out = self.endpoint.complete_many(
      [_chat(r) for r in requests], self.temperature, self.max_new_tokens
    )
    if all(isinstance(o, EndpointError) for o in out):
      raise out[0]  # the endpoint does not answer at all: stop with its message
    return [None if isinstance(o, EndpointError) else Written(o.strip()) for o in out]


@dataclasses.dataclass
class OracleWriter:
  """Kind "oracle" (module docstring): `oracle_reflection`, `oracle_prior`, `oracle_score`."""

  max_points: int = 3
  name: str = "oracle"

  def write(self, requests: Sequence[Request]) -> list[Written | None]:
    out: list[Written | None] = []
    for r in requests:
      if r.kind == "reflect":
        out.append(Written(oracle_reflection(r.episode, self.max_points)))
      elif r.kind == "prior":
        out.append(Written(oracle_prior(r.positives, r.negatives)))
      elif r.kind == "judge":
        out.append(Written(str(oracle_score(r.episode, r.reflection))))
      else:
        raise ValueError(f"request kind {r.kind!r}: not reflect, prior or judge")
    return out


def _chat(r: Request) -> list[dict[str, str]]:
  system = [{"role": "system", "content": r.system}] if r.system else []  # OPID's: user only
  return [*system, {"role": "user", "content": r.user}]


def build_writer(
  kind: str,
  *,
  url: str = "",
  model: str = "",
  api_key_env: str = "",
  timeout: float = 60.0,
  retries: int = 2,
  max_new_tokens: int = 512,
  temperature: float = 1.0,
  generate: Callable[..., list] | None = None,
):
  """The writer of `kind` (KINDS); "policy" needs `generate`, "openai" a `url`."""
  if kind == "policy":
    if generate is None:
      raise ValueError("reflector 'policy' needs the trainer's generate (Iteration.generate)")
    return PolicyWriter(generate, max_new_tokens, temperature)
  if kind == "openai":
    endpoint = ChatEndpoint(url, model, api_key_env, timeout=timeout, retries=retries)
    return EndpointWriter(endpoint, max_new_tokens, temperature)
  if kind == "oracle":
    return OracleWriter()
  raise ValueError(f"reflector {kind!r}: not one of {KINDS}")


# ------------------------------------------------------------------------------------ oracle
_NOTHING = re.compile(r"^\s*nothing happens", re.IGNORECASE)
_NOT_OBJECTS = frozenset(
  re.findall(
    r"\w+",
    "put place move take some the and with them then into onto in on at of for to it its a an "
    "two clean cool hot heat cold look examine find under using use your task is desklamp light",
  )
)
_POINT = re.compile(r"^\s*\d+\.\s*(.+?)\s*$")
_ACTION = re.compile(r"`([^`]+)`")


def task_objects(task: str) -> list[str]:
  """The words of the task that may name its objects (ALFWorld's "put a clean apple in fridge":
  apple, fridge), in order."""
  words = re.findall(r"[a-z]+", task.lower())
  return list(dict.fromkeys(w for w in words if len(w) > 2 and w not in _NOT_OBJECTS))


def _after(ep: Any) -> list[str]:
  """The observation each turn's action led to."""
  turns = ep.turns
  out = [t.observation for t in turns[1:]]
  return out + [getattr(ep, "final_observation", "") or ""] if turns else []


def oracle_reflection(ep: Any, max_points: int = 3) -> str:
  """Up to `max_points` numbered lessons from `ep`: a won episode's "Do `<action>`" lines (its
  finishing action, then where the task's objects were first seen); a lost one's "Avoid
  `<action>`: it changed nothing." lines (each such action once), then the environment's plan
  from where it stopped ("Do `<step>` next"), else where objects were seen."""
  actions = [t.action for t in ep.turns]
  after = _after(ep)
  objects = task_objects(getattr(ep, "task", "") or "")
  seen: list[str] = []
  shown: set[str] = set()
  for action, obs in zip(actions, after):
    for obj in objects:
      if obj not in shown and re.search(rf"\b{obj}\s+\d+", obs.lower()):
        shown.add(obj)
        seen.append(f"Do `{action}`: it showed the {obj}.")
  if ep.won:
    points = ([f"Do `{actions[-1]}`: it finished the task."] if actions else []) + seen
  else:
    before = [t.observation for t in ep.turns]
    idle = [
      a
      for a, b, obs in zip(actions, before, after)
      if _NOTHING.match(obs) or obs.strip() == b.strip()
    ]
    points = [f"Avoid `{a}`: it changed nothing." for a in dict.fromkeys(idle)]
    plan = list((getattr(ep, "info", None) or {}).get("expert_plan") or [])
    points = points[: max_points - 1] + (
      [f"Do `{plan[0]}` next: the environment's plan from where the attempt stopped."]
      if plan
      else seen
    )
  lines = [f"{k + 1}. {p}" for k, p in enumerate(points[:max_points])]
  return "\n".join([ORACLE_LABEL, *lines]) if lines else ORACLE_LABEL


def _points(texts: Sequence[str], prefix: str) -> list[str]:
  out = []
  for text in texts:
    for line in text.splitlines():
      m = _POINT.match(line)
      if m and m.group(1).startswith(prefix):
        out.append(m.group(1))
  return list(dict.fromkeys(out))


def oracle_prior(positives: Sequence[str], negatives: Sequence[str], most: int = 5) -> str:
  """The group's contrastive prior from its reflections: the successes' "Do" lessons under DO,
  the failures' "Avoid" lessons under AVOID, each lesson once, at most `most` each, in order."""
  do = _points(positives, "Do ")[:most] or ["(none)"]
  avoid = _points(negatives, "Avoid ")[:most] or ["(none)"]
  return "\n".join(
    [ORACLE_LABEL, "DO:", *(f"- {p}" for p in do), "AVOID:", *(f"- {p}" for p in avoid)]
  )


def oracle_score(ep: Any, reflection: str) -> int:
  """A reflection's score in 0-3: 0 when it has no numbered lesson or none that fits the outcome
  (a "Do" lesson for a win, an "Avoid" one for a loss); else the number of lessons whose quoted
  action the episode really played, at most 3."""
  points = [m.group(1) for m in map(_POINT.match, (reflection or "").splitlines()) if m]
  want = "Do " if ep.won else "Avoid "
  if not any(p.startswith(want) for p in points):
    return 0
  played = {t.action for t in ep.turns}
  grounded = [p for p in points if any(a in played for a in _ACTION.findall(p))]
  return min(3, len(grounded))
