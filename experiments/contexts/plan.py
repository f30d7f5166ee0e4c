r"""The third stage, contexts (issue 59): its design, fixed in writing before any run, and the plan
of every step.

    mkdir -p runs/contexts && setsid nohup nice -n 19 .venv/bin/python -m experiments.contexts \
        run --records=docs/results >> runs/contexts/run.log 2>&1 &
    .venv/bin/python -m experiments.contexts status   # steps done, hours, the two decisions
    .venv/bin/python -m experiments.contexts plan     # every command, the power; runs nothing
    .venv/bin/python -m experiments.contexts cost     # machine-hours per step kind
    .venv/bin/python -m experiments.contexts report   # from the tables in docs/results

The question: does a teacher that sees the group's successful episode (`sibling`) or the
episode's own future (`hindsight`) make self-distillation beat GRPO? The design (docs/results.md,
"The third stage: contexts", planned 2026-12-06):
* ARMS (six): `grpo`; `sdar` with its teacher reading the skills (`sdar_skills`), the group's
  successful episode (`sdar_sibling`) or the episode's own future (`sdar_hindsight`),
  `--config.algo.context=skills|sibling|hindsight`; `sdpo` (its preset: an EMA teacher reading a
  success of the group, else the next observation); and the vocabulary form `sdar_vocab` with
  the better of `sibling` and `hindsight` by the VOCAB RULE: the larger of
  `warm_start/sibling_gap_on_expert` and `warm_start/hindsight_gap_on_expert` (the teacher-student
  gap on held-out expert turns) in the context policy's warm_start_metrics.json, measured when
  that policy was built, before any run; a tie goes to `sibling` (the primary's). `run` records
  the choice in <out>/vocab_context.json before its first step and never recomputes it; it
  refuses to start while the file or its keys are missing.
* Every arm starts from the context-reading demo policy (CONTEXT_POLICY, `model.path`) with the
  demo's budget (configs/default.py: 16 iterations x 2 tasks x 8 episodes, validation on the 64
  valid_seen games before training and every 8 iterations); only the preset, its context, the
  learning rate and the seed differ.
* THE RATE RULE: one learning rate for every arm, RATE = 5e-4. The PILOT first: `grpo` and the
  primary arm `sdar_sibling` at 5e-4 and at PILOT_RATE = 1e-3 on seeds 0 and 1 (8 runs); if
  1e-3 gives the strictly higher mean final valid_seen success over those two seeds for both
  arms, every arm runs at 1e-3, else at 5e-4. Decided once, when the 8 pilot runs have finished
  and before any other run, and written with its inputs to <out>/rate_decision.json (never
  recomputed; `status` prints it). Every factor contrast (context, form) is drawn at that rate.
* SEEDS 0-7 for every arm at the chosen rate (the pilot's runs at that rate are seeds 0 and 1 of
  `grpo` and `sdar_sibling`), seed-major after the pilot (seed 0 of every arm, then seed 1, ...),
  each run followed by its held-out evaluation.
* HELDOUT: every final policy and the context policy itself on `heldout_seen` and
  `heldout_unseen`, 640 games each, generator seed 2: the panels of the long-budget stage
  (experiments.long_budget; no PDDL problem shared with a train, valid_seen, valid_unseen or
  seed-1 panel game, nor between the two). The PANELS step runs that stage's own check into
  <out>/panels.json. Each episode's draws are keyed by its game and turn (`eval.streams=task`,
  common random numbers: arms share draws for as long as their actions agree), in the held-out
  evaluations and in the valid_seen validations during training (an evaluation setting; the
  demo's default, "rank", is unchanged).
* THE PRIMARY COMPARISON, named before any run: `sdar_sibling` - `grpo`, final success on
  held-out seen, paired over seeds x games, tested alone at alpha = 0.05 (two-way bootstrap,
  sdar_jax.observe.stats); its power is computed beforehand (`power_lines`). Every other row
  (FAMILY: each other arm - `grpo`, the context contrasts, the form contrast, on held-out seen;
  all of them and the primary on held-out unseen) is one Holm family.
Each step runs under `nice -n 19` (stop the driver for a test-suite run with `python -m
experiments.contexts stop`: a training saves its last finished iteration first; start it again
with the same command), resumable (a finished step is skipped, an interrupted training
resumes from its checkpoint); `run --records=<folder>` appends each finished step to the tables
there (experiment "contexts", stage 3). `--smoke` plays the same plan at a tiny budget (SMOKE)
into another folder.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence

from experiments import driver, power
from experiments.driver import REPO, rate_name
from experiments.long_budget import plan as long_budget
from experiments.long_budget.plan import Step, step_done  # noqa: F401 (contexts' steps: the same done rule)
from experiments.powered.plan import final_success

__all__ = ["REPO", "Step"]

EXPERIMENT = "contexts"
STAGE = 3  # the third stage; the experiment column keeps it apart from long_budget's
CONFIG = "configs/default.py"
CONTEXT_POLICY = "sdar_jax/assets/policies/alfworld_demo_context"
WARM_START_METRICS = "warm_start_metrics.json"
VOCAB_ARM = "sdar_vocab"
VOCAB_CHOICES = ("sibling", "hindsight")  # in tie order: a tie goes to the first
# arm -> (algo preset, overrides); the vocab arm's context is added by the VOCAB RULE
ARMS: dict[str, tuple[str, tuple[str, ...]]] = {
  "grpo": ("grpo", ()),
  "sdar_skills": ("sdar", ("algo.context=skills",)),
  "sdar_sibling": ("sdar", ("algo.context=sibling",)),
  "sdar_hindsight": ("sdar", ("algo.context=hindsight",)),
  "sdpo": ("sdpo", ()),
  VOCAB_ARM: ("sdar_vocab", ()),
}
RATE = 5e-4
PILOT_RATE = 1e-3
PILOT_ARMS = ("grpo", "sdar_sibling")
PRIMARY = ("sdar_sibling", "grpo")
PRIMARY_MEASURE = "final heldout_seen"
HELDOUT_MEASURES = ("final heldout_seen", "final heldout_unseen")
VOCAB_FILE = "vocab_context.json"
RATE_FILE = "rate_decision.json"
UNDECIDED = "undecided"


def family(vocab_context: str) -> list[tuple[str, str, str]]:
  """The Holm family, (A, B, measure) for A - B: every row but the primary comparison."""
  rows = [
    *((arm, "grpo") for arm in ARMS if arm != "grpo"),
    ("sdar_sibling", "sdar_skills"),  # context: the group's success against the skills
    ("sdar_hindsight", "sdar_skills"),  # context: the episode's future against the skills
    ("sdar_sibling", "sdar_hindsight"),
    (VOCAB_ARM, f"sdar_{vocab_context}"),  # form: vocabulary against the sampled token
  ]
  out = [(a, b, m) for m in HELDOUT_MEASURES for a, b in rows]
  return [r for r in out if (r[0], r[1], r[2]) != (*PRIMARY, PRIMARY_MEASURE)]


def questions(vocab_context: str) -> list[tuple[str, list[tuple[str, str]]]]:
  """The verdicts' four questions (docs/results.md), each with the comparisons (A, B) that answer
  it, read on both held-out panels; the first holds the primary comparison."""
  return [
    ("Does the sibling teacher beat GRPO?", [PRIMARY]),
    ("Does the hindsight teacher beat GRPO?", [("sdar_hindsight", "grpo")]),
    (
      "Does either context beat the skills?",
      [("sdar_sibling", "sdar_skills"), ("sdar_hindsight", "sdar_skills")],
    ),
    (
      "Does the vocabulary form beat the sampled-token form at its context?",
      [(VOCAB_ARM, f"sdar_{vocab_context}")],
    ),
  ]


@dataclasses.dataclass(frozen=True)
class Design:
  """The budget of one version of the plan (FULL: the experiment; SMOKE: its end-to-end check)."""

  out: str
  seeds: tuple[int, ...]
  pilot_seeds: tuple[int, ...]
  iterations: int
  eval_every: int
  num_heldout: int  # games per panel: the long-budget stage's panels
  heldout_seed: int
  extra: tuple[str, ...] = ()  # overrides of every training run and evaluation

  def heldout(self) -> tuple[str, ...]:
    return driver.heldout_overrides(self.num_heldout, self.heldout_seed)


FULL = Design(
  out="runs/contexts",
  seeds=tuple(range(8)),
  pilot_seeds=(0, 1),
  iterations=16,
  eval_every=8,
  num_heldout=long_budget.FULL.num_heldout,
  heldout_seed=long_budget.FULL.heldout_seed,
)
SMOKE = Design(
  out="runs/contexts_smoke",
  seeds=(0, 1),
  pilot_seeds=(0,),
  iterations=2,
  eval_every=1,
  num_heldout=long_budget.SMOKE.num_heldout,
  heldout_seed=long_budget.SMOKE.heldout_seed,
  extra=("checkpoint.every=1",),
)


# ---------------------------------------------------------------------------- the vocab rule
def vocab_context(policy: str = os.path.join(REPO, CONTEXT_POLICY)) -> tuple[str, dict[str, float]]:
  """The VOCAB RULE: (context, {context: gap}) from `policy`'s warm_start_metrics.json, the
  larger of the sibling and hindsight gaps on held-out expert turns (a tie: sibling). Raises
  FileNotFoundError or ValueError saying what is missing."""
  path = os.path.join(policy, WARM_START_METRICS)
  if not os.path.isfile(path):
    raise FileNotFoundError(
      f"{path} is missing: the vocab arm's context is the larger of the sibling and hindsight "
      "gaps recorded there when the context-reading policy is built. Fix: build "
      f"{CONTEXT_POLICY} first (its warm start measures both gaps)."
    )
  with open(path) as f:
    metrics = json.load(f)
  gaps = {}
  for name in VOCAB_CHOICES:
    key = f"warm_start/{name}_gap_on_expert"
    value = metrics.get(key)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
      raise ValueError(
        f"{path} has no finite {key!r} ({value!r}): the vocab arm's context is chosen by the "
        "larger of the sibling and hindsight gaps. Fix: build the policy with "
        "warm_start.contexts=sibling,hindsight so that its warm start measures both."
      )
    gaps[name] = float(value)
  return max(VOCAB_CHOICES, key=lambda n: (gaps[n], -VOCAB_CHOICES.index(n))), gaps


def recorded_vocab_context(out: str) -> str | None:
  path = os.path.join(out, VOCAB_FILE)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)["context"]


def decide_vocab_context(out: str, policy: str = os.path.join(REPO, CONTEXT_POLICY)) -> str:
  """The vocab arm's context, recorded in <out>/VOCAB_FILE on the first call (before any run)
  and read from there ever after."""
  found = recorded_vocab_context(out)
  if found is not None:
    return found
  context, gaps = vocab_context(policy)
  record = {
    "context": context,
    "gaps": gaps,
    "rule": "the larger of warm_start/sibling_gap_on_expert and warm_start/hindsight_gap_on_"
    "expert in the context policy's warm_start_metrics.json; a tie: sibling",
    "source": os.path.join(policy, WARM_START_METRICS),
    "recorded": datetime.datetime.now().isoformat(timespec="seconds"),  # after a restore: then
  }
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, VOCAB_FILE), "w") as f:
    json.dump(record, f, indent=1)
  return context


def planned_vocab_context(out: str, policy: str = os.path.join(REPO, CONTEXT_POLICY)) -> str:
  """The recorded context, else the rule's on the policy as it is now (nothing written), else
  UNDECIDED (the plan shows the arm; `run` refuses to start until the rule can be applied)."""
  found = recorded_vocab_context(out)
  if found is not None:
    return found
  try:
    return vocab_context(policy)[0]
  except (FileNotFoundError, ValueError):
    return UNDECIDED


# ---------------------------------------------------------------------------- the rate rule
def rate_rule(finals: Mapping[str, Mapping[float, Sequence[float]]]) -> float:
  """THE RATE RULE on the pilot: `finals` arm -> rate -> final valid_seen success per pilot
  seed. PILOT_RATE when its mean is strictly the higher for every pilot arm, else RATE."""
  return PILOT_RATE if all(_higher(finals[arm]) for arm in PILOT_ARMS) else RATE


def _higher(by_rate: Mapping[float, Sequence[float]]) -> bool:
  """Whether PILOT_RATE's mean final success is strictly above RATE's (to 1e-9)."""
  low, high = (sum(by_rate[r]) / len(by_rate[r]) for r in (RATE, PILOT_RATE))
  return round(high, 9) > round(low, 9)


def pilot_dir(out: str, arm: str, rate: float, seed: int) -> str:
  return os.path.join(out, arm, rate_name(rate), f"seed{seed}")


run_dir = pilot_dir


def rate_decision(out: str) -> dict[str, object] | None:
  path = os.path.join(out, RATE_FILE)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def decide_rate(out: str, design: Design = FULL) -> float | None:
  """The chosen rate: <out>/RATE_FILE's, else, once every pilot run has finished, the rule's
  (written there with its inputs, once); None while the pilot runs."""
  found = rate_decision(out)
  if found is not None:
    return float(found["chosen"])
  finals: dict[str, dict[float, list[float]]] = {}
  for arm in PILOT_ARMS:
    for rate in (RATE, PILOT_RATE):
      got = [final_success(pilot_dir(out, arm, rate, s)) for s in design.pilot_seeds]
      if any(g is None for g in got):
        return None
      finals.setdefault(arm, {})[rate] = [g[0] for g in got]
  chosen = rate_rule(finals)
  record = {
    "chosen": chosen,
    "rule": f"{PILOT_RATE:g} for every arm if its mean final valid_seen success over seeds "
    f"{list(design.pilot_seeds)} is strictly higher than {RATE:g}'s for both "
    f"{' and '.join(PILOT_ARMS)}; else {RATE:g}",
    "pilot": {
      arm: {rate_name(r): {"final": v, "mean": sum(v) / len(v)} for r, v in by.items()}
      | {"higher_at_pilot_rate": _higher(by)}
      for arm, by in finals.items()
    },
    "recorded": datetime.datetime.now().isoformat(timespec="seconds"),  # after a restore: then
  }
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, RATE_FILE), "w") as f:
    json.dump(record, f, indent=1)
  return chosen


# ---------------------------------------------------------------------------- the steps
def arm_overrides(arm: str, vocab: str) -> tuple[str, ...]:
  own = ARMS[arm][1]
  return (*own, f"algo.context={vocab}") if arm == VOCAB_ARM else own


def train_overrides(design: Design, arm: str, rate: float, seed: int, vocab: str) -> list[str]:
  return [
    f"optim.lr={rate}",
    f"train.seed={seed}",
    f"run.arm={arm}",
    f"train.iterations={design.iterations}",
    f"train.eval_every={design.eval_every}",
    f"model.path={CONTEXT_POLICY}",
    "eval.streams=task",  # the validations' draws keyed by game and turn too
    *design.extra,
    *arm_overrides(arm, vocab),
  ]


def _command(module: str, algo: str, overrides: Sequence[str], python: str) -> tuple[str, ...]:
  return driver.command(module, algo, overrides, python, CONFIG)


def train_step(
  design: Design, out: str, arm: str, rate: float, seed: int, vocab: str, python: str
) -> Step:
  overrides = train_overrides(design, arm, rate, seed, vocab)
  cmd = _command("sdar_jax.train", ARMS[arm][0], overrides, python)
  return driver.train_step(Step, arm, rate, seed, run_dir(out, arm, rate, seed), cmd)


def heldout_step(
  design: Design, out: str, arm: str, rate: float, seed: int, vocab: str, python: str
) -> Step:
  workdir = run_dir(out, arm, rate, seed)
  overrides = [*train_overrides(design, arm, rate, seed, vocab), *design.heldout()]
  cmd = _command("sdar_jax.evaluate", ARMS[arm][0], overrides, python)
  return driver.evaluation_step(Step, "heldout", arm, rate, seed, workdir, cmd)


def initial_step(design: Design, out: str, python: str) -> Step:
  """The context policy (every arm's start) on the held-out panels."""
  own = [f"model.path={CONTEXT_POLICY}", *design.extra, *design.heldout()]
  cmd = _command("sdar_jax.evaluate", "grpo", own, python)
  workdir = os.path.join(out, "initial")
  return driver.evaluation_step(Step, "heldout", "initial", None, None, workdir, cmd)


def panels_step(out: str, python: str, smoke: bool = False) -> Step:
  """The long-budget stage's panels (generated there if missing) and its check, into <out>."""
  design = long_budget.SMOKE if smoke else long_budget.FULL
  return long_budget.panels_step(design, out, python, smoke)


def pilot_steps(design: Design, out: str, vocab: str, python: str) -> list[Step]:
  return [
    train_step(design, out, arm, rate, seed, vocab, python)
    for seed in design.pilot_seeds
    for arm in PILOT_ARMS
    for rate in (RATE, PILOT_RATE)
  ]


def plan(
  design: Design = FULL,
  out: str | None = None,
  python: str = sys.executable,
  smoke: bool = False,
  rate: float | None = None,
  vocab: str | None = None,
) -> list[Step]:
  """Every step known now, in order: the panels, the context policy's evaluation, the pilot, then
  (once the rate is decided: `decide_rate`, or `rate` given) seed-major at the chosen rate, each
  run followed by its held-out evaluation (a pilot run at that rate is not trained again)."""
  out = out or design.out
  vocab = vocab or planned_vocab_context(out)
  steps = [panels_step(out, python, smoke), initial_step(design, out, python)]
  steps += pilot_steps(design, out, vocab, python)
  rate = rate if rate is not None else decide_rate(out, design)
  if rate is None:
    return steps
  piloted = {s.workdir for s in steps}
  for seed in design.seeds:
    for arm in ARMS:
      if run_dir(out, arm, rate, seed) not in piloted:
        steps.append(train_step(design, out, arm, rate, seed, vocab, python))
      steps.append(heldout_step(design, out, arm, rate, seed, vocab, python))
  return steps


def total_steps(design: Design = FULL) -> int:
  """Steps once the rate is decided: panels, initial, pilot, the other runs, every evaluation."""
  runs = len(ARMS) * len(design.seeds)
  pilot = 2 * len(PILOT_ARMS) * len(design.pilot_seeds)
  return 2 + pilot + runs - pilot // 2 + runs


# ---------------------------------------------------------------------------- the cost plan
# Seconds per step at FULL from the powered stages' records (docs/results/runs.csv, nice 19 on 2
# shared cores, 2026-12-05): the median wall time of each arm's 16-iteration training runs (all
# arms: 287 s): grpo 229 s, sdar 297 s, sdar_vocab 281 s; sdpo never ran, taken as the slowest
# distilling arm's (agent_opsd, 310 s). A 640 + 640-game held-out evaluation: 5 x the 128 + 128
# median of ~99 s (the long-budget stage's estimate). Every figure x 1.3 (longer teacher prompts
# with a sibling's or the future's text, a shared machine).
TRAIN_SECONDS = {"grpo": 229.0, "sdar": 297.0, "sdar_vocab": 281.0, "sdpo": 310.0}
HELDOUT_SECONDS = long_budget.HELDOUT_SECONDS
PANELS_SECONDS = long_budget.PANELS_SECONDS  # in full if the long-budget stage has not made them
MARGIN = 1.3


def expected_seconds(step: Step, design: Design = FULL) -> float:
  """The cost plan's seconds for one step (scaled down for a smaller design)."""
  if step.kind == "panels":
    return MARGIN * PANELS_SECONDS * design.num_heldout / FULL.num_heldout
  if step.kind != "train":
    return MARGIN * HELDOUT_SECONDS * design.num_heldout / FULL.num_heldout
  return MARGIN * TRAIN_SECONDS[ARMS[step.arm][0]] * design.iterations / FULL.iterations


def cost_table(design: Design = FULL) -> list[tuple[str, int, float]]:
  """(step kind, how many, machine-hours each) of the whole plan (the rate decided)."""
  steps = plan(design, "/nonexistent", python="python", rate=RATE, vocab="sibling")
  return driver.cost_table(steps, lambda s: expected_seconds(s, design))


# ---------------------------------------------------------------------------- the power
# The variance components recorded for a held-out difference (docs/results.md, "Power": the
# `sdar_vocab` - `grpo` grid of final held-out seen success, 8 seeds x 128 games, read in both
# powered stages' reports): seed 0.00076, game x arm 0.1154, residual 0.2360. The issue quotes
# their square roots (standard deviations 0.028, 0.340, 0.486). The stage-2 row `sdar` - `grpo`
# (5 x 128) gives seed 0.00266, game 0.00237, residual 0.2239: printed beside it.
COMPONENTS = power.Components(seed=0.00076, game=0.1154, residual=0.2360)
SDAR_COMPONENTS = power.Components(seed=0.00266, game=0.00237, residual=0.2239)
EFFECT = 0.05
ALPHA = 0.05


def power_lines(design: Design = FULL) -> list[str]:
  """The primary comparison's power at the design's seeds x games, and the Holm family's."""
  seeds, games = len(design.seeds), design.num_heldout
  rows = len(family("sibling"))
  head = f"{PRIMARY[0]} - {PRIMARY[1]}, {PRIMARY_MEASURE}, alone at alpha = {ALPHA}"
  lines = [f"primary comparison: {head}, {seeds} seeds x {games} games"]
  for name, parts in (("recorded components", COMPONENTS), ("sdar - grpo's", SDAR_COMPONENTS)):
    se = parts.standard_error(seeds, games)
    lines.append(
      f"  {name} (seed {parts.seed:.5f}, game {parts.game:.4f}, residual {parts.residual:.4f}): "
      f"se {se:.4f}; detectable at 80% power {power.detectable(parts, seeds, games, ALPHA):.3f}; "
      f"power at +{EFFECT} {power.power_at(parts, seeds, games, EFFECT, ALPHA):.3f}; games "
      f"needed for +{EFFECT} at 80%: {power.games_needed(parts, seeds, EFFECT, ALPHA) or 'none suffice (the seed term alone is too large)'}"
    )
  strict = ALPHA / rows
  lines.append(
    f"Holm family: {rows} rows; its first step tests at {ALPHA}/{rows} = {strict:.4f}: "
    f"detectable at 80% power there {power.detectable(COMPONENTS, seeds, games, strict):.3f} "
    "(recorded components)"
  )
  return lines
