"""UCOB's reflection training (`algo.skill_memory.train`, sdar_jax/algos/skill_memory_training.py)
against pure-Python / NumPy transcriptions of the authors' functions (TU2021/UCOB@d38292c,
verl/trainer/main_ucob.py: `_collect_current_step_memory_counts`,
`_select_reflection_train_records_for_pool`, `_reflection_train_active`) on hand-made memories;
the rows carry the writer's stored tokens with the advantage on every response token; the
warm-up; the hooks' pass after the updates, the same after a resume (state_dict round trip)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from sdar_jax.algos import get_preset
from sdar_jax.algos.contexts import load_templates
from sdar_jax.algos.skill_memory import Memory, SkillMemory
from sdar_jax.algos.skill_memory_source import SkillMemoryHooks, retrieve_for
from sdar_jax.algos.skill_memory_training import (
  select_records,
  train_reflections,
  training_active,
  training_records,
  used_counts,
)
from sdar_jax.core.batch import TurnSample
from sdar_jax.rollout.batching import pack_batch
from sdar_jax.rollout.trajectory import Episode, Turn

T = load_templates()
TASK = "put a apple in fridge"
SETTINGS = SkillMemory(train=True, train_warmup=0)


# ------------------------------------------------------------------------------ authors' code
def _authors_pool(item):
  """`_memory_pool_from_item`."""
  pool = str(item.get("reflection_train_pool", "") or "").strip().lower()
  if pool in {"task", "state"}:
    return pool
  return "state" if str(item.get("memory_type", "") or "").lower() == "state_skill" else "task"


def _authors_select(by_id, pool, memory_counts, most, min_count, min_abs, eps, clip):
  """`_select_reflection_train_records_for_pool`, the provider's `get_by_id` a dict lookup."""
  if most <= 0:
    return []
  candidates = []
  for memory_id, step_count in memory_counts.items():
    item = by_id.get(memory_id)
    if not item or _authors_pool(item) != pool:
      continue
    if item.get("reflection_train_backend") != "vllm_self_reflection":
      continue
    prompt = str(item.get("reflection_prompt", "") or "")
    response = str(item.get("reflection_response", "") or "")
    if not prompt.strip() or not response.strip():
      continue
    lifetime_count = int(item.get("count", 1))
    if lifetime_count < min_count:
      continue
    utility = float(item.get("utility_score", 0.0))
    if abs(utility) < min_abs:
      continue
    candidates.append(
      {
        "memory_id": memory_id,
        "prompt": prompt,
        "response": response,
        "utility": max(-1.0, min(1.0, utility)),
        "step_count": int(step_count),
        "lifetime_count": lifetime_count,
      }
    )
  candidates.sort(
    key=lambda c: (int(c["step_count"]), abs(float(c["utility"])), int(c["lifetime_count"])),
    reverse=True,
  )
  candidates = candidates[:most]
  if len(candidates) < 2:
    return []
  rewards = np.asarray([c["utility"] for c in candidates], dtype=np.float32)
  mean = float(np.mean(rewards))
  std = max(float(np.std(rewards)), float(eps))
  for c in candidates:
    advantage = (float(c["utility"]) - mean) / std
    if clip > 0:
      advantage = max(-clip, min(clip, advantage))
    c["advantage"] = float(advantage)
  return [c for c in candidates if abs(float(c.get("advantage", 0.0))) > 0.0]


def _authors_counts(total_batch_list):
  """`_collect_current_step_memory_counts` (the step's explicit per-pool id lists)."""
  counts = {"task": {}, "state": {}}
  for steps in total_batch_list:
    for step in steps:
      if not bool(step.get("active_masks", True)) or step.get("dynamic_memory_branch") != "good":
        continue
      for pool in ("task", "state"):
        for memory_id in step.get(f"dynamic_memory_{pool}_ids", []):
          counts[pool][memory_id] = counts[pool].get(memory_id, 0) + 1
  return counts


def _authors_item(e):
  """Our skill as the provider's item: a policy-written one with its prompt and response (here
  their ids as text) and the writer's metadata (`_reflection_training_metadata`)."""
  item = {"memory_id": e["id"], "count": e["count"], "utility_score": e["utility"]}
  if e.get("response_ids") is not None:
    item["reflection_train_backend"] = "vllm_self_reflection"
    item["reflection_prompt"] = " ".join(map(str, e["prompt_ids"]))
    item["reflection_response"] = " ".join(map(str, e["response_ids"]))
    item["reflection_train_pool"] = e["pool"]
  else:
    item["memory_type"] = "state_skill" if e["pool"] == "state" else "task_skill"
  return item


def _skill(k):
  return {"title": f"skill {k}", "principle": f"principle {k} ...", "when_to_apply": f"when {k}."}


def _add(mem, pool, k, utility, count=1, tokens=True, task=TASK, state=""):
  ids = (list(range(3, 9 + k % 4)), list(range(20 + k, 26 + k))) if tokens else None
  mem.add(pool, task, state, _skill(k), 0, "policy" if tokens else "oracle", ids)
  mem.entries[-1].update(utility=float(utility), count=int(count))
  return mem.entries[-1]["id"]


# ------------------------------------------------------------------------------ the selection
UTILITIES = (-1.5, -0.5, -0.25, -0.019, 0.0, 0.02, 0.25, 0.5, 0.75, 1.3)


@pytest.mark.parametrize("seed", range(12))
def test_the_selection_is_the_authors_on_hand_made_memories(seed):
  rng = np.random.default_rng(seed)
  s = dataclasses.replace(
    SETTINGS,
    train_task_samples=int(rng.choice([0, 1, 3, 16, 16])),
    train_state_samples=int(rng.choice([1, 3, 16])),
    train_min_count_task=int(rng.choice([1, 2])),
    train_min_count_state=int(rng.choice([1, 3])),
    train_eps=float(rng.choice([0.05, 0.5])),
    train_clip=float(rng.choice([0.0, 1.0, 2.0])),
  )
  mem = Memory(s)
  for k in range(int(rng.integers(3, 16))):
    u = rng.choice(UTILITIES) if rng.random() < 0.6 else rng.uniform(-1.2, 1.2)
    pool = "task" if rng.random() < 0.5 else "state"
    _add(mem, pool, k, u, int(rng.integers(1, 5)), tokens=rng.random() < 0.8)
  ids = [e["id"] for e in mem.entries] + ["m999"]  # one evicted since its use
  counts = {"task": {}, "state": {}}
  for uses in counts.values():  # in a random first-use order, ties likely; some skills unused
    for i in rng.permutation(len(ids))[: int(rng.integers(len(ids) // 2, len(ids) + 1))]:
      uses[ids[i]] = int(rng.integers(1, 4))
  by_id = {e["id"]: _authors_item(e) for e in mem.entries}
  for pool in ("task", "state"):
    most = s.train_state_samples if pool == "state" else s.train_task_samples
    low = s.train_min_count_state if pool == "state" else s.train_min_count_task
    want = _authors_select(
      by_id, pool, counts[pool], most, low, s.train_min_abs_utility, s.train_eps, s.train_clip
    )
    got = select_records(mem, pool, counts[pool], s)
    assert [r["id"] for r in got] == [c["memory_id"] for c in want]
    assert [r["advantage"] for r in got] == [c["advantage"] for c in want]  # bit for bit
    assert [r["utility"] for r in got] == [c["utility"] for c in want]
    assert [r["uses"] for r in got] == [c["step_count"] for c in want]
    for r, c in zip(got, want):  # the stored tokens of the skill
      assert " ".join(map(str, r["prompt_ids"])) == c["prompt"]
      assert " ".join(map(str, r["response_ids"])) == c["response"]


def test_the_rules_one_by_one():
  mem = Memory(SETTINGS)
  a = _add(mem, "task", 0, 0.25)
  b = _add(mem, "task", 1, 0.5)
  c = _add(mem, "task", 2, 0.75)
  small = _add(mem, "task", 3, 0.019)  # under the smallest |utility| trained
  oracle = _add(mem, "task", 4, 0.9, tokens=False)  # not written by the policy: no tokens
  state = _add(mem, "state", 5, 0.9, state="You see a fridge.")  # the other pool
  uses = {a: 1, b: 1, c: 1, small: 5, oracle: 5, state: 5}
  got = select_records(mem, "task", uses, SETTINGS)
  # the mean utility's own advantage is exactly 0: dropped; the others ±0.25 / std
  std = float(np.std(np.float32([0.25, 0.5, 0.75])))
  assert [(r["id"], r["advantage"]) for r in got] == [(c, 0.25 / std), (a, -0.25 / std)]
  assert select_records(mem, "task", {a: 1}, SETTINGS) == []  # fewer than 2: none
  # sort: uses, then |utility|, then count; the top k only
  top = select_records(
    mem, "task", {a: 3, b: 1, c: 1}, dataclasses.replace(SETTINGS, train_task_samples=2)
  )
  assert [r["id"] for r in top] == [a, c]
  # the std's floor and the clip
  mem.entries[1]["utility"] = 0.26
  near = select_records(mem, "task", {a: 1, b: 1}, SETTINGS)
  assert [r["id"] for r in near] == [b, a]  # the larger |utility| first
  assert [r["advantage"] for r in near] == pytest.approx([0.1, -0.1], abs=1e-6)  # 0.005 / 0.05
  far = [_add(mem, "task", 6 + k, 0.1) for k in range(5)] + [_add(mem, "task", 11, 1.0)]
  out = select_records(mem, "task", dict.fromkeys(far, 1), SETTINGS)
  assert out[0]["id"] == far[-1] and out[0]["advantage"] == 2.0  # (1 − 0.25) / 0.335: clipped
  # a utility past ±1 is clipped to it first
  mem.entries[-1]["utility"] = 3.0
  assert select_records(mem, "task", dict.fromkeys(far, 1), SETTINGS)[0]["utility"] == 1.0


def _episodes(groups=2):
  """Groups of 4 on TASK; the second half of each plays UCOB's good view."""
  out = []
  for g in range(groups):
    for e in range(4):
      ep = Episode(e, 0, g, task=TASK, won=(e + g) % 3 == 0, reward=float((e + g) % 3 == 0))
      ep.turns = [
        Turn([1, 2], [3, 4], [-0.5, -0.5], act, True, 0, observation=obs, skills_in_prompt=e >= 2)
        for act, obs in (("look", "You are in a room."), ("open fridge", "You see a fridge."))
      ]
      out.append(ep)
  return out


def test_the_uses_are_the_good_views_turns():
  mem = Memory(SETTINGS)
  for k in range(4):
    _add(mem, "task", k, 0.1 * k)
    _add(mem, "state", 10 + k, -0.1 * k, state=["You are in a room.", "You see a fridge."][k % 2])
  episodes = _episodes()
  retrieve_for(mem, episodes, T, views=True)
  steps = [
    [
      {
        "dynamic_memory_branch": "good" if turn.skills_in_prompt else "none",
        "active_masks": True,
        # what the rollout retrieved for each step: the none branch's ids must not count
        "dynamic_memory_task_ids": mem.retrieve("task", ep.task),
        "dynamic_memory_state_ids": mem.retrieve("state", ep.task, turn.observation),
      }
      for turn in ep.turns
    ]
    + [{"dynamic_memory_branch": "good", "active_masks": False, "dynamic_memory_task_ids": ["m0"]}]
    for ep in episodes
  ]
  want = _authors_counts(steps)
  got = used_counts(episodes)
  assert got == want and list(got["task"]) == list(want["task"])  # and the first-use order
  assert sum(want["task"].values()) == 3 * 8  # 8 good-view turns, 3 task skills each


# ------------------------------------------------------------------------------ rows, warm-up
class _View:
  """The iteration view a hook sees: `update_on` records what it is asked."""

  def __init__(self, algo, episodes, iteration, generate=None):
    self.algo, self.episodes, self.iteration, self.generate = algo, episodes, iteration, generate
    self.calls = []

  def update_on(self, rows, prefix, **kwargs):
    self.calls.append((rows, prefix, kwargs))
    return {f"{prefix}/loss": 1.0}


def test_the_rows_carry_the_writers_tokens_with_the_advantage_on_every_response_token():
  mem = Memory(SETTINGS)
  a, b = _add(mem, "task", 0, 0.5), _add(mem, "task", 1, -0.5)
  records = training_records(mem, [], SETTINGS)
  assert records == []  # nothing used, nothing trained
  s = dataclasses.replace(SETTINGS, train_loss_weight=0.5, train_mini_batch_size=3)
  records = select_records(mem, "task", {a: 1, b: 1}, s)
  view = _View(None, [], 0)
  metrics = train_reflections(view, records, s)
  ((rows, prefix, kwargs),) = view.calls
  assert prefix == "skill_memory_train" and metrics["skill_memory_train/loss"] == 1.0
  assert kwargs == {"mini_batch_size": 3, "recompute_old_logp": True}  # θ_old at the weights now
  assert metrics["skill_memory_train/rows"] == 2.0 and metrics["skill_memory_train/task_rows"] == 2
  samples = [
    TurnSample(r["prompt_ids"], r["response_ids"], r["logprobs"], 0.0, r["advantage"], k, 0, True)
    for k, r in enumerate(rows)
  ]
  batch = pack_batch(samples, 4, with_teacher=False)  # as `Iteration.update_on` packs them
  for i, memory_id in enumerate((a, b)):
    e = mem.get(memory_id)
    n, p = len(e["response_ids"]), len(e["prompt_ids"])
    Ps = batch.student_tokens.shape[1] - batch.response_mask.shape[1]
    assert batch.student_tokens[i, Ps - p : Ps].tolist() == e["prompt_ids"]
    assert batch.student_tokens[i, Ps : Ps + n].tolist() == e["response_ids"]
    assert batch.response_mask[i].tolist() == [1.0] * n + [0.0] * (batch.response_mask.shape[1] - n)
    assert batch.advantages[i] == pytest.approx(0.5 * (1.0 if i == 0 else -1.0))  # weight · ±1
  assert not batch.response_mask[2:].any()  # the empty rows


def test_the_warm_up_is_the_authors():
  def authors_active(enable, warmup, step):  # `_reflection_train_active`, UCOB's steps from 1
    return enable and (warmup <= 0 or step > warmup)

  for warmup in (0, 1, 30):
    for it in range(35):
      s = dataclasses.replace(SETTINGS, train_warmup=warmup)
      assert training_active(s, it) == authors_active(True, warmup, it + 1)
      assert not training_active(dataclasses.replace(s, train=False), it)
  launcher = SkillMemory(train=True)  # its 30 warm-up steps: iterations 0-29 do not train
  assert not training_active(launcher, 29) and training_active(launcher, 30)


# ------------------------------------------------------------------------------ the hooks
def _policy_generate():
  """The policy writer's sampler: a valid skill per prompt (written about failures), its ids."""
  calls = []

  def generate(chats, max_new_tokens, temperature):
    out = []
    for chat in chats:
      k = len(calls)
      calls.append(chat)
      text = json.dumps({"task_success": False, **_skill(100 + k)})
      out.append(([5, 6, 7 + k], [40 + k, 41, 42], [-0.1, -0.2, -0.3], text))
    return out

  return generate


def test_the_hooks_train_after_the_warm_up_and_the_same_after_a_resume():
  algo = dataclasses.replace(
    get_preset("ucob"), skill_memory=SkillMemory(train=True, train_warmup=2)
  )
  hooks = SkillMemoryHooks(algo)
  for k, u in enumerate((0.5, -0.5, 0.1)):
    _add(hooks.memory, "task", k, u)
  # iteration 1 (< the warm-up of 2): the round writes skills with the policy's tokens, no pass
  view = _View(algo, _episodes(), 1, _policy_generate())
  m = hooks.before_teacher_context(view)
  assert m["skill_memory/written"] >= 1.0 and hooks.after_updates(view) is None and not view.calls
  written = [e for e in hooks.memory.entries if e["written_at"] == 1]
  assert written and all(e["response_ids"][1:] == [41, 42] for e in written)
  assert "prompt_ids" not in hooks.memory.to_json()
  # the checkpoint: a JSON round trip, restored into new hooks
  saved = json.loads(json.dumps(hooks.state_dict()))
  resumed = SkillMemoryHooks(algo)
  resumed.load_state_dict(saved, None)
  assert resumed.memory.entries == hooks.memory.entries
  # iteration 2: the pass after the updates, on the records of the skills the good view used
  runs = []
  for h in (hooks, resumed):
    view = _View(algo, _episodes(), 2, _policy_generate())
    h.before_teacher_context(view)
    metrics = h.after_updates(view)
    ((rows, _, kwargs),) = view.calls
    runs.append((rows, metrics["skill_memory_train/rows"], h.memory.state_dict()))
    # against the transcription on the memory after the round
    by_id = {e["id"]: _authors_item(e) for e in h.memory.entries}
    counts = used_counts(view.episodes)
    s = algo.skill_memory
    want = [
      c
      for pool in ("task", "state")
      for c in _authors_select(by_id, pool, counts[pool], 16, 1, 0.02, 0.05, 2.0)
    ]
    assert len(rows) == len(want) >= 2 and kwargs["mini_batch_size"] == s.train_mini_batch_size
    for row, c in zip(rows, want):
      assert row["advantage"] == c["advantage"]
      assert " ".join(map(str, row["response_ids"])) == c["response"]
  assert runs[0][0] == runs[1][0] and runs[0][2] == runs[1][2]  # the resumed run: the same pass


def test_the_settings_are_checked():
  with pytest.raises(ValueError, match="algo.skill_memory.train=True with algo.ucob.memory=False"):
    dataclasses.replace(get_preset("sdar"), skill_memory=SkillMemory(train=True))
  with pytest.raises(ValueError, match=r"(?s)train_mini_batch_size=0.*train_eps=0"):
    dataclasses.replace(
      get_preset("ucob"),
      skill_memory=SkillMemory(train=True, train_eps=0.0, train_mini_batch_size=0),
    )
