"""The lines the experiments' `status` prints, shared by their drivers: the steps done and left
by the cost plan, the measured pace against it, the episodes lost to env failures and the commits
the steps ran at (experiments.driver plays the steps; each driver adds its own notes)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence

from experiments.driver import Step
from sdar_jax.observe import collect


def wall_hours(steps: Iterable[Step]) -> float:
  """The wall time the steps took, in hours (a step without a record counts 0)."""
  return sum(collect.wall_seconds(s.results) or 0.0 for s in steps) / 3600


def cost_lines(
  done: Sequence[Step],
  left: Sequence[Step],
  total: int,
  hours: Callable[[Step], float],
  notes: Sequence[str] = (),
) -> list[str]:
  """The head of `status` by the cost plan: the steps done of `total` and their wall time, the
  hours `left` (`hours` a step), the `notes`, the next three steps and the partial training runs."""
  partial = [s for s in left if s.kind == "train" and collect.run_state(s.workdir) == "partial"]
  pace = pace_line(done, left, hours)
  return [
    (
      f"{len(done)}/{total} steps done, {wall_hours(done):.2f} h of wall time; "
      f"{len(left)} left, about {sum(hours(s) for s in left):.1f} machine-hours by the cost plan "
      "(a partial run counts in full)"
    ),
    *([pace] if pace else []),
    *notes,
    *(f"  next: {s.label} ({hours(s):.2f} h)" for s in left[:3]),
    *(f"  partial: {s.label} (resumes from its checkpoint)" for s in partial),
  ]


RECENT = 3  # the pace line's recent steps of each kind


def pace_line(done: Sequence[Step], left: Sequence[Step], hours: Callable[[Step], float]) -> str:
  """The wall time the finished steps took against the cost plan, per step kind, and the steps
  `left` at those ratios (a kind not measured yet at the ratio of all): on a shared machine with
  restarts the plan's machine-hours are a floor, and this is what the rest took so far. A
  training resumes from its checkpoints, so all its attempts count; any other step starts over,
  so only its finishing attempt does and the earlier ones are reported as lost. A step done in
  under 1% of its plan (its work found done elsewhere, e.g. panels another stage made) is left
  out. The rest is also given at the ratios of the last `RECENT` steps of each kind to finish
  (what the current code and machine share give; the early steps ran on slower code). Empty
  before a planned step has a wall time."""
  measured: dict[str, list[float]] = {}  # kind -> [wall hours, planned hours]
  finished: dict[str, list[tuple[float, float, float]]] = {}  # kind -> [(end, wall h, plan h)]
  lost = 0.0
  for step in done:
    status = collect.read_status(step.results)
    seconds = collect.wall_seconds(step.results, status) if status else None
    last = ((status or {}).get("attempts") or [{}])[-1].get("seconds")
    if step.kind != "train" and seconds and last is not None:
      lost += max(seconds - last, 0.0) / 3600
      seconds = last
    if seconds and hours(step) > 0 and seconds / 3600 >= 0.01 * hours(step):
      pair = measured.setdefault(step.kind, [0.0, 0.0])
      pair[0] += seconds / 3600
      pair[1] += hours(step)
      attempt = status["attempts"][-1]
      end = attempt.get("ended") or (attempt.get("started") or 0.0) + (last or 0.0)
      finished.setdefault(step.kind, []).append((end, seconds / 3600, hours(step)))
  if not measured:
    return ""

  def rest_at(pairs: dict[str, tuple[float, float]]) -> float:
    ratio = {kind: wall / plan for kind, (wall, plan) in pairs.items()}
    overall = sum(w for w, _ in pairs.values()) / sum(p for _, p in pairs.values())
    return sum(hours(s) * ratio.get(s.kind, overall) for s in left)

  rest = rest_at({kind: (wall, plan) for kind, (wall, plan) in measured.items()})
  recent: dict[str, tuple[float, float]] = {}
  for kind, steps in finished.items():
    last = sorted(steps)[-RECENT:]
    recent[kind] = (sum(w for _, w, _ in last), sum(p for _, _, p in last))
  recent_rest = rest_at(recent)
  kinds = ", ".join(
    f"{kind} {wall:.2f} h for {plan:.2f} planned ({wall / plan:.1f}x)"
    for kind, (wall, plan) in sorted(measured.items())
  )
  restarted = f"; {lost:.1f} h lost to attempts that had to start over" if lost >= 0.05 else ""
  return (
    f"measured wall time against the plan: {kinds}; the rest at those ratios: about {rest:.0f} h "
    f"of wall time, at the last {RECENT} of each kind's: about {recent_rest:.0f} h (as this "
    f"machine was shared{restarted})"
  )


def lost_episodes(steps: Sequence[Step]) -> list[tuple[str, int, str, int]]:
  """(step label, iteration, metric, episodes) for every metrics row of the steps' folders that
  counts episodes lost to env failures (a `*/env_failures` above 0: an env that raised, hung
  past its limit, or whose worker died). An evaluation with such a row scored fewer games than
  its panel holds, and a training iteration learned from fewer episodes."""
  lost = []
  for step in steps:
    for row in collect.read_metrics(os.path.join(step.results, "metrics.jsonl")):
      for key, value in sorted(row.items()):
        if key.endswith("/env_failures") and value:
          lost.append((step.label, int(row["step"]), key, int(value)))
  return lost


def lost_lines(lost: Sequence[tuple[str, int, str, int]]) -> list[str]:
  if not lost:
    return ["no episode was lost to an env failure"]
  return [
    f"episodes lost to env failures: {label}, iteration {it}: {key}={n}"
    for label, it, key, n in lost
  ]


def step_commits(steps: Sequence[Step]) -> dict[str, list[str]]:
  """commit -> the labels of the steps whose attempts ran at it (`collect.code_commit`, kept in
  each step's run_status.json; "not recorded" for attempts from before it was kept). A step
  resumed by a later commit counts under both."""
  found: dict[str, list[str]] = {}
  for step in steps:
    attempts = (collect.read_status(step.results) or {}).get("attempts", [])
    for commit in sorted({a.get("commit") or "not recorded" for a in attempts}):
      found.setdefault(commit, []).append(step.label)
  return found


def commit_lines(found: Mapping[str, list[str]]) -> list[str]:
  return [f"code at {commit}: {len(labels)} step(s)" for commit, labels in sorted(found.items())]


def check_lines(lost_in: Sequence[Step], commits_of: Sequence[Step]) -> list[str]:
  """The episodes lost in the steps `lost_in`, then the commits that ran the steps `commits_of`."""
  return [*lost_lines(lost_episodes(lost_in)), *commit_lines(step_commits(commits_of))]
