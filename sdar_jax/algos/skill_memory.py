"""UCOB's evolving skill memory (arXiv 2606.29502; TU2021/UCOB@d38292c,
agent_system/memory/reflection_memory.py `ReflectionMemory` / `DynamicMemoryProvider` and
verl/trainer/main_ucob.py, with its ALFWorld launcher's settings): the memory object and its rules.
The teacher context source "skill_memory" and its round are `sdar_jax.algos.skill_memory_source`.

A skill is {title, principle, when_to_apply} in one of two pools: "task" (written about a task,
retrieved by the task's text) and "state" (written about one observation, retrieved by the task
and the observation). Each has a utility (initial 0) and a count (1 when written).

* Retrieval (`retrieve`, UCOB's `_rank_candidates` with retrieve_type "ucb"): the pool's skills
  scored for relevance to the query; those under `relevance_threshold` dropped; the
  `similarity_top_m` most relevant kept; each scored α·relevance + (1 − α)·(utility +
  c·sqrt(ln N / count)), N the memory's total count; the `top_k` highest (ties: pool order).
  Relevance is BM25 (bm25s) divided by the query's best BM25 score over the pool, in [0, 1]: UCOB
  uses the cosine of sentence embeddings (all-MiniLM-L6-v2), which cannot be downloaded here.
* Utility (`update`, `_update_score_internal`): u ← (1 − β)·u + β·score, count += 1, then N =
  max(Σ count, 1) (`_recompute_total_count`). A write adds 1 to N.
* Validation (`parse_skill`, `add_from_reflection_output`): the writer's JSON (in
  <reflection>...</reflection>, a ```json block, else from the first "{" to the last "}") must
  hold a `task_success` equal to the real outcome of the episode written about, and a title (>= 2
  characters), principle and when_to_apply (>= 8 each), else the skill is not kept.
* Capacity (ours: UCOB's memory grows without bound): past `capacity` skills, the lowest
  utility goes first (the oldest among equals). A skill whose text is already in its pool is not
  written twice (ours: UCOB adds its structured skills without a check).
* Reflection training (`train`, UCOB's `reflection_train_*`): a policy-written skill keeps its
  writer's prompt and response token ids (`prompt_ids`, `response_ids`: in `state_dict`, not in
  the readable JSON); `sdar_jax.algos.skill_memory_training` trains them on their utilities.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

POOLS = ("task", "state")


@dataclasses.dataclass(frozen=True)
class SkillMemory:
  """Source "skill_memory"'s settings (algo.skill_memory); defaults: UCOB's ALFWorld launcher
  (run_alfworld_qwen25_3b_full.sh at d38292c) unless marked ours."""

  reflector: str = "policy"
  """Who writes the skills: "policy", "openai" (algo.reflection.url / .model, its endpoint
  settings) or "oracle" (`sdar_jax.algos.reflectors`)."""
  task_top_k: int = 3
  """Task skills retrieved per turn (the task's text as the query)."""
  state_top_k: int = 3
  """State skills retrieved per turn (the task and the turn's observation as the query)."""
  alpha: float = 0.1
  """Weight of relevance in the retrieval score (the rest: utility and its bonus)."""
  ucb_scale: float = 0.1
  """c, the exploration bonus's scale."""
  relevance_threshold: float = 0.4
  """Skills less relevant than this (BM25 / the best BM25 of the query) are not retrieved."""
  similarity_top_m: int = 10
  """Only the m most relevant skills are scored (0: all)."""
  task_beta: float = 0.2
  """β of a task skill's utility update."""
  state_beta: float = 0.2
  """β of a state skill's utility update."""
  initial_utility: float = 0.0
  """A new skill's utility (UCOB's baseline_relative update: 0)."""
  validate: bool = True
  """Keep a skill only when its `task_success` equals the real outcome."""
  step_skills: bool = True
  """Also write state skills from contrasting turns (step_reflection_enable)."""
  step_per_group: int = 1
  """State skills written per GRPO group (the largest return gaps)."""
  step_min_gap: float = 0.05
  """A state skill's two turns differ in discounted return by at least this."""
  gamma: float = 0.95
  """Discount of the turn returns that pick a state skill's turns."""
  capacity: int = 200
  """Ours: most skills kept (both pools); the lowest utility goes first."""
  tokens: int = 512
  """New tokens of a skill ("policy", "openai")."""
  temperature: float = 1.0
  """The writer's sampling temperature (the trajectory shown: algo.reflection.max_turns,
  .obs_chars, .action_chars)."""
  # UCOB's reflection training (`reflection_train_*`; `sdar_jax.algos.skill_memory_training`)
  train: bool = False
  """Train the policy's own skill-writing on the written skills' utilities after each
  iteration's updates (`reflection_train_enable`; preset `ucob`: on). Needs algo.ucob.memory;
  only skills written by reflector "policy" carry tokens to train."""
  train_warmup: int = 30
  """The training runs from iteration `train_warmup` (0-based) on: UCOB's steps count from 1 and
  train when step > `reflection_train_warmup_steps` (0: from the first)."""
  train_task_samples: int = 16
  """At most this many task skills trained an iteration (the top of UCOB's sort)."""
  train_state_samples: int = 16
  """At most this many state skills trained an iteration."""
  train_min_count_task: int = 1
  """A task skill is trained once its count (1 when written, +1 per update) reaches this."""
  train_min_count_state: int = 1
  """The same for a state skill (the launcher's 1; UCOB's code default is 10)."""
  train_min_abs_utility: float = 0.02
  """Skills with |utility| under this are not trained."""
  train_eps: float = 0.05
  """Floor of the utilities' std in the advantage (u − mean) / max(std, eps), per pool."""
  train_clip: float = 2.0
  """The advantage clipped to [−clip, clip] (0: not clipped)."""
  train_mini_batch_size: int = 16
  """Skills per optimizer step of the training pass (`reflection_train_mini_batch_size`)."""
  train_loss_weight: float = 1.0
  """Scales the advantages of the pass (`reflection_loss_weight`)."""


def skill_memory_problems(algo: Any) -> list[str]:
  """Every invalid algo.skill_memory value, one "algo.skill_memory.<key>=<value>: <problem>.
  Fix: <fix>" line each."""
  s, out = algo.skill_memory, []
  if algo.ucob.memory and algo.views != "mixed":
    out.append(
      f"algo.ucob.memory=True with algo.views={algo.views!r}: the memory's skills go to UCOB's "
      "good view. Fix: algo.views=mixed (preset ucob), or algo.ucob.memory=False"
    )
  kinds = ("policy", "openai", "oracle")
  if s.reflector not in kinds:
    out.append(f"algo.skill_memory.reflector={s.reflector!r}: not a writer. Fix: use {kinds}")
  ints = {"task_top_k": 0, "state_top_k": 0, "similarity_top_m": 0, "step_per_group": 0}
  ints.update(capacity=1, tokens=1, train_warmup=0, train_task_samples=0, train_state_samples=0)
  ints.update(train_min_count_task=0, train_min_count_state=0, train_mini_batch_size=1)
  for key, low in ints.items():
    v = getattr(s, key)
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
      out.append(f"algo.skill_memory.{key}={v!r}: must be an integer >= {low}. Fix: one that is")
  unit = ("alpha", "task_beta", "state_beta", "relevance_threshold", "gamma")
  train = ("train_min_abs_utility", "train_eps", "train_clip", "train_loss_weight")
  for key in unit + ("ucb_scale", "step_min_gap", "temperature", "initial_utility") + train:
    v = getattr(s, key)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
      out.append(f"algo.skill_memory.{key}={v!r}: must be a number. Fix: use one")
    elif key in unit and not 0 <= v <= 1:
      out.append(f"algo.skill_memory.{key}={v!r}: must be in [0, 1]. Fix: use one that is")
    elif key not in unit and key != "initial_utility" and v < 0:
      out.append(f"algo.skill_memory.{key}={v!r}: must be >= 0. Fix: use one that is")
  for key in ("validate", "step_skills", "train"):
    if not isinstance(getattr(s, key), bool):
      out.append(f"algo.skill_memory.{key}={getattr(s, key)!r}: must be True or False. Fix: set it")
  if isinstance(s.train_eps, (int, float)) and s.train_eps == 0:
    out.append("algo.skill_memory.train_eps=0: the advantage divides by max(std, eps). Fix: > 0")
  if s.train is True and not algo.ucob.memory:
    out.append(
      "algo.skill_memory.train=True with algo.ucob.memory=False: UCOB trains the skills its good "
      "view used. Fix: preset ucob (algo.ucob.memory=True), or algo.skill_memory.train=False"
    )
  return out


# ------------------------------------------------------------------------------------ parsing
def _clean(value: Any, chars: int) -> str:
  return " ".join(str(value or "").strip().split())[:chars].strip()


def extract_json(text: str) -> dict | None:
  """The JSON object of a writer's reply, found as UCOB's `_extract_json` finds it (after any
  </think>); None when there is none or it does not parse."""
  content = str(text or "").split("</think>")[-1]
  m = re.search(r"<reflection>\s*(\{.*?\})\s*</reflection>", content, re.DOTALL)
  m = m or re.search(r"```(?:json)?\s*(\{.*?\})\s*```", content, re.DOTALL)
  if m:
    raw = m.group(1)
  else:
    start, end = content.find("{"), content.rfind("}")
    if start == -1 or end <= start:
      return None
    raw = content[start : end + 1]
  try:
    out = json.loads(raw)
  except json.JSONDecodeError:
    return None
  return out if isinstance(out, dict) else None


def parse_skill(text: str, actual_success: bool, validate: bool = True) -> tuple[dict | None, str]:
  """(the skill's fields, "ok") or (None, why: "parse_failed", "success_mismatch",
  "empty_skill"), as UCOB's `add_from_reflection_output` and `add_skill` decide."""
  data = extract_json(text)
  if data is None:
    return None, "parse_failed"
  predicted = data.get("task_success", False)
  if isinstance(predicted, str):
    predicted = predicted.strip().lower() in {"true", "1", "yes", "success", "successful"}
  if validate and bool(predicted) != bool(actual_success):
    return None, "success_mismatch"
  title = _clean(data.get("title"), 160)
  principle = _clean(data.get("principle"), 900)
  when = _clean(data.get("when_to_apply"), 600)
  if len(title) < 2 or len(principle) < 8 or len(when) < 8:
    return None, "empty_skill"
  return {"title": title, "principle": principle, "when_to_apply": when}, "ok"


def skill_text(entry: dict) -> str:
  return f"Skill: {entry['title']}\nPrinciple: {entry['principle']}\nWhen: {entry['when_to_apply']}"


# ------------------------------------------------------------------------------------ memory
def _bm25s():
  import bm25s

  return bm25s


class Memory:
  """The skills, their utilities and counts (module docstring); `state_dict` / `load_state_dict`
  round-trip it exactly, `to_json` is its readable form."""

  def __init__(self, settings: SkillMemory):
    self.s = settings
    self.entries: list[dict] = []
    self.next_id = 0
    self.total_count = 1
    self._index: dict[str, Any] = {}

  def __len__(self) -> int:
    return len(self.entries)

  # ---------------------------------------------------------------------------- writing
  def add(
    self, pool: str, task: str, state: str, skill: dict, iteration: int, source: str,
    tokens: tuple[Sequence[int], Sequence[int]] | None = None,
  ) -> str:  # fmt: skip
    """Writes `skill` (parse_skill's fields) into `pool`; its id, or "" when its text is there.
    `tokens`: the writer's (prompt ids, response ids), kept for the reflection training."""
    text = skill_text(skill)
    if any(e["pool"] == pool and e["text"] == text for e in self.entries):
      return ""
    entry = {
      "id": f"m{self.next_id}",
      "pool": pool,
      "task": task,
      "state": state,
      **skill,
      "text": text,
      "utility": float(self.s.initial_utility),
      "count": 1,
      "written_at": int(iteration),
      "source": source,
    }
    if tokens is not None:
      entry["prompt_ids"] = [int(i) for i in tokens[0]]
      entry["response_ids"] = [int(i) for i in tokens[1]]
    self.next_id += 1
    self.entries.append(entry)
    self.total_count += 1
    self._index.pop(pool, None)
    return entry["id"]

  def evict(self) -> list[str]:
    """Drops the lowest-utility skills (the oldest among equals) past `capacity`; their ids."""
    over = len(self.entries) - self.s.capacity
    if over <= 0:
      return []
    order = sorted(range(len(self.entries)), key=lambda i: (self.entries[i]["utility"], i))
    gone = {self.entries[i]["id"] for i in order[:over]}
    self.entries = [e for e in self.entries if e["id"] not in gone]
    self._index.clear()
    return sorted(gone)

  # ---------------------------------------------------------------------------- utility
  def update(self, updates: Sequence[tuple[str, float]], beta: float) -> int:
    """u ← (1 − β)·u + β·score and count += 1 per (id, score), in order; then N = max(Σ count,
    1). Returns how many updates found their skill."""
    by_id = {e["id"]: e for e in self.entries}
    done = 0
    for memory_id, score in updates:
      e = by_id.get(memory_id)
      if e is not None:
        e["utility"] = (1.0 - beta) * float(e["utility"]) + beta * float(score)
        e["count"] = int(e["count"]) + 1
        done += 1
    if done:
      self.total_count = max(sum(int(e["count"]) for e in self.entries), 1)
    return done

  # ---------------------------------------------------------------------------- retrieval
  @staticmethod
  def query(pool: str, task: str, state: str = "") -> str:
    """UCOB's `_retrieval_query_text`: the task, and for the state pool its observation."""
    if pool == "state" and state:
      return f"{task}\nCurrent observation: {state}"
    return task

  @staticmethod
  def key_text(entry: dict) -> str:
    """What a skill is matched by (`_memory_embedding_text`): its task, and for a state skill
    the observation it was written at."""
    if entry["pool"] == "state":
      return "\n".join(p for p in (entry["task"], entry["state"]) if p.strip())
    return entry["task"]

  def relevance(self, pool: str, query: str) -> tuple[list[int], np.ndarray]:
    """(indices of the pool's skills, their BM25 relevance to `query` / the best, in [0, 1])."""
    members = [i for i, e in enumerate(self.entries) if e["pool"] == pool]
    if not members:
      return [], np.zeros(0)
    bm25s = _bm25s()
    if pool not in self._index:
      corpus = bm25s.tokenize(
        [self.key_text(self.entries[i]) or "-" for i in members], stopwords="en",
        show_progress=False,
      )  # fmt: skip
      index = bm25s.BM25()
      index.index(corpus, show_progress=False)
      self._index[pool] = index
    index = self._index[pool]
    words = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
    words = [w for w in words if w in index.vocab_dict]
    if not words:
      return members, np.zeros(len(members))
    raw = np.asarray(index.get_scores(words), np.float64)
    top = raw.max()
    return members, (raw / top if top > 0 else np.zeros_like(raw))

  def retrieve(self, pool: str, task: str, state: str = "", top_k: int | None = None) -> list[str]:
    """The ids of the `top_k` skills of `pool` for (task, state) by the upper-confidence rule
    (module docstring), best first."""
    s = self.s
    k = (s.task_top_k if pool == "task" else s.state_top_k) if top_k is None else top_k
    if k <= 0:
      return []
    members, rel = self.relevance(pool, self.query(pool, task, state))
    rows = [(i, r) for i, r in zip(members, rel.tolist()) if r >= s.relevance_threshold]
    if 0 < s.similarity_top_m < len(rows):
      rows.sort(key=lambda row: row[1], reverse=True)
      rows = rows[: s.similarity_top_m]
    scored = []
    for i, r in rows:
      e = self.entries[i]
      bonus = s.ucb_scale * math.sqrt(math.log(self.total_count) / max(int(e["count"]), 1))
      scored.append((s.alpha * r + (1.0 - s.alpha) * (float(e["utility"]) + bonus), e["id"]))
    scored.sort(key=lambda row: row[0], reverse=True)
    return [memory_id for _, memory_id in scored[:k]]

  def get(self, memory_id: str) -> dict | None:
    return next((e for e in self.entries if e["id"] == memory_id), None)

  # ---------------------------------------------------------------------------- saving
  def state_dict(self) -> dict[str, Any]:
    return {
      "entries": [dict(e) for e in self.entries],
      "next_id": self.next_id,
      "total_count": self.total_count,
    }

  def load_state_dict(self, state: dict[str, Any]) -> None:
    self.entries = [dict(e) for e in state.get("entries", [])]
    self.next_id = int(state.get("next_id", len(self.entries)))
    self.total_count = int(state.get("total_count", 1))
    self._index.clear()

  def to_json(self) -> str:
    """The memory as readable JSON: the settings that rank it, N, the next skill's id, and every
    skill (without its writer's token ids: `state_dict` keeps them)."""
    out = {"total_count": self.total_count, "next_id": self.next_id}
    out["settings"] = dataclasses.asdict(self.s)
    hidden = ("text", "prompt_ids", "response_ids")
    out["skills"] = [{k: v for k, v in e.items() if k not in hidden} for e in self.entries]
    return json.dumps(out, indent=2, ensure_ascii=False)

  @classmethod
  def from_json(cls, text: str, where: str = "the memory") -> Memory:
    """The memory `to_json` wrote (a run's <workdir>/skill_memory.json), with the settings it was
    ranked by: it retrieves what the run's memory retrieved. `where` names the file in errors."""
    try:
      data = json.loads(text)
      settings = SkillMemory(**data["settings"])
      skills = list(data["skills"])
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(
        f"{where}: not a skill memory written by a run ({type(e).__name__}: {e}). Fix: point to "
        "the skill_memory.json of a run whose teacher context includes 'skill_memory'"
      ) from None
    ids = [int(e["id"][1:]) for e in skills if str(e.get("id", "")).startswith("m")]
    memory = cls(settings)
    memory.load_state_dict(
      {
        "entries": [{**e, "text": skill_text(e)} for e in skills],
        # a file written before it held next_id: one past the highest id kept
        "next_id": data.get("next_id", max(ids, default=-1) + 1),
        "total_count": data.get("total_count", 1),
      }
    )
    return memory


__all__ = ["POOLS", "Memory", "SkillMemory", "extract_json", "parse_skill", "skill_memory_problems"]
