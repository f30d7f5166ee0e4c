"""Validation transcripts and per-game outcomes: every episode of an evaluation, as text.

`write_transcripts` writes `episodes_<prefix>.jsonl` (one JSON object per episode in task order:
task, outcome, and per turn the observation, the decoded response, the action sent, validity and
admissibility) and `write_outcomes` `outcomes_<prefix>.csv` (one row per episode: arm, seed, step,
split, repeat, game, task type, success, reward: what paired comparisons read) into an
evaluation's folder; `read_transcripts`, `read_outcomes` and `summarise` read them back. With
several processes every process's episodes are gathered (a collective) and the primary process
writes (local or gs://). The files' fields: docs/design.md, "Transcripts and outcomes".
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any

from sdar_jax.infra import multihost, paths

__all__ = [
  "OUTCOMES_PREFIX",
  "OUTCOME_COLUMNS",
  "TRANSCRIPT_PREFIX",
  "read_outcomes",
  "read_transcripts",
  "summarise",
  "transcript",
  "write_outcomes",
  "write_transcripts",
]

TRANSCRIPT_PREFIX = "episodes_"  # episodes_<eval mode prefix>.jsonl
OUTCOMES_PREFIX = "outcomes_"  # outcomes_<eval mode prefix>.csv
OUTCOME_COLUMNS = (
  "arm", "seed", "step", "split", "repeat", "task_id", "gamefile", "task_type", "success", "reward",
  "turns",
)  # fmt: skip


def transcript(episode: Any, decode) -> dict[str, Any]:
  """One episode (`sdar_jax.rollout.Episode`) as a JSON-ready dict; `decode(ids) -> str`."""
  return {
    "task_id": int(episode.task_id),
    "task": episode.task,
    "task_type": episode.task_type,
    "gamefile": episode.gamefile,
    "won": bool(episode.won),
    "reward": float(episode.reward),
    "env_error": episode.env_error,
    "turns": [
      {
        "observation": turn.observation,
        "response": decode(turn.response_ids),
        "action": turn.action,
        "valid": bool(turn.valid),
        "admissible": turn.admissible,
      }
      for turn in episode.turns
    ],
  }


def write_transcripts(out_dir: str, prefix: str, episodes: Sequence[Any], decode) -> str | None:
  """Writes `<out_dir>/episodes_<prefix>.jsonl` (every process's episodes, sorted by task id);
  returns its path on the primary process, None elsewhere. A collective with several processes:
  every process must call it."""
  mine = [transcript(ep, decode) for ep in episodes]
  everyone = [t for part in multihost.allgather(mine) for t in part]
  if not paths.is_primary_process():
    return None
  everyone.sort(key=lambda t: t["task_id"])
  path = paths.join(out_dir, f"{TRANSCRIPT_PREFIX}{prefix}.jsonl")
  paths.write_text(path, "".join(json.dumps(t) + "\n" for t in everyone))
  return path


def read_transcripts(path: str) -> list[dict[str, Any]]:
  """The episodes of a transcript file (`write_transcripts`), in file order."""
  return [json.loads(line) for line in paths.read_text(path).splitlines() if line.strip()]


def summarise(episodes: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
  """Per task type (and "all"): episodes, success rate and mean turns of transcript dicts."""
  groups: dict[str, list[dict[str, Any]]] = {"all": list(episodes)}
  for ep in episodes:
    groups.setdefault(ep["task_type"], []).append(ep)
  return {
    name: {
      "episodes": float(len(eps)),
      "success_rate": sum(e["won"] for e in eps) / max(1, len(eps)),
      "mean_turns": sum(len(e["turns"]) for e in eps) / max(1, len(eps)),
    }
    for name, eps in groups.items()
  }


def write_outcomes(
  out_dir: str,
  prefix: str,
  episodes: Sequence[Any],
  *,
  arm: str,
  seed: int,
  step: int,
  split: str,
  repeats: Sequence[int] | None = None,
) -> str | None:
  """Writes `<out_dir>/outcomes_<prefix>.csv`, one row per finished episode of `episodes` (every
  process's already: `sdar_jax.rollout.trajectory.episode_summaries`), sorted by repeat and task
  id; `repeats[i]` is episode i's repeat (eval.repeats; default all 0). The primary process
  writes and gets the path, the others None. Episodes whose env failed have no outcome and no
  row."""
  if not paths.is_primary_process():
    return None
  repeats = [0] * len(episodes) if repeats is None else list(repeats)
  if len(repeats) != len(episodes):
    raise ValueError(f"{len(repeats)} repeat indices for {len(episodes)} episodes")
  rows = sorted(
    ((r, ep) for r, ep in zip(repeats, episodes) if ep.env_error is None),
    key=lambda pair: (pair[0], pair[1].task_id),
  )
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(OUTCOME_COLUMNS)
  for r, ep in rows:
    writer.writerow(
      [arm, int(seed), int(step), split, int(r), int(ep.task_id), ep.gamefile or ""]
      + [ep.task_type, int(bool(ep.won)), f"{float(ep.reward):g}", len(ep.turns)]
    )
  path = paths.join(out_dir, f"{OUTCOMES_PREFIX}{prefix}.csv")
  paths.write_text(path, out.getvalue())
  return path


def read_outcomes(path: str) -> list[dict[str, Any]]:
  """The rows of an outcomes file (`write_outcomes`), with seed, step, repeat, task_id, success
  and turns as ints and reward as a float; turns is None in files written before it was kept
  (2026-12-06)."""
  rows = list(csv.DictReader(io.StringIO(paths.read_text(path))))
  for row in rows:
    for key in ("seed", "step", "repeat", "task_id", "success"):
      row[key] = int(row[key])
    row["reward"] = float(row["reward"])
    row["turns"] = int(row["turns"]) if row.get("turns") not in (None, "") else None
  return rows
