"""What a run does about failures it can survive: the first environment failure and the first
failed search of each kind logged once (the rest counted in metrics), and the two limits that stop
a run: every environment failed in `train.max_failed_iterations` consecutive iterations
(`EnvFailureError`), `train.max_skipped_updates` updates skipped in a row for a non-finite loss or
gradient (`SkippedUpdatesError`, raised before another checkpoint or the export is written); and
a run that ends without one applied update (`NothingTrainedError`, before the export). The
counters live in the run's `LoopState` (checkpointed); `RunGuards` keeps which kinds were logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from sdar_jax.infra.errors import UserError

log = logging.getLogger(__name__)


class EnvFailureError(UserError, RuntimeError):
  """Every environment failed in `train.max_failed_iterations` consecutive iterations."""

  heading = "EnvFailureError"


class EvalEnvFailureError(UserError, RuntimeError):
  """An evaluation-only run's eval modes lost more episodes to env failures than
  `eval.max_env_failures`: they are not recorded as finished."""

  heading = "EvalEnvFailureError"


class SkippedUpdatesError(UserError):
  """`train.max_skipped_updates` updates in a row were skipped because their loss or gradient
  was not finite: the run stops before another checkpoint or the export is written."""


class NothingTrainedError(UserError):
  """A run's iterations ended without one update that changed the policy: nothing exported."""

  heading = "Nothing trained"


def error_kind(error: str) -> str:
  """'env raised during reset: JSONDecodeError: Expecting ...' -> its first two ': ' fields."""
  return ": ".join(error.split(": ")[:2])


class RunGuards:
  """One run's failure reports and limits (`train.max_failed_iterations`,
  `train.max_skipped_updates`, read from the run config's `train` section)."""

  def __init__(self, train: Any = None):
    train = train if train is not None else {}
    self.max_failed_iterations = int(train.get("max_failed_iterations", 3))
    self.max_skipped_updates = int(train.get("max_skipped_updates", 3))
    self.failure_kinds: dict[str, str] = {}  # first error of each kind, with its env and game
    self.search_error_kinds: set[str] = set()  # kinds of failed searches already warned about
    self.updates_applied = 0  # updates of this process's run that changed the parameters
    self.updates_skipped = 0  # and those skipped for a non-finite loss or gradient

  def report_env_failures(self, episodes: Sequence[Any], games: Sequence[str], prefix: str) -> None:
    """Logs the first failure of each kind with its env and game file; the rest are counted."""
    for ep in episodes:
      if ep.env_error is None:
        continue
      kind = error_kind(ep.env_error)
      if kind in self.failure_kinds:
        continue
      game = ep.gamefile or (games[ep.task_id] if 0 <= ep.task_id < len(games) else "?")
      where = f"{prefix} env {ep.env_index} (task {ep.task_id}, game {game})"
      self.failure_kinds[kind] = f"{where}: {ep.env_error}"
      log.warning(
        "%s failed: %s. Further failures of this kind are counted in %s/env_failures, not shown.",
        where,
        ep.env_error,
        prefix,
      )

  def report_search_errors(self, episodes: Sequence[Any], where: str) -> None:
    """Logs the first failed search of each kind (unreachable, timeout, HTTP 500, ...) once per
    run; every failed search is counted in rollout/search_errors (<prefix>/search_errors in an
    evaluation)."""
    for ep in episodes:
      for kind, message in ep.search_errors:
        if kind in self.search_error_kinds:
          continue
        self.search_error_kinds.add(kind)
        log.warning(
          "%s: a search failed (%s): %s. The episode goes on with the error as its observation; "
          "further failures of this kind are counted in rollout/search_errors, not shown. Check "
          "the retrieval server at env.search_url (env.search_timeout_s, env.search_retries).",
          where,
          kind,
          message,
        )

  def check_all_failed(self, loop_state: Any, episodes: Sequence[Any]) -> None:
    """Counts iterations in which every env failed (`loop_state.all_failed_iterations`); raises
    EnvFailureError after train.max_failed_iterations in a row."""
    if episodes and all(ep.env_error is not None for ep in episodes):
      loop_state.all_failed_iterations += 1
    else:
      loop_state.all_failed_iterations = 0
    limit = self.max_failed_iterations
    if loop_state.all_failed_iterations >= limit:
      first = "\n  - ".join(self.failure_kinds.values())
      raise EnvFailureError(
        f"every environment failed in {loop_state.all_failed_iterations} consecutive "
        "iterations "
        f"(train.max_failed_iterations={limit}); nothing was trained. First error of each kind:"
        f"\n  - {first}\nFix the environment or its data (env.data_dir, the generated games), or "
        "raise --config.train.max_failed_iterations."
      )

  def count_skipped(
    self,
    loop_state: Any,
    metrics: dict[str, Any],
    iteration: int,
    k: int,
    n: int,
    latest_checkpoint: Callable[[], int | None] = lambda: None,
  ) -> None:
    """Counts updates skipped in a row (`loop_state.skipped_in_a_row`; train/skipped_update of
    update `k` of `n` in `iteration`); raises SkippedUpdatesError at train.max_skipped_updates (0:
    never), before the iteration's checkpoint: the last saved one (`latest_checkpoint()`, None:
    none) holds the last good state."""
    if float(metrics.get("train/skipped_update", 0.0)) > 0:
      loop_state.skipped_in_a_row += 1
      self.updates_skipped += 1
    else:
      loop_state.skipped_in_a_row = 0
      self.updates_applied += 1
    limit = self.max_skipped_updates
    if limit > 0 and loop_state.skipped_in_a_row >= limit:
      saved = latest_checkpoint()
      kept = (
        f"the last checkpoint (iteration {saved}) is kept as it was"
        if saved is not None
        else "no checkpoint was written"
      )
      count = loop_state.skipped_in_a_row
      raise SkippedUpdatesError(
        f"{count} update{'s' if count > 1 else ''} in a row {'were' if count > 1 else 'was'} "
        "skipped because the loss or the gradient was not finite (NaN or inf), the last at "
        f"iteration {iteration}, update {k} of {n} (train.max_skipped_updates={limit}); {kept} "
        "and nothing was exported. Fix: check the weights the run started from (model.path), "
        "lower optim.lr or keep optim.clip_norm on, and read train/grad_norm in metrics.jsonl; "
        "--config.train.max_skipped_updates=0 never stops."
      )

  def check_trained(self, iterations: int) -> None:
    """After a run that trained `iterations` iterations: NothingTrainedError when not one update
    changed the parameters (every env failed, or every update was skipped), so that nothing is
    exported and the command does not exit 0 on an untrained policy."""
    if iterations <= 0 or self.updates_applied > 0:
      return
    if self.updates_skipped:
      why = (
        f"all {self.updates_skipped} updates were skipped because the loss or the gradient was "
        "not finite. Fix: check the weights the run started from (model.path), lower optim.lr, "
        "and read train/grad_norm in metrics.jsonl"
      )
    else:
      first = "\n  - ".join(self.failure_kinds.values()) or "no turn-sample to train on"
      why = (
        "no iteration had a turn-sample to train on (every environment failed). First error of "
        f"each kind:\n  - {first}\nFix the environment or its data (env.data_dir, the generated "
        "games, a writable HOME)"
      )
    raise NothingTrainedError(
      f"{iterations} iteration(s) ran and not one update changed the policy: {why}. Nothing was "
      "exported."
    )
