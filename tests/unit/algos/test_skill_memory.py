"""Source "skill_memory" (UCOB's evolving skill memory) on hand-made episodes, against pure-Python
transcriptions of the authors' rules (TU2021/UCOB@d38292c, agent_system/memory/
reflection_memory.py and verl/trainer/main_ucob.py): the upper-confidence ranking, the utility
update, the baseline-relative credit, the validation of a written skill; a memory that evolves
over three iterations (written, validated, updated, retrieved, capped) and survives a resume."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from sdar_jax.algos import get_preset
from sdar_jax.algos.contexts import compose_teacher_contexts, load_templates
from sdar_jax.algos.reflectors import Written
from sdar_jax.algos.skill_memory import Memory, SkillMemory, parse_skill
from sdar_jax.algos.skill_memory_source import (
  OracleSkillWriter,
  SkillMemoryHooks,
  memory_round,
  skill_memory_source,
)
from sdar_jax.rollout.trajectory import Episode, Turn

T = load_templates()
ALGO = dataclasses.replace(
  get_preset("grpo"), context="skill_memory", skill_memory=SkillMemory(reflector="oracle")
)


def _turn(obs, action, reward=0.0):
  return Turn([1, 2], [3, 4], [-0.5, -0.5], action, True, 0, observation=obs, reward=reward)


def _group(group: int, task="put a apple in fridge", room="You are in a room."):
  won = Episode(0, 0, group, task=task, won=True, reward=1.0)
  won.turns = [_turn(room, "go to countertop 1"), _turn("You see a apple 1.", "put apple", 1.0)]
  lost = Episode(1, 0, group, task=task, won=False)
  lost.turns = [_turn(room, "open drawer 9"), _turn("Nothing happens.", "look")]
  return [won, lost]


# ------------------------------------------------------------------------------ authors' rules
def _authors_rank(data, sims, total_count, alpha, ucb_scale, threshold, top_m, top_k):
  """ReflectionMemory._rank_candidates with retrieve_type "ucb"."""
  rows = [(i, data[i], s) for i, s in enumerate(sims) if s >= threshold]
  if top_m > 0 and len(rows) > top_m:
    rows.sort(key=lambda r: r[2], reverse=True)
    rows = rows[:top_m]
  cands = []
  for _, item, rel in rows:
    bonus = ucb_scale * math.sqrt(math.log(total_count) / max(int(item["count"]), 1))
    cands.append((alpha * rel + (1 - alpha) * (item["utility_score"] + bonus), item["memory_id"]))
  cands.sort(key=lambda x: x[0], reverse=True)
  return [m for _, m in cands[:top_k]]


def _authors_update(data, updates, beta):
  """update_utility_by_id_scores: the EMA per update, then the total recomputed."""
  by_id = {d["memory_id"]: d for d in data}
  for mid, score in updates:
    d = by_id[mid]
    d["utility_score"] = (1 - beta) * d["utility_score"] + beta * score
    d["count"] += 1
  return max(sum(d["count"] for d in data), 1)


def test_the_ranking_and_update_are_the_authors():
  s = SkillMemory(similarity_top_m=3, relevance_threshold=0.2, task_top_k=2)
  mem = Memory(s)
  rng = np.random.default_rng(0)
  tasks = ["put apple in fridge", "put a hot apple in fridge", "clean the mug", "apple on table"]
  for k, task in enumerate(tasks * 2):
    skill = {"title": f"t{k}", "principle": f"principle {k}", "when_to_apply": f"when {k} ..."}
    mem.add("task", task, "", skill, 0, "test")
  updates = [(f"m{int(i)}", float(rng.uniform(-1, 1))) for i in rng.integers(0, 8, 12)]
  data = [{"memory_id": e["id"], "utility_score": 0.0, "count": 1} for e in mem.entries]
  mem.update(updates, 0.2)
  assert mem.total_count == _authors_update(data, updates, 0.2)
  for e, d in zip(mem.entries, data):
    assert math.isclose(e["utility"], d["utility_score"]) and e["count"] == d["count"]
  for query in ["put the apple in the fridge", "clean a mug", "apple"]:
    _, rel = mem.relevance("task", query)
    want = _authors_rank(data, rel.tolist(), mem.total_count, 0.1, 0.1, 0.2, 3, 2)
    assert mem.retrieve("task", query) == want


def test_a_written_skill_is_kept_only_when_valid():
  good = '{"task_success": false, "title": "Look first", "principle": "Go to the countertop.", '
  good += '"when_to_apply": "When the apple is not in view."}'
  assert parse_skill(f"<think>x</think><reflection>{good}</reflection>", False)[1] == "ok"
  assert parse_skill(f"```json\n{good}\n```", True) == (None, "success_mismatch")
  assert parse_skill(f"```json\n{good}\n```", True, validate=False)[1] == "ok"
  assert parse_skill("no json here", False) == (None, "parse_failed")
  assert parse_skill('{"task_success": "no", "title": "x"}', False) == (None, "empty_skill")
  with pytest.raises(ValueError, match=r"(?s)capacity=0: must be an integer >= 1.*alpha=2.0"):
    dataclasses.replace(ALGO, skill_memory=SkillMemory(alpha=2.0, capacity=0))


# ------------------------------------------------------------------------------ three iterations
class _Lying:
  """A writer that claims every attempt succeeded: validation drops all it writes."""

  name = "lying"

  def write(self, requests):
    return [
      Written(OracleSkillWriter().write([r])[0].text.replace("false", "true")) for r in requests
    ]


def test_the_memory_evolves_over_three_iterations_and_survives_a_resume():
  mem = Memory(ALGO.skill_memory)
  oracle = OracleSkillWriter()
  # a writer whose skills do not validate keeps nothing
  m = memory_round(mem, _group(0), ALGO, _Lying(), T, 0)
  assert m["skill_memory/rejected_mismatch"] == 2.0 and len(mem) == 0
  # iteration 0: nothing to retrieve; a task skill (the failure beside the success) and a state
  # skill (the first observation: returns 0.95 against 0) are written and validated
  eps = _group(0)
  m = memory_round(mem, eps, ALGO, oracle, T, 0)
  assert m["skill_memory/turns_given"] == 0.0 and m["skill_memory/written"] == 2.0
  assert [e["pool"] for e in mem.entries] == ["task", "state"]
  assert "go to countertop 1" in mem.entries[0]["principle"]  # the success's "Do" lessons
  assert "`go to countertop 1` rather than `open drawer 9`" in mem.entries[1]["principle"]
  assert mem.entries[1]["state"] == "You are in a room." and mem.total_count == 3
  # iteration 1: the same task retrieves both on every turn (the state skill is the only one of
  # its pool: its relevance, BM25 over the best, is 1); every episode was given one, so the baseline is 0 and the
  # task credit is the group's success rate 0.5; the state credit each episode's success
  eps = _group(1)
  m = memory_round(mem, eps, ALGO, oracle, T, 1)
  assert eps[0].skill_memory_ids == [(["m0"], ["m1"]), (["m0"], ["m1"])]
  assert m["skill_memory/turns_given"] == 4.0
  assert m["skill_memory/task_updates"] == 1.0 and m["skill_memory/state_updates"] == 2.0
  task, state = mem.get("m0"), mem.get("m1")
  assert math.isclose(task["utility"], 0.2 * 0.5) and task["count"] == 2
  assert math.isclose(state["utility"], 0.8 * (0.2 * 1.0) + 0.2 * 0.0) and state["count"] == 3
  assert m["skill_memory/duplicates"] == 2.0 and len(mem) == 2  # the same skills again
  counts = compose_teacher_contexts(eps, ALGO, lambda s: list(s.encode()), bytes.decode, T)
  assert counts["skill_memory/with_context"] == 4.0
  block = skill_memory_source_text(eps[0], 0)
  assert "For the task:" in block and "For this situation:" in block
  # the memory as a checkpoint keeps it: JSON round trip into a fresh hook
  hooks = SkillMemoryHooks(ALGO)
  hooks.memory = mem
  saved = json.loads(json.dumps(hooks.state_dict()))
  resumed = SkillMemoryHooks(ALGO)
  resumed.load_state_dict(saved, None)
  # iteration 2: another task, the memory capped at 3 skills: its two new skills come in, and
  # the lowest utility goes (the older of the two new ones at 0)
  capped = dataclasses.replace(
    ALGO, skill_memory=dataclasses.replace(ALGO.skill_memory, capacity=3)
  )
  outs = []
  for memory in (mem, resumed.memory):
    memory.s = capped.skill_memory
    eps = _group(2, task="put a mug in cabinet", room="You enter the kitchen.")
    outs.append((memory_round(memory, eps, capped, oracle, T, 2), eps))
  (m, eps), (m_resumed, eps_resumed) = outs
  assert m == m_resumed and [e.skill_memory_ids for e in eps] == [
    e.skill_memory_ids for e in eps_resumed
  ]
  assert mem.state_dict() == resumed.memory.state_dict()
  assert m["skill_memory/written"] == 2.0 and m["skill_memory/evicted"] == 1.0 and len(mem) == 3
  assert [e["id"] for e in mem.entries] == ["m0", "m1", "m3"]  # utilities 0.1, 0.16, 0, 0: m2 goes
  shown = json.loads(mem.to_json())
  assert [s["id"] for s in shown["skills"]] == ["m0", "m1", "m3"] and shown["total_count"] > 3
  # what a run wrote reads back (warm_start.memory) with the same state
  assert Memory.from_json(mem.to_json()).state_dict() == mem.state_dict()
  # an evaluation's token view: the memory's retrieval, its state untouched
  before, seen = mem.state_dict(), _group(3)
  resumed.memory = mem
  resumed.before_evaluation_contexts(capped, seen)
  assert mem.state_dict() == before and seen[0].skill_memory_ids[0] == (["m0"], ["m1"])
  assert compose_teacher_contexts(seen, capped, lambda s: list(s.encode()), bytes.decode, T)


def skill_memory_source_text(ep, k):
  from sdar_jax.algos.contexts import ContextRequest

  return skill_memory_source(ContextRequest(ep, [], ALGO, T, lambda s, n: s))[k]


# ------------------------------------------------------------------------------ UCOB's rollout
def test_ucob_good_view_reads_the_memory_through_the_rollout_retriever():
  from sdar_jax.algos.sections import UCOB
  from sdar_jax.algos.skill_memory_source import MemoryRetriever, _block

  algo = dataclasses.replace(get_preset("ucob"), skill_memory=SkillMemory(reflector="oracle"))
  assert algo.ucob.memory and algo.views == "mixed"
  hooks = SkillMemoryHooks(algo)

  class View:
    def __init__(self, episodes, iteration):
      self.algo, self.episodes, self.iteration, self.retriever = algo, episodes, iteration, None

    def set_rollout_retriever(self, retriever):
      self.retriever = retriever

  # the run's start installs the retriever over the (empty) memory: the first rollout's good
  # view reads no skill (UCOB's memory is empty then); the first round writes into it
  first = View(_group(0), 0)
  hooks.at_run_start(first)
  retriever = first.retriever
  assert isinstance(retriever, MemoryRetriever) and retriever.skill_text(task="x", query="x") == ""
  for ep in first.episodes:  # UCOB's views: the second half of the group plays with the skills
    for turn in ep.turns:
      turn.skills_in_prompt = ep.env_index == 1
  m = hooks.before_teacher_context(first)
  assert first.retriever is retriever and m["skill_memory/turns_given"] == 0.0
  assert len(hooks.memory) >= 1
  # the rollout's block is the memory's retrieval for (task, observation), as the round re-derives
  task, obs = "put a apple in fridge", "You are in a room."
  mem = hooks.memory
  by_id = {e["id"]: e for e in mem.entries}
  want = _block(by_id, mem.retrieve("task", task), mem.retrieve("state", task, obs), T)
  assert want and retriever.student_block("user text", query=f"{task} {obs}", task=task) == want
  assert retriever.privileged_block(query=f"{task} {obs}", task=task) == want
  assert retriever.skill_text(query="clean a mug", task="clean a mug") == ""  # nothing relevant
  # the next round: only the skill-view turns were given skills; the plain view is the baseline
  second = View(_group(0), 1)
  for ep in second.episodes:
    for turn in ep.turns:
      turn.skills_in_prompt = ep.env_index == 0  # the won episode played with them
  m = hooks.before_teacher_context(second)
  won, lost = second.episodes
  assert all(a for a, _ in won.skill_memory_ids) and not any(
    a or b for a, b in lost.skill_memory_ids
  )
  assert m["skill_memory/utility_groups"] == 1.0 and m["skill_memory/task_updates"] >= 1.0
  assert second.retriever is None  # installed at the start only
  task_skill = mem.get(won.skill_memory_ids[0][0][0])
  assert task_skill["utility"] == pytest.approx(0.2 * (1.0 - 0.0))  # β·(success − baseline)
  # a resumed run installs it over the restored memory
  resumed, view = SkillMemoryHooks(algo), View([], 2)
  resumed.load_state_dict(hooks.state_dict(), view)
  resumed.at_run_start(view)
  assert isinstance(view.retriever, MemoryRetriever) and len(view.retriever.memory) == len(mem)
  with pytest.raises(ValueError, match="algo.ucob.memory=True with algo.views='single'"):
    dataclasses.replace(get_preset("sdar"), ucob=UCOB(memory=True))


def test_the_oracles_state_skill_when_both_attempts_took_the_same_action():
  """UCOB contrasts two returns at one observation, whatever the actions: when both attempts
  took the same one, the oracle says the steps before it decide, not "do X rather than X"."""
  from sdar_jax.algos.skill_memory_source import SkillRequest, oracle_skill

  won, _ = _group(0)
  details = {"task": won.task, "observation": "You see a desklamp 1.", "better_action": "use desklamp 1",
             "better_return": 1.0, "worse_action": "use desklamp 1", "worse_return": 0.0}  # fmt: skip
  text = oracle_skill(SkillRequest("skill", "", "", episode=won, pool="state", details=details))
  skill, why = parse_skill(text, True)
  assert why == "ok" and "rather than" not in skill["principle"]
  assert "`use desklamp 1` here led to a return of 1.00 against 0.00" in skill["principle"]
