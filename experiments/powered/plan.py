r"""The powered, paired ablation: its arms, stages and the plan of every step (training runs and
held-out evaluations), with the learning-rate rule fixed before any run.

    nohup nice -n 19 .venv/bin/python -m experiments.powered run [--stage 2] \
        --records=docs/results >> runs/powered/run.log 2>&1 &
    .venv/bin/python -m experiments.powered status [--stage 2]   # steps done, hours, rates
    .venv/bin/python -m experiments.powered plan [--stage 2]     # every command, runs nothing
    .venv/bin/python -m experiments.powered report [--stage 2]   # from the tables in docs/results

The design of both stages, fixed in writing before their runs, is in docs/results.md ("The
powered ablation, first stage" and "second stage"); what this module fixes in code:
* ARMS (stage 1) and STAGE2_ARMS: arm -> (algorithm preset, overrides). Every arm has the demo's
  budget (configs/default.py: 16 iterations x 2 tasks x 8 episodes, validation on the 64
  valid_seen games every 8 iterations); only the preset, the learning rate and the seed differ.
* The rate rule (`choose_rate`): each arm at RATES on SEARCH_SEEDS; the highest mean final
  valid_seen success, a tie the higher mean AUC, then DEFAULT_RATE. Then the stage's seeds at the
  chosen rate (the search seeds reused). `--adopt` takes rates an earlier search chose
  (stage1_rates.json: the first stage's, whose search runs were lost with their machine).
* HELDOUT: each final policy on `heldout_seen` and `heldout_unseen` (128 games each, generator
  seed 1; eval.seed 0 for every arm); stage 2 also with the skills in the student's prompt
  (WITH_SKILLS, every arm the same skills), and trains stage 1's `grpo` seed 0 again as a check
  that the reused runs' commit trains alike (COMMIT_CHECK).
Each step runs under `nice -n 19`, resumable (a finished step is skipped, an interrupted training
resumes from its checkpoint); its state is the run folders under --out. `run --records=<folder>`
appends every finished step's rows to the tables there (experiments.records), so a lost machine
loses no finished step: `restore --records=<folder>` writes their records back into --out, and a
restored run is trained again before an evaluation needs its weights.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence

import numpy as np

from experiments import driver
from experiments.driver import Step, rate_name, step_done
from sdar_jax.observe import collect

__all__ = ["Step", "rate_name", "step_done"]  # the drivers' shared base's, this plan's too

CONFIG = "configs/default.py"
# arm -> (algo preset, extra overrides)
ARMS: dict[str, tuple[str, tuple[str, ...]]] = {
  "grpo": ("grpo", ()),
  "sdar_vocab": ("sdar_vocab", ()),
  "sdar_vocab_noskills": ("sdar_vocab", ("env.skills.strategy=none",)),
}
# The second stage's own arms (arm -> (algo preset, extra overrides)); it reuses the first's.
STAGE2_ARMS: dict[str, tuple[str, tuple[str, ...]]] = {
  "sdar": ("sdar", ()),
  "grpo_opsd": ("grpo_opsd", ()),
  # β = 0: every vocabulary entry's gap gate σ(β·Δ_v) is exactly 0.5, so the term is half the
  # forward KL(teacher ‖ student) at each position, ungated (λ = 0.5 stays the preset's)
  "sdar_vocab_ungated": ("sdar_vocab", ("algo.beta=0.0",)),
  "sdar_topk": ("sdar_topk", ()),
  # the rule this arm ran (2026-12-05): one stage, the frozen warm-started policy as the teacher
  # (the skills in a block before its prompt), sliding windows; the preset has been RetireOPD's
  # two stages since 2026-12-07 (docs/reference.md §11.4)
  "retire_opd": (
    "retire_opd",
    (
      "algo.teacher_weights=initial",
      "algo.teacher_context=block",
      "algo.teacher_stage.preset=",
      "algo.retire.windows=sliding",
    ),
  ),
  # the rule this arm ran (2026-12-05) was named `agent_opsd` then and `agent_opsd_rms` since
  # 2026-12-06 (the published AgentOPSD took the name; docs/reference.md §11.1)
  "agent_opsd": ("agent_opsd_rms", ()),  # its preset keeps algo.teacher_source="rollout"
}
ALL_ARMS = {**ARMS, **STAGE2_ARMS}
RATES = (2.5e-4, 5e-4, 1e-3)
DEFAULT_RATE = 5e-4
SEARCH_SEEDS = (0, 1)
SEEDS = tuple(range(8))
HELDOUT = (
  "eval.split=heldout_seen",
  "eval.splits=heldout_unseen",
  "eval.num_tasks=-1",
  "env.offline.num_heldout=128",
  "env.offline.heldout_seed=1",
)
HELDOUT_DIR = "heldout"  # <run>/heldout: the evaluation's results
# The with-skills evaluation (stage 2): the same panels with the skills in the student's prompt,
# into <run>/heldout_skills; the metric prefixes stay those of HELDOUT (eval.skills "with" has one
# mode, "val"), so its files are outcomes_val.csv and outcomes_val_heldout_unseen.csv too.
WITH_SKILLS = "eval.skills=with"
SKILLS_DIR = "heldout_skills"
# a step's results folder below its run: the step's kind (driver.Step.results)
RESULTS_DIRS = {"heldout": HELDOUT_DIR, "heldout_skills": SKILLS_DIR}


@dataclasses.dataclass(frozen=True)
class Stage:
  """What one stage plans and reports (STAGES: the first and the second)."""

  number: int
  title: str
  arms: tuple[str, ...]  # trained by the stage: the rate search, then every seed
  seeds: tuple[int, ...]  # at the chosen rate (the search seeds among them are reused)
  comparisons: tuple[tuple[str, str], ...]  # A - B, paired; the report's Holm family
  dest: str  # the report's default folder
  rates_file: str | None = "chosen_rates.json"  # in --out; None: written by no one
  reused: tuple[str, ...] = ()  # an earlier stage's arms: read at their chosen rate, never trained
  skills: bool = False  # also evaluate every final policy with the skills at test time

  @property
  def flag(self) -> str:
    return "" if self.number == 1 else f" --stage {self.number}"

  @property
  def total(self) -> int:
    """Steps once every rate is chosen (each trained arm: the search, the other seeds, one or two
    held-out evaluations a seed; each reused arm: its with-skills evaluations; the initial policy)."""
    return self.total_with(())

  def total_with(self, adopted: Sequence[str]) -> int:
    """`total` when the `adopted` arms skip the search (their rate adopted from an earlier one):
    such an arm trains its search seeds at the adopted rate instead of every rate."""
    evaluations = 2 if self.skills else 1
    trained = len(RATES) * len(SEARCH_SEEDS) + len(self.seeds) * (1 + evaluations)
    reused = len(self.reused) * len(self.seeds) if self.skills else 0
    check = 1 if "grpo" in self.reused else 0  # the commit check
    skipped = (len(RATES) - 1) * len(SEARCH_SEEDS) * len(set(adopted) & set(self.arms))
    return len(self.arms) * (trained - len(SEARCH_SEEDS)) + reused + check + 1 - skipped


# The comparisons each stage reports (A - B; the first of stage 1 is its primary comparison)
COMPARISONS = (
  ("sdar_vocab", "grpo"),
  ("sdar_vocab_noskills", "grpo"),
  ("sdar_vocab", "sdar_vocab_noskills"),
)
# Stage 2: every arm against GRPO, then the gate on either form (gated - ungated, β = 5 vs 0)
STAGE2_COMPARISONS = (
  *((arm, "grpo") for arm in ("sdar_vocab", "sdar_vocab_noskills", *STAGE2_ARMS)),
  ("sdar", "grpo_opsd"),
  ("sdar_vocab", "sdar_vocab_ungated"),
)
STAGES = {
  1: Stage(1, "first stage", tuple(ARMS), SEEDS, COMPARISONS, "docs/results/powered"),
  2: Stage(
    2,
    "second stage",
    tuple(STAGE2_ARMS),
    tuple(range(5)),
    STAGE2_COMPARISONS,
    "docs/results/powered_stage2",
    rates_file="chosen_rates_stage2.json",
    reused=tuple(ARMS),
    skills=True,
  ),
}


def run_dir(out: str, arm: str, rate: float, seed: int) -> str:
  return os.path.join(out, arm, rate_name(rate), f"seed{seed}")


def _overrides(arm: str, rate: float, seed: int) -> list[str]:
  _, extra = ALL_ARMS[arm]
  return [f"optim.lr={rate}", f"train.seed={seed}", f"run.arm={arm}", *extra]


def _command(module: str, arm: str, overrides: Sequence[str], python: str) -> tuple[str, ...]:
  algo = ALL_ARMS[arm][0] if arm in ALL_ARMS else "grpo"
  return driver.command(module, algo, overrides, python, CONFIG)


def train_step(out: str, arm: str, rate: float, seed: int, python: str) -> Step:
  cmd = _command("sdar_jax.train", arm, _overrides(arm, rate, seed), python)
  return driver.train_step(Step, arm, rate, seed, run_dir(out, arm, rate, seed), cmd)


COMMIT_CHECK = "commit_check"  # <out>/commit_check/grpo/<rate>/seed0: stage 1's grpo seed 0 again


def commit_check_dir(out: str, rate: float) -> str:
  return run_dir(os.path.join(out, COMMIT_CHECK), "grpo", rate, 0)


def commit_check_step(out: str, rate: float, python: str) -> Step:
  """Stage 1's `grpo` run of seed 0 at its chosen rate, trained again by the commit that trains a
  later stage: the reused runs come from an earlier commit, and this run shows whether the two
  commits train alike (the report compares the two runs' valid_seen outcomes game by game)."""
  cmd = _command("sdar_jax.train", "grpo", _overrides("grpo", rate, 0), python)
  return driver.train_step(Step, "grpo_commit_check", rate, 0, commit_check_dir(out, rate), cmd)


def _heldout(skills: bool) -> tuple[str, tuple[str, ...]]:
  """(step kind, the evaluation's overrides) without or with the skills at test time."""
  return ("heldout_skills", (*HELDOUT, WITH_SKILLS)) if skills else ("heldout", HELDOUT)


def heldout_step(
  out: str, arm: str, rate: float, seed: int, python: str, skills: bool = False
) -> Step:
  """The final policy of a run on the held-out panels; `skills`: with the skills in the student's
  prompt (every arm the same skills: an arm's own env.skills overrides, e.g. the no-skills
  control's strategy=none, are left out, so its policy is tested with the skills too)."""
  kind, held = _heldout(skills)
  own = [kv for kv in _overrides(arm, rate, seed) if not (skills and kv.startswith("env.skills."))]
  cmd = _command("sdar_jax.evaluate", arm, [*own, *held], python)
  return driver.evaluation_step(Step, kind, arm, rate, seed, run_dir(out, arm, rate, seed), cmd)


def initial_step(out: str, python: str, skills: bool = False) -> Step:
  """The warm-started policy (every arm's start) on the held-out panels."""
  kind, held = _heldout(skills)
  cmd = _command("sdar_jax.evaluate", "initial", held, python)
  return driver.evaluation_step(
    Step, kind, "initial", None, None, os.path.join(out, "initial"), cmd
  )


def final_success(run: str) -> tuple[float, float] | None:
  """(final valid_seen success, AUC of the valid_seen curve) of a finished run, else None. Read
  from its metrics alone: a run restored from the tables on a fresh machine has no config.json."""
  if collect.run_state(run) != "finished":
    return None
  rows = collect.read_metrics(os.path.join(run, "metrics.jsonl"))
  record = collect.RunRecord(path=run, name=run, config={}, rows=rows)  # the curve needs no config
  if not record.curve():
    return None
  return float(record.final_success), float(record.auc)


def choose_rate(results: dict[float, list[tuple[float, float]]]) -> float:
  """The rule fixed before any run: the highest mean final valid_seen success over the search
  seeds; a tie, the higher mean AUC; then the demo's rate. `results`: rate -> [(final, auc)]."""

  def key(rate: float) -> tuple[float, float, bool]:
    rows = np.asarray(results[rate], np.float64)
    return (
      round(float(rows[:, 0].mean()), 9),
      round(float(rows[:, 1].mean()), 9),
      rate == DEFAULT_RATE,
    )

  return max(sorted(results), key=key)


ADOPTED = "adopted_rates.json"  # <out>/adopted_rates.json: rates an earlier search chose


def read_adopted(path: str) -> dict[str, dict[str, object]]:
  """An adopted-rates file: {arm: {"chosen": rate, "source": where the search ran, "search":
  {rate name: {"final": [...]}}}}. Raises ValueError naming what is wrong."""
  with open(path) as f:
    record = json.load(f)
  if not isinstance(record, dict) or not record:
    raise ValueError(f"{path}: expected a JSON object arm -> {{'chosen': rate, 'source': ...}}")
  for arm, entry in record.items():
    if arm not in ALL_ARMS:
      raise ValueError(f"{path}: unknown arm {arm!r}; the arms are {sorted(ALL_ARMS)}")
    if not isinstance(entry, dict) or entry.get("chosen") not in RATES or not entry.get("source"):
      raise ValueError(
        f"{path}: arm {arm!r} needs 'chosen' (one of {list(RATES)}) and 'source' (the commit and "
        f"record of the search that chose it); it has {entry!r}"
      )
  return record


def adopted_rates(out: str) -> dict[str, float]:
  """arm -> rate for the arms whose rate was adopted from an earlier search (<out>/ADOPTED): their
  search is not run again; their search seeds train at that rate like the other seeds."""
  path = os.path.join(out, ADOPTED)
  if not os.path.isfile(path):
    return {}
  return {arm: float(e["chosen"]) for arm, e in read_adopted(path).items()}


def adopt(out: str, path: str) -> dict[str, float]:
  """Copies an adopted-rates file into `out` (see `adopted_rates`); refuses to change one already
  there, or to adopt a rate for an arm that has search runs in `out` (its own search decides)."""
  record = read_adopted(path)
  target = os.path.join(out, ADOPTED)
  if os.path.isfile(target):
    if read_adopted(target) != record:
      raise ValueError(
        f"{target} already adopts other rates than {path}; a stage's rates never change under "
        "it. Fix: pass the same file, or use a new --out."
      )
    return adopted_rates(out)
  for arm, entry in record.items():
    searched = [
      run_dir(out, arm, r, s)
      for r in RATES
      for s in SEARCH_SEEDS
      if r != entry["chosen"] and collect.run_state(run_dir(out, arm, r, s)) != "new"
    ]
    if searched:
      raise ValueError(
        f"{out} already holds search runs of {arm!r} ({searched[0]} ...): its own search "
        "decides its rate. Fix: adopt rates only into a fresh --out."
      )
  os.makedirs(out, exist_ok=True)
  with open(target, "w") as f:
    json.dump(record, f, indent=1)
  return adopted_rates(out)


def chosen_rates(
  out: str, arms: Sequence[str] = tuple(ARMS), record_file: str | None = "chosen_rates.json"
) -> dict[str, float]:
  """Each arm whose search runs all finished -> its chosen rate (also written to
  <out>/<record_file> with the figures that chose it; None writes nothing). An arm whose rate was
  adopted (<out>/ADOPTED) gets that rate, and its record says where it came from."""
  chosen, record = {}, {}
  adopted = read_adopted(os.path.join(out, ADOPTED)) if adopted_rates(out) else {}
  for arm in arms:
    if arm in adopted:
      chosen[arm] = float(adopted[arm]["chosen"])
      record[arm] = {"adopted": True, **adopted[arm]}
      continue
    results = {}
    for rate in RATES:
      finals = [final_success(run_dir(out, arm, rate, s)) for s in SEARCH_SEEDS]
      if any(f is None for f in finals):
        break
      results[rate] = finals
    else:
      chosen[arm] = choose_rate(results)
      record[arm] = {
        "chosen": chosen[arm],
        "search": {
          rate_name(r): {"final": [f for f, _ in v], "auc": [a for _, a in v]}
          for r, v in results.items()
        },
      }
  if record and record_file:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, record_file), "w") as f:
      json.dump(record, f, indent=1)
  return chosen


def plan(
  out: str, python: str = sys.executable, arms: Sequence[str] | None = None, stage: int = 1
) -> list[Step]:
  """Every step in order, as far as it is known now: the search (arm-major: every rate and search
  seed of an arm), the initial policy's held-out evaluation, then seed by seed every arm whose
  rate is chosen (so the arms stay paired as the seeds complete), each run followed by its
  held-out evaluation. Call again after steps finish: a chosen rate adds its steps.

  Stage 2 also evaluates each of its runs with the skills at test time (after the held-out
  evaluation), the initial policy with them (instead of without: stage 1 did that), and, seed by
  seed before its own arms, every reused stage-1 arm's run at its chosen rate once that run's
  training finished (stage 2 never trains or plans a stage-1 run)."""
  return _plan(out, python, STAGES[stage], arms)


def _plan(out: str, python: str, st: Stage, arms: Sequence[str] | None = None) -> list[Step]:
  arms = tuple(st.arms if arms is None else arms)
  adopted = adopted_rates(out)
  steps = [
    train_step(out, a, r, s, python)
    for a in arms
    if a not in adopted
    for r in RATES
    for s in SEARCH_SEEDS
  ]
  steps.append(initial_step(out, python, skills=st.skills))
  chosen = chosen_rates(out, (*st.reused, *arms), st.rates_file)
  if "grpo" in st.reused and "grpo" in chosen:
    steps.append(commit_check_step(out, chosen["grpo"], python))
  for seed in st.seeds:
    for arm in st.reused:
      if arm in chosen and collect.run_state(run_dir(out, arm, chosen[arm], seed)) == "finished":
        steps.append(heldout_step(out, arm, chosen[arm], seed, python, skills=True))
    for arm in arms:
      if arm in chosen:
        rate = chosen[arm]
        if seed not in SEARCH_SEEDS or arm in adopted:
          steps.append(train_step(out, arm, rate, seed, python))
        steps.append(heldout_step(out, arm, rate, seed, python))
        if st.skills:
          steps.append(heldout_step(out, arm, rate, seed, python, skills=True))
  return steps


def steps_left(out: str, stage: int) -> int:
  """How many of the stage's steps are not done, those not planned yet included (its total less
  the done ones); writes no chosen-rates file."""
  st = dataclasses.replace(STAGES[stage], rates_file=None)
  total = st.total_with(tuple(adopted_rates(out)))
  return total - sum(step_done(s) for s in _plan(out, sys.executable, st))
