"""Run-config keys that moved, old dotted key -> new one, and what reads a run config written
before a move: `translate` moves a saved config's values to their new keys (on load: sweeps'
tables, `AlgoConfig.from_config`); on the command line an old key is refused, naming its new one
(`renamed_problem`). Layer 0: nothing of the project is imported here."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

_SECTION_MOVES = {
  "algo": {
    # 2026-12-06: each method's settings in its own section, PPO's clip in algo.ppo
    "agent_opsd_lambda": "algo.agent_opsd.lam",
    "agent_opsd_band": "algo.agent_opsd.band",
    "agent_opsd_eps": "algo.agent_opsd.eps",
    "agent_opsd_v0": "algo.agent_opsd.v0",
    "grsd_scale": "algo.grsd.scale",
    "grsd_clip": "algo.grsd.clip",
    "grsd_floor": "algo.grsd.floor",
    "rlsd_lam0": "algo.rlsd.lam0",
    "rlsd_warmdown_steps": "algo.rlsd.warmdown_steps",
    "rlsd_clip_eps": "algo.rlsd.clip_eps",
    "retire_window": "algo.retire.window",
    "retire_progress": "algo.retire.progress",
    "retire_competence": "algo.retire.competence",
    "teacher_ema_decay": "algo.ema.decay",
    "teacher_ema_every": "algo.ema.every",
    "clip_low": "algo.ppo.clip_low",
    "clip_high": "algo.ppo.clip_high",
    "clip_c": "algo.ppo.clip_c",
    # 2026-12-06: reward shaping is the rollout's, not the algorithm's
    "norm_adv_by_std": "rollout.shaping.norm_adv_by_std",
    "invalid_penalty": "rollout.shaping.invalid_penalty",
    "inadmissible_penalty": "rollout.shaping.inadmissible_penalty",
    "inadmissible_no_credit": "rollout.shaping.inadmissible_no_credit",
    "step_adv_coef": "rollout.shaping.step_adv_coef",
    "step_gamma": "rollout.shaping.step_gamma",
    "step_anchor": "rollout.shaping.step_anchor",
  }
}
RENAMED: dict[str, str] = {
  f"{section}.{old}": new for section, moves in _SECTION_MOVES.items() for old, new in moves.items()
}


def new_key(dotted: str) -> str | None:
  """The key `dotted` moved to, or None."""
  return RENAMED.get(dotted)


def renamed_problem(dotted: str) -> str | None:
  """The message refusing an old key on the command line, or None for a key that did not move."""
  new = RENAMED.get(dotted)
  if new is None:
    return None
  return f"{dotted}: this setting moved to {new} (2026-12-06). Fix: use --config.{new}=..."


def translate(config: Mapping[str, Any]) -> dict[str, Any]:
  """A copy of a saved run config (a nested dict, as config.json holds) with every moved key's
  value at its new key; a value already at the new key wins."""
  out = copy.deepcopy(dict(config))
  for old, new in RENAMED.items():
    section, leaf = old.split(".", 1)
    node = out.get(section)
    if not isinstance(node, dict) or leaf not in node:
      continue
    value = node.pop(leaf)
    *parents, last = new.split(".")
    target = out
    for key in parents:
      target = target.setdefault(key, {})
    target.setdefault(last, value)
  return out


def translate_section(section: str, values: Mapping[str, Any]) -> dict[str, Any]:
  """`translate` of one section's dict (e.g. a saved `algo` section): its moved keys that stay in
  the section go to their subsections; those that left it are dropped."""
  moved = translate({section: dict(values)})
  return moved.get(section, {})
