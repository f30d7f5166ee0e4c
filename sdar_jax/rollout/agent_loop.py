"""The batched multi-turn loop: prompts -> `Sampler.generate` -> actions -> `EnvPool.step`.

`AgentLoop.run(params, tasks, groups, key)` plays one episode per task on the env pool: each turn
every active episode gets one user message from its environment's adapter, chat-templated and
tokenized once, sampled in one batch; response ids and log-probs are stored exactly as sampled,
with the teacher prompt (the skill block, then the student prompt as the student got it; with
`teacher_context="message"` the skills inside the user message; with `mixed_views`, UCOB's rollout,
half of each group plays with the skills and each turn's teacher prompt is the other view) when
the algorithm needs one. Returns `Episode`s (`rollout.trajectory`). A turn's draws depend on the
call's key, the turn and the episodes still playing, not on how the turn is split into sampler
calls, so `overlap="halves"` plays the serial loop's episodes; with `row_streams="task"` (an
evaluation's common random numbers, `eval.streams`) on the call's key, the turn and the episode's
task alone, so two policies on one panel share their draws for as long as their actions agree.
Never imports the update.
Prompting, keys and the overlap: docs/design.md, "The agent loop".
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import jax

from envs.base import EnvAdapter, EpisodeView
from sdar_jax.core.sampling import GenerationResult, Sampler, SamplingParams
from sdar_jax.infra import multihost
from sdar_jax.infra.console import Progress
from sdar_jax.infra.errors import UserError
from sdar_jax.rollout.trajectory import Episode, RolloutTimings, Turn
from sdar_jax.text.chat_templates import ChatTemplate
from sdar_jax.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# Whose random stream a sampled row draws from: its rank among the episodes decoding the turn, or
# its episode's task (one episode per task in a call: evaluations).
ROW_STREAMS = ("rank", "task")
OVERLAP_MODES = ("off", "halves")  # rollout.overlap: serial turns, or two halves in alternation


def overlap_problem(overlap: Any) -> str | None:
  """Why `overlap` is not a `rollout.overlap` mode (a "<key>=<value>: ... Fix: ..." line), or
  None."""
  if overlap in OVERLAP_MODES:
    return None
  return (
    f"rollout.overlap={overlap!r}: unknown mode. Fix: use 'off' (serial: every env steps, then "
    "the whole batch decodes) or 'halves' (one half of the episodes decodes while the other "
    "half's envs step)"
  )


def split_halves(group_ids: Sequence[int]) -> list[list[int]]:
  """Episode indices 0..n-1 in two halves of consecutive indices, cut at the GRPO group boundary
  (a change of group id) nearest the middle, or in the middle when there is none; one half for a
  single episode."""
  n = len(group_ids)
  if n < 2:
    return [list(range(n))]
  bounds = [k for k in range(1, n) if group_ids[k] != group_ids[k - 1]] or [n // 2]
  cut = min(bounds, key=lambda k: (abs(2 * k - n), k))
  return [list(range(cut)), list(range(cut, n))]


class PromptTooLongError(UserError, ValueError):
  """A prompt longer than rollout.max_prompt_len with rollout.prompt_truncation='error'."""

  heading = "Prompt too long"


class AgentLoop:
  """Runs batches of episodes on an `EnvPool` with the current policy parameters.

  Args:
    pool: an `envs.EnvPool` with at least as many envs as episodes per call.
    adapter: the environment's `EnvAdapter` (``envs.env_family(name).adapter()``).
    sampler: a `sampling.Sampler` for the policy's model config (and mesh).
    tokenizer: the policy's tokenizer; `chat_template` the template its prompts are rendered with
      (`sdar_jax.text.chat_templates.resolve_chat_template` picks it from the config).
    sampling: sampling parameters of every turn.
    max_turns / history_length: episode cap and prompt history window.
    max_prompt_len / truncation: a student prompt longer than `max_prompt_len` tokens is an error
      ("error", the reference for ALFWorld/WebShop) or keeps its last tokens ("left"; the first
      cut is logged as a warning, every cut is marked on its `Turn.prompt_truncated_from`).
    retriever: an `envs.skills.SkillRetriever` (needed for a teacher or Skill-GRPO).
    with_teacher: build teacher prompts (skill block + the student prompt).
    skills_in_student: Skill-GRPO: the block goes inside the student's user message.
    teacher_context: "block" (the privileged block before the student's prompt) or "message" (the
      teacher's prompt is the student's with the skills inside its user message).
    mixed_views: UCOB's rollout: an episode at position p of its GRPO group of m (in index order)
      plays with the skills inside its user message when p >= max(1, m // 2) (a group of one:
      every other episode by index), without them otherwise; each turn's teacher prompt is the
      other view's (needs `with_teacher`).
    overlap: "off" (serial turns) or "halves" (env steps of one half overlap the other half's
      decoding; the same episodes, docs/design.md "The agent loop"). Needs one process.
  """

  def __init__(
    self,
    pool,
    adapter: EnvAdapter,
    sampler: Sampler,
    tokenizer: Tokenizer,
    chat_template: ChatTemplate,
    sampling: SamplingParams,
    max_turns: int,
    history_length: int = 2,
    max_prompt_len: int = 2048,
    truncation: str = "error",
    retriever=None,
    with_teacher: bool = False,
    skills_in_student: bool = False,
    enable_thinking: bool = False,
    progress: bool = True,
    overlap: str = "off",
    teacher_context: str = "block",
    mixed_views: bool = False,
    row_streams: str = "rank",
  ):
    if row_streams not in ROW_STREAMS:
      raise ValueError(
        f"eval.streams={row_streams!r}: not a row stream rule. Fix: use one of {ROW_STREAMS}"
      )
    if overlap_problem(overlap):
      raise ValueError(overlap_problem(overlap))
    if overlap != "off" and getattr(sampler, "collective", False):
      raise ValueError(
        f"rollout.overlap={overlap!r} with several processes: their sampler calls are "
        "collectives entered in lockstep, one per turn. Fix: set rollout.overlap='off', or run "
        "one process."
      )
    if truncation not in ("error", "left"):
      raise ValueError(f"rollout.prompt_truncation={truncation!r}; choose 'error' or 'left'.")
    if (with_teacher or skills_in_student) and retriever is None:
      raise ValueError("A teacher branch or Skill-GRPO needs a skill retriever (env.skills).")
    if teacher_context not in ("block", "message"):
      raise ValueError(f"teacher_context={teacher_context!r}; choose 'block' or 'message'.")
    if mixed_views and (not with_teacher or skills_in_student):
      raise ValueError(
        "mixed_views keeps the other view as the teacher's prompt: it needs "
        "with_teacher=True and skills_in_student=False."
      )
    if not isinstance(chat_template, ChatTemplate):
      raise TypeError(
        f"chat_template={chat_template!r} is not a ChatTemplate. Fix: pass "
        "sdar_jax.text.chat_templates.ChatTemplate.builtin(name) or resolve_chat_template(...)."
      )
    self.pool = pool
    self.adapter = adapter
    self.sampler = sampler
    self.tokenizer = tokenizer
    self.chat_template = chat_template
    self.sampling = sampling
    self.max_turns = max_turns
    self.history_length = history_length
    self.max_prompt_len = max_prompt_len
    self.truncation = truncation
    self.retriever = retriever
    self.with_teacher = with_teacher
    self.skills_in_student = skills_in_student
    self.enable_thinking = enable_thinking
    self.progress = progress
    self.overlap = overlap
    self.teacher_context = teacher_context
    self.mixed_views = mixed_views
    self.row_streams = row_streams
    self.truncated_prompts = 0  # student prompts cut by truncation="left" so far

  # ------------------------------------------------------------------------------- prompts
  def _render_user_message(self, user: str) -> str:
    return self.chat_template.render(
      [{"role": "user", "content": user}],
      add_generation_prompt=True,
      enable_thinking=self.enable_thinking,
    )

  def _fit_to_max_prompt_len(self, ids: list[int], where: str) -> list[int]:
    """`ids` if they fit rollout.max_prompt_len, else their last tokens (truncation="left") or
    a PromptTooLongError naming `where`."""
    if len(ids) <= self.max_prompt_len:
      return ids
    if self.truncation == "left":
      if not self.truncated_prompts:
        log.warning(
          "%s: a prompt of %d tokens was cut to its last %d (rollout.max_prompt_len, "
          "rollout.prompt_truncation=left): the model no longer sees the start of its context "
          "and the teacher gets the same cut prompt. Raise --config.rollout.max_prompt_len (or "
          "shorten env.history) to keep whole prompts. Further cuts are not logged; the metrics "
          "count them (episode/truncated_prompts in training, val/truncated_prompts in "
          "validation).",
          where,
          len(ids),
          self.max_prompt_len,
        )
      self.truncated_prompts += 1
      return ids[-self.max_prompt_len :]
    raise PromptTooLongError(
      f"{where}: the prompt has {len(ids)} tokens, more than rollout.max_prompt_len="
      f"{self.max_prompt_len}. Raise --config.rollout.max_prompt_len, shorten env.history, or set "
      f"--config.rollout.prompt_truncation=left to keep the last tokens."
    )

  def check_first_prompt(self, task: int, where: str) -> str | None:
    """Resets env 0 of the pool on `task` and builds its first turn's prompts, the shortest a
    rollout of it sends: with rollout.prompt_truncation='error' a prompt over
    rollout.max_prompt_len is a `PromptTooLongError` now, before anything is compiled, rather
    than at the first rollout or evaluation. Returns the env's error when the reset failed (the
    rollout reports such failures; the caller decides), else None. Nothing is counted: no
    truncated prompt, no draw of the retriever's shared random state."""
    result = self.pool.reset([int(task)], [0])[0]
    views: list[EpisodeView | None] = [None]
    self._record_env_result(
      Episode(env_index=0, task_id=int(task), group_id=0), views, 0, result, True
    )
    if views[0] is None:
      return str(result.info.get("env_error", "env failed"))
    truncated = self.truncated_prompts
    self._build_prompts(views[0], sample_id=f"start-check:{task}", where=where)
    self.truncated_prompts = truncated
    return None

  def build_prompts(
    self, view: EpisodeView, sample_id: Any, where: str, skills: bool = False
  ) -> tuple[list[int], list[int] | None]:
    """(student prompt ids, teacher prompt ids or None) for one episode's current turn (`skills`:
    with mixed views, an episode that plays with the skills)."""
    student, teacher, _, _ = self._build_prompts(view, sample_id, where, skills)
    return student, teacher

  def _build_prompts(
    self, view: EpisodeView, sample_id: Any, where: str, skills: bool = False
  ) -> tuple[list[int], list[int] | None, int | None, str | None]:
    """`build_prompts` plus the student prompt's length before truncation (None when uncut) and
    the skill block's text (None without a teacher, with Skill-GRPO, the skills in the teacher's
    message or mixed views).

    Student: the chat-templated user message (Skill-GRPO, or `skills` with mixed views:
    `SkillRetriever.student_block` at the start of the message), then fitted to max_prompt_len.
    Teacher: the privileged block's ids followed by the fitted student ids, so both branches
    share the student's context token for token (with Skill-GRPO the student prompt already holds
    skills and is the teacher prompt as well); with teacher_context="message" the message with
    the skills, fitted; with mixed views the other view's prompt, fitted.
    """
    user = self.adapter.user_text(view, self.history_length)

    def with_skills() -> str:
      return (
        self.retriever.student_block(
          user,
          task_type=view.task_type,
          gamefile=view.gamefile,
          query=self.adapter.skill_query(view),
          sample_id=sample_id,
          task=view.task,
        )
        + user
      )

    def fitted(text: str) -> tuple[list[int], int]:
      full = self.tokenizer.encode(self._render_user_message(text))
      return self._fit_to_max_prompt_len(full, where), len(full)

    own_skills = self.skills_in_student or (self.mixed_views and skills)
    student, full_len = fitted(with_skills() if own_skills else user)
    teacher = block = None
    if self.with_teacher:
      if self.skills_in_student:
        teacher = student
      elif self.mixed_views:
        teacher, _ = fitted(user if skills else with_skills())
      elif self.teacher_context == "message":
        teacher, _ = fitted(with_skills())
      else:
        block = self.retriever.privileged_block(
          task_type=view.task_type,
          gamefile=view.gamefile,
          query=self.adapter.skill_query(view),
          sample_id=sample_id,
          task=view.task,
        )
        teacher = self.tokenizer.encode(block) + student
    return student, teacher, (full_len if full_len > len(student) else None), block

  # ------------------------------------------------------------------------------- rollout
  def run(
    self,
    params,
    tasks: Sequence[int],
    group_ids: Sequence[int],
    rng: jax.Array,
    policy_version: int = 0,
    sampling: SamplingParams | None = None,
    desc: str = "rollout",
    timings: RolloutTimings | None = None,
  ) -> list[Episode]:
    """Plays one episode per entry of `tasks` on envs 0..len(tasks)-1 and returns them.
    `timings`, when given, gets the seconds blocked on the envs and in the sampler and the
    generated tokens added to it (`sdar_jax.observe.perf`). With several processes every process
    calls it with its own share of the episodes (possibly none) and the same `rng`."""
    sampling = sampling or self.sampling
    timings = RolloutTimings() if timings is None else timings
    n = len(tasks)
    if n > len(self.pool):
      raise ValueError(f"{n} episodes requested but the env pool has {len(self.pool)} envs.")
    if self.row_streams == "task" and len(set(tasks)) < n:
      raise ValueError(
        "eval.streams='task' keys each episode's draws by its task, but a task is played twice "
        "in one call (their draws would be the same). Fix: play each task once a call, or "
        "eval.streams='rank'"
      )
    episodes = [
      Episode(env_index=i, task_id=int(t), group_id=int(g))
      for i, (t, g) in enumerate(zip(tasks, group_ids))
    ]
    views: list[EpisodeView | None] = [None] * n
    start = time.perf_counter()
    reset = Progress(n, desc, unit="envs reset", wanted=self.progress)
    resets = self.pool.reset(list(tasks), list(range(n)), progress=reset.to)
    reset.close()
    timings.env_seconds += time.perf_counter() - start
    for i, result in enumerate(resets):
      self._record_env_result(episodes[i], views, i, result, first=True)

    bar = Progress(self.max_turns, desc, wanted=self.progress)
    collective = getattr(self.sampler, "collective", False)  # several processes sample together
    turn_keys = []  # key_t of every turn (docs/design.md, "The agent loop")
    for _ in range(self.max_turns):
      rng, key = jax.random.split(rng)
      turn_keys.append(key)
    play = _Play(episodes, views, params, turn_keys, policy_version, sampling, timings)
    if self.mixed_views:
      play.skills = skills_views(group_ids)
    if self.overlap == "halves":
      self._run_halves(play, split_halves(group_ids), bar)
    else:
      self._run_serial(play, collective, bar)
    bar.close()
    for ep in episodes:
      ep.done = True
    return episodes

  def _run_serial(self, play: _Play, collective: bool, bar) -> None:
    """Every turn: all active episodes decode in one batch, then all their envs step."""
    n, episodes = len(play.episodes), play.episodes
    for turn in range(self.max_turns):
      active = [i for i in range(n) if not episodes[i].done]
      # A turn runs while any process has an active episode (one with none joins the sampler's
      # collective with no prompts; sdar_jax.infra.multihost).
      if not (multihost.any_process(bool(active)) if collective else active):
        break
      decoded = self._decode(play, active, turn)
      start = time.perf_counter()
      results = self.pool.step([a for a, _ in decoded.actions], active)
      play.timings.env_seconds += time.perf_counter() - start
      self._apply(play, decoded, results)
      bar.update(1, active=len(active), won=sum(e.won for e in episodes))

  def _run_halves(self, play: _Play, halves: list[list[int]], bar) -> None:
    """The two halves in alternation: a half waits for its envs' last step, decodes its next
    turn and sends the actions without waiting, then the other half does the same, so one
    half's env steps run while the other half decodes. A half decodes turn t after the lower
    halves decoded theirs (or finished), so its rows take the ranks that follow theirs among the
    episodes playing turn t: the serial batch's row streams."""
    episodes = play.episodes
    turns = [0] * len(halves)  # turns decoded so far, per half
    ranked: dict[int, int] = {}  # turn -> episodes of the lower halves that decoded it
    shown = 0  # turns on the progress bar: those the faster half has decoded
    out: list[tuple[_Decoded, Any] | None] = [None] * len(halves)  # (decoded turn, env request)
    while True:
      for h, half in enumerate(halves):
        if out[h] is not None:
          decoded, request = out[h]
          out[h] = None
          start = time.perf_counter()
          results = self.pool.wait(request)
          play.timings.env_seconds += time.perf_counter() - start
          self._apply(play, decoded, results)
        active = [i for i in half if not episodes[i].done]
        if active and turns[h] < self.max_turns:
          offset = 0 if h == 0 else ranked.get(turns[h], 0)
          ranked[turns[h]] = offset + len(active)
          decoded = self._decode(play, active, turns[h], [offset + k for k in range(len(active))])
          out[h] = (decoded, self.pool.step_async([a for a, _ in decoded.actions], active))
          turns[h] += 1
          if turns[h] > shown:
            bar.update(turns[h] - shown, won=sum(e.won for e in episodes))
            shown = turns[h]
      if not any(out):
        return

  def _decode(
    self, play: _Play, active: list[int], turn: int, row_ids: list[int] | None = None
  ) -> _Decoded:
    """Prompts, one sampler call and the projected actions of episodes `active` at `turn`;
    `row_ids` name their random streams (default: their ranks in this call; docs/design.md, "The
    agent loop"; with row_streams "task", their tasks)."""
    episodes, views = play.episodes, play.views
    prompts = [
      self._build_prompts(
        views[i],
        (episodes[i].group_id, turn),
        f"env {i} turn {turn}",
        bool(play.skills and play.skills[i]),
      )
      for i in active
    ]
    if self.row_streams == "task":  # common random numbers: the task names the stream
      row_ids = [episodes[i].task_id for i in active]
    start = time.perf_counter()
    out = self.sampler.generate(
      play.params,
      [p[0] for p in prompts],
      play.sampling,
      play.turn_keys[turn],
      row_ids=row_ids,
    )
    play.timings.sampler_seconds += time.perf_counter() - start
    play.timings.sampler_calls += 1
    play.timings.generated_tokens += sum(len(t) for t in out.tokens)
    texts = self.tokenizer.decode_batch(out.tokens, skip_special_tokens=True)
    actions = [self.adapter.project(text) for text in texts]
    return _Decoded(active, prompts, out, actions)

  def _apply(self, play: _Play, decoded: _Decoded, results) -> None:
    """Records the decoded turn on its episodes and folds in their envs' step results."""
    prompts, out, actions = decoded.prompts, decoded.out, decoded.actions
    check = getattr(self.adapter, "is_admissible", None)
    for k, i in enumerate(decoded.active):
      view = play.views[i]
      play.episodes[i].turns.append(
        Turn(
          prompt_ids=prompts[k][0],
          teacher_prompt_ids=prompts[k][1],
          response_ids=out.tokens[k],
          logprobs=out.logprobs[k],
          action=actions[k][0],
          valid=actions[k][1],
          policy_version=play.policy_version,
          finish_reason=out.finish_reasons[k],
          observation=view.observation,
          prompt_truncated_from=prompts[k][2],
          skill_block=prompts[k][3],
          admissible=check(actions[k][0], view) if check is not None else None,
          skills_in_prompt=self.skills_in_student or bool(play.skills and play.skills[i]),
        )
      )
      view.history.append((view.observation, actions[k][0]))
      self._record_env_result(play.episodes[i], play.views, i, results[k], first=False)

  @staticmethod
  def _record_env_result(ep: Episode, views: list, i: int, result, first: bool) -> None:
    """Folds one env reset (`first`) or step result into episode `ep` and its view `views[i]`."""
    info = result.info
    if result.failed:
      ep.env_error, ep.done = info.get("env_error", "env failed"), True
      return
    if first:
      ep.task = info.get("task", "")
      ep.task_type = info.get("task_type", "unknown")
      ep.gamefile = info.get("gamefile", "")
      views[i] = EpisodeView(
        task=ep.task,
        task_type=ep.task_type,
        gamefile=ep.gamefile,
        observation=result.observation,
        admissible=list(info.get("admissible_commands", [])),
        history=[],
      )
    else:
      views[i].observation = ep.final_observation = result.observation
      views[i].admissible = list(info.get("admissible_commands", []))
      if info.get("search_error"):  # the episode goes on; the trainer counts and warns
        ep.search_errors.append((str(info.get("search_error_kind", "error")), info["search_error"]))
      ep.reward += float(result.reward)
      if ep.turns:  # the turn whose action this step played
        ep.turns[-1].reward = float(result.reward)
    ep.won = bool(info.get("won", False))
    ep.done = bool(result.done) or ep.won
    ep.info = {k: v for k, v in info.items() if k != "admissible_commands"}


@dataclasses.dataclass
class _Play:
  """One `AgentLoop.run` call's episodes and what its turns need."""

  episodes: list[Episode]
  views: list[EpisodeView | None]
  params: Any
  turn_keys: list[jax.Array]  # the sampler key of each turn
  policy_version: int
  sampling: SamplingParams
  timings: RolloutTimings
  skills: list[bool] = dataclasses.field(default_factory=list)  # mixed views: each episode's


def skills_views(group_ids: Sequence[int]) -> list[bool]:
  """Mixed views (UCOB's `_rollout_skill_mask`): whether each episode plays with the skills, by
  its position p among its GRPO group's m episodes (in index order): p >= max(1, m // 2); in a
  group of one, every other episode by index."""
  sizes: dict[int, int] = {}
  for g in group_ids:
    sizes[g] = sizes.get(g, 0) + 1
  seen: dict[int, int] = {}
  out = []
  for i, g in enumerate(group_ids):
    p = seen.get(g, 0)
    seen[g] = p + 1
    m = sizes[g]
    out.append(p >= max(1, m // 2) if m > 1 else i % 2 == 1)
  return out


@dataclasses.dataclass
class _Decoded:
  """One sampler call's turn: its episodes, their (student, teacher, uncut length, skill block)
  prompts, the generation and the projected (action, valid) pairs."""

  active: list[int]
  prompts: list[tuple[list[int], list[int] | None, int | None, str | None]]
  out: GenerationResult
  actions: list[tuple[str, bool]]
