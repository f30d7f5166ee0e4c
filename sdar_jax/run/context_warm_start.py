"""Teaching a warm-started policy to read the teacher's context blocks of `algo.context`.

The expert warm start (`warm_start.py`) teaches the skill block: the skill-following expert's turns
are SFT targets under the skill prompt. `warm_start.contexts` names the other sources to teach the
same way, each with the block the trainer composes after a rollout (`sdar_jax.algos.contexts`, the
run's own templates and token budgets), so the policy meets at RL time exactly the text it was
taught on:

- "sibling": for every game where an expert episode succeeded, the expert plays it once more in
  mode "demo", following that episode (`envs.alfworld.expert.demonstration_places`); its turns are
  targets under the sibling block built from the successful episode + the student prompt.
- "hindsight": every expert turn is also a target under the hindsight block of its own episode
  (the observations its action led to) + the student prompt.
- "reflection" is measured, not taught: the group of a game's expert episodes (both modes, and
  the demonstration-following one) gets GRSD's contrastive prior from the `oracle` reflector
  (`sdar_jax.algos.reflection`) when it holds a success and a failure.
- "skill_memory" is measured, not taught: each turn gets the skills a run's memory retrieves for
  its task and observation (`warm_start.memory`: the run's <workdir>/skill_memory.json, ranked by
  the settings it was written with; `sdar_jax.algos.skill_memory_source.retrieve_for`).

The teacher–student gap of each source is measured on the held-out games' turns of the expert
whose action the block explains: the demonstration-following expert's for "sibling", the
knowledge-free expert's for the others (`warm_start/<source>_gap_on_expert`; the skill block's
keeps its name, `warm_start/teacher_student_gap_on_expert`). With `warm_start.measure` and no
steps, a run measures these gaps of its starting policy and trains nothing
(`python -m sdar_jax.tools.build_demo_policy --measure`).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Sequence
from typing import Any

from sdar_jax.algos.contexts import (
  TEACHER_CONTEXTS,
  ContextRequest,
  context_names,
  load_templates,
)
from sdar_jax.algos.reflection import reflect_episodes, reflection_source, writers
from sdar_jax.algos.skill_memory import Memory
from sdar_jax.algos.skill_memory_source import retrieve_for
from sdar_jax.core.batch import TurnSample
from sdar_jax.infra import paths
from sdar_jax.rollout.agent_loop import AgentLoop

TAUGHT = ("sibling", "hindsight")  # the sources a warm start can teach besides the skill block
MEASURED = ("reflection", "skill_memory")  # measured only: no expert follows these blocks
DEMO_MODE = "demo"  # envs.alfworld.expert.DEMO_MODE (envs is not imported here)


def taught_contexts(section: Any) -> tuple[str, ...]:
  """`warm_start.contexts` as a tuple of names ("" or absent: none)."""
  return context_names(section.get("contexts", "") or "")


def setting_problems(section: Any) -> list[str]:
  """The problems of `warm_start.contexts` and `warm_start.measure`, one line each."""
  problems = []
  names = taught_contexts(section)
  for name in names:
    if name not in TAUGHT + MEASURED:
      problems.append(
        f"warm_start.contexts={section.contexts!r}: {name!r} cannot be taught or measured. Fix: "
        f"name any of {list(TAUGHT + MEASURED)} (the skill block is taught by the 'skills' "
        "expert already), or ''"
      )
  if names and section.get("source", "walkthroughs") != "expert":
    problems.append(
      f"warm_start.contexts={section.contexts!r} needs warm_start.source='expert' (the blocks "
      "are taught on the search expert's games). Fix: set warm_start.source=expert"
    )
  memory = section.get("memory", "") or ""
  if "skill_memory" in names and not memory:
    problems.append(
      f"warm_start.contexts={section.contexts!r} measures 'skill_memory' without a memory. Fix: "
      "set warm_start.memory to a run's <workdir>/skill_memory.json"
    )
  elif memory and not paths.exists(memory):
    problems.append(
      f"warm_start.memory={memory!r}: no such file. Fix: point to the skill_memory.json a run "
      "with teacher context 'skill_memory' wrote in its workdir"
    )
  measure = section.get("measure", False)
  if not isinstance(measure, bool):
    problems.append(f"warm_start.measure={measure!r}: must be True or False. Fix: set one")
  return problems


def play_demonstrations(
  records: Sequence[dict[str, Any]],
  play: Callable[[list[int], Callable[[dict[str, Any]], Any]], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
  """Replays in mode "demo" every game that has a successful record among `records` (each with
  its "task_index"), following the first successful record of that game in `records`' order
  (the knowledge-free expert's before the skill-following one's). `play(tasks, demonstration)`
  plays the expert on those game indices (`warm_start.record_expert_games` in mode "demo");
  each returned record holds the one it followed under "demonstration"."""
  by_game: dict[str, dict[str, Any]] = {}
  for record in records:
    if record["won"] and record["steps"]:
      by_game.setdefault(record["gamefile"], record)
  tasks = sorted({r["task_index"] for r in by_game.values()})
  if not tasks:
    return []
  played = play(tasks, lambda info: by_game[info["gamefile"]]["steps"])
  return [dict(r, demonstration=by_game[r["gamefile"]]) for r in played if r["gamefile"] in by_game]


def _episode(record: dict[str, Any]) -> types.SimpleNamespace:
  """An expert record in the shape the context sources read (`rollout.trajectory.Episode`)."""
  won = bool(record.get("won", False))
  return types.SimpleNamespace(
    turns=[
      types.SimpleNamespace(observation=s["observation"], action=s["action"])
      for s in record["steps"]
    ],
    won=won,
    reward=1.0 if won else 0.0,  # ALFWorld's return: 1 for a won game
    final_observation=record.get("final_observation", ""),
  )


def reflection_texts(
  records: Sequence[dict[str, Any]], algo: Any, templates: dict[str, str]
) -> dict[int, list[str | None]]:
  """Source "reflection"'s block on each step of each record (by id), its group a game's records,
  the prior written by the `oracle` reflector (`algo.reflection`'s budgets and templates)."""
  settings = dataclasses.replace(algo.reflection, reflector="oracle", judge="none")
  episodes = []
  for record in records:
    episode = _episode(record)
    episode.task, episode.group_id, episode.env_error, episode.info = (
      record.get("task", ""), record.get("gamefile", ""), None, {}
    )  # fmt: skip
    episodes.append(episode)
  writer, _ = writers(settings)
  reflect_episodes(episodes, settings, writer, None, templates)
  return {
    id(r): reflection_source(ContextRequest(ep, [], algo, templates, None))
    for r, ep in zip(records, episodes)
  }


def memory_texts(
  records: Sequence[dict[str, Any]], memory_file: str, templates: dict[str, str]
) -> dict[int, list[str | None]]:
  """Source "skill_memory"'s block on each step of each record (by id): the skills the memory in
  `memory_file` retrieves for the record's task and the step's observation (None: none qualify).
  Retrieval is pure: the memory is read, never updated."""
  memory = Memory.from_json(
    paths.read_text(memory_file), where=f"warm_start.memory={memory_file!r}"
  )
  episodes = [_episode(record) for record in records]
  for record, episode in zip(records, episodes):
    episode.task, episode.env_error = record.get("task", ""), None
  retrieve_for(memory, episodes, templates)  # one call: its queries' cache spans the records
  return {id(r): list(ep.skill_memory_blocks) for r, ep in zip(records, episodes)}


def block_texts(
  source: str, record: dict[str, Any], algo: Any, templates: dict[str, str], cut
) -> list[str | None]:
  """The context block `source` gives each step of `record`, by the trainer's own source function:
  "sibling" from the record's demonstration (its group), "hindsight" from its own steps."""
  group = [_episode(record["demonstration"])] if source == "sibling" else []
  request = ContextRequest(_episode(record), group, algo, templates, cut)
  return TEACHER_CONTEXTS.get(source)(request)


def context_samples(
  source: str,
  records: Sequence[dict[str, Any]],
  loop: AgentLoop,
  end_token_id: int,
  algo: Any,
  *,
  for_gap: bool,
  record_turns: Callable[..., list[tuple]],
  make_sample: Callable[..., TurnSample],
  memory: str = "",
) -> list[TurnSample]:
  """One sample per non-random expert step of the records `source` teaches on (module docstring):
  for SFT (`for_gap` False) the block + the student prompt as its prompt; for the gap
  (`for_gap` True) the student prompt with the block + it as the teacher prompt. A step the
  source gives no block is left out. `record_turns` and `make_sample` are the warm start's own
  (`warm_start._record_turns`, `warm_start._sample`): the student prompts and responses exactly
  as its other samples'. `memory` is `warm_start.memory` (source "skill_memory")."""
  if source in MEASURED and not for_gap:
    return []  # measured only
  if source == "sibling":
    chosen = [r for r in records if r.get("mode") == DEMO_MODE]
  else:  # the knowledge-free expert's turns for the gap, every expert's for SFT
    keep = ("plain",) if for_gap else ("plain", "skills")
    chosen = [r for r in records if r.get("mode") in keep]
  templates = load_templates(algo.context_templates)
  tok = loop.tokenizer

  def cut(text: str, tokens: int) -> str:
    ids = tok.encode(text)
    return text if len(ids) <= tokens else tok.decode(ids[:tokens])

  rows = record_turns(chosen, loop, end_token_id, skip_random=True)
  steps = {
    id(r): [k for k, s in enumerate(r["steps"]) if not s.get("random", False)] for r in chosen
  }
  if source == "reflection":
    texts = reflection_texts(records, algo, templates)  # groups: all of a game's records
  elif source == "skill_memory":
    texts = memory_texts(chosen, memory, templates)
  else:
    texts = {id(r): block_texts(source, r, algo, templates, cut) for r in chosen}
  seen: dict[int, int] = {}
  out = []
  for record, plain, _, response, action in rows:
    n = seen[id(record)] = seen.get(id(record), -1) + 1
    text = texts[id(record)][steps[id(record)][n]]
    if text is None:
      continue
    block = tok.encode(text) + list(plain)
    task_type = record.get("task_type", "unknown")
    if for_gap:
      sample = make_sample(list(plain), response, 0, task_type, teacher=block)
      sample.score = 1.0 if action.startswith("go to ") else 0.0  # marks the search turns
    else:
      sample = make_sample(block, response, 0, task_type)
    out.append(sample)
  return out
