"""Teacher context source "skill_memory": skills retrieved from an evolving memory that the
reflector writes from the run's own episodes, after UCOB (TU2021/UCOB@d38292c; the memory's rules:
`sdar_jax.algos.skill_memory`; docs/reference.md, "UCOB's skill memory").

Once per iteration, between the rollout and the teacher's contexts (`before_teacher_context`),
`memory_round`:

1. retrieval: each episode's task skills (query: the task) and, per turn, its state skills (the
   task and the turn's observation) by the upper-confidence rule, from the memory as the earlier
   iterations left it; the teacher reads them before each turn (template "skill_memory");
2. utility, UCOB's `baseline_relative` (`_update_baseline_relative_memory_utility`): per GRPO
   group, the episodes given a skill against the others (baseline: their success rate, 0 when
   there are none); the task skills given in the group get mean success(given) − baseline (β
   `task_beta`), the state skills given to an episode get its success − baseline (β
   `state_beta`). The skills given are the teacher's: the student played without them;
3. writing (`reflection_selection` "group_task", `_build_group_task_reflection_obs`): per group,
   its first failure, shown beside its first success when it has one; with `step_skills`, per
   group the `step_per_group` observations where two turns' discounted returns differ most (at
   least `step_min_gap`), the better and the worse action shown
   (`_select_step_contrast_reflection_records`); each written by the reflector as JSON and kept
   only when valid (`parse_skill`: its `task_success` the real outcome: False for both kinds);
4. with `train` past its warm-up, UCOB's reflection training records of the skills the good view
   used (`sdar_jax.algos.skill_memory_training`), trained after the iteration's updates;
5. the memory cut to its capacity.

The memory is saved with every checkpoint (`state_dict`) and written to <workdir>/skill_memory.json
at each iteration's end. Each process keeps the memory of its own episodes.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from sdar_jax.algos.contexts import ContextRequest, load_templates, register_context_source
from sdar_jax.algos.hooks import MethodHooks, register_hooks
from sdar_jax.algos.reflection import _cut, steps_text
from sdar_jax.algos.reflectors import (
  ORACLE_LABEL,
  Request,
  Written,
  build_writer,
  oracle_reflection,
)
from sdar_jax.algos.skill_memory import Memory, parse_skill
from sdar_jax.algos.skill_memory_training import (
  train_reflections,
  training_active,
  training_records,
)

SOURCE = "skill_memory"
MEMORY_FILE = "skill_memory.json"


@dataclasses.dataclass
class SkillRequest(Request):
  """A skill to write: `pool` "task" (about `episode`, `reference` a success of its group or
  None) or "state" (`details`: task, observation, the better and worse actions, their returns)."""

  pool: str = "task"
  reference: Any = None
  details: dict = dataclasses.field(default_factory=dict)


# ------------------------------------------------------------------------------------ requests
def discounted_returns(ep: Any, gamma: float) -> list[float]:
  """Each turn's Σ_k γ^(k−t)·r_k over its episode from it on (r: the env's reward for the turn)."""
  out, running = [], 0.0
  for turn in reversed(ep.turns):
    running = float(turn.reward) + gamma * running
    out.append(running)
  return out[::-1]


def task_request(ep: Any, reference: Any, s, reflect_settings, t: dict[str, str]) -> SkillRequest:
  ref = ""
  if reference is not None:
    ref = t["skill_memory_reference"].format(steps=steps_text(reference, reflect_settings, t))
    ref += "\n\n"
  user = t["skill_memory_task_user"].format(
    task=_cut(ep.task, 1500),
    reference=ref,
    outcome="succeeded" if ep.won else "failed",
    steps=steps_text(ep, reflect_settings, t),
  )
  sys = t["skill_memory_system"]
  return SkillRequest("skill", sys, user, episode=ep, pool="task", reference=reference)


def state_requests(members: Sequence[Any], s, t: dict[str, str]) -> list[SkillRequest]:
  """The group's `step_per_group` contrasting observations as state-skill requests."""
  by_obs: dict[str, list[tuple[float, Any, Any]]] = {}
  for ep in members:
    for turn, ret in zip(ep.turns, discounted_returns(ep, s.gamma)):
      if turn.observation:
        by_obs.setdefault(turn.observation, []).append((ret, ep, turn))
  found = []
  for obs, rows in by_obs.items():
    if len(rows) < 2:
      continue
    rows = sorted(rows, key=lambda row: row[0])  # stable: the first of equal returns stays first
    (worst, w_ep, w_turn), (best, _, b_turn) = rows[0], rows[-1]
    if best - worst >= s.step_min_gap:
      found.append((best - worst, obs, w_ep, b_turn.action, best, w_turn.action, worst))
  found.sort(key=lambda row: -row[0])
  out = []
  for _, obs, ep, better, b_ret, worse, w_ret in found[: s.step_per_group]:
    details = {"task": ep.task, "observation": obs, "better_action": better}
    details.update(better_return=b_ret, worse_action=worse, worse_return=w_ret)
    user = t["skill_memory_state_user"].format(**{**details, "observation": _cut(obs, 1200)})
    sys = t["skill_memory_system"]
    out.append(SkillRequest("skill", sys, user, episode=ep, pool="state", details=details))
  return out


# ------------------------------------------------------------------------------------ oracle
def oracle_skill(r: SkillRequest) -> str:
  """The oracle's skill as JSON after ORACLE_LABEL: for a task, the first success's "Do"
  lessons (`oracle_reflection`), else the failure's own; for a state, the better action over the
  worse one. Its `task_success` is the real outcome of the episode written about."""
  if r.pool == "state":
    d = r.details
    better, worse = d["better_action"], d["worse_action"]
    returns = f"{d['better_return']:.2f} against {d['worse_return']:.2f}"
    principle = f"Do `{better}` rather than `{worse}` here: it led to a return of {returns}."
    if better == worse:  # UCOB contrasts returns at one observation, not actions
      principle = (
        f"`{better}` here led to a return of {returns} in another attempt: it pays only once "
        "the steps the task needs before it are done."
      )
    skill = {
      "title": f"At this point, {better}",
      "principle": principle,
      "when_to_apply": f"When you see: {_cut(d['observation'], 200)}",
    }
  else:
    source = r.reference if r.reference is not None else r.episode
    lines = oracle_reflection(source).splitlines()[1:]
    points = [line.split(". ", 1)[-1] for line in lines]
    skill = {
      "title": f"How to {_cut(r.episode.task, 60)}".strip(),
      "principle": " ".join(points) or "(nothing learned)",
      "when_to_apply": f"When the task is to {_cut(r.episode.task, 200)}",
    }
  skill = {"task_success": bool(r.episode.won), **skill}
  return f"{ORACLE_LABEL}\n{json.dumps(skill, ensure_ascii=False)}"


@dataclasses.dataclass
class OracleSkillWriter:
  name: str = "oracle"

  def write(self, requests: Sequence[SkillRequest]) -> list[Written | None]:
    return [Written(oracle_skill(r)) for r in requests]


def skill_writer(algo: Any, generate=None):
  """The writer of algo.skill_memory.reflector ("openai": algo.reflection's endpoint)."""
  s, r = algo.skill_memory, algo.reflection
  if s.reflector == "oracle":
    return OracleSkillWriter()
  return build_writer(
    s.reflector, url=r.url, model=r.model, api_key_env=r.api_key_env, timeout=r.timeout,
    retries=r.retries, max_new_tokens=s.tokens, temperature=s.temperature, generate=generate,
  )  # fmt: skip


# ------------------------------------------------------------------------------------ a round
def _groups(episodes: Sequence[Any]) -> dict[Any, list[Any]]:
  out: dict[Any, list[Any]] = {}
  for ep in episodes:
    if ep.env_error is None and ep.turns:
      out.setdefault(ep.group_id, []).append(ep)
  return out


def retrieve_for(
  memory: Memory, episodes: Sequence[Any], t: dict[str, str], views: bool = False
) -> dict[str, float]:
  """Sets on each episode `skill_memory_ids` (per turn: (task ids, state ids)) and
  `skill_memory_blocks` (per turn: the teacher's text, or None when nothing was retrieved).
  `views` (UCOB's rollout, `algo.ucob.memory`): only the turns played with the skills in the
  prompt (`Turn.skills_in_prompt`) were given them (the retrieval is the rollout's: the memory has
  not changed since); the others get none."""
  by_id = {e["id"]: e for e in memory.entries}
  cache: dict[tuple, list[str]] = {}

  def ids(pool: str, task: str, state: str = "") -> list[str]:
    key = (pool, task, state)
    if key not in cache:
      cache[key] = memory.retrieve(pool, task, state)
    return cache[key]

  given = 0.0
  for ep in episodes:
    ep.skill_memory_ids, ep.skill_memory_blocks = [], []
    if ep.env_error is not None:
      continue
    task_ids = ids("task", ep.task)
    for turn in ep.turns:
      if views and not turn.skills_in_prompt:
        ep.skill_memory_ids.append(([], []))
        ep.skill_memory_blocks.append(None)
        continue
      state_ids = ids("state", ep.task, turn.observation)
      ep.skill_memory_ids.append((list(task_ids), list(state_ids)))
      ep.skill_memory_blocks.append(_block(by_id, task_ids, state_ids, t))
      given += float(bool(task_ids or state_ids))
  return {"skill_memory/turns_given": given}


def _block(by_id, task_ids, state_ids, t) -> str | None:
  if not task_ids and not state_ids:
    return None
  parts = []
  for head, chosen in (("task_head", task_ids), ("state_head", state_ids)):
    if chosen:
      items = [t["skill_memory_item"].format(**by_id[i]) for i in chosen]
      parts.append("\n".join([t[f"skill_memory_{head}"], *items]))
  return t["skill_memory"].format(skills="\n".join(parts)) + "\n\n"


def update_utilities(memory: Memory, episodes: Sequence[Any], s) -> dict[str, float]:
  """UCOB's baseline-relative update from the episodes' outcomes (module docstring, 2)."""
  task_updates, state_updates, groups = [], [], 0
  for members in _groups(episodes).values():
    ids = {id(ep): getattr(ep, "skill_memory_ids", []) for ep in members}
    good = [ep for ep in members if any(a or b for a, b in ids[id(ep)])]
    rest = [ep for ep in members if ep not in good]
    if not good:
      continue
    groups += 1
    baseline = float(np.mean([ep.won for ep in rest])) if rest else 0.0
    credit = float(np.mean([ep.won for ep in good])) - baseline
    task_ids = sorted({i for ep in good for a, _ in ids[id(ep)] for i in a})
    task_updates += [(i, credit) for i in task_ids]
    for ep in good:
      state_ids = sorted({i for _, b in ids[id(ep)] for i in b})
      state_updates += [(i, float(ep.won) - baseline) for i in state_ids]
  n_task = memory.update(task_updates, s.task_beta)
  n_state = memory.update(state_updates, s.state_beta)
  return {
    "skill_memory/utility_groups": float(groups),
    "skill_memory/task_updates": float(n_task),
    "skill_memory/state_updates": float(n_state),
  }


def write_skills(
  memory: Memory, episodes, algo, writer, t: dict[str, str], iteration: int
) -> dict[str, float]:
  """UCOB's task and state skills of the iteration (module docstring, 3), validated and kept."""
  s = algo.skill_memory
  asks: list[SkillRequest] = []
  for members in _groups(episodes).values():
    wins = [ep for ep in members if ep.won]
    fails = [ep for ep in members if not ep.won]
    if fails:
      asks.append(task_request(fails[0], wins[0] if wins else None, s, algo.reflection, t))
    if s.step_skills and s.step_per_group > 0:
      asks += state_requests(members, s, t)
  counts = dict.fromkeys(("ok", "parse_failed", "success_mismatch", "empty_skill"), 0.0)
  counts.update(duplicate=0.0, failed=0.0)
  source = getattr(writer, "name", s.reflector)
  for r, w in zip(asks, writer.write(asks) if asks else []):
    if w is None:
      counts["failed"] += 1
      continue
    skill, why = parse_skill(w.text, bool(r.episode.won), s.validate)
    if skill is not None:
      state = r.details.get("observation", "") if r.pool == "state" else ""
      tokens = (w.prompt_ids, w.response_ids) if s.train and w.response_ids else None
      added = memory.add(r.pool, r.episode.task, state, skill, iteration, source, tokens)
      why = "ok" if added else "duplicate"
    counts[why] += 1
  return {
    "skill_memory/asked": float(len(asks)),
    "skill_memory/written": counts["ok"],
    "skill_memory/rejected_mismatch": counts["success_mismatch"],
    "skill_memory/rejected_unparsed": counts["parse_failed"] + counts["empty_skill"],
    "skill_memory/duplicates": counts["duplicate"],
    "skill_memory/failed": counts["failed"],
  }


def memory_round(
  memory: Memory, episodes, algo, writer, templates, iteration: int, records: list | None = None
) -> dict:
  """One iteration's retrieval, utility update, writing and cut (module docstring); `records`
  (a list) receives the reflection training's records (`training_records`) before the cut."""
  metrics = retrieve_for(memory, episodes, templates, views=bool(algo.ucob.memory))
  metrics.update(update_utilities(memory, episodes, algo.skill_memory))
  metrics.update(write_skills(memory, episodes, algo, writer, templates, iteration))
  if records is not None:
    records.extend(training_records(memory, episodes, algo.skill_memory))
  metrics["skill_memory/evicted"] = float(len(memory.evict()))
  metrics["skill_memory/size"] = float(len(memory))
  for pool in ("task", "state"):
    metrics[f"skill_memory/{pool}_size"] = float(sum(e["pool"] == pool for e in memory.entries))
  utilities = [e["utility"] for e in memory.entries]
  metrics["skill_memory/utility_mean"] = float(np.mean(utilities)) if utilities else 0.0
  return metrics


# ------------------------------------------------------------------------------------ source
@register_context_source(SOURCE)
def skill_memory_source(request: ContextRequest) -> list[str | None]:
  """Per turn: the skills retrieved for it (template "skill_memory"), or None."""
  ep = request.episode
  if not hasattr(ep, "skill_memory_blocks"):
    raise RuntimeError(
      "teacher context source 'skill_memory': the episode has no retrieved skills; the "
      "skill-memory hook (before_teacher_context) did not run. Fix: train through "
      "sdar_jax.run.trainer, or call sdar_jax.algos.skill_memory_source.memory_round first"
    )
  return list(ep.skill_memory_blocks)


# ------------------------------------------------------------------------------------ rollout
# UCOB's good view reads the memory (TU2021/UCOB@d38292c: the rollout's `memory.retrieve` for the
# skill-prompted half of each group; `algo.ucob.memory`): the hooks install a `MemoryRetriever` on
# the training agent loop when the run starts (fresh or resumed), so from the first rollout on the
# episodes that play with the skills read, per turn, the task skills for the task and the state
# skills for the turn's observation, template "skill_memory" (empty when nothing qualifies). The
# retrieval is pure: the round re-derives the same ids for the utility update.
def state_of(query: str, task: str) -> str:
  """The observation in a rollout's skill query (the adapter's "<task> <observation>")."""
  query = query or ""
  if task and query.startswith(task):
    return query[len(task) :].strip()
  return query.strip()


class MemoryRetriever:
  """`envs.skills.SkillRetriever`'s interface over a `Memory` (the rollout calls `student_block`
  for the good view's prompt; `privileged_block` serves a teacher block)."""

  header = ""

  def __init__(self, memory: Memory, templates: dict[str, str]):
    self.memory, self.templates = memory, templates

  def skill_text(self, task_type=None, gamefile=None, query="", sample_id=None, task="") -> str:
    del task_type, gamefile, sample_id
    task_ids = self.memory.retrieve("task", task)
    state_ids = self.memory.retrieve("state", task, state_of(query, task))
    by_id = {e["id"]: e for e in self.memory.entries}
    return _block(by_id, task_ids, state_ids, self.templates) or ""

  def privileged_block(self, task_type=None, gamefile=None, query="", sample_id=None, task=""):
    return self.skill_text(task_type, gamefile, query, sample_id, task)

  def student_block(self, prompt_text: str, **kwargs: Any) -> str:
    del prompt_text
    return self.skill_text(**kwargs)


# ------------------------------------------------------------------------------------ hooks
class SkillMemoryHooks(MethodHooks):
  """The memory across iterations: its round before the teacher's contexts, UCOB's reflection
  training after the updates, its JSON at each iteration's end, its state in every checkpoint."""

  def __init__(self, algo):
    self.memory = Memory(algo.skill_memory)
    self.records: list | None = None  # the iteration's reflection training records
    self.installed = not algo.ucob.memory  # only UCOB's rollout reads the memory

  def _install(self, view):
    """UCOB's rollout (`algo.ucob.memory`): the good view's skills from the memory
    (`MemoryRetriever`)."""
    if view is not None and not self.installed:
      view.set_rollout_retriever(
        MemoryRetriever(self.memory, load_templates(view.algo.context_templates))
      )
      self.installed = True

  def at_run_start(self, view):
    self._install(view)  # UCOB's first rollout reads the memory (empty, or as restored)

  def before_teacher_context(self, view):
    templates = load_templates(view.algo.context_templates)
    writer = skill_writer(view.algo, getattr(view, "generate", None))
    start = time.perf_counter()
    self.records = [] if training_active(view.algo.skill_memory, view.iteration) else None
    metrics = memory_round(
      self.memory, view.episodes, view.algo, writer, templates, view.iteration, self.records
    )
    metrics["perf/skill_memory_seconds"] = time.perf_counter() - start
    return metrics

  def after_updates(self, view):
    """UCOB's reflection training pass over the round's records (`train_reflections`)."""
    records, self.records = self.records, None
    if records is None:
      return None
    start = time.perf_counter()
    metrics = train_reflections(view, records, view.algo.skill_memory)
    metrics["perf/skill_memory_train_seconds"] = time.perf_counter() - start
    return metrics

  def before_evaluation_contexts(self, algo, episodes):
    """The memory's retrieval for every turn (pure: no utility update, no writing)."""
    retrieve_for(self.memory, episodes, load_templates(algo.context_templates))

  def at_iteration_end(self, view):
    save = getattr(view, "save_text", None)
    if save is not None:
      save(MEMORY_FILE, self.memory.to_json())

  def state_dict(self):
    return self.memory.state_dict()

  def load_state_dict(self, state, view):
    self.memory.load_state_dict(state)

  def run_problems(self, config) -> list[str]:
    s = config.algo.skill_memory
    if s.reflector == "openai" and not config.algo.reflection.url:
      problem = (
        "algo.reflection.url='': the skill memory's writer 'openai' needs the endpoint's API "
        "base. Fix: --config.algo.reflection.url=http://HOST:PORT/v1 (and .model)"
      )
      return [problem]
    async_run = (
      config.train.get("max_staleness", 0) or config.rollout.get("overlap", "off") != "off"
    )
    if config.algo.ucob.memory and async_run:
      problem = (
        "algo.ucob.memory=True with train.max_staleness > 0 or rollout.overlap: a rollout would "
        "play before the previous iteration's memory round. Fix: train.max_staleness=0 and "
        "rollout.overlap=off"
      )
      return [problem]
    return []


@register_hooks("skill_memory")
def _skill_memory_hooks(algo) -> MethodHooks | None:
  wanted = SOURCE in algo.context_names or algo.ucob.memory
  return SkillMemoryHooks(algo) if wanted else None


__all__ = [
  "SOURCE",
  "MemoryRetriever",
  "SkillMemoryHooks",
  "memory_round",
  "oracle_skill",
  "skill_memory_source",
]
