"""What each committed report covers (`Spec`): the demo's ablation and the powered ablation's two
stages, by name (SPECS), for `python -m experiments.report` and the experiments' commands."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from experiments.powered.plan import STAGES
from experiments.tables_view import MEASURES


@dataclasses.dataclass(frozen=True)
class Spec:
  """What one report covers."""

  experiment: str
  stage: int | None  # None: every stage's rows
  title: str
  arms: tuple[str, ...]  # in the order shown (reused arms first)
  seeds: tuple[int, ...]
  comparisons: tuple[tuple[str, str], ...]  # A - B; one Holm family
  measures: tuple[str, ...]  # of tables_view.MEASURES
  dest: str
  command: str  # what regenerates it
  skills: bool = False  # the with-skills evaluations: the internalisation family
  primary: tuple[str, str, str] | None = None  # (A, B, measure) named before any run


def demo_ablation(dest: str = "docs/results/demo_ablation") -> Spec:
  """The demo's three-seed ablation (2026-12-03): `sdar_vocab` against GRPO on valid_seen."""
  return Spec(
    experiment="demo_ablation",
    stage=1,
    title="The demo's ablation, `sdar_vocab` against GRPO (64 valid_seen games)",
    arms=("grpo", "sdar_vocab"),
    seeds=(0, 1, 2),
    comparisons=(("sdar_vocab", "grpo"),),
    measures=("final valid_seen", "valid_seen AUC"),
    dest=dest,
    command="python -m experiments.report demo_ablation",
  )


def powered(stage: int, dest: str | None = None) -> Spec:
  """A stage of the powered ablation: its arms (the reused ones first), seeds and family."""
  st = STAGES[stage]
  return Spec(
    experiment="powered",
    stage=stage,
    title=f"The powered ablation, {st.title}",
    arms=(*st.reused, *st.arms),
    seeds=st.seeds,
    comparisons=st.comparisons,
    measures=MEASURES,
    dest=dest or st.dest,
    command=f"python -m experiments.powered report{st.flag}",
    skills=st.skills,
    primary=("sdar_vocab", "grpo", "final heldout_seen") if stage == 1 else None,
  )


SPECS: dict[str, Callable[[], Spec]] = {
  "demo_ablation": demo_ablation,
  "powered": lambda: powered(1),
  "powered_stage2": lambda: powered(2),
}
