r"""The third stage, long budget (issue 60): its design, fixed in writing before any run, and the
plan of every step.

    mkdir -p runs/long_budget && nohup nice -n 19 .venv/bin/python -m experiments.long_budget \
        run --records=docs/results >> runs/long_budget/run.log 2>&1 &
    .venv/bin/python -m experiments.long_budget status   # steps done, hours spent and left
    .venv/bin/python -m experiments.long_budget plan     # every command, runs nothing
    .venv/bin/python -m experiments.long_budget report   # from the tables in docs/results

The design (docs/results.md, "The third stage: long budget", planned 2026-12-06):
* ARMS: `grpo`, `grpo_opsd` and `sdar` (the teacher shares the student's weights and reads the
  skills), each at the demo's config (configs/default.py) but 96 iterations, validating every 8
  on the 64 valid_seen games; `retire_opd` as its preset's two stages (stage 1 trains the
  skill-conditioned teacher, `skill_grpo`, for as many iterations as stage 2; stage 2 distils
  from it frozen and retires the term by the rule, fixed windows of W = 5), stage 2 at 96
  iterations validating every 4 (so the rule, which needs 2W = 10 iterations of its KL, can fire
  from iteration 12 on). One learning rate, 5e-4 (the demo's), no search; SEEDS 0, 1, 2.
* The measures per iteration (metrics.jsonl, then the tables): the teacher-student gap on the
  rollout's tokens (rollout/teacher_old_gap_mean) and its spread over tokens (the standard
  deviation sqrt(rms^2 - mean^2) from rollout/teacher_old_gap_rms), the KL from the initial
  policy (actor/kl_loss: k3 on the sampled response tokens against the warm-started policy; every
  arm has kl_coef 0.01), the policy's entropy (actor/entropy), the share of invalid actions
  (1 - episode/valid_action_ratio; and the share the room did not offer, 1 -
  episode/admissible_action_ratio), the gradient norm (train/grad_norm), valid_seen success.
* COLLAPSE (`collapsed`): a run collapses at the second of two consecutive validations whose
  valid_seen success is each at least 0.2 below the best success of the run's validations up to
  and including it (the validation before training counts).
* HELDOUT: every final policy and the warm-started one on `heldout_seen` and `heldout_unseen`,
  640 games each, generator seed 2 (the powered stages' panels: 128 games, seed 1), each
  episode's draws keyed by its game and turn (eval.streams=task: common random numbers). The PANELS
  step generates them first and checks that no PDDL problem (the problem text without its name)
  is shared with train, valid_seen, valid_unseen or the seed-1 panels, nor between the two new
  panels, with every number in the problem ignored (object numbers, scenes); it fails otherwise.
* Order: the panels, the warm-started policy's evaluation, then seed-major (seed 0 of every arm,
  then seed 1, ...), each run followed by its held-out evaluation, so 2 seeds of every arm finish
  before the third starts.
Each step runs under `nice -n 19`, resumable (a finished step is skipped, an interrupted training
resumes from its checkpoint, every 4 iterations); `run --records=<folder>` appends each finished
step to the tables there (experiment "long_budget", stage 3). `--smoke` plays the same plan at a
tiny budget (SMOKE) into another folder, to check the driver end to end.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence

from experiments import driver
from experiments.driver import NICE, rate_name

EXPERIMENT = "long_budget"
STAGE = 3  # the tables' stage column (the powered ablation's are 1 and 2)
CONFIG = "configs/default.py"
RATE = 5e-4
# arm -> (algo preset, extra overrides)
ARMS: dict[str, tuple[str, tuple[str, ...]]] = {
  "grpo": ("grpo", ()),
  "grpo_opsd": ("grpo_opsd", ()),
  "sdar": ("sdar", ()),
  "retire_opd": ("retire_opd", ()),
}
RETIRE_ARM = "retire_opd"


@dataclasses.dataclass(frozen=True)
class Design:
  """The budget of one version of the plan (FULL: the experiment; SMOKE: its end-to-end check)."""

  out: str  # the runs' default parent folder
  seeds: tuple[int, ...]
  iterations: int
  eval_every: int
  retire_eval_every: int
  num_heldout: int  # games per panel (one task type)
  heldout_seed: int
  extra: tuple[str, ...] = ()  # overrides of every training run and evaluation
  retire_extra: tuple[str, ...] = ()  # overrides of retire_opd's runs

  def heldout(self) -> tuple[str, ...]:
    return driver.heldout_overrides(self.num_heldout, self.heldout_seed)


FULL = Design(
  out="runs/long_budget",
  seeds=(0, 1, 2),
  iterations=96,
  eval_every=8,
  retire_eval_every=4,
  num_heldout=640,
  heldout_seed=2,
)
SMOKE = Design(
  out="runs/long_budget_smoke",
  seeds=(0,),
  iterations=4,
  eval_every=2,
  retire_eval_every=1,
  num_heldout=8,
  heldout_seed=2,
  extra=("checkpoint.every=2",),
  retire_extra=("algo.retire.window=1",),  # 2W = 2 iterations: the rule can fire at iteration 2
)
# the panels whose PDDL problems the new ones must not share: (num_heldout, heldout_seed)
EARLIER_PANELS = ((128, 1),)
PANELS_FILE = "panels.json"  # <out>/panels.json: the panels step's record (its done marker)


@dataclasses.dataclass(frozen=True)
class Step(driver.Step):
  """One process of the plan: the panels (results in <out>/panels), a training run or a held-out
  evaluation."""

  @property
  def label(self) -> str:
    if self.kind == "panels":
      return "panels (generate and check)"
    return super().label


def run_dir(out: str, arm: str, seed: int) -> str:
  return os.path.join(out, arm, rate_name(RATE), f"seed{seed}")


def train_overrides(design: Design, arm: str, seed: int) -> list[str]:
  every = design.retire_eval_every if arm == RETIRE_ARM else design.eval_every
  own = [*ARMS[arm][1], *(design.retire_extra if arm == RETIRE_ARM else ())]
  return [
    f"optim.lr={RATE}",
    f"train.seed={seed}",
    f"run.arm={arm}",
    f"train.iterations={design.iterations}",
    f"train.eval_every={every}",
    *design.extra,
    *own,
  ]


def _command(module: str, algo: str, overrides: Sequence[str], python: str) -> tuple[str, ...]:
  return driver.command(module, algo, overrides, python, CONFIG)


def train_step(design: Design, out: str, arm: str, seed: int, python: str) -> Step:
  cmd = _command("sdar_jax.train", ARMS[arm][0], train_overrides(design, arm, seed), python)
  return driver.train_step(Step, arm, RATE, seed, run_dir(out, arm, seed), cmd)


def heldout_step(design: Design, out: str, arm: str, seed: int, python: str) -> Step:
  """The final policy of a run on the held-out panels (its own settings, the panels')."""
  overrides = [*train_overrides(design, arm, seed), *design.heldout()]
  cmd = _command("sdar_jax.evaluate", ARMS[arm][0], overrides, python)
  return driver.evaluation_step(Step, "heldout", arm, RATE, seed, run_dir(out, arm, seed), cmd)


def initial_step(design: Design, out: str, python: str) -> Step:
  """The warm-started policy (every arm's start) on the held-out panels."""
  workdir = os.path.join(out, "initial")
  cmd = _command("sdar_jax.evaluate", "grpo", [*design.extra, *design.heldout()], python)
  return driver.evaluation_step(Step, "heldout", "initial", None, None, workdir, cmd)


def panels_step(design: Design, out: str, python: str, smoke: bool = False) -> Step:
  """Generates the held-out panels and checks them against every earlier game set."""
  cmd = (*NICE, python, "-m", "experiments.long_budget", "panels", f"--out={out}")
  return Step("panels", "panels", None, None, out, (*cmd, *(("--smoke",) if smoke else ())))


def plan(
  design: Design = FULL, out: str | None = None, python: str = sys.executable, smoke: bool = False
) -> list[Step]:
  """Every step in order (module doc): the panels, the initial policy, then seed-major."""
  out = out or design.out
  steps = [panels_step(design, out, python, smoke), initial_step(design, out, python)]
  for seed in design.seeds:
    for arm in ARMS:
      steps.append(train_step(design, out, arm, seed, python))
      steps.append(heldout_step(design, out, arm, seed, python))
  return steps


def step_done(step: Step) -> bool:
  if step.kind == "panels":
    return os.path.isfile(os.path.join(step.workdir, PANELS_FILE))
  return driver.step_done(step)


# ---------------------------------------------------------------------------- the cost plan
# Seconds per step kind at FULL, from the powered stages' records (docs/results/runs.csv and the
# metrics' perf/iteration_seconds, nice 19 on 2 shared cores, 2026-12-05): the median seconds per
# training iteration of each arm's 16-iteration runs, ~23 s per 64-game validation and ~20 s to
# start; a 128+128-game evaluation took a median of ~99 s, so 640+640 games ~5 x 99 s. RetireOPD
# adds its stage 1 (skill_grpo at GRPO's pace, the skills in the prompt: +15%) and validates every
# 4 in both stages, once more with the skills at the start. Every figure x 1.3: later iterations
# play longer episodes when a policy degrades, and the machine is shared.
SECONDS_PER_ITERATION = {"grpo": 10.0, "grpo_opsd": 13.6, "sdar": 14.1, "retire_opd": 13.7}
VALIDATION_SECONDS = 23.0
START_SECONDS = 20.0
HELDOUT_SECONDS = 5 * 99.0
PANELS_SECONDS = 1536 * 1.0  # ~1 s a planner-checked game under load, 1,280 new + 256 earlier
MARGIN = 1.3


def expected_seconds(step: Step, design: Design = FULL) -> float:
  """The cost plan's seconds for one step (scaled from FULL's budget when smaller)."""
  scale = design.num_heldout / FULL.num_heldout
  if step.kind == "panels":
    return MARGIN * PANELS_SECONDS * scale
  if step.kind != "train":
    return MARGIN * HELDOUT_SECONDS * scale
  n = design.iterations
  if step.arm == RETIRE_ARM:
    validations = n // design.retire_eval_every + 2  # + the teacher's with-skills validation
    stage1 = n * SECONDS_PER_ITERATION["grpo"] * 1.15 + validations * VALIDATION_SECONDS
    stage2 = n * SECONDS_PER_ITERATION[step.arm] + validations * VALIDATION_SECONDS
    return MARGIN * (2 * START_SECONDS + stage1 + stage2)
  validations = n // design.eval_every + 1
  per = SECONDS_PER_ITERATION[step.arm]
  return MARGIN * (START_SECONDS + n * per + validations * VALIDATION_SECONDS)


def cost_table(design: Design = FULL) -> list[tuple[str, int, float]]:
  """(step kind, how many, machine-hours each) of the plan, for docs and `status`."""
  steps = plan(design, python="python")
  return driver.cost_table(steps, lambda s: expected_seconds(s, design))
