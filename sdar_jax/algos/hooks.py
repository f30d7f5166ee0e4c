"""Hook points of a training iteration, which a method registers for (`METHOD_HOOKS`).

A method that acts once per iteration is a `MethodHooks` subclass returned by a factory
registered for the `AlgoConfig`s it applies to. The trainer builds each run's hooks once and calls
them in registration order: `before_teacher_context(view)` (the episodes played, no teacher context
composed yet: a source's own preparation, e.g. reflections), `after_rollout(view)`,
`after_teacher_scoring(view)` (may rewrite the
advantages), `after_updates(view)`, `at_evaluation(view, evaluation, start)`,
`at_iteration_end(view)`; `state_dict` / `load_state_dict` go into each checkpoint and
`run_problems(config)` refuses a run config before anything is built. Each returns metrics to
log (or None). The `view` is the trainer's; what it offers is the `IterationView` protocol below.
Nothing here imports the layers above. Writing one: docs/extending.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sdar_jax.algos.registry import Registry

Metrics = dict[str, float]


class IterationView(Protocol):
  """What the trainer shows a hook (sdar_jax.run.iteration implements it)."""

  algo: Any  # the run's AlgoConfig (as swapped by `set_algo`)
  iteration: int  # 0-based index of the iteration being trained (completed ones at evaluation)
  metrics: Mapping[str, float]  # the iteration's metrics so far
  samples: list  # the iteration's TurnSamples (after_rollout may replace the list)
  tokenizer: Any  # the run's tokenizer (sdar_jax.text.Tokenizer), to read responses as text
  episodes: list  # the iteration's episodes (this process's; sdar_jax.rollout.trajectory.Episode)

  def generate(self, conversations: list, max_new_tokens: int, temperature: float) -> list:
    """The policy's continuations of chat `conversations` (lists of role/content dicts) through
    the in-process sampler at the current params, one batched call: per conversation (prompt
    ids, response ids, log-probs, text)."""

  def update_on(self, rows: list, prefix: str) -> Metrics:
    """One more pass of the update over extra rows (dicts: prompt_ids, response_ids, logprobs,
    advantage), no teacher context; returns the updates' mean metrics under `prefix`/."""

  def rewrite_advantages(self, fn: Callable[..., Any]) -> Metrics:
    """Replaces every turn-sample's advantage by fn(table, num_groups=...) of the iteration's
    `algos.TurnTable` (every process's samples); returns turn_adv/* metrics."""

  def updates_applied(self) -> bool:
    """Whether at least one of the iteration's updates was applied (none skipped them all)."""

  def move_teacher_ema(self) -> None:
    """ema ← d·ema + (1 − d)·params once (algo.teacher_weights="ema")."""

  def set_algo(self, algo: Any) -> None:
    """Runs the rest of the training with `algo` (one more compilation of the update)."""

  def save_text(self, name: str, text: str) -> None:
    """Writes `text` to the run folder's file `name` (the primary process only)."""

  def set_rollout_retriever(self, retriever: Any) -> None:
    """Makes `retriever` (`skill_text`, `privileged_block`, `student_block` as
    envs.skills.SkillRetriever's) the training rollout's skill retriever from its next rollout on;
    the validation loops keep theirs."""


class MethodHooks:
  """A method's hooks; every one is optional (the defaults do nothing)."""

  # eval modes (prefixes of `run.setup`'s validation loops, e.g. "val_with_skill") that the
  # evaluation before training must also play, whatever eval.skills says
  start_eval_modes: tuple[str, ...] = ()
  # whose weights play those modes: "policy" (the params at the start) or "teacher" (the teacher
  # branch's weights, algo.teacher_weights: e.g. a frozen teacher read from a folder)
  start_eval_weights: str = "policy"
  # the loop-state key a checkpoint written before hooks existed kept this hook's state under
  legacy_state_key: str | None = None

  def at_run_start(self, view: IterationView) -> None:
    """Once the run's state is in place (fresh, or restored with `load_state_dict`), before its
    first rollout."""
    return None

  def before_teacher_context(self, view: IterationView) -> Metrics | None:
    return None

  def before_evaluation_contexts(self, algo: Any, episodes: list) -> None:
    """The token view composes the teacher's contexts for these evaluation `episodes` (run
    algorithm `algo`): give them what this method's context source reads, without changing the
    method's state (nothing written, no utility updated, no model called)."""
    return None

  def after_rollout(self, view: IterationView) -> Metrics | None:
    return None

  def after_teacher_scoring(self, view: IterationView) -> Metrics | None:
    return None

  def after_updates(self, view: IterationView) -> Metrics | None:
    return None

  def at_evaluation(
    self, view: IterationView, evaluation: Mapping[str, float], start: bool
  ) -> Metrics | None:
    return None

  def at_iteration_end(self, view: IterationView) -> Metrics | None:
    return None

  def state_dict(self) -> dict[str, Any] | None:
    return None

  def load_state_dict(self, state: dict[str, Any], view: IterationView) -> None:
    return None

  def run_problems(self, config) -> list[str]:
    return []


HookFactory = Callable[[Any], "MethodHooks | None"]
METHOD_HOOKS: Registry[HookFactory] = Registry("method hook")


def register_hooks(name: str) -> Callable[[HookFactory], HookFactory]:
  """Registers `factory(algo) -> MethodHooks | None` under `name` (the name keys its state in a
  checkpoint)."""
  return METHOD_HOOKS.register(name)


def build_hooks(algo) -> dict[str, MethodHooks]:
  """name -> hooks of every registered factory that applies to `algo`, in registration order."""
  out = {}
  for name in METHOD_HOOKS.registered():
    hooks = METHOD_HOOKS.get(name)(algo)
    if hooks is not None:
      out[name] = hooks
  return out
