"""A search expert for ALFWorld that does not know where the object is: the warm start's teacher.

The planner's walkthroughs go straight to the hidden object, a behaviour no policy can copy
without seeing where the object is. `SearchExpert` plays like a careful person instead: it reads
the task sentence, visits receptacles one after the other, opens the closed ones, takes the
target when an observation shows it, uses the appliance the task needs (the microwave to heat,
the fridge to cool, a sink basin to clean, the named lamp to look), and delivers. It acts only on
what the agent itself sees each turn: the observation text and the admissible commands (the task
sentence is part of the first observation). It never receives the game file, the PDDL facts, the
planner's plan or any other hidden state, so its decisions are a function of the transcript and
its seed alone (`replay` checks exactly that).

Both modes know the game's mechanics above; they differ only in where they look first:
- without skills (`skill_text=None`) the receptacles are searched in a knowledge-free order, a
  seeded shuffle of the room ("shuffled") or the order of the room description ("room");
- with skills, the order is read from the skill text itself (`search_priorities`): the
  "Places by type:" list of the general ALFWorld skills names, for each object type, the
  receptacle types where the generated households keep it, most likely first ("tables" and "seats"
  stand for the groups the same text defines). Those receptacles are searched first, in that
  order, then the rest of the room in the knowledge-free order. An object type the text does not
  list falls back to the knowledge-free order.

A third mode, "demo", follows a demonstration: the steps of another, successful episode of the same
game (`demonstration_places`): the receptacles where that episode took the task's object and used
the lamp are searched first, then the rest as above. It is how the demo's context-reading policy
learns to read a worked example in the teacher's prompt (`algo.context=sibling`); the expert still
sees only the transcript and the demonstration, never the game file.

`epsilon` is the share of turns on which it sends a uniformly drawn admissible command instead
(an imperfect expert; such turns are marked in the recorded steps). With `invalid_share` > 0, that
share of the random turns sends an inadmissible command instead, of the kinds a small policy gets
wrong: going to where it already stands, to a receptacle type the room does not have, or taking
a numbered copy of the target that is not there (the engine answers "Nothing happens."). Such
turns are context, not targets, in the warm start: the turns after them show how the expert goes
on from the unchanged state, which a policy trained on flawless transcripts never sees. `play_episodes` runs experts
on an `envs.EnvPool` of ALFWorld envs (the real engine) and records every step as the agent loop
sees it.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
  "DEMO_MODE",
  "MODES",
  "SEARCH_ORDERS",
  "Goal",
  "SearchExpert",
  "demonstration_places",
  "parse_goal",
  "play_episodes",
  "replay",
  "search_priorities",
]

MODES = ("plain", "skills")  # knowledge-free search, skill-following search
DEMO_MODE = "demo"  # follows another episode's steps (played on request, not one of MODES)
# ALFRED's receptacle classes as the engine names them (lower case): where an inadmissible "go to"
# of an imperfect expert may point when the room lacks them.
RECEPTACLE_TYPES = (
  "armchair",
  "bathtubbasin",
  "bed",
  "cabinet",
  "cart",
  "coffeemachine",
  "coffeetable",
  "countertop",
  "desk",
  "diningtable",
  "drawer",
  "dresser",
  "fridge",
  "garbagecan",
  "handtowelholder",
  "laundryhamper",
  "microwave",
  "ottoman",
  "safe",
  "shelf",
  "sidetable",
  "sinkbasin",
  "sofa",
  "stoveburner",
  "toaster",
  "toilet",
  "toiletpaperhanger",
  "towelholder",
  "tvstand",
)
SEARCH_ORDERS = ("shuffled", "room")
APPLIANCE = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}

# The task sentences of ALFWorld (and of envs.alfworld.generator), most specific first.
_GOAL_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
  (kind, re.compile(pattern))
  for kind, pattern in (
    ("look", r"^look at (?:a |an |the |some )?(?P<obj>\w+) under the (?P<lamp>\w+)$"),
    ("look", r"^examine (?:a |an |the |some )?(?P<obj>\w+) with the (?P<lamp>\w+)$"),
    ("two", r"^put two (?P<obj>\w+) (?:in|on) (?P<dest>\w+)$"),
    ("two", r"^find two (?P<obj>\w+) and put them (?:in|on) (?P<dest>\w+)$"),
    ("clean", r"^put a clean (?P<obj>\w+) (?:in|on) (?P<dest>\w+)$"),
    ("heat", r"^put a hot (?P<obj>\w+) (?:in|on) (?P<dest>\w+)$"),
    ("cool", r"^put a cool (?P<obj>\w+) (?:in|on) (?P<dest>\w+)$"),
    ("clean", r"^clean (?:a |an |the |some )?(?P<obj>\w+) and put it (?:in|on) (?P<dest>\w+)$"),
    ("heat", r"^heat (?:a |an |the |some )?(?P<obj>\w+) and put it (?:in|on) (?P<dest>\w+)$"),
    ("cool", r"^cool (?:a |an |the |some )?(?P<obj>\w+) and put it (?:in|on) (?P<dest>\w+)$"),
    ("pick", r"^put (?:a |an |the |some )?(?P<obj>\w+) (?:in|on) (?P<dest>\w+)$"),
  )
)
_TASK = re.compile(r"Your task is to:\s*(.*?)\s*$", re.DOTALL)
_ROOM = re.compile(r"Looking quickly around you, you see (.*?)\.\s*(?:\n|$)")
_NAME = r"[a-z]+ \d+"
_ARRIVE = re.compile(rf"^You arrive at (?:loc \d+|(?P<where>{_NAME}))\.")
_CLOSED = re.compile(rf"The (?P<where>{_NAME}) is closed\.")
_ON = re.compile(rf"On the (?P<where>{_NAME}), you see (?P<what>.*?)\.(?:\s|$)")
_IN = re.compile(rf"The (?P<where>{_NAME}) is open\. In it, you see (?P<what>.*?)\.(?:\s|$)")
_TAKE = re.compile(rf"^You pick up the (?P<what>{_NAME}) from the (?P<where>{_NAME})\.")
_MOVE = re.compile(
  rf"^You (?:move|put) the (?P<what>{_NAME}) (?:to|in|on) the (?P<where>{_NAME})\."
)
_CHANGE = re.compile(rf"^You (?P<verb>heat|cool|clean) the (?P<what>{_NAME}) using the")
_PLACES = re.compile(r"Places by type: (.*?)\.(?:\s|$)")
_GROUP = re.compile(r"\b(\w+) = ([a-z]+(?:, [a-z]+)*)")


@dataclasses.dataclass(frozen=True)
class Goal:
  """What a task sentence asks: `kind` in pick / two / clean / heat / cool / look, the object type,
  the destination receptacle type (placement tasks) and the lamp type (look tasks)."""

  kind: str
  obj: str
  dest: str = ""
  lamp: str = ""


def parse_goal(task: str) -> Goal:
  """The goal of an ALFWorld task sentence ("put a hot mug in cabinet." -> heat, mug, cabinet)."""
  sentence = task.strip().rstrip(".").strip().lower()
  for kind, pattern in _GOAL_PATTERNS:
    match = pattern.match(sentence)
    if match:
      groups = match.groupdict()
      return Goal(kind, groups["obj"], groups.get("dest") or "", groups.get("lamp") or "")
  raise ValueError(
    f"cannot read the task sentence {task!r}: the expert knows the six ALFWorld task phrasings "
    f"(e.g. 'put a hot mug in cabinet.', 'look at pen under the desklamp.'); pass the text after "
    f"'Your task is to:'"
  )


def search_priorities(skill_text: str) -> dict[str, list[str]]:
  """Object type -> receptacle types to search first, most likely first, read from `skill_text`.

  Reads every "Places by type: <objects>: <places>; ...." list in the text, expanding the group
  names the text defines ("tables = countertop, diningtable, ..."). The first mention of an object
  type wins (the general skills come first in a skill block). Empty when the text has no such list.
  """
  groups = {name: members.split(", ") for name, members in _GROUP.findall(skill_text)}
  priorities: dict[str, list[str]] = {}
  for listing in _PLACES.findall(skill_text):
    for entry in listing.split("; "):
      if ": " not in entry:
        continue
      objects, places = entry.split(": ", 1)
      order: list[str] = []
      for place in places.split(", "):
        for receptacle in groups.get(place.strip(), [place.strip()]):
          if receptacle and receptacle not in order:
            order.append(receptacle)
      for obj in objects.split(", "):
        priorities.setdefault(obj.strip(), order)
  return priorities


def demonstration_places(steps: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
  """Object type -> the receptacles (by name) where a demonstration took an object of that type or
  used it (a lamp is used where one stands), in the order it did so, from its steps' actions
  ("go to R", "take X from R", "use X") alone."""
  places: dict[str, list[str]] = {}
  here = None
  for step in steps:
    action = step.get("action", "").strip()
    go = re.fullmatch(rf"go to ({_NAME})", action)
    take = re.fullmatch(rf"take ({_NAME}) from ({_NAME})", action)
    use = re.fullmatch(rf"use ({_NAME})", action)
    if go:
      here = go.group(1)
    elif take:
      places.setdefault(_type(take.group(1)), []).append(take.group(2))
    elif use and here:
      places.setdefault(_type(use.group(1)), []).append(here)
  return {k: list(dict.fromkeys(v)) for k, v in places.items()}


def _things(listing: str) -> list[str]:
  """["apple 1", "mug 2"] from "a apple 1, and a mug 2" ("nothing" -> [])."""
  if listing.strip() == "nothing":
    return []
  found = []
  for part in listing.replace(", and ", ", ").replace(" and ", ", ").split(", "):
    part = part.strip()
    for article in ("a ", "an ", "the ", "some "):
      if part.startswith(article):
        part = part[len(article) :]
        break
    if re.fullmatch(_NAME, part):
      found.append(part)
  return found


def _type(name: str) -> str:
  return name.rsplit(" ", 1)[0]


def _number(name: str) -> int:
  return int(name.rsplit(" ", 1)[1])


class SearchExpert:
  """One episode's expert. Call `act(observation, admissible)` every turn, starting with the
  first observation (it holds the room and the task); it returns the command to send.

  Args:
    skill_text: the skill text the expert follows (its "Places by type" list sets the search
      order); None: the knowledge-free search.
    epsilon: probability of sending a uniformly drawn admissible command on a turn.
    seed: seeds the shuffled search order and the random turns; the same seed and transcript give
      the same commands.
    search_order: the knowledge-free order, "shuffled" (seeded) or "room" (room description order).
    invalid_share: share of the random turns that send an inadmissible command instead of an
      admissible one (0: every random command is admissible).
    demonstration: the steps of a successful episode of the same game (mode "demo"): the places
      `demonstration_places` reads from it are searched before any others.
  """

  def __init__(
    self,
    skill_text: str | None = None,
    epsilon: float = 0.0,
    seed: int | str = 0,
    search_order: str = "shuffled",
    invalid_share: float = 0.0,
    demonstration: Sequence[dict[str, Any]] | None = None,
  ):
    if not 0.0 <= epsilon <= 1.0:
      raise ValueError(f"epsilon={epsilon} must be in [0, 1] (the share of random turns).")
    if not 0.0 <= invalid_share <= 1.0:
      raise ValueError(
        f"invalid_share={invalid_share} must be in [0, 1] (the share of the random turns that "
        "send an inadmissible command)."
      )
    if search_order not in SEARCH_ORDERS:
      raise ValueError(f"search_order={search_order!r}; choose one of {SEARCH_ORDERS}.")
    self.priorities = search_priorities(skill_text) if skill_text else {}
    self.mode = "skills" if skill_text else "plain"
    self.shown: dict[str, list[str]] = {}  # object type -> receptacles a demonstration used
    if demonstration is not None:
      self.shown, self.mode = demonstration_places(demonstration), DEMO_MODE
    self.epsilon = epsilon
    self.invalid_share = invalid_share
    self.search_order = search_order
    self.rng = random.Random(f"search-expert:{seed}")
    self.goal: Goal | None = None
    self.order: list[str] = []  # receptacles to search for the object, in visiting order
    self.lamp_order: list[str] = []  # ... and for the lamp (look tasks)
    self.location: str | None = None
    self.contents: dict[str, list[str]] = {}  # receptacle -> objects seen in it (last look)
    self.closed: set[str] = set()
    self.holding: str | None = None
    self.changed: set[str] = set()  # objects heated / cooled / cleaned
    self.delivered: list[tuple[str, str]] = []  # (object, receptacle) placed for the goal
    self.last_random = False  # whether the last command was a random one

  # ------------------------------------------------------------------------------ reading
  def _start(self, observation: str, admissible: Sequence[str]) -> None:
    task = _TASK.search(observation)
    if not task:
      raise ValueError(
        "the first observation must contain 'Your task is to: ...' (the expert reads the task "
        f"from it); got {observation[:200]!r}"
      )
    self.goal = parse_goal(task.group(1))
    room = _ROOM.search(observation)
    receptacles = _things(room.group(1)) if room else []
    if not receptacles:  # no room description: the places one can go to
      receptacles = [c[len("go to ") :] for c in admissible if c.startswith("go to ")]
    free = list(receptacles)
    if self.search_order == "shuffled":
      free.sort(key=lambda r: (_type(r), _number(r)))  # independent of the description's order
      self.rng.shuffle(free)
    self.order = self._prioritised(self.goal.obj, receptacles, free)
    self.lamp_order = (
      self._prioritised(self.goal.lamp, receptacles, free) if self.goal.kind == "look" else []
    )

  def _prioritised(self, obj: str, receptacles: list[str], free: list[str]) -> list[str]:
    first = [r for r in self.shown.get(obj, []) if r in receptacles]
    for rtype in self.priorities.get(obj, []):
      first += sorted((r for r in receptacles if _type(r) == rtype and r not in first), key=_number)
    return first + [r for r in free if r not in first]

  def _observe(self, observation: str) -> None:
    text = observation.strip()
    arrive = _ARRIVE.match(text)
    if arrive:  # older ALFWorld releases say "You arrive at loc 12. On the desk 1, you see ..."
      named = [p.search(text) for p in (_ON, _IN, _CLOSED)]
      fallback = next((m.group("where") for m in named if m), None)
      self.location = arrive.group("where") or fallback
    take = _TAKE.match(text)
    if take:
      self.holding = take.group("what")
      seen = self.contents.get(take.group("where"), [])
      if take.group("what") in seen:
        seen.remove(take.group("what"))
    move = _MOVE.match(text)
    if move:
      what, where = move.group("what"), move.group("where")
      self.holding = None
      self.contents.setdefault(where, []).append(what)
      if self.goal and _type(what) == self.goal.obj and _type(where) == self.goal.dest:
        self.delivered.append((what, where))
    change = _CHANGE.match(text)
    if change:
      self.changed.add(change.group("what"))
    closed = _CLOSED.search(text)
    if closed:
      self.closed.add(closed.group("where"))
    for pattern in (_ON, _IN):
      seen = pattern.search(text)
      if seen:
        self.closed.discard(seen.group("where"))
        self.contents[seen.group("where")] = _things(seen.group("what"))
    if text.startswith("You close the "):
      self.closed.add(text[len("You close the ") :].rstrip(". "))
    if text.startswith("You are not carrying anything"):
      self.holding = None

  # ------------------------------------------------------------------------------ deciding
  def act(self, observation: str, admissible: Sequence[str]) -> str:
    """The command for this turn, from the current observation and admissible commands only."""
    if self.goal is None:
      self._start(observation, admissible)
    self._observe(observation)
    commands = [c for c in admissible if c != "help"]
    if not commands:
      raise ValueError("no admissible commands: the expert needs the env's admissible list.")
    self.last_random = self.rng.random() < self.epsilon
    if self.last_random:
      if self.invalid_share and self.rng.random() < self.invalid_share:
        wrong = self._inadmissible(commands)
        if wrong:
          return self.rng.choice(self.rng.choice(wrong))
      return self.rng.choice(commands)
    action = self._plan(commands)
    if action not in commands:  # a stale belief: look at a fresh place instead
      action = self.rng.choice([c for c in commands if c.startswith("go to ")] or commands)
    return action

  def _inadmissible(self, commands: Sequence[str]) -> list[list[str]]:
    """Inadmissible commands by kind (each kind non-empty): a "go to" where it stands, a "go to"
    a receptacle type absent from the room, a "take" of a target copy that is not here."""
    here, admissible = self.location, set(commands)
    present = {_type(r) for r in self.order}
    kinds = [
      [f"go to {here}"] if here else [],
      [f"go to {t} 1" for t in RECEPTACLE_TYPES if t not in present],
      [f"take {self.goal.obj} {n} from {here}" for n in (1, 2, 3)] if here and self.goal else [],
    ]
    kinds = [[c for c in kind if c not in admissible] for kind in kinds]
    return [kind for kind in kinds if kind]

  def _plan(self, commands: Sequence[str]) -> str:
    goal = self.goal
    assert goal is not None
    here = self.location
    if self.holding and _type(self.holding) != goal.obj:  # a wrong object in hand: put it back
      put = [c for c in commands if c.startswith(f"move {self.holding} to ")]
      return put[0] if put else f"move {self.holding} to {here}"
    if self.holding:
      return self._with_target(self.holding, commands)
    # Empty hands: a target seen before and not yet delivered, else search on.
    placed = {o for o, _ in self.delivered}
    into = {r for _, r in self.delivered}
    for receptacle in [here] + [r for r in self.order if r != here]:
      for thing in self.contents.get(receptacle or "", []):
        if _type(thing) == goal.obj and thing not in placed and receptacle not in into:
          if receptacle == here:
            return f"take {thing} from {receptacle}"
          return f"go to {receptacle}"
    return self._search(self.order, skip_dest=goal.kind != "look", commands=commands)

  def _search(self, order: Sequence[str], skip_dest: bool, commands: Sequence[str]) -> str:
    """Opens the closed receptacle it stands at, else goes to the next one not yet looked into."""
    here = self.location
    if here in self.closed and f"open {here}" in commands:
      return f"open {here}"
    for receptacle in order:
      if receptacle == here or receptacle in self.contents:
        continue
      if skip_dest and self.goal and _type(receptacle) == self.goal.dest:
        continue  # a game never starts with the task already done
      return f"go to {receptacle}"
    # Everything looked into: revisit places at random (something may have been missed).
    return self.rng.choice([c for c in commands if c.startswith("go to ")] or list(commands))

  def _with_target(self, thing: str, commands: Sequence[str]) -> str:
    goal = self.goal
    assert goal is not None
    here = self.location
    if goal.kind in APPLIANCE and thing not in self.changed:
      verb, appliance = goal.kind, APPLIANCE[goal.kind]
      use = [c for c in commands if c.startswith(f"{verb} {thing} with ")]
      if use:
        return use[0]
      places = [r for r in self.order if _type(r) == appliance]
      places.sort(key=lambda r: (r not in self.contents, _number(r)))  # one already seen first
      if places:
        return f"go to {places[0]}"
    if goal.kind == "look":
      use = [c for c in commands if c.startswith(f"use {goal.lamp} ")]
      if use:
        return use[0]
      lamp_at = [r for r, seen in self.contents.items() if any(_type(t) == goal.lamp for t in seen)]
      if lamp_at:
        return f"go to {lamp_at[0]}"
      return self._search(self.lamp_order, skip_dest=False, commands=commands)
    # Deliver: the receptacle the first of two went into, else one already opened or seen, else
    # the lowest-numbered one of the destination type.
    if self.delivered:
      dest = self.delivered[0][1]
    else:
      choices = [r for r in self.order if _type(r) == goal.dest]
      if here in choices:
        dest = here
      else:
        choices.sort(key=lambda r: (r in self.closed, r not in self.contents, _number(r)))
        dest = choices[0] if choices else ""
    if not dest:
      return self._search(self.order, skip_dest=False, commands=commands)
    if here != dest:
      return f"go to {dest}"
    if f"move {thing} to {dest}" in commands:
      return f"move {thing} to {dest}"
    if f"open {dest}" in commands:
      return f"open {dest}"
    return f"move {thing} to {dest}"


def replay(expert: SearchExpert, steps: Sequence[dict[str, Any]]) -> list[str]:
  """The commands `expert` chooses when fed a recorded transcript's observations and admissible
  commands (as `play_episodes` records them), one per step, in order."""
  return [expert.act(s["observation"], s["admissible_commands"]) for s in steps]


def play_episodes(
  pool: Any,
  tasks: Sequence[int],
  modes: Sequence[str],
  skill_text: Callable[[dict[str, Any]], str] | None = None,
  epsilon: float = 0.0,
  seed: int = 0,
  search_order: str = "shuffled",
  invalid_share: float = 0.0,
  demonstration: Callable[[dict[str, Any]], Sequence[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
  """Plays game `tasks[i]` on env i of `pool` (an `envs.EnvPool` of ALFWorld envs; its envs'
  `max_steps` is the turn limit) with a `SearchExpert` in `modes[i]`, all episodes in lock-step.

  `skill_text(info)` gives the skill text of an episode in "skills" mode from the env's reset
  info (its task type and game file; the expert itself sees neither) with the first observation
  added under "observation"; `demonstration(info)`, from the same info, the steps an episode in
  mode "demo" follows. Episode i's expert is seeded with f"{seed}:{tasks[i]}:{modes[i]}".

  Returns one record per episode: task, task_type, gamefile, mode, won, failed (the env crashed),
  steps, each step the observation before the command, the admissible commands, the command
  and whether it was a random one (exactly the text the agent loop turns into a prompt), and
  final_observation, what the env answered to the last command.
  """
  if len(tasks) != len(modes):
    raise ValueError(f"{len(tasks)} tasks but {len(modes)} modes; give one mode per task.")
  if len(tasks) > len(pool):
    raise ValueError(f"{len(tasks)} episodes requested but the env pool has {len(pool)} envs.")
  bad = sorted(set(modes) - {*MODES, DEMO_MODE})
  if bad:
    raise ValueError(f"unknown expert modes {bad}; choose from {(*MODES, DEMO_MODE)}.")
  if "skills" in modes and skill_text is None:
    raise ValueError("'skills' mode needs skill_text (a function of the env's reset info).")
  if DEMO_MODE in modes and demonstration is None:
    raise ValueError("'demo' mode needs demonstration (a function of the env's reset info).")
  n = len(tasks)
  records: list[dict[str, Any]] = []
  experts: list[SearchExpert] = []
  current: list[tuple[str, list[str]]] = []
  for i, result in enumerate(pool.reset(list(tasks), list(range(n)))):
    info = result.info
    text = None
    if modes[i] == "skills" and skill_text and not result.failed:
      text = skill_text(dict(info, observation=result.observation))
    shown = demonstration(info) if modes[i] == DEMO_MODE and demonstration else None
    experts.append(
      SearchExpert(
        text, epsilon, f"{seed}:{tasks[i]}:{modes[i]}", search_order, invalid_share, shown
      )
    )
    records.append(
      {
        "task": info.get("task", ""),
        "task_type": info.get("task_type", "unknown"),
        "gamefile": info.get("gamefile", ""),
        "mode": modes[i],
        "won": False,
        "failed": result.failed,
        "steps": [],
      }
    )
    current.append((result.observation, list(info.get("admissible_commands", []))))
  active = [i for i in range(n) if not records[i]["failed"]]
  while active:
    actions = []
    for i in active:
      observation, admissible = current[i]
      action = experts[i].act(observation, admissible)
      actions.append(action)
      records[i]["steps"].append(
        {
          "observation": observation,
          "admissible_commands": admissible,
          "action": action,
          "random": experts[i].last_random,
        }
      )
    still = []
    for i, result in zip(active, pool.step(actions, active)):
      if result.failed:
        records[i]["failed"] = True
        continue
      records[i]["won"] = bool(result.info.get("won", False))
      records[i]["final_observation"] = result.observation
      current[i] = (result.observation, list(result.info.get("admissible_commands", [])))
      if not (result.done or records[i]["won"]):
        still.append(i)
    active = still
  return records
