"""Run-config keys and values that were renamed, and what reads a run config written before.

`RENAMED` maps an old dotted key to its new one, `RENAMED_VALUES` an old value of a key to its new
one. `translate` moves a saved config's values to their new keys and values (on load: sweeps'
tables, `AlgoConfig.from_config`); on the command line an old key or value is refused, naming the
new one (`renamed_problem`). Layer 0: nothing of the project is imported here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

_MOVES = {
  # 2026-12-06: each method's settings in its own section, PPO's clip in algo.ppo
  "algo.agent_opsd_lambda": "algo.agent_opsd.lam",
  "algo.agent_opsd_band": "algo.agent_opsd.band",
  "algo.agent_opsd_eps": "algo.agent_opsd.eps",
  "algo.agent_opsd_v0": "algo.agent_opsd.v0",
  "algo.grsd_scale": "algo.grsd.scale",
  "algo.grsd_clip": "algo.grsd.clip",
  "algo.grsd_floor": "algo.grsd.floor",
  "algo.rlsd_lam0": "algo.rlsd.lam0",
  "algo.rlsd_warmdown_steps": "algo.rlsd.warmdown_steps",
  "algo.rlsd_clip_eps": "algo.rlsd.clip_eps",
  "algo.retire_window": "algo.retire.window",
  "algo.retire_progress": "algo.retire.progress",
  "algo.retire_competence": "algo.retire.competence",
  "algo.teacher_ema_decay": "algo.ema.decay",
  "algo.teacher_ema_every": "algo.ema.every",
  "algo.clip_low": "algo.ppo.clip_low",
  "algo.clip_high": "algo.ppo.clip_high",
  "algo.clip_c": "algo.ppo.clip_c",
  # 2026-12-06: reward shaping is the rollout's, not the algorithm's
  "algo.norm_adv_by_std": "rollout.shaping.norm_adv_by_std",
  "algo.invalid_penalty": "rollout.shaping.invalid_penalty",
  "algo.inadmissible_penalty": "rollout.shaping.inadmissible_penalty",
  "algo.inadmissible_no_credit": "rollout.shaping.inadmissible_no_credit",
  "algo.step_adv_coef": "rollout.shaping.step_adv_coef",
  "algo.step_gamma": "rollout.shaping.step_gamma",
  "algo.step_anchor": "rollout.shaping.step_anchor",
  # 2026-12-06, later: "iteration" is a rollout and its updates, "update" one optimizer step
  "train.total_steps": "train.iterations",
  "optim.warmup_steps": "optim.warmup_iterations",
  "env.tasks_per_step": "env.tasks_per_iteration",
  "algo.rlsd.warmdown_steps": "algo.rlsd.warmdown_iterations",
}
MOVED_ON = "2026-12-06"  # the day of both moves, named in the messages


def _final(key: str) -> str:
  """Where `key` is now, after every move (a key moved twice goes to its last place)."""
  seen = set()
  while key in _MOVES and key not in seen:
    seen.add(key)
    key = _MOVES[key]
  return key


RENAMED: dict[str, str] = {old: _final(old) for old in _MOVES}
# old value -> new value of a key (the key at its new place)
RENAMED_VALUES: dict[str, dict[Any, Any]] = {
  "algo.teacher_source": {"step": "update"},  # the teacher scored inside each update
}


def new_key(dotted: str) -> str | None:
  """The key `dotted` moved to, or None."""
  return RENAMED.get(dotted)


def renamed_problem(dotted: str, value: Any = None) -> str | None:
  """The message refusing an old key (or, given `value` as written on the command line, an old
  value of a key) on the command line, or None for a key and value that did not change."""
  new = RENAMED.get(dotted)
  if new is not None:
    return f"{dotted}: this setting moved to {new} ({MOVED_ON}). Fix: use --config.{new}=..."
  values = RENAMED_VALUES.get(dotted, {})
  for old, renamed in values.items():
    if value is not None and str(value).strip("'\"") == str(old):
      return (
        f"{dotted}={old}: this value is now {renamed!r} ({MOVED_ON}). Fix: use "
        f"--config.{dotted}={renamed}"
      )
  return None


def _pop(config: dict[str, Any], dotted: str) -> tuple[bool, Any]:
  """Removes `dotted` from a nested dict: (whether it was there, its value)."""
  *parents, leaf = dotted.split(".")
  node: Any = config
  for key in parents:
    node = node.get(key) if isinstance(node, dict) else None
  if not isinstance(node, dict) or leaf not in node:
    return False, None
  return True, node.pop(leaf)


def _set_default(config: dict[str, Any], dotted: str, value: Any) -> None:
  *parents, leaf = dotted.split(".")
  node = config
  for key in parents:
    if not isinstance(node.get(key), dict):
      node[key] = {}
    node = node[key]
  node.setdefault(leaf, value)


def translate(config: Mapping[str, Any]) -> dict[str, Any]:
  """A copy of a saved run config (a nested dict, as config.json holds) with every moved key's
  value at its new key (a value already at the new key wins) and every renamed value replaced."""
  out = copy.deepcopy(dict(config))
  for old in _MOVES:  # in order: a key moved twice passes both moves
    found, value = _pop(out, old)
    if found:
      _set_default(out, _MOVES[old], value)
  for dotted, values in RENAMED_VALUES.items():
    *parents, leaf = dotted.split(".")
    node: Any = out
    for key in parents:
      node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict) and leaf in node:
      try:
        node[leaf] = values.get(node[leaf], node[leaf])
      except TypeError:  # an unhashable value is not a renamed one
        pass
  return out


def translate_section(section: str, values: Mapping[str, Any]) -> dict[str, Any]:
  """`translate` of one section's dict (e.g. a saved `algo` section): its moved keys that stay in
  the section go to their subsections; those that left it are dropped."""
  moved = translate({section: dict(values)})
  return moved.get(section, {})
