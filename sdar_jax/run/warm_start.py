"""Expert warm start: supervised updates on expert turns before RL, with rollout-identical prompts.

`warm_start_run` (a run with `warm_start.steps` > 0) turns the env family's expert turns
(`envs.EnvFamily.expert_records`, or `play_expert` games recorded with and without the skill
block, `record_expert_games`) into turn-samples exactly as the agent loop builds them (the same
prompt, the response `<think>...</think>\n<action>ACTION</action><|im_end|>`), runs the SFT
updates and returns the new params with its `warm_start/*` metrics; `teacher_student_gap_on_expert`
measures on held-out skill-following turns how much the skill block raises the response's
log-probability. `built_policy_metrics` reads a prebuilt policy's metrics (the demo's). Inputs: a
run config, params, the env family, its agent loop and pool; writes nothing but the metrics row's
fields. docs/environments.md, "The expert warm start", says why and how.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from envs.base import EnvFamily
from sdar_jax.algos.config import AlgoConfig
from sdar_jax.core.batch import TurnSample, prompt_bucket
from sdar_jax.core.scoring import response_logprobs
from sdar_jax.infra import multihost, paths
from sdar_jax.infra.console import show_progress_bars
from sdar_jax.models import ModelConfig, Params, load_pretrained
from sdar_jax.rollout.agent_loop import AgentLoop, EpisodeView
from sdar_jax.rollout.batching import pack_batch
from sdar_jax.run import context_warm_start
from sdar_jax.run.checkpoint import export_hf
from sdar_jax.run.context_warm_start import DEMO_MODE
from sdar_jax.run.setup import build_retriever

log = logging.getLogger(__name__)


_TAGGED_BLOCK = re.compile(r"<(\w+)>.*</\1>", re.DOTALL)


def expert_response(task: str, action: str, project=None) -> str:
  """The target text of one expert step: a one-line reasoning, then the action in ``<action>``
  tags (ALFWorld, WebShop), or as it is when it is a complete tagged block of its own (Search-QA's
  ``<search>...</search>`` / ``<answer>...</answer>``, which its prompt asks for without a
  wrapper). Short on purpose: the response bucket, and so the cost of every SFT step, follows
  its length. `project`: the environment's output -> (action, valid) projection; the response
  must project back to `action` with a valid format, else ValueError."""
  del task  # the prompt states it; repeating it would double the target length
  body = action if _TAGGED_BLOCK.fullmatch(action.strip()) else f"<action>{action}</action>"
  response = f"<think>I follow my plan.</think>\n{body}"
  if project is not None:
    projected, valid = project(response)
    if not valid or projected.strip().lower() != action.strip().lower():
      raise ValueError(
        f"warm start: the expert action {action!r} does not survive the environment's output "
        f"projection (its response {response!r} projects to {projected!r}, valid={valid}). "
        "Fix: the expert records' actions must be what the environment's projection produces."
      )
  return response


def _record_turns(
  records: Sequence[dict[str, Any]], loop: AgentLoop, end_token_id: int, skip_random: bool
) -> list[tuple[dict[str, Any], list[int], list[int] | None, list[int], str]]:
  """(record, plain prompt, skill prompt or None, response ids, action) per expert step."""
  turns = []
  for r, record in enumerate(records):
    history: list[tuple[str, str]] = []
    for k, step in enumerate(record["steps"]):
      view = EpisodeView(
        task=record["task"],
        task_type=record.get("task_type", "unknown"),
        gamefile=record.get("gamefile", ""),
        observation=step["observation"],
        admissible=list(step.get("admissible_commands", [])),
        history=list(history),
      )
      history.append((step["observation"], step["action"]))
      if skip_random and step.get("random", False):
        continue  # its prompt stays in the later turns' history, its action is not a target
      plain, skill = loop.build_prompts(view, sample_id=(r, k), where=f"expert {r} step {k}")
      text = expert_response(record["task"], step["action"], loop.adapter.project)
      response = loop.tokenizer.encode(text)
      response.append(end_token_id)
      turns.append((record, plain, skill, response, step["action"]))
  return turns


def _sample(
  prompt: list[int],
  response: list[int],
  group: int,
  task_type: str,
  teacher: list[int] | None = None,
) -> TurnSample:
  return TurnSample(
    prompt_ids=prompt,
    response_ids=response,
    logprobs=[0.0] * len(response),
    score=0.0,
    advantage=0.0,
    group_id=group,
    policy_version=0,
    valid=True,
    task_type=task_type,
    teacher_prompt_ids=teacher,
  )


def _check_skill_loop(records: Sequence[dict[str, Any]], loop: AgentLoop) -> None:
  if any(r.get("mode") == "skills" for r in records) and not loop.with_teacher:
    raise ValueError(
      "expert records in 'skills' mode need the skill prompt: build the loop with a skill "
      "retriever and with_teacher=True (warm_start_loop does)."
    )


def expert_samples(
  records: Sequence[dict[str, Any]],
  loop: AgentLoop,
  end_token_id: int,
  *,
  skip_random: bool = True,
) -> list[TurnSample]:
  """One SFT sample per expert step, its prompt built by `loop` as during rollouts.

  Records of walkthroughs and of the "plain" expert get the student prompt; records of the
  "skills" expert get the teacher's prompt (skill block + the student prompt), so `loop` must
  build teacher prompts when there are any. Random turns of an imperfect expert are not targets
  unless `skip_random` is False.
  """
  _check_skill_loop(records, loop)
  rows = _record_turns(records, loop, end_token_id, skip_random)
  index = {id(record): r for r, record in enumerate(records)}
  return [
    _sample(
      skill if record.get("mode") == "skills" else plain,
      response,
      index[id(record)],
      record.get("task_type", "unknown"),
    )
    for record, plain, skill, response, _ in rows
  ]


def gap_samples(
  records: Sequence[dict[str, Any]], loop: AgentLoop, end_token_id: int
) -> list[TurnSample]:
  """The skill-following expert's steps as samples with the plain prompt (`prompt_ids`) and the
  skill prompt (`teacher_prompt_ids`), for `teacher_student_gap_on_expert`."""
  skill_records = [r for r in records if r.get("mode") == "skills"]
  _check_skill_loop(skill_records, loop)
  rows = _record_turns(skill_records, loop, end_token_id, skip_random=True)
  samples = []
  for record, plain, skill, response, action in rows:
    sample = _sample(plain, response, 0, record.get("task_type", "unknown"), teacher=skill)
    sample.score = 1.0 if action.startswith("go to ") else 0.0  # marks the search turns
    samples.append(sample)
  return samples


def warm_start_loop(loop: AgentLoop, retriever) -> AgentLoop:
  """A prompt builder with `loop`'s settings (tokenizer, chat template, history window, prompt
  limit and truncation) whose student prompt never holds skills and whose teacher prompt is
  `retriever`'s skill block + the student prompt: the plain and the skill prompt of the warm start,
  the same whatever the algorithm (Skill-GRPO included), so every ablation arm starts alike."""
  return AgentLoop(
    pool=None,
    adapter=loop.adapter,
    sampler=None,
    tokenizer=loop.tokenizer,
    chat_template=loop.chat_template,
    sampling=loop.sampling,
    max_turns=loop.max_turns,
    history_length=loop.history_length,
    max_prompt_len=loop.max_prompt_len,
    truncation=loop.truncation,
    retriever=retriever,
    with_teacher=True,
    skills_in_student=False,
    enable_thinking=loop.enable_thinking,
    progress=False,
  )


def record_expert_games(
  pool,
  tasks: Sequence[int],
  retriever,
  *,
  family: EnvFamily,
  epsilon: float = 0.0,
  seed: int = 0,
  search_order: str = "shuffled",
  invalid_share: float = 0.0,
  progress: bool = True,
  modes: Sequence[str] | None = None,
  demonstration=None,
) -> list[dict[str, Any]]:
  """Plays every game of `tasks` once with each of `family`'s expert modes (ALFWorld:
  knowledge-free, then skill-following; or `modes`, with `demonstration(info)` for mode "demo":
  `context_warm_start`) on `pool` (its envs' `max_steps` is the turn limit) and
  returns the episode records (`family.play_expert`). The skill-following expert reads the skill
  text the teacher's block holds at the game's first turn (`retriever.skill_text` for its task
  type, game file and the adapter's skill query of the first turn): the block of every turn with
  the "rules" strategy; "bm25" and "random" may pick other items on later turns."""
  from tqdm import tqdm

  if family.play_expert is None:
    raise ValueError(
      f"warm_start.source='expert': env {family.name!r} has no expert (EnvFamily.play_expert). "
      "Fix: use warm_start.source='walkthroughs' if it has expert records, or warm_start.steps=0."
    )
  adapter = family.adapter()

  def skill_text(info: dict[str, Any]) -> str:
    first_turn = EpisodeView(
      task=info.get("task", ""),
      task_type=info.get("task_type", "unknown"),
      gamefile=info.get("gamefile", ""),
      observation=info.get("observation", ""),
      admissible=[],
      history=[],
    )
    query = adapter.skill_query(first_turn)
    return retriever.skill_text(
      task_type=info.get("task_type"),
      gamefile=info.get("gamefile"),
      query=query,
      task=info.get("task", ""),
    )

  jobs = [(mode, t) for mode in (modes or family.expert_modes) for t in tasks]
  records: list[dict[str, Any]] = []
  n = len(pool)
  bars = show_progress_bars(progress)
  for start in tqdm(range(0, len(jobs), n), desc="expert games", leave=False, disable=not bars):
    chunk = jobs[start : start + n]
    played = family.play_expert(
      pool,
      [t for _, t in chunk],
      [m for m, _ in chunk],
      skill_text=skill_text,
      epsilon=epsilon,
      seed=seed,
      search_order=search_order,
      invalid_share=invalid_share,
      **({"demonstration": demonstration} if demonstration else {}),
    )
    records += [dict(r, task_index=t) for r, (_, t) in zip(played, chunk)]
  return [r for r in records if not r["failed"]]


def split_held_out(
  records: Sequence[dict[str, Any]], fraction: float, seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
  """(train, held-out) records, split by game (both modes of a game fall on the same side); at
  least one game is held out when `fraction` > 0 and there are two games or more."""
  if not 0.0 <= fraction < 1.0:
    raise ValueError(f"held-out fraction {fraction} must be in [0, 1).")
  games = sorted({r.get("gamefile", "") for r in records})
  rng = np.random.default_rng(seed)
  rng.shuffle(games)
  k = round(fraction * len(games))
  if fraction > 0 and len(games) > 1:
    k = min(max(k, 1), len(games) - 1)
  held = set(games[:k])
  return (
    [r for r in records if r.get("gamefile", "") not in held],
    [r for r in records if r.get("gamefile", "") in held],
  )


def expert_summary(records: Sequence[dict[str, Any]]) -> dict[str, float]:
  """Success rate and mean steps per expert mode (`warm_start/expert_<mode>_success`, `..._steps`)."""
  out = {}
  for mode in sorted({r.get("mode", "walkthrough") for r in records}):
    mine = [r for r in records if r.get("mode", "walkthrough") == mode]
    out[f"warm_start/expert_{mode}_success"] = float(np.mean([r["won"] for r in mine]))
    out[f"warm_start/expert_{mode}_steps"] = float(np.mean([len(r["steps"]) for r in mine]))
  return out


def expert_warm_start_data(
  settings: Any,
  loop: AgentLoop,
  pool,
  num_games: int,
  end_token_id: int,
  *,
  family: EnvFamily,
  seed: int = 0,
  progress: bool = True,
  algo: Any = None,
) -> tuple[list[TurnSample], dict[str, list[TurnSample]], dict[str, float]]:
  """Plays the search expert on the training games and turns its episodes into samples.

  `settings` is the config's `warm_start` section; read with defaults: `expert_games` (games
  played, each once per mode; 0 = all `num_games`), `expert_epsilon` (share of random turns),
  `expert_search_order` ("shuffled" | "room"), `expert_invalid_share` (share of the random turns
  that send an inadmissible command), `expert_holdout` (share of the games kept out of the
  SFT for the teacher-student gap), `contexts` (the other context blocks taught,
  `context_warm_start`; their blocks follow `algo`, the run's AlgoConfig). `loop` builds the plain
  and the skill prompts (`warm_start_loop`); `family` is the environment's `envs.EnvFamily` (it
  plays the expert). Returns (SFT samples, held-out gap samples per context source ("skills" and
  each taught one), expert metrics).
  """
  games = settings.get("expert_games", 0) or num_games
  tasks = sorted(np.random.default_rng(seed).permutation(num_games)[: min(games, num_games)])
  play = functools.partial(
    record_expert_games,
    pool,
    retriever=loop.retriever,
    family=family,
    epsilon=settings.get("expert_epsilon", 0.0),
    seed=seed,
    search_order=settings.get("expert_search_order", "shuffled"),
    invalid_share=settings.get("expert_invalid_share", 0.0),
    progress=progress,
  )
  records = play([int(t) for t in tasks])
  contexts = context_warm_start.taught_contexts(settings)
  if "sibling" in contexts:  # the demonstration-following expert, on the games someone won
    records += context_warm_start.play_demonstrations(
      records, lambda todo, shown: play(todo, modes=(DEMO_MODE,), demonstration=shown)
    )
  train, held_out = split_held_out(records, settings.get("expert_holdout", 0.1), seed=seed)
  samples = expert_samples([r for r in train if r["mode"] != DEMO_MODE], loop, end_token_id)
  gap = {"skills": gap_samples(held_out, loop, end_token_id)}
  for name in contexts:
    kwargs = dict(
      record_turns=_record_turns, make_sample=_sample, memory=settings.get("memory", "")
    )
    samples += context_warm_start.context_samples(
      name, train, loop, end_token_id, algo, for_gap=False, **kwargs
    )
    gap[name] = context_warm_start.context_samples(
      name, held_out, loop, end_token_id, algo, for_gap=True, **kwargs
    )
  return samples, gap, expert_summary(records)


def _nll(config: ModelConfig, params: Params, batch) -> tuple[jax.Array, jax.Array]:
  logp, _ = response_logprobs(
    config, params, batch.student_tokens, batch.student_mask, batch.response_len
  )
  mask = batch.response_mask
  tokens = jnp.maximum(mask.sum(), 1.0)
  return -(logp * mask).sum() / tokens, tokens


def make_sft_step(config: ModelConfig, optimizer: optax.GradientTransformation):
  """A jitted (params, opt_state, batch) -> (params, opt_state, loss) likelihood step."""

  @jax.jit
  def step(params, opt_state, batch):
    (loss, _), grads = jax.value_and_grad(lambda p: _nll(config, p, batch), has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


def warm_start(
  config: ModelConfig,
  params: Params,
  samples: Sequence[TurnSample],
  *,
  steps: int,
  batch_size: int,
  lr: float,
  seed: int = 0,
  shard_batch=lambda b: b,
  progress: bool = True,
) -> tuple[Params, list[float]]:
  """`steps` AdamW updates on random mini-batches of the expert samples; returns the new params
  and the loss of every step."""
  from tqdm import tqdm

  if not samples:
    raise ValueError("warm start: no expert samples (empty walkthrough file?).")
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(lr, weight_decay=0.0))
  opt_state = optimizer.init(params)
  step = make_sft_step(config, optimizer)
  rng = np.random.default_rng(seed)
  # Length-grouped batches: each step draws a prompt bucket (in proportion to its samples), then
  # the batch from that bucket, so short prompts are not padded to the longest of a mixed batch
  # (plain and skill-block prompts differ by the block's length).
  by_bucket: dict[int, list[int]] = {}
  for i, sample in enumerate(samples):
    by_bucket.setdefault(prompt_bucket(len(sample.prompt_ids)), []).append(i)
  groups = [np.array(members) for _, members in sorted(by_bucket.items())]
  weights = np.array([len(g) for g in groups], np.float64) / len(samples)
  losses = []
  bars = show_progress_bars(progress)
  for _ in tqdm(range(steps), desc="warm start (expert SFT)", leave=False, disable=not bars):
    group = groups[rng.choice(len(groups), p=weights)]
    pick = rng.choice(group, size=min(batch_size, len(group)), replace=False)
    batch = shard_batch(pack_batch([samples[i] for i in pick], batch_size, with_teacher=False))
    params, opt_state, loss = step(params, opt_state, batch)
    losses.append(float(loss))
  return params, losses


def teacher_student_gap_on_expert(
  config: ModelConfig,
  params: Params,
  samples: Sequence[TurnSample],
  *,
  batch_size: int = 8,
  shard_batch=lambda b: b,
  key: str = "warm_start/teacher_student_gap_on_expert",
) -> dict[str, float]:
  """The teacher's advantage on skill-following expert turns (`gap_samples`), under `params`
  (or on another source's turns, `context_warm_start.context_samples`, under another `key`).

  Returns `key` (`warm_start/teacher_student_gap_on_expert`): the mean over all response tokens of
  log p(response | skill prompt) - log p(response | plain prompt); `..._search`: the same over the
  turns whose action is a "go to" (where the skill text decides which receptacle comes next; absent
  when there are none); and `..._tokens`: how many response tokens were scored. Positive: the skill text makes the model
  more confident of the skill-following actions.
  """
  if not samples:
    raise ValueError("teacher_student_gap_on_expert: no samples (no skill-following expert turns).")

  @functools.partial(jax.jit, static_argnames="response_len")
  def logps(params, student_tokens, student_mask, teacher_tokens, teacher_mask, response_len):
    student, _ = response_logprobs(config, params, student_tokens, student_mask, response_len)
    teacher, _ = response_logprobs(config, params, teacher_tokens, teacher_mask, response_len)
    return teacher, student

  total = search = 0.0
  tokens = search_tokens = 0.0
  for start in range(0, len(samples), batch_size):
    chunk = list(samples[start : start + batch_size])
    batch = shard_batch(pack_batch(chunk, batch_size, with_teacher=True))
    teacher, student = logps(
      params,
      batch.student_tokens,
      batch.student_mask,
      batch.teacher_tokens,
      batch.teacher_mask,
      response_len=batch.response_len,
    )
    # whole arrays on every process (a gather when a multi-process batch spans the processes)
    mask, teacher, student = (multihost.fetch(x) for x in (batch.response_mask, teacher, student))
    mask = np.asarray(mask, np.float64)
    diff = (np.asarray(teacher, np.float64) - np.asarray(student, np.float64)) * mask
    is_search = np.zeros(mask.shape[0])
    is_search[: len(chunk)] = [s.score for s in chunk]
    total += diff.sum()
    tokens += mask.sum()
    search += (diff.sum(axis=1) * is_search).sum()
    search_tokens += (mask.sum(axis=1) * is_search).sum()
  out = {key: float(total / tokens), f"{key}_tokens": float(tokens)}
  if search_tokens:
    out[f"{key}_search"] = float(search / search_tokens)
  return out


# ------------------------------------------------------------------------------------ in a run
def warm_start_wanted(section) -> bool:
  """Whether a run's `warm_start` section asks for one: SFT steps, or (`measure`) the starting
  policy's teacher-student gaps alone."""
  return section.steps > 0 or section.get("measure", False) is True


def setting_problems(section) -> list[str]:
  """What cannot work in a run config's ``warm_start`` section, one "<key>=<value>: <problem>.
  Fix: <fix>" line each (reported with the config's other problems)."""
  problems = []
  for key, low, fix in (
    ("steps", 0, "use 0 to start RL from the given weights"),
    ("batch_size", 1, "use a value >= 1"),
  ):
    value = section.get(key, low)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
      problems.append(f"warm_start.{key}={value!r}: must be a number >= {low}. Fix: {fix}")
  if not section.get("lr", 1.0) > 0:
    problems.append(f"warm_start.lr={section.lr!r}: must be > 0. Fix: set a positive learning rate")
  return problems + context_warm_start.setting_problems(section)


# What `python -m sdar_jax.tools.build_demo_policy` writes beside a warm-started policy: its
# warm_start/* metrics (expert success with and without skills, loss, teacher-student gap), measured
# when it was built.
BUILT_POLICY_METRICS = "warm_start_metrics.json"


def built_policy_metrics(model_path: str | None) -> dict[str, float]:
  """The warm_start/* metrics of a built policy folder (`BUILT_POLICY_METRICS`), so a run that
  starts from it (warm_start.steps=0) logs them at step 0 as if it had run that warm start;
  {} for any other folder."""
  if not model_path:
    return {}
  path = paths.join(model_path, BUILT_POLICY_METRICS)
  if not paths.exists(path):
    return {}
  metrics = json.loads(paths.read_text(path))
  log.info("starting from the warm-started policy in %s (its build: %s)", model_path, path)
  return {
    k: float(v)
    for k, v in metrics.items()
    if k.startswith("warm_start/") and isinstance(v, (int, float))
  }


def warm_start_run(
  config,
  params: Params,
  *,
  model_config: ModelConfig,
  family: EnvFamily,
  loop: AgentLoop,
  pool,
  num_games: int,
  end_token_id: int,
  shard_batch,
  mesh,
  workdir: str,
) -> tuple[Params, dict[str, float]]:
  """A run's warm start (`warm_start_wanted`): expert SFT on the env family's expert records
  (ALFWorld: the walkthroughs), or (warm_start.source="expert") on its expert's games with and
  without skills (played on `pool`'s `num_games` training games through `loop`), then the
  teacher-student gap on held-out expert turns. Once per workdir: the result is saved as a Hugging
  Face directory in `<workdir>/warm_start_policy` and reloaded on resume (metrics {} then), so the
  KL reference stays the warm-started policy. `shard_batch` places a batch on the run's mesh
  (`TrainStep.shard_batch`), `end_token_id` ends each expert response. Returns (params,
  warm_start/* metrics). With warm_start.measure and no steps, only the gaps of `params`: nothing
  is trained or written."""
  out = paths.join(workdir, "warm_start_policy")
  if paths.exists(paths.join(out, "config.json")):  # complete: config.json is written last
    with paths.local_copy(out) as local_dir:  # a download when the workdir is remote
      _, params = load_pretrained(local_dir, dtype=config.model.param_dtype, mesh=mesh)
    return params, {}
  w = config.warm_start
  end = end_token_id
  gap, metrics = {}, {}
  if w.get("source", "walkthroughs") == "expert":
    samples, gap, metrics = expert_warm_start_data(
      w,
      warm_start_loop(loop, build_retriever(config)),
      pool,
      num_games,
      end,
      family=family,
      seed=config.train.seed,
      algo=AlgoConfig.from_config(config.algo),
    )
  else:
    if family.expert_records is None:
      raise ValueError(
        f"warm_start.source={w.get('source', 'walkthroughs')!r}: env {family.name!r} has no "
        "expert records (EnvFamily.expert_records). Fix: set warm_start.steps=0 or "
        "warm_start.source='expert' if the env has an expert."
      )
    records = family.expert_records(config.env, w.split)
    samples = expert_samples(records, loop, end_token_id=end)
  metrics["warm_start/expert_samples"] = float(len(samples))
  if w.steps > 0:
    params, losses = warm_start(
      model_config,
      params,
      samples,
      steps=w.steps,
      batch_size=w.batch_size,
      lr=w.lr,
      seed=config.train.seed,
      shard_batch=shard_batch,
    )
    metrics.update({"warm_start/loss_first": losses[0], "warm_start/loss_last": losses[-1]})
    log.info("warm start: %d expert turn-samples, %d steps, loss %.3f -> %.3f",
             len(samples), w.steps, losses[0], losses[-1])  # fmt: skip
  for name, held in gap.items():  # measured before RL: does each block raise the expert's turns?
    if not held:
      continue
    key = "warm_start/teacher_student_gap_on_expert"
    key = key if name == "skills" else f"warm_start/{name}_gap_on_expert"
    metrics.update(
      teacher_student_gap_on_expert(
        model_config, params, held, batch_size=w.batch_size, shard_batch=shard_batch, key=key
      )
    )
    log.info("warm start: the %s block's teacher-student gap on held-out expert turns %.4f "
             "(search turns %.4f)", name, metrics[key], metrics.get(f"{key}_search", np.nan))  # fmt: skip
  if w.steps == 0:  # warm_start.measure: the starting policy's gaps, nothing trained or written
    return params, metrics
  # Every process calls it (a multi-host gather); the primary one writes, through a local folder
  # when the workdir is remote.
  export_hf(model_config, params, out)
  return params, metrics
