"""A game specification (room, receptacles, objects, goal) and its PDDL problem for alfworld's ALFRED domain.

The problem declares the agent, one location per receptacle plus the agent's starting spot (which
has no receptacle, so the first observation is "You are in the middle of a room"), the object and
receptacle type constants, and the static facts the domain's actions test: receptacleType,
objectType, canContain, openable, pickupable, heatable/coolable/cleanable, toggleable. Goals are
written per task type from the domain's predicates (what "done" means in ALFRED).
"""

from __future__ import annotations

import dataclasses

from envs.alfworld.catalog import OBJECTS, OPENABLE
from envs.alfworld.tasks import TASK_TYPES

__all__ = ["Receptacle", "Thing", "GameSpec", "pddl_problem", "pddl_goal"]

AGENT = "agent1"
START_LOCATION = "loc_bar_0"


@dataclasses.dataclass(frozen=True)
class Receptacle:
  id: str  # PDDL id, e.g. "Cabinet_bar_3" or "Sink_bar_1_bar_SinkBasin"
  type: str  # ALFRED class, e.g. "Cabinet", "SinkBasin"
  location: str  # PDDL location id


@dataclasses.dataclass(frozen=True)
class Thing:
  id: str  # PDDL id, e.g. "Apple_bar_2"
  type: str  # ALFRED class, e.g. "Apple", "DeskLamp"
  receptacle: str  # id of the receptacle it starts in


@dataclasses.dataclass(frozen=True)
class GameSpec:
  """Everything needed to write one game. `parent_target` is empty for look tasks, `toggle_target` otherwise."""

  task_type: str
  room: str
  scene: int
  object_target: str
  parent_target: str
  toggle_target: str
  task_desc: str
  receptacles: tuple[Receptacle, ...]
  things: tuple[Thing, ...]

  def __post_init__(self) -> None:
    if self.task_type not in TASK_TYPES:
      raise ValueError(f"unknown task type {self.task_type!r}; expected one of {TASK_TYPES}")


def _exists(variables: str, body: str) -> str:
  return f"(exists ({variables}) {body})"


def pddl_goal(spec: GameSpec) -> str:
  """The (:goal ...) form for the spec's task type."""
  obj, recep = f"{spec.object_target}Type", f"{spec.parent_target}Type"
  kind = spec.task_type
  if kind == "look_at_obj_in_light":
    lamp_lit_here = _exists(
      "?t - object ?r - receptacle ?l - location",
      f"(and (objectType ?t {spec.toggle_target}Type) (toggleable ?t) (isToggled ?t) (inReceptacle ?t ?r) "
      f"(receptacleAtLocation ?r ?l) (atLocation {AGENT} ?l))",
    )
    holding = _exists("?o - object", f"(and (objectType ?o {obj}) (holds {AGENT} ?o))")
    return f"(:goal (and {lamp_lit_here} {holding}))"
  if kind == "pick_two_obj_and_place":
    body = (
      f"(and (not (= ?o1 ?o2)) (objectType ?o1 {obj}) (objectType ?o2 {obj}) (receptacleType ?r {recep}) "
      f"(inReceptacle ?o1 ?r) (inReceptacle ?o2 ?r))"
    )
    return f"(:goal {_exists('?r - receptacle ?o1 - object ?o2 - object', body)})"
  state = {
    "pick_and_place_simple": "",
    "pick_clean_then_place_in_recep": " (cleanable ?o) (isClean ?o)",
    "pick_heat_then_place_in_recep": " (heatable ?o) (isHot ?o)",
    "pick_cool_then_place_in_recep": " (coolable ?o) (isCool ?o)",
  }[kind]
  body = f"(and (objectType ?o {obj}) (receptacleType ?r {recep}){state} (inReceptacle ?o ?r))"
  return f"(:goal {_exists('?r - receptacle ?o - object', body)})"


def pddl_problem(spec: GameSpec, name: str = "generated") -> str:
  """The full PDDL problem text (domain `alfred`)."""
  receptacle_types = sorted({r.type for r in spec.receptacles})
  object_types = sorted({t.type for t in spec.things} | {spec.object_target})
  location_of = {r.id: r.location for r in spec.receptacles}
  for thing in spec.things:
    if thing.receptacle not in location_of:
      raise ValueError(f"{thing.id} is placed in unknown receptacle {thing.receptacle!r}")

  objects = [f"{AGENT} - agent", f"{START_LOCATION} - location"]
  objects += [f"{r.location} - location" for r in spec.receptacles]
  objects += [f"{r.id} - receptacle" for r in spec.receptacles]
  objects += [f"{t.id} - object" for t in spec.things]
  objects += [f"{t}Type - otype" for t in object_types]
  objects += [f"{t}Type - rtype" for t in receptacle_types]

  init = [f"(atLocation {AGENT} {START_LOCATION})"]
  for r in spec.receptacles:
    init.append(f"(receptacleAtLocation {r.id} {r.location})")
    init.append(f"(receptacleType {r.id} {r.type}Type)")
    if r.type in OPENABLE:
      init.append(f"(openable {r.id})")
  for t in spec.things:
    init.append(f"(objectType {t.id} {t.type}Type)")
    kind = OBJECTS.get(t.type)
    if kind is None:  # a lamp: it stays where it is and can be switched on
      init.append(f"(toggleable {t.id})")
    else:
      init.append(f"(pickupable {t.id})")
      for flag in ("heatable", "coolable", "cleanable"):
        if getattr(kind, flag):
          init.append(f"({flag} {t.id})")
    init.append(f"(inReceptacle {t.id} {t.receptacle})")
    init.append(f"(objectAtLocation {t.id} {location_of[t.receptacle]})")
  for rtype in receptacle_types:
    for otype in object_types:
      kind = OBJECTS.get(otype)
      if kind is not None and rtype in kind.places:
        init.append(f"(canContain {rtype}Type {otype}Type)")

  lines = [f"(define (problem {name})", "(:domain alfred)", "(:objects"]
  lines += objects
  lines += [")", "(:init"]
  lines += init
  lines += [")", pddl_goal(spec), ")", ""]
  return "\n".join(lines)
