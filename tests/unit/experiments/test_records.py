"""The committed tidy tables give the committed reports' rows again; the variance components and
the detectable effect by hand; the tables' append-only format."""

from __future__ import annotations

import csv
import gzip
import math
import os

import numpy as np
import pytest

from experiments import power, records, tables_view
from sdar_jax.observe import stats
from tests.helpers import REPO

RESULTS = os.path.join(REPO, "docs", "results")


@pytest.fixture(scope="module")
def tables():
  return records.Tables(RESULTS)


def _report_row(folder: str, comparison: str, measure: str) -> dict[str, str]:
  with open(os.path.join(RESULTS, folder, "paired.csv")) as f:
    rows = [
      r for r in csv.DictReader(f) if (r["comparison"], r["measure"]) == (comparison, measure)
    ]
  assert len(rows) == 1, (folder, comparison, measure)
  return rows[0]


@pytest.mark.parametrize(
  "stage, folder, a, b, measure",
  [
    (1, "powered", "sdar_vocab", "grpo", "final heldout_seen"),  # stage 1's primary comparison
    (2, "powered_stage2", "sdar", "grpo_opsd", "final heldout_unseen"),  # the gate, stage 2
  ],
)
def test_a_committed_row_is_rebuilt_from_the_tables(tables, stage, folder, a, b, measure):
  """One row of each stage's report, recomputed from the tables alone: the same seeds, games and
  difference, and at the report's resamples and family size the same p and intervals."""
  from experiments.specs import powered as spec

  sp = spec(stage)
  view = tables_view.View(tables, "powered", stage, sp.arms, sp.seeds)
  grid_a, grid_b = view.paired(a, b, measure)
  want = _report_row(folder, f"{a} - {b}", measure)
  with open(os.path.join(RESULTS, folder, "paired.csv")) as f:
    family_size = sum(1 for _ in csv.DictReader(f))
  got = stats.bootstrap(grid_a - grid_b, family_size=family_size)
  assert (got.seeds, got.games) == (int(want["seeds"]), int(want["games"]))
  # a mean of 0/1 outcomes over seeds x games: exact to the rounding of one sum
  assert got.difference == pytest.approx(float(want["difference"]), abs=1e-12)
  for key in ("ci_low", "ci_high", "sim_low", "sim_high", "p"):
    assert getattr(got, key) == pytest.approx(float(want[key]), abs=1e-9), key


def test_a_table_is_appended_to_and_read_back(tmp_path):
  path = str(tmp_path / "t.csv.gz")
  cols = ("run", "seed", "value")
  assert records.append(path, [{"run": "a", "seed": 0, "value": 0.5}], cols) == 1
  assert records.append(path, [{"run": "b", "seed": None, "value": float("nan")}], cols) == 1
  with open(path, "rb") as f:  # two gzip members: the second appended, the first untouched
    assert f.read().count(b"\x1f\x8b\x08") == 2
  rows = records.read(path)
  assert [(r["run"], r["seed"]) for r in rows] == [("a", 0), ("b", None)]
  assert rows[0]["value"] == 0.5 and math.isnan(rows[1]["value"])
  assert gzip.open(path, "rt").read().splitlines()[0] == "run,seed,value"
  with pytest.raises(ValueError, match="has the columns"):
    records.append(path, [], ("run", "other"))


def test_a_step_is_withdrawn_and_redone(tmp_path):
  """`Tables.withdraw` removes one step's outcomes and manifest row (a training run's metrics
  too) and keeps every other row's cells as written; `redo --step` withdraws a finished
  evaluation and moves its folder aside, and names the finished evaluations for a wrong label."""
  from experiments import driver

  tables = records.Tables(str(tmp_path / "tables"))
  key = {"experiment": "x", "stage": 3, "arm": "grpo", "seed": 0, "lr": 5e-4}
  for run, kind in (("grpo/s0", "train"), ("grpo/s0", "heldout"), ("initial", "heldout")):
    outcomes = [dict(key, run=run, kind=kind, game=f"g{i}", success=i % 2) for i in range(3)]
    metrics = [dict(key, run=run, iteration=1, metric="m", value=0.1)] if kind == "train" else []
    tables.add(outcomes, metrics, dict(key, run=run, kind=kind, wall_seconds=1 / 3, finished=1))
  before = {t: records.read(getattr(tables, t)) for t in ("outcomes", "metrics", "runs")}
  assert tables.withdraw("x", "grpo/s0", "heldout") == 4  # 3 outcomes + its manifest row
  after = {t: records.read(getattr(tables, t)) for t in ("outcomes", "metrics", "runs")}
  gone = lambda r: (r["run"], r["kind"]) == ("grpo/s0", "heldout")  # noqa: E731
  for table in ("outcomes", "runs"):
    assert after[table] == [r for r in before[table] if not gone(r)]
  assert after["metrics"] == before["metrics"]  # an evaluation has none of its own
  assert after["runs"][1]["wall_seconds"] == 1 / 3  # cells as written (repr of the float)
  assert tables.withdraw("x", "grpo/s0", "heldout") == 0
  assert tables.withdraw("x", "grpo/s0", "train") == 5

  out = tmp_path / "runs"
  step = driver.Step("heldout", "initial", None, None, str(out / "initial"), ("true",))
  os.makedirs(step.results)
  (out / "initial" / "heldout.redo").mkdir()  # an earlier redo's folder stays
  said = driver.redo_evaluation(step.label, [step], str(out), tables, "x", done=lambda s: True)
  assert "4 row(s) withdrawn" in said and said.endswith("`run` plays it again")
  assert os.path.isdir(step.results + ".redo-2") and not os.path.exists(step.results)
  assert tables.read("runs") == []
  with pytest.raises(ValueError, match=f'Fix: one of "{step.label}"'):
    driver.redo_evaluation("train grpo", [step], str(out), tables, "x", done=lambda s: True)


def test_a_training_stopped_after_its_last_iteration_is_recorded_finished(tmp_path):
  """A run stopped (SIGTERM) after its last iteration's metrics, before run_status.json said it
  finished, is finished for the drivers (experiments.driver.step_done) and so in its manifest row;
  one stopped an iteration earlier is not."""
  import json

  from experiments import driver

  key = {"experiment": "x", "stage": 3, "run": "r", "arm": "grpo", "seed": 0, "lr": 5e-4}
  for last, want in ((2, 1), (1, 0)):
    run = tmp_path / f"last{last}"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"train": {"iterations": 2}}))
    (run / "run_status.json").write_text(json.dumps({"attempts": [], "finished": False}))
    (run / "metrics.jsonl").write_text(
      "".join(json.dumps({"step": i, "m": 0.5}) + "\n" for i in range(1, last + 1))
    )
    _, metrics, manifest = records.step_rows(str(run), kind="train", **key)
    assert manifest["finished"] == want and len(metrics) == last
    step = driver.Step("train", "grpo", 5e-4, 0, str(run), ("true",))
    assert driver.step_done(step) == bool(want)


def test_variance_components_and_the_detectable_effect_by_hand():
  """An additive grid d = u_s + v_g has no residual; the seed and game components are the sample
  variances of u and v (the ANOVA estimates are exact there)."""
  u, v = np.array([0.1, -0.2, 0.4]), np.array([0.0, 0.5, -0.5, 1.0])
  parts = power.components(u[:, None] + v[None, :])
  assert parts.seed == pytest.approx(np.var(u, ddof=1), abs=1e-12)
  assert parts.game == pytest.approx(np.var(v, ddof=1), abs=1e-12)
  assert parts.residual == pytest.approx(0.0, abs=1e-12)
  # z_0.975 + z_0.8 = 1.959964 + 0.841621; se^2 = su/S + sv/G + se/(S G)
  parts = power.Components(seed=0.01, game=0.1, residual=0.2)
  se = math.sqrt(0.01 / 8 + 0.1 / 128 + 0.2 / (8 * 128))
  assert power.detectable(parts, 8, 128) == pytest.approx(2.801585 * se, rel=1e-6)
  # the seed term alone: 0.01 / 4 at 4 seeds leaves no room for an effect of 0.05 / 2.8
  assert power.games_needed(parts, 4, 0.05) is None
  need = power.games_needed(parts, 8, 0.1)
  assert power.detectable(parts, 8, need) <= 0.1 < power.detectable(parts, 8, need - 1)
