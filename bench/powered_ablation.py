r"""The powered, paired ablation (first stage): GRPO against our vocabulary form and its no-skills
control, on the demo's work, 8 seeds an arm, each arm at the learning rate its own search chose,
the final policies measured on two held-out panels.

    nohup .venv/bin/python bench/powered_ablation.py run > runs/powered/run.log 2>&1 &
    .venv/bin/python bench/powered_ablation.py status      # how far it got, what it cost
    .venv/bin/python bench/powered_ablation.py snapshot --snapshot=docs/results/powered_state
    .venv/bin/python bench/powered_ablation.py plan        # every command, in order, run nothing
    .venv/bin/python bench/powered_ablation.py report      # docs/results/powered/: tables, CSVs

Fixed before any run (docs/results.md states the same):
* Arms: `grpo`, `sdar_vocab` (ours: the gated forward KL from the frozen warm-started teacher
  given the skills) and `sdar_vocab_noskills` (the same with `env.skills.strategy=none`: the
  teacher sees no skills, so only the pull toward the frozen policy is left).
* Budget: the demo's (configs/default.py: 16 iterations x 2 tasks x 8 episodes, validation on the
  64 valid_seen games every 8 iterations), the same for every arm; only the algorithm, the
  learning rate and the seed differ.
* Learning rate: each arm trains at 2.5e-4, 5e-4 and 1e-3 on seeds 0 and 1; the rate with the
  highest mean final valid_seen success over those two seeds is chosen (a tie: the higher mean
  area under the valid_seen curve, then the demo's 5e-4). Only valid_seen decides. Seeds 2-7 then
  run at the chosen rate; seeds 0 and 1 at that rate are reused.
* Held-out panels: each final policy of the chosen rate (seeds 0-7) is evaluated by
  `python -m sdar_jax.evaluate` on `heldout_seen` (128 fresh games of the valid_seen distribution,
  generator seed 1) and `heldout_unseen` (128 games in scenes no train game uses, seed 1), with
  the same sampling keys for every arm (eval.seed 0); so is the warm-started policy, once.
* Primary comparison: final held-out success of `sdar_vocab` against `grpo`, paired over seeds and
  games. Secondary: `sdar_vocab_noskills` against `grpo` and against `sdar_vocab`.

The report (`report`): per arm, the final held-out success on both panels and the area under the
valid_seen curve (mean and sample standard deviation over seeds), the warm-started policy's
held-out success, and each comparison's paired difference (over the seeds both arms finished and
the games of the panel) with its interval from the two-way bootstrap of sdar_jax.observe.stats;
the intervals are Holm-corrected across every comparison shown (each drawn at Holm's step-down
level for the rank of its bootstrap p-value). Written to --dest (default docs/results/powered):
report.md, summary.csv, curves.png and each run's per-game outcome CSVs, config and metrics; it
refuses to replace a report holding more finished seeds unless --overwrite.

How it runs: one process after another, each under `nice -n 19` (the lowest CPU priority: it
yields to anything else on the machine); resumable at any point, per arm, rate and seed (a
finished run or evaluation is skipped, an interrupted training resumes from its checkpoint).
Stop it before a test run (`kill <pid>`: the running step stops with it). Its state is the run
folders under --out (default runs/powered) and <out>/chosen_rates.json.

A machine can be lost with everything on it that git does not hold. `run --snapshot=<folder>`
copies the records of every finished step (no weights: SNAPSHOT_SKIPS) there after each step, a
folder to commit; on a fresh machine `restore --snapshot=<folder>` puts them back into --out and
`run` goes on. A restored run has no weights: before its held-out evaluation, `run` trains it again
(training is deterministic on one machine and commit) and logs whether the valid_seen outcomes
agree with the kept records.

`run --adopt=<file>` takes rates an earlier search chose (arm -> chosen rate, the search's source
and figures; bench/powered_stage1_rates.json holds the first stage's, from runs trained by
1f3ba72 and lost with their machine): those arms skip the search and train all 8 seeds, the
search seeds included, at that rate (49 steps for the stage instead of 61).

The second stage (`--stage 2` to run, status, plan and report; the default, 1, is the above). It
runs after the first has finished, on the same --out, so it finds the first stage's runs there
(`run --stage 2` refuses to start while the first has steps left, unless --before-stage-1-ends):

    nohup .venv/bin/python bench/powered_ablation.py run --stage 2 >> runs/powered/run2.log 2>&1 &
    .venv/bin/python bench/powered_ablation.py report --stage 2   # docs/results/powered_stage2/

Fixed before any of its runs (docs/results.md states the same):
* Arms: `sdar` (the reference form: the gap gate on the sampled token, the teacher the current
  policy given the skills), `grpo_opsd` (the same with β = 0: every gate exactly 0.5),
  `sdar_vocab_ungated` (`sdar_vocab` with `algo.beta=0.0`: every vocabulary entry's gate
  σ(β·Δ_v) is 0.5, so the term is half the forward KL from the frozen teacher, ungated, at the
  preset's λ = 0.5), `sdar_topk`, `retire_opd` and `agent_opsd` (its preset already reads the
  teacher from the rollout, algo.teacher_source="rollout"). The first stage's `grpo`,
  `sdar_vocab` and `sdar_vocab_noskills` are reused at their chosen rates, never trained again.
* Budget, learning rates, rule, search seeds and panels: the first stage's; then seeds 2-4 at the
  chosen rate (5 seeds an arm, 0-4; the reused arms' seeds 0-4 too). Its chosen rates go to
  <out>/chosen_rates_stage2.json (the first stage's file is left to the first stage).
* Skill internalisation: each final policy of seeds 0-4 of every arm (the reused ones included)
  and the warm-started policy are evaluated again on both panels with the skills in the
  student's prompt (`eval.skills=with`, into <run>/heldout_skills; that mode keeps the metric
  prefixes, so the files are outcomes_val.csv and outcomes_val_heldout_unseen.csv again). Every
  arm gets the same skills: an arm's own env.skills overrides (the no-skills control's
  strategy=none) are left out of this evaluation.
* Measures: the first stage's per arm; the paired difference against `grpo` of every arm, and of
  the gate on either form (`sdar` - `grpo_opsd`, `sdar_vocab` - `sdar_vocab_ungated`), on each
  measure, Holm-corrected together; with minus without the skills per arm and panel, paired over
  seeds and games, Holm-corrected as a family of its own; the training dynamics of `sdar`,
  `grpo_opsd`, `sdar_vocab` and `sdar_vocab_ungated` (sdar/teacher_gap_mean,
  sdar/positive_gap_share, sdar/gate_active_ratio per iteration: mean, min and max over seeds);
  each `retire_opd` seed's retire/retired_at (or "not retired").
* Commit check: the reused runs were trained by an earlier commit, so once `grpo`'s rate is
  known its seed-0 run is trained once more by this stage's commit (<out>/commit_check/); the
  report says whether its valid_seen outcomes equal the reused run's, game by game.
* 131 steps: 36 search runs, 18 more training runs, 30 held-out and 30 with-skills evaluations of
  its own runs, 15 with-skills evaluations of the reused runs, the commit check, and the
  warm-started policy's.
The report (`report --stage 2`, default --dest docs/results/powered_stage2) adds paired.csv,
internalisation.csv, dynamics.csv / dynamics.png and retirement.csv to the first stage's files.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

import numpy as np  # noqa: E402

from sdar_jax.observe import collect, compare, stats, transcripts  # noqa: E402
from sdar_jax.run import evaluation  # noqa: E402
from sdar_jax.run.workdir_lock import LOCK_NAME  # noqa: E402

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
  "retire_opd": ("retire_opd", ()),
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
RESULTS_DIRS = {"heldout": HELDOUT_DIR, "heldout_skills": SKILLS_DIR}
NICE = ("nice", "-n", "19")


def rate_name(rate: float) -> str:
  return f"lr{rate:.1e}"


@dataclasses.dataclass(frozen=True)
class Step:
  """One process of the plan: a training run or a held-out evaluation."""

  kind: str  # "train" | "heldout" | "heldout_skills"
  arm: str
  rate: float | None
  seed: int | None
  workdir: str  # the run folder (for "heldout", the run evaluated)
  command: tuple[str, ...]

  @property
  def label(self) -> str:
    what = "initial policy" if self.arm == "initial" else f"{self.arm} {rate_name(self.rate)}"
    seed = "" if self.seed is None else f" seed {self.seed}"
    return f"{self.kind} {what}{seed}"

  @property
  def results(self) -> str:
    """Where the step's results go (its done marker lives there)."""
    if self.kind == "train":
      return self.workdir
    return os.path.join(self.workdir, RESULTS_DIRS[self.kind])


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


def run_dir(out: str, arm: str, rate: float, seed: int) -> str:
  return os.path.join(out, arm, rate_name(rate), f"seed{seed}")


def _overrides(arm: str, rate: float, seed: int) -> list[str]:
  _, extra = ALL_ARMS[arm]
  return [f"optim.lr={rate}", f"train.seed={seed}", *extra]


def _command(module: str, arm: str, overrides: Sequence[str], python: str) -> tuple[str, ...]:
  algo = ALL_ARMS[arm][0] if arm in ALL_ARMS else "grpo"
  return (
    *NICE,
    python,
    "-m",
    module,
    f"--config={CONFIG}:algo={algo}",
    *(f"--config.{kv}" for kv in overrides),
  )


def train_step(out: str, arm: str, rate: float, seed: int, python: str) -> Step:
  workdir = run_dir(out, arm, rate, seed)
  cmd = _command("sdar_jax.train", arm, _overrides(arm, rate, seed), python)
  return Step("train", arm, rate, seed, workdir, (*cmd, f"--workdir={workdir}"))


COMMIT_CHECK = "commit_check"  # <out>/commit_check/grpo/<rate>/seed0: stage 1's grpo seed 0 again


def commit_check_dir(out: str, rate: float) -> str:
  return run_dir(os.path.join(out, COMMIT_CHECK), "grpo", rate, 0)


def commit_check_step(out: str, rate: float, python: str) -> Step:
  """Stage 1's `grpo` run of seed 0 at its chosen rate, trained again by the commit that trains a
  later stage: the reused runs come from an earlier commit, and this run shows whether the two
  commits train alike (the report compares the two runs' valid_seen outcomes game by game)."""
  workdir = commit_check_dir(out, rate)
  cmd = _command("sdar_jax.train", "grpo", _overrides("grpo", rate, 0), python)
  return Step("train", "grpo_commit_check", rate, 0, workdir, (*cmd, f"--workdir={workdir}"))


def commit_check(out: str) -> dict[str, object] | None:
  """The commit check's comparison once both runs finished: the valid_seen evaluations both
  logged, the games compared and how many outcomes differ, each run's final success."""
  rate = chosen_rates(out, ("grpo",), None).get("grpo")
  if rate is None:
    return None
  first, again = run_dir(out, "grpo", rate, 0), commit_check_dir(out, rate)
  if collect.run_state(first) != "finished" or collect.run_state(again) != "finished":
    return None
  a, b = compare.eval_outcomes(first), compare.eval_outcomes(again)
  steps = sorted(set(a) & set(b))
  pairs = [(a[s][g], b[s][g]) for s in steps for g in sorted(set(a[s]) & set(b[s]))]
  return {
    "rate": rate,
    "evaluations": len(steps),
    "outcomes": len(pairs),
    "differ": sum(x != y for x, y in pairs),
    "final_first": collect.read_run(first).final_success,
    "final_again": collect.read_run(again).final_success,
  }


def _heldout(skills: bool) -> tuple[str, tuple[str, ...]]:
  """(step kind, the evaluation's overrides) without or with the skills at test time."""
  return ("heldout_skills", (*HELDOUT, WITH_SKILLS)) if skills else ("heldout", HELDOUT)


def heldout_step(
  out: str, arm: str, rate: float, seed: int, python: str, skills: bool = False
) -> Step:
  """The final policy of a run on the held-out panels; `skills`: with the skills in the student's
  prompt (every arm the same skills: an arm's own env.skills overrides, e.g. the no-skills
  control's strategy=none, are left out, so its policy is tested with the skills too)."""
  workdir = run_dir(out, arm, rate, seed)
  kind, held = _heldout(skills)
  own = [kv for kv in _overrides(arm, rate, seed) if not (skills and kv.startswith("env.skills."))]
  cmd = _command("sdar_jax.evaluate", arm, [*own, *held], python)
  results = os.path.join(workdir, RESULTS_DIRS[kind])
  return Step(kind, arm, rate, seed, workdir, (*cmd, f"--workdir={workdir}", f"--output={results}"))


def initial_step(out: str, python: str, skills: bool = False) -> Step:
  """The warm-started policy (every arm's start) on the held-out panels."""
  workdir = os.path.join(out, "initial")
  kind, held = _heldout(skills)
  cmd = _command("sdar_jax.evaluate", "initial", held, python)
  return Step(
    kind,
    "initial",
    None,
    None,
    workdir,
    (*cmd, f"--workdir={workdir}", f"--output={os.path.join(workdir, RESULTS_DIRS[kind])}"),
  )


def final_success(run: str) -> tuple[float, float] | None:
  """(final valid_seen success, AUC of the valid_seen curve) of a finished run, else None."""
  if collect.run_state(run) != "finished":
    return None
  record = collect.read_run(run)
  if record.final_success is None:
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


def evaluated(folder: str) -> bool:
  """Whether an evaluation finished into `folder` (a killed one's step is still to do)."""
  return evaluation.eval_finished(folder)


def step_done(step: Step) -> bool:
  if step.kind == "train":
    return collect.run_state(step.workdir) == "finished"
  return evaluated(step.results)


def has_final_checkpoint(run: str) -> bool:
  """Whether a finished run still holds the checkpoint of its last step (an evaluation reads the
  final policy from it; without one it would evaluate the warm-started weights instead)."""
  from sdar_jax.run.checkpoint import CheckpointManager

  folder = os.path.join(run, "checkpoints")
  total = (
    collect.read_run(run).total_steps if os.path.isfile(os.path.join(run, "config.json")) else None
  )
  if total is None or not os.path.isdir(folder):
    return False
  with CheckpointManager(folder, read_only=True) as ckpt:
    return total in ckpt.all_steps()


# What a snapshot leaves out: the weights, checkpoints and the final export alike (a cache: a run
# trains again, on one machine and commit to the same figures); the bulky views no figure of the
# report reads (episode transcripts, pictures, token views, the gap histograms, TensorBoard
# events: about 1 MB an evaluation, 25 times its figures); and a workdir's lock (LOCK_NAME: its
# holder is a process of the machine that wrote it; restore skips it too)
SNAPSHOT_SKIPS = ("checkpoints", "warm_start_policy", "hf_export", "diagnostics")
SNAPSHOT_SKIP_FILES = ("episodes_*.jsonl", "*.png", "*.html", "events.out.tfevents.*")

SNAPSHOT_MAX_BYTES = 4 << 20  # a bigger file stays out of a snapshot (none of the records is)


def _unfinished(folder: str) -> bool:
  """A training run or a held-out evaluation that has not finished (in flight or killed)."""
  if os.path.isfile(os.path.join(folder, evaluation.EVAL_RECORD)):
    return not evaluated(folder)
  if os.path.isfile(os.path.join(folder, collect.RUN_STATUS)) or collect.is_run_dir(folder):
    return collect.run_state(folder) != "finished"
  return False


def snapshot(out: str, dest: str) -> tuple[int, list[str]]:
  """Copies every record under `out` (run status, configs, metrics, logs, evaluations, per-game
  outcomes, chosen rates) of the finished steps into `dest`, the weights and bulky views left out
  (SNAPSHOT_SKIPS, SNAPSHOT_SKIP_FILES),
  so a fresh machine restores the experiment's state from it (`restore`). Returns (files written, files left out
  for size). A file already in `dest` with the same bytes is not written again."""
  import filecmp
  import fnmatch
  import shutil

  written, big = 0, []
  for folder, dirnames, files in os.walk(out):
    if _unfinished(folder):
      dirnames[:] = []  # a run or evaluation in flight (or killed): played again after a restore
      continue
    dirnames[:] = sorted(d for d in dirnames if d not in SNAPSHOT_SKIPS)
    for name in sorted(set(files) - {LOCK_NAME}):
      if any(fnmatch.fnmatch(name, pattern) for pattern in SNAPSHOT_SKIP_FILES):
        continue
      src = os.path.join(folder, name)
      target = os.path.join(dest, os.path.relpath(src, out))
      if os.path.getsize(src) > SNAPSHOT_MAX_BYTES:
        big.append(src)
        continue
      if os.path.isfile(target) and filecmp.cmp(src, target, shallow=False):
        continue
      os.makedirs(os.path.dirname(target), exist_ok=True)
      shutil.copyfile(src, target)
      written += 1
  return written, big


def restore(snapshot_dir: str, out: str) -> int:
  """Copies a snapshot's files into `out` where `out` lacks them (it never replaces a file);
  returns how many. A restored finished run has no weights: before an evaluation of it, `run`
  trains it again (see `retrain_lost`)."""
  import shutil

  copied = 0
  for folder, dirnames, files in os.walk(snapshot_dir):
    dirnames.sort()
    for name in sorted(set(files) - {LOCK_NAME}):
      src = os.path.join(folder, name)
      target = os.path.join(out, os.path.relpath(src, snapshot_dir))
      if not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(src, target)
        copied += 1
  return copied


def retrain_lost(step: Step, out: str, python: str) -> tuple[Step, str]:
  """An evaluation whose finished run lost its weights (restored from a snapshot): the run's
  folder moves aside to <run>.restored[-N] and the returned train step trains it again into its
  own folder. Returns (that step, the folder aside); `after_retrain` then brings back the
  evaluations that had finished and compares the two trainings."""
  aside, n = f"{step.workdir}.restored", 1
  while os.path.exists(aside):
    n += 1
    aside = f"{step.workdir}.restored-{n}"
  os.rename(step.workdir, aside)
  arm = "grpo" if step.arm == "grpo_commit_check" else step.arm
  return train_step(out, arm, step.rate, step.seed, python), aside


def after_retrain(run: str, aside: str) -> str:
  """Moves the finished evaluations of the folder aside back into the retrained run and says
  whether the two trainings' valid_seen outcomes agree game by game."""
  import shutil

  for name in RESULTS_DIRS.values():
    src, dst = os.path.join(aside, name), os.path.join(run, name)
    if evaluated(src) and not os.path.exists(dst):
      shutil.copytree(src, dst)
  a, b = compare.eval_outcomes(aside), compare.eval_outcomes(run)
  pairs = [
    (a[s][g], b[s][g]) for s in sorted(set(a) & set(b)) for g in sorted(set(a[s]) & set(b[s]))
  ]
  differ = sum(x != y for x, y in pairs)
  return (
    f"retrained {run}: {differ} of {len(pairs)} valid_seen outcomes differ from the records "
    f"kept in {aside}"
  )


def _clock(seconds: float) -> str:
  seconds = round(seconds)
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def run(
  out: str,
  python: str = sys.executable,
  runner: Callable[..., object] | None = None,
  echo: Callable[[str], None] = lambda line: print(line, flush=True),
  max_steps: int | None = None,
  stage: int = 1,
  snapshot_to: str | None = None,
) -> int:
  """Plays the plan's steps not yet done, one after another, re-planning after each (a chosen
  rate adds steps); returns the number of failed steps. A step's output goes to its results
  folder's log (train.log / heldout.log), its wall time and attempts to run_status.json. An
  evaluation of a run that lost its weights trains that run again first (`retrain_lost`).
  `snapshot_to`: after each step, `snapshot` the records there."""
  import subprocess

  runner = runner or subprocess.run
  failed: set[str] = set()
  played = 0
  start = time.time()
  while max_steps is None or played < max_steps:
    steps = plan(out, python, stage=stage)
    todo = [s for s in steps if not step_done(s) and s.label not in failed]
    if not todo:
      break
    step, total = todo[0], len(steps)
    aside = None
    if step.kind != "train" and step.arm != "initial" and not has_final_checkpoint(step.workdir):
      step, aside = retrain_lost(step, out, python)
      echo(f"{step.label}: its final weights are gone (records kept in {aside}); training again")
    echo(
      f"[{total - len(todo) + 1}/{total}+] {step.label}: starting, elapsed "
      f"{_clock(time.time() - start)}; output in {step.results}"
    )
    os.makedirs(step.results, exist_ok=True)
    log = os.path.join(step.results, f"{step.kind}.log")
    code = collect.run_and_record(
      step.command, step.results, cwd=_REPO, log_path=log, runner=runner
    )
    played += 1
    if code:
      failed.add(step.label)
      echo(f"{step.label}: failed with exit code {code}; see {log}")
    elif aside:
      echo(after_retrain(step.workdir, aside))
    if snapshot_to:
      written, big = snapshot(out, snapshot_to)
      echo(
        f"snapshot: {written} file(s) written to {snapshot_to}"
        + (f"; too big: {big}" if big else "")
      )
  echo(f"stopped after {played} step(s) in {_clock(time.time() - start)}; {len(failed)} failed")
  return len(failed)


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


def _lost_lines(lost: Sequence[tuple[str, int, str, int]]) -> list[str]:
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


def _commit_lines(found: Mapping[str, list[str]]) -> list[str]:
  return [f"code at {commit}: {len(labels)} step(s)" for commit, labels in sorted(found.items())]


def status(out: str, python: str = sys.executable, stage: int = 1) -> str:
  """How far the plan got: steps done of those known, the wall time they cost, the chosen rates."""
  st = STAGES[stage]
  steps = plan(out, python, stage=stage)
  done = [s for s in steps if step_done(s)]
  seconds = 0.0
  for s in done:
    wall = collect.wall_seconds(s.results)
    seconds += wall or 0.0
  total = st.total_with(tuple(adopted_rates(out)))
  more = f" (more are planned once every arm's rate is chosen: {total} in all)"
  lines = [
    f"{len(done)}/{len(steps)} steps done{more if len(steps) < total else ''}, "
    f"{seconds / 3600:.2f} h of wall time",
    f"chosen rates: {chosen_rates(out, (*st.reused, *st.arms), st.rates_file) or 'none yet'}",
  ]
  lines += [f"  next: {s.label}" for s in steps if not step_done(s)][:3]
  lines += _lost_lines(lost_episodes(done))
  lines += _commit_lines(step_commits(done))
  return "\n".join(lines)


# ------------------------------------------------------------------------------------ report
# (panel, the evaluation's metric prefix in <run>/heldout: eval.split is heldout_seen)
PANELS = (("heldout_seen", "val"), ("heldout_unseen", "val_heldout_unseen"))
COMPARISONS = (  # A - B; the first is the primary comparison
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
MEASURES = ("final heldout_seen", "final heldout_unseen", "valid_seen AUC")
SUMMARY_COLUMNS = (
  "arm", "rate", "seeds", "heldout_seen", "heldout_seen_sd", "heldout_unseen",
  "heldout_unseen_sd", "valid_seen_final", "valid_seen_auc", "valid_seen_auc_sd", "wall_min",
)  # fmt: skip
PAIRED_COLUMNS = (
  "comparison", "measure", "seeds", "games", "difference", "ci_low", "ci_high", "level", "p",
  "holm_p",
)  # fmt: skip
INTERNALISATION_COLUMNS = (
  "arm", "measure", "seeds", "games", "without", "with", "difference", "ci_low", "ci_high",
  "level", "p", "holm_p",
)  # fmt: skip
# The training dynamics (stage 2): metrics.jsonl keys drawn against the iteration, for these arms
DYNAMICS_ARMS = ("sdar", "grpo_opsd", "sdar_vocab", "sdar_vocab_ungated")
DYNAMICS = (
  ("sdar/teacher_gap_mean", "mean teacher-student gap (nats / token)"),
  ("sdar/positive_gap_share", "share of tokens with gap > 0"),
  ("sdar/gate_active_ratio", "share of tokens with g > 0.5"),
)
RETIRED_AT = "retire/retired_at"

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


def finished_runs(out: str, stage: int = 1) -> dict[str, dict[int, str]]:
  """arm -> {seed: run folder} of the stage's runs (its reused arms' first) at the arm's chosen
  rate whose training and held-out evaluation both finished."""
  st = STAGES[stage]
  found: dict[str, dict[int, str]] = {}
  for arm, rate in chosen_rates(out, (*st.reused, *st.arms), st.rates_file).items():
    for seed in st.seeds:
      run = run_dir(out, arm, rate, seed)
      held = heldout_step(out, arm, rate, seed, sys.executable)
      if collect.run_state(run) == "finished" and step_done(held):
        found.setdefault(arm, {})[seed] = run
  return found


def panel_outcomes(folder: str, prefix: str) -> dict[int, float]:
  """{task id: success} of an evaluation folder's outcomes_<prefix>.csv (repeats averaged)."""
  path = os.path.join(folder, f"{transcripts.OUTCOMES_PREFIX}{prefix}.csv")
  if not os.path.isfile(path):
    return {}
  sums: dict[int, list[float]] = {}
  for row in transcripts.read_outcomes(path):
    sums.setdefault(row["task_id"], []).append(float(row["success"]))
  return {task: float(np.mean(v)) for task, v in sums.items()}


Grid = tuple[list[int], np.ndarray]  # (games, outcome per game)


def panel_grids(folder: str) -> dict[str, Grid | None]:
  """Per held-out measure (MEASURES[:2]): (games, outcomes per game) of one evaluation folder."""
  out: dict[str, Grid | None] = {}
  for (_, prefix), measure in zip(PANELS, MEASURES):
    games = panel_outcomes(folder, prefix)
    out[measure] = (sorted(games), np.array([games[g] for g in sorted(games)])) if games else None
  return out


def outcome_grids(run: str) -> dict[str, Grid | None]:
  """Per measure of MEASURES: (games, outcomes per game) of one run."""
  out = panel_grids(os.path.join(run, HELDOUT_DIR))
  curves = compare.eval_outcomes(run)  # {step: {task: success}} on valid_seen
  steps = sorted(curves)
  games = sorted(set.intersection(*(set(curves[s]) for s in steps))) if len(steps) >= 2 else []
  if games:
    grid = np.array([[curves[s][g] for g in games] for s in steps])  # [steps, games]
    out[MEASURES[2]] = (games, stats.per_game_auc(steps, grid))
  else:
    out[MEASURES[2]] = None
  return out


def paired_grids(
  a: dict[int, dict[str, Grid | None]], b: dict[int, dict[str, Grid | None]], measure: str
) -> tuple[int, int, np.ndarray, np.ndarray] | None:
  """(seeds, games, A [seeds, games], B [seeds, games]) of a measure over the seeds both sides
  have it for and the games all of them share; None when no seed has it on both sides."""
  have = [s for s in sorted(set(a) & set(b)) if a[s][measure] and b[s][measure]]
  if not have:
    return None
  games = sorted(set.intersection(*(set(side[s][measure][0]) for side in (a, b) for s in have)))

  def grid(side):
    rows = []
    for s in have:
      ids, values = side[s][measure]
      index = {g: i for i, g in enumerate(ids)}
      rows.append([values[index[g]] for g in games])
    return np.asarray(rows, np.float64)

  return len(have), len(games), grid(a), grid(b)


def holm_intervals(rows: list[dict[str, object]], resamples: int) -> list[dict[str, object]]:
  """Completes rows that hold their differences [seeds, games] under "_d" and their bootstrap p:
  the Holm-adjusted p across the rows, the row's Holm level and the interval at that level."""
  adjusted, levels = stats.holm([r["p"] for r in rows])
  for row, p_adj, level in zip(rows, adjusted, levels):
    low, high = stats.bootstrap_interval(row.pop("_d"), resamples, level=level)
    row.update(holm_p=p_adj, level=level, ci_low=low, ci_high=high)
  return rows


def paired_rows(
  runs: dict[str, dict[int, str]],
  resamples: int = stats.RESAMPLES,
  comparisons: Sequence[tuple[str, str]] = COMPARISONS,
) -> list[dict[str, object]]:
  """Every comparison x measure with both arms present: the paired difference on the common
  seeds and games, its bootstrap p, the Holm-corrected level and the interval at that level."""
  grids = {
    arm: {seed: outcome_grids(run) for seed, run in seeds.items()} for arm, seeds in runs.items()
  }
  rows = []
  for a, b in comparisons:
    if a not in grids or b not in grids:
      continue
    for measure in MEASURES:
      paired = paired_grids(grids[a], grids[b], measure)
      if paired is None:
        continue
      seeds, games, grid_a, grid_b = paired
      d = grid_a - grid_b
      rows.append(
        {
          "comparison": f"{a} - {b}",
          "measure": measure,
          "seeds": seeds,
          "games": games,
          "difference": float(d.mean()),
          "p": stats.bootstrap_p(d, resamples),
          "_d": d,
        }
      )
  return holm_intervals(rows, resamples)


def internalisation_rows(
  runs: dict[str, dict[int, str]], resamples: int = stats.RESAMPLES
) -> list[dict[str, object]]:
  """Per arm and held-out panel: success with the skills in the student's prompt at test time
  minus without, paired over the seeds evaluated both ways and the games both evaluations share;
  Holm-corrected across these rows alone (a family of its own)."""
  rows = []
  for arm, seeds in runs.items():
    with_ = {
      s: panel_grids(os.path.join(r, SKILLS_DIR))
      for s, r in seeds.items()
      if evaluated(os.path.join(r, SKILLS_DIR))
    }
    without = {s: panel_grids(os.path.join(seeds[s], HELDOUT_DIR)) for s in with_}
    for measure in MEASURES[:2]:
      paired = paired_grids(with_, without, measure)
      if paired is None:
        continue
      n_seeds, games, grid_with, grid_without = paired
      d = grid_with - grid_without
      rows.append(
        {
          "arm": arm,
          "measure": measure,
          "seeds": n_seeds,
          "games": games,
          "without": float(grid_without.mean()),
          "with": float(grid_with.mean()),
          "difference": float(d.mean()),
          "p": stats.bootstrap_p(d, resamples),
          "_d": d,
        }
      )
  return holm_intervals(rows, resamples)


def retirement_rows(runs: dict[str, dict[int, str]]) -> list[dict[str, object]]:
  """Each retire_opd seed: the iteration its distillation retired at (None: not retired), the
  frozen teacher's valid_seen success with its skills, and the last competence and progress."""
  rows = []
  for seed, run in sorted(runs.get("retire_opd", {}).items()):
    metrics = collect.read_metrics(os.path.join(run, "metrics.jsonl"))

    def last(key, metrics=metrics):
      values = [r[key] for r in metrics if key in r]
      return float(values[-1]) if values else None

    retired = last(RETIRED_AT)
    rows.append(
      {
        "seed": seed,
        "retired_at": None if retired is None else int(retired),
        "teacher_success": last("retire/teacher_success"),
        "competence": last("retire/competence"),
        "progress": last("retire/progress"),
      }
    )
  return rows


def summary_rows(
  out: str, runs: dict[str, dict[int, str]], stage: int = 1
) -> list[dict[str, object]]:
  st = STAGES[stage]
  rates = chosen_rates(out, (*st.reused, *st.arms), st.rates_file)
  rows = []
  for arm in (*st.reused, *st.arms):
    if arm not in runs:
      continue
    per_seed = [outcome_grids(run) for run in runs[arm].values()]
    records = [collect.read_run(run) for run in runs[arm].values()]

    def ms(measure, per_seed=per_seed):
      values = [float(g[measure][1].mean()) for g in per_seed if g[measure]]
      return collect.mean_std(values)[:2]

    walls = [
      (collect.wall_seconds(run) or 0.0)
      + (collect.wall_seconds(os.path.join(run, HELDOUT_DIR)) or 0.0)
      for run in runs[arm].values()
    ]
    seen, unseen, auc = ms(MEASURES[0]), ms(MEASURES[1]), ms(MEASURES[2])
    rows.append(
      {
        "arm": arm,
        "rate": rates[arm],
        "seeds": len(runs[arm]),
        "heldout_seen": seen[0],
        "heldout_seen_sd": seen[1],
        "heldout_unseen": unseen[0],
        "heldout_unseen_sd": unseen[1],
        "valid_seen_final": collect.mean_std(r.final_success for r in records)[0],
        "valid_seen_auc": auc[0],
        "valid_seen_auc_sd": auc[1],
        "wall_min": float(np.median(walls)) / 60.0,
      }
    )
  return rows


def export(out: str, runs: dict[str, dict[int, str]], dest: str, stage: int = 1) -> int:
  """Copies each run's config, metrics and per-game outcome CSVs (valid_seen at every
  evaluation, both held-out panels, and with the skills at test time in stage 2) under
  dest/<arm>/seed<k>/; returns the number of files."""
  import shutil

  st = STAGES[stage]
  copied = 0
  initial = os.path.join(out, "initial")
  sources = [(os.path.join(initial, HELDOUT_DIR), os.path.join(dest, "initial"))]
  if st.skills:
    sources.append((os.path.join(initial, SKILLS_DIR), os.path.join(dest, "initial", SKILLS_DIR)))
  sources += [
    (run, os.path.join(dest, arm, f"seed{s}"))
    for arm, seeds in runs.items()
    for s, run in seeds.items()
  ]
  patterns = ["config.json", "metrics.jsonl", "eval/step_*/outcomes_*.csv"]
  patterns += [f"{d}/outcomes_*.csv" for d in (HELDOUT_DIR, SKILLS_DIR)[: 1 + st.skills]]
  for src, dst in sources:
    for pattern in (*patterns, "outcomes_*.csv"):
      for path in glob.glob(os.path.join(src, pattern)):
        target = os.path.join(dst, os.path.relpath(path, src))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(path, target)
        copied += 1
  chosen = os.path.join(out, st.rates_file or "")
  if st.rates_file and os.path.isfile(chosen):
    shutil.copyfile(chosen, os.path.join(dest, st.rates_file))
  return copied


def _ablation():
  """bench/ablation.py, whose curves and figures these reuse."""
  if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import ablation

  return ablation


def _ablation_arms(runs: dict[str, dict[int, str]]) -> list:
  """The runs as bench/ablation.py's ArmResults."""
  ablation = _ablation()
  return [
    ablation.ArmResult(arm, [collect.read_run(r) for r in seeds.values()], sorted(seeds))
    for arm, seeds in runs.items()
  ]


def plot_curves(runs: dict[str, dict[int, str]], path: str) -> str | None:
  """valid_seen success against the iteration: per arm the mean over seeds, a min-max band
  (bench/ablation.py's figure)."""
  return _ablation().plot_curves(_ablation_arms(runs), path)


def dynamics_rows(runs: dict[str, dict[int, str]]) -> list[dict[str, object]]:
  """The training dynamics of DYNAMICS_ARMS: per metric of DYNAMICS, arm and iteration, the
  mean, min and max over the arm's finished runs that logged it."""
  arms = _ablation_arms({a: runs[a] for a in DYNAMICS_ARMS if a in runs})
  rows = []
  for key, _ in DYNAMICS:
    for arm in arms:
      steps, mean, low, high = _ablation().curves(arm, key)
      rows += [
        {"metric": key, "arm": arm.arm, "iteration": int(s), "mean": m, "min": lo, "max": hi}
        for s, m, lo, hi in zip(steps, mean, low, high)
      ]
  return rows


def plot_dynamics(runs: dict[str, dict[int, str]], path: str) -> str | None:
  """One panel per metric of DYNAMICS that some run logged, against the iteration: per arm of
  DYNAMICS_ARMS the mean over seeds with a min-max band (bench/ablation.py's drawing); None when
  no run logged any of them."""
  arms = _ablation_arms({a: runs[a] for a in DYNAMICS_ARMS if a in runs})
  shown = [(k, t) for k, t in DYNAMICS if any(r.curve(k) for a in arms for r in a.finished_runs)]
  if not shown:
    return None
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(shown), figsize=(5.0 * len(shown), 3.8), squeeze=False)
  for ax, (key, title) in zip(axes.flat, shown):
    _ablation().draw_curves(ax, arms, key)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(key)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def adopted_lines(out: str, arms: Sequence[str]) -> list[str]:
  """report.md's table of the rates adopted from an earlier search (none: no lines): per arm, the
  search's final valid_seen success at the chosen rate beside this stage's runs of the same seeds
  at that rate (a later commit retracing the search's runs)."""
  path = os.path.join(out, ADOPTED)
  record = (
    {a: e for a, e in read_adopted(path).items() if a in arms} if os.path.isfile(path) else {}
  )
  if not record:
    return []
  lines = [
    "",
    "Rates adopted from an earlier search (not searched again): its final valid_seen success at "
    "the chosen rate beside this stage's runs of the same seeds at that rate.",
    "",
    "| arm | rate | the search's seeds "
    + " / ".join(map(str, SEARCH_SEEDS))
    + " | this stage's | source |",
    "|---|---:|---|---|---|",
  ]
  for arm, entry in record.items():
    rate = float(entry["chosen"])
    kept = (entry.get("search") or {}).get(rate_name(rate), {}).get("final") or []
    ours = [final_success(run_dir(out, arm, rate, s)) for s in SEARCH_SEEDS]
    shown = " / ".join("running" if f is None else f"{f[0]:.3f}" for f in ours)
    lines.append(
      f"| `{arm}` | {rate:g} | {' / '.join(f'{x:.3f}' for x in kept) or 'not kept'} | {shown} "
      f"| {entry['source']} |"
    )
  return lines


def _f(x: object, digits: int = 3) -> str:
  return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else f"{x:.{digits}f}"


def _write_csv(path: str, rows: Sequence[dict[str, object]], columns: Sequence[str]) -> None:
  with open(path, "w") as f:
    f.write(collect.csv_text(rows, columns))


def report(
  out: str,
  dest: str,
  overwrite: bool = False,
  resamples: int = stats.RESAMPLES,
  stage: int = 1,
) -> str:
  """Writes dest/report.md, summary.csv, curves.png and the runs' files; returns report.md.
  Stage 2 also writes paired.csv, internalisation.csv, dynamics.csv / dynamics.png and
  retirement.csv (report.md shows them)."""
  st = STAGES[stage]
  runs = finished_runs(out, stage)
  finished = sum(len(s) for s in runs.values())
  summary_csv = os.path.join(dest, "summary.csv")
  collect.refuse_shrinking_report(
    summary_csv, finished, lambda rows: sum(int(r["seeds"]) for r in rows), out, overwrite
  )
  os.makedirs(dest, exist_ok=True)
  summary = summary_rows(out, runs, stage)
  _write_csv(summary_csv, summary, SUMMARY_COLUMNS)
  initial = {
    panel: panel_outcomes(os.path.join(out, "initial", HELDOUT_DIR), prefix)
    for panel, prefix in PANELS
  }
  lines = [
    f"# The powered ablation, {st.title}: report",
    "",
    f"Written by `python bench/powered_ablation.py report{st.flag}` from {finished} finished "
    f"run(s) ({', '.join(f'{a}: seeds {sorted(s)}' for a, s in runs.items()) or 'none'}).",
    "",
    "| arm | rate | seeds | held-out seen | held-out unseen | valid_seen final | valid_seen AUC | wall / run (min, median) |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for r in summary:
    lines.append(
      f"| `{r['arm']}` | {r['rate']:g} | {r['seeds']} | {_f(r['heldout_seen'])} ± {_f(r['heldout_seen_sd'])} "
      f"| {_f(r['heldout_unseen'])} ± {_f(r['heldout_unseen_sd'])} | {_f(r['valid_seen_final'])} "
      f"| {_f(r['valid_seen_auc'])} ± {_f(r['valid_seen_auc_sd'])} | {_f(r['wall_min'], 1)} |"
    )
  lines += [
    "",
    "Wall / run: a training run and its held-out evaluation (without the skills), the median over "
    "the arm's seeds; an attempt killed before run records kept a heartbeat counts until the next "
    "attempt began, which a median keeps out of the figure.",
  ]
  lines += adopted_lines(out, (*st.reused, *st.arms))
  if any(initial.values()):
    shown = " / ".join(
      f"{panel} {np.mean(list(v.values())):.3f} ({len(v)} games)"
      for panel, v in initial.items()
      if v
    )
    lines += ["", f"The warm-started policy (every arm's start): {shown}."]
  pairs = paired_rows(runs, resamples, st.comparisons)
  if pairs:
    lines += [
      "",
      "Paired differences (A - B) over the seeds both arms finished and the panel's games; "
      f"two-way bootstrap ({resamples} resamples), intervals Holm-corrected across the "
      f"{len(pairs)} comparisons shown (level = Holm's step-down level of the row).",
      "",
      "| comparison | measure | seeds x games | difference | interval | level | p | Holm p |",
      "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in pairs:
      lines.append(
        f"| {r['comparison']} | {r['measure']} | {r['seeds']} x {r['games']} | {r['difference']:+.3f} "
        f"| [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['level']:.4f} | {r['p']:.3g} | {r['holm_p']:.3g} |"
      )
  png = plot_curves(runs, os.path.join(dest, "curves.png"))
  if png:
    lines += ["", "![valid_seen curves](curves.png)"]
  if st.skills:
    _write_csv(os.path.join(dest, "paired.csv"), pairs, PAIRED_COLUMNS)
    lines += _stage_two_sections(out, runs, dest, resamples)
  done = [s for s in plan(out, sys.executable, stage=stage) if step_done(s)]
  lines += ["", "The code that ran the stage's finished steps (the commit each attempt ran at):"]
  lines += [f"- {line}" for line in _commit_lines(step_commits(done))]
  lost = lost_episodes(done)
  lines += ["", "Lost episodes (every finished step of the stage, the rate search's included):"]
  lines += [f"- {line}" for line in _lost_lines(lost)]
  if lost:
    lines += [
      "",
      "An evaluation that lost episodes scored only the games that finished; the paired rows "
      "above keep the games every compared run scored, so such a run narrows its comparisons' "
      "games.",
    ]
  held = f"{HELDOUT_DIR}/outcomes_val.csv, outcomes_val_heldout_unseen.csv"
  lines += [
    "",
    "Each run's command is in its run_status.json (`command`); `python bench/powered_ablation.py "
    f"plan{st.flag}` prints them all. Per-game outcomes: <arm>/seed<k>/eval/step_<N>/outcomes_val.csv "
    f"(valid_seen) and <arm>/seed<k>/{held}"
    + (f" (with the skills: the same names under {SKILLS_DIR}/)." if st.skills else "."),
  ]
  export(out, runs, dest, stage)
  path = os.path.join(dest, "report.md")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return path


def _stage_two_sections(
  out: str, runs: dict[str, dict[int, str]], dest: str, resamples: int
) -> list[str]:
  """report.md's skill internalisation, training dynamics and retirement sections (and their
  CSVs in dest)."""
  lines: list[str] = []
  inner = internalisation_rows(runs, resamples)
  _write_csv(os.path.join(dest, "internalisation.csv"), inner, INTERNALISATION_COLUMNS)
  if inner:
    lines += [
      "",
      "Skill internalisation: each final policy on the held-out panels with the skills in the "
      "student's prompt at test time minus without (every arm given the same skills), paired "
      "over the seeds evaluated both ways and the panel's games; two-way bootstrap "
      f"({resamples} resamples), intervals Holm-corrected across the {len(inner)} rows of this "
      "table as a family of its own (apart from the comparisons above).",
      "",
      "| arm | panel | seeds x games | without skills | with skills | with - without | interval | level | p | Holm p |",
      "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in inner:
      lines.append(
        f"| `{r['arm']}` | {r['measure'].removeprefix('final ')} | {r['seeds']} x {r['games']} "
        f"| {r['without']:.3f} | {r['with']:.3f} | {r['difference']:+.3f} "
        f"| [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}] | {r['level']:.4f} | {r['p']:.3g} | {r['holm_p']:.3g} |"
      )
  check = commit_check(out)
  if check:
    same = "identical" if not check["differ"] else f"different in {check['differ']}"
    lines += [
      "",
      f"Commit check: `grpo` seed 0 at {check['rate']:g}, trained again by this stage's commit "
      f"({COMMIT_CHECK}/): its valid_seen outcomes are {same} of {check['outcomes']} "
      f"(games x the {check['evaluations']} evaluations both runs logged); final valid_seen "
      f"success {_f(check['final_first'])} in the reused run, {_f(check['final_again'])} again.",
    ]
  initial = os.path.join(out, "initial")
  both = [
    (panel, panel_outcomes(os.path.join(initial, SKILLS_DIR), prefix), without)
    for panel, prefix in PANELS
    if (without := panel_outcomes(os.path.join(initial, HELDOUT_DIR), prefix))
  ]
  shown = [
    f"{panel} {np.mean([w[g] for g in games]):.3f} with, "
    f"{np.mean([wo[g] for g in games]):.3f} without ({len(games)} games)"
    for panel, w, wo in both
    if (games := sorted(set(w) & set(wo)))
  ]
  if shown:
    lines += ["", f"The warm-started policy, with and without the skills: {'; '.join(shown)}."]
  dynamics = dynamics_rows(runs)
  _write_csv(
    os.path.join(dest, "dynamics.csv"),
    dynamics,
    ("metric", "arm", "iteration", "mean", "min", "max"),
  )
  if plot_dynamics(runs, os.path.join(dest, "dynamics.png")):
    lines += [
      "",
      "Training dynamics (each run's metrics.jsonl, per iteration; the mean over seeds, a band "
      "from the lowest to the highest seed; figures in dynamics.csv): the mean teacher-student "
      "gap Δ = log p_teacher - log p_student on the student's sampled tokens (each arm's own "
      "teacher: the current policy given the skills for `sdar` and `grpo_opsd`, the frozen "
      "warm-started policy given them for the vocabulary forms), the share of those "
      "tokens with Δ > 0 (for any β > 0, those whose gap gate g = σ(βΔ) exceeds 0.5), and the "
      "share with g > 0.5 (0 by construction at β = 0: `grpo_opsd` and `sdar_vocab_ungated`).",
      "",
      "![training dynamics](dynamics.png)",
    ]
  retired = retirement_rows(runs)
  if retired:
    _write_csv(
      os.path.join(dest, "retirement.csv"),
      retired,
      ("seed", "retired_at", "teacher_success", "competence", "progress"),
    )
    lines += [
      "",
      "RetireOPD's retirement per seed (its metrics: retire/retired_at, the iteration after which "
      "the distillation stopped; the frozen teacher's valid_seen success with its skills; the "
      "last competence and progress logged):",
      "",
      "| seed | retired at | teacher success | competence | progress |",
      "|---:|---|---:|---:|---:|",
    ]
    for r in retired:
      at = "not retired" if r["retired_at"] is None else f"iteration {r['retired_at']}"
      lines.append(
        f"| {r['seed']} | {at} | {_f(r['teacher_success'])} | {_f(r['competence'])} "
        f"| {_f(r['progress'])} |"
      )
  return lines


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("action", choices=("run", "status", "plan", "report", "snapshot", "restore"))
  parser.add_argument("--stage", type=int, choices=sorted(STAGES), default=1, help="which stage")
  parser.add_argument("--out", default="runs/powered", help="the runs' parent folder")
  parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
  parser.add_argument(
    "--dest", default=None, help="where the report goes (default: the stage's docs/results folder)"
  )
  parser.add_argument(
    "--overwrite", action="store_true", help="replace a report that holds more finished seeds"
  )
  parser.add_argument(
    "--before-stage-1-ends",
    action="store_true",
    help="run stage 2 although stage 1 has steps left (they then share the machine)",
  )
  parser.add_argument(
    "--snapshot",
    default=None,
    help="the records' copy without weights (run: written after each step; snapshot: written "
    "now; restore: read into --out)",
  )
  parser.add_argument(
    "--adopt",
    default=None,
    help="run: a JSON file of rates an earlier search chose (arm -> chosen, source, search); "
    "those arms skip the search and train every seed at that rate",
  )
  args = parser.parse_args(argv)
  if args.action in ("snapshot", "restore"):
    if not args.snapshot:
      print(f"{args.action}: pass --snapshot=<folder> (the records' copy)", file=sys.stderr)
      return 2
    if args.action == "snapshot":
      written, big = snapshot(args.out, args.snapshot)
      print(f"{written} file(s) written to {args.snapshot}; left out for size: {big or 'none'}")
    else:
      print(f"{restore(args.snapshot, args.out)} file(s) restored into {args.out}")
    return 0
  if args.adopt:
    try:
      print(f"adopted rates: {adopt(args.out, args.adopt)}")
    except (OSError, ValueError) as e:
      print(f"--adopt={args.adopt}: {e}", file=sys.stderr)
      return 2
  if args.action == "report":
    try:
      print(
        report(args.out, args.dest or STAGES[args.stage].dest, args.overwrite, stage=args.stage)
      )
    except collect.ReportShrinkError as e:
      print(f"report not written: {e}", file=sys.stderr)
      return 2
    return 0
  if args.action == "plan":
    for step in plan(args.out, stage=args.stage):
      print(("done  " if step_done(step) else "todo  ") + " ".join(step.command))
    return 0
  if args.action == "status":
    print(status(args.out, stage=args.stage))
    return 0
  if args.stage > 1 and not args.before_stage_1_ends and (left := steps_left(args.out, 1)):
    total = STAGES[1].total_with(tuple(adopted_rates(args.out)))
    print(
      f"stage {args.stage} not started: stage 1 has {left} of its {total} steps left in "
      f"{args.out}. Fix: wait until `status` says {total}/{total}, or pass "
      "--before-stage-1-ends to share the machine with it.",
      file=sys.stderr,
    )
    return 2
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # kill: the running step stops with it
  failed = run(args.out, max_steps=args.max_steps, stage=args.stage, snapshot_to=args.snapshot)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
