"""The host loop as a user runs it: evaluating a run's checkpoints, progress lines, metric rows
every `logging.every`, `checkpoint.every=0`, runs whose environments all fail, a kill between a
metrics row and its checkpoint, the workdir lock, options that are refused.

A tiny model on the real ALFWorld engine over a (2, 1, 4) mesh of fake CPU devices; the broken-env
runs use generated games whose PDDL problem is cut off, so every env fails at reset.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from sdar_jax.observe.metrics import read_history
from sdar_jax.run.guards import NothingTrainedError
from tests.helpers import (
  tiny_run_config,
  wandb_history,
  wandb_offline_env,
  wandb_offline_runs,
  wandb_run_record,
)

pytestmark = pytest.mark.slow

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(iterations: int, **overrides):
  return tiny_run_config(iterations, **overrides)


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


class _Killed(Exception):
  """Stands for the process being killed."""


class _Records(logging.Handler):
  def __init__(self):
    super().__init__(logging.INFO)
    self.messages: list[tuple[str, int, str]] = []

  def emit(self, record):
    self.messages.append((record.name, record.levelno, record.getMessage()))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """3 iterations: eval before training and at 3, checkpoints at 2 and 3, rows every 2."""
  from sdar_jax.run import trainer

  workdir = str(tmp_path_factory.mktemp("run"))
  config = _config(
    3, **{"train.eval_every": 3, "checkpoint.every": 2, "logging.every": 2, "checkpoint.keep": 5}
  )
  records = _Records()
  ours = logging.getLogger("sdar_jax")
  level = ours.level
  ours.addHandler(records)
  ours.setLevel(logging.INFO)
  try:
    trainer.run(config, workdir)
  finally:
    ours.removeHandler(records)
    ours.setLevel(level)
  return workdir, config, records.messages


def _run_files(workdir) -> dict[str, str]:
  """sha256 of every file the run wrote (outside eval/, and outside evaluations/, which only
  sdar_jax.evaluate writes)."""
  out = {}
  for path in glob.glob(os.path.join(workdir, "**"), recursive=True):
    rel = os.path.relpath(path, workdir)
    if os.path.isfile(path) and not rel.startswith(("eval" + os.sep, "evaluations" + os.sep)):
      with open(path, "rb") as f:
        out[rel] = hashlib.sha256(f.read()).hexdigest()
  return out


# ------------------------------------------------------------------------------------ training
def test_rows_every_logging_every_and_checkpoints(trained):
  from sdar_jax.run.checkpoint import CheckpointManager

  workdir, _, _ = trained
  rows = _rows(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 2, 3]  # eval row 0, every 2nd, the last (with eval)
  assert "val/success_rate" in rows[0] and "val/success_rate" in rows[2]
  assert "train/loss" in rows[1] and rows[1]["episode/env_failures"] == 0
  with CheckpointManager(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
    assert ckpt.all_steps() == [2, 3]
  assert os.path.exists(os.path.join(workdir, "metrics.png"))
  assert not os.path.exists(os.path.join(workdir, ".sdar_jax.lock"))  # released at the end


def test_a_stop_before_a_validation_plays_it_when_the_run_resumes(trained, tmp_path, monkeypatch):
  """A stop request that comes in the iteration a validation is due after (its env workers may
  have ended with the signal) saves the iteration without the validation; the resumed run plays
  it first, and the row it logs is the one of the run that never stopped. Resumed from the
  module's run at checkpoint 2, stopped in iteration 3."""
  from sdar_jax.run import trainer
  from sdar_jax.run.preemption import Preempted

  source, config, _ = trained
  workdir = tmp_path / "run"
  shutil.copytree(source, workdir, ignore=shutil.ignore_patterns("3", "eval", "*.lock"))
  real = trainer.Trainer.train_iteration

  def stopped_in_3(self, stop=None):
    metrics = real(self, stop)
    if self.loop_state.iteration == 2:  # the request comes after iteration 3's update
      stop.signum = signal.SIGTERM
    return metrics

  monkeypatch.setattr(trainer.Trainer, "train_iteration", stopped_in_3)
  with pytest.raises(Preempted, match="after 3 of 3 iterations: iteration 3 is saved"):
    trainer.run(config, str(workdir))
  rows = {r["step"]: r for r in read_history(str(workdir / "metrics.jsonl"))}
  assert "train/loss" in rows[3] and "val/success_rate" not in rows[3]
  monkeypatch.undo()
  trainer.run(config, str(workdir))
  played = {r["step"]: r for r in read_history(str(workdir / "metrics.jsonl"))}
  never = {r["step"]: r for r in read_history(os.path.join(source, "metrics.jsonl"))}
  val = {k: v for k, v in never[3].items() if k.startswith("val/")}
  assert len(val) > 3 and {k: played[3][k] for k in val} == val


def test_training_rows_have_the_perf_metrics(trained):
  """Throughputs, env-wait and compile shares, staleness (sdar_jax.observe.perf) in every training
  row: finite, shares in [0, 1], staleness 0 in the synchronous loop."""
  workdir, _, _ = trained
  for row in _rows(os.path.join(workdir, "metrics.jsonl"))[1:]:
    for name in ("rollout_tokens_per_s", "update_tokens_per_s", "iteration_seconds"):
      assert 0.0 < row[f"perf/{name}"] < float("inf"), (row["step"], name)
    for name in ("env_wait_share", "compile_share"):
      assert 0.0 <= row[f"perf/{name}"] <= 1.0, (row["step"], name)
    assert row["perf/env_wait_share"] > 0.0  # the envs were stepped
    assert row["perf/staleness_mean"] == row["perf/staleness_max"] == 0.0


def test_progress_lines_and_compile_messages(trained):
  _, _, messages = trained
  progress = [m for name, _, m in messages if name == "sdar_jax.run.trainer" and "iteration " in m]
  for k in (1, 2, 3):
    (line,) = [m for m in progress if m.startswith(f"iteration {k}/3 ")]
    assert re.search(r" in [\d.:]+s?, elapsed [\d.:]+s?, ETA [\d.:]+s? \| ", line), line
    assert "episode/valid_action_ratio=" in line and "train/loss=" in line
  assert "val/success_rate=" in next(m for m in progress if m.startswith("iteration 3/3 "))
  compiling = [m for _, _, m in messages if m.startswith("compiling the ")]
  assert any(m.startswith("compiling the sampler") for m in compiling)
  assert any(m.startswith("compiling the update") for m in compiling)


# ------------------------------------------------------------------------------------ evaluation
def test_evaluate_latest_checkpoint_reproduces_the_runs_evaluation(trained, monkeypatch):
  """The run's own evaluation at step 3 and an eval-only run of checkpoint 3 play the same
  episodes with the same parameters; the run's files are not touched, no optimizer is built."""
  from sdar_jax.run import evaluation as evaluate
  from sdar_jax.run import resume, trainer

  workdir, config, _ = trained
  before = _run_files(workdir)
  plan = evaluate.plan_evaluation(config, workdir)
  assert plan.params_from == (os.path.join(workdir, "checkpoints"), 3)
  assert plan.output == os.path.join(workdir, "evaluations", "step_3")  # beside eval/, not in it

  def forbidden(*args, **kwargs):
    raise AssertionError("an evaluation built training state")

  monkeypatch.setattr(trainer, "create_train_state", forbidden)
  monkeypatch.setattr(trainer, "train_step_from_config", forbidden)
  monkeypatch.setattr(resume, "abstract_train_state", forbidden)
  from sdar_jax.run.workdir_lock import WorkdirLock

  with WorkdirLock(workdir):  # a training run holding its workdir does not block evaluation
    t = trainer.Trainer(config, plan.output, eval_only=True, params_from=plan.params_from)
    try:
      assert t.state is None and t.ref_params is None and t.pool is None and t.ckpt is None
      row = t.run()
    finally:
      t.close()
  assert row["step"] == 3
  trained_row = _rows(os.path.join(workdir, "metrics.jsonl"))[-1]
  val = [k for k in trained_row if k.startswith("val/") and "seconds" not in k]
  assert "val/success_rate" in val and "val/valid_action_ratio" in val
  for key in val:
    assert row[key] == trained_row[key], key
  out = plan.output
  assert [r["step"] for r in _rows(os.path.join(out, "metrics.jsonl"))] == [3]
  assert os.path.exists(os.path.join(out, "metrics.png"))
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["train"]["iterations"] == 3
  with open(os.path.join(out, evaluate.EVAL_RECORD)) as f:
    assert json.load(f)["evaluated"]["step"] == 3
  assert _run_files(workdir) == before
  # Per-game outcomes beside the transcripts: their success rate is the logged one.
  from sdar_jax.observe.transcripts import read_outcomes

  outcomes = read_outcomes(os.path.join(out, "outcomes_val.csv"))
  assert outcomes and {(r["step"], r["seed"]) for r in outcomes} == {(3, config.train.seed)}
  assert sum(r["success"] for r in outcomes) / len(outcomes) == row["val/success_rate"]


def test_validation_draws_depend_on_eval_seed_only(trained, tmp_path, monkeypatch):
  """Common random numbers: the same parameters evaluated at another iteration, or by a run of
  another train.seed, play the same validation episodes (the same response tokens, and the run's
  own metrics at step 3); another eval.seed draws other tokens."""
  import copy

  from sdar_jax.rollout.agent_loop import AgentLoop
  from sdar_jax.run import trainer

  workdir, config, _ = trained
  played = []
  run = AgentLoop.run

  def spy(self, *args, **kwargs):
    episodes = run(self, *args, **kwargs)
    played.append([t.response_ids for ep in episodes for t in ep.turns])
    return episodes

  monkeypatch.setattr(AgentLoop, "run", spy)
  trained_row = _rows(os.path.join(workdir, "metrics.jsonl"))[-1]
  keys = [k for k in trained_row if k.startswith("val/") and "seconds" not in k]
  checkpoint = (os.path.join(workdir, "checkpoints"), 3)
  other_seed = copy.deepcopy(config)
  other_seed.train.seed = config.train.seed + 7
  t = trainer.Trainer(other_seed, str(tmp_path / "a"), eval_only=True, params_from=checkpoint)
  try:
    rows = [t.evaluate()]
    t.loop_state.iteration = 11  # as if evaluated later in a run
    rows.append(t.evaluate())
  finally:
    t.close()
  for row in rows:
    assert {k: row[k] for k in keys} == {k: trained_row[k] for k in keys}
  other_eval = copy.deepcopy(config)
  other_eval.eval.seed = 1
  trainer.run_evaluation(other_eval, str(tmp_path / "b"), params_from=checkpoint)
  assert len(played) == 3 and played[0] and played[0] == played[1] != played[2]


def test_evaluate_a_chosen_step_and_again(trained):
  from sdar_jax.run import evaluation as evaluate
  from sdar_jax.run import trainer

  workdir, config, _ = trained
  plan = evaluate.plan_evaluation(config, workdir, step=2)
  assert plan.output == os.path.join(workdir, "evaluations", "step_2")
  for _ in range(2):  # evaluating again replaces the results
    row = trainer.run_evaluation(config, plan.output, plan.params_from)
    assert row["step"] == 2 and "val/success_rate" in row
    assert [r["step"] for r in _rows(os.path.join(plan.output, "metrics.jsonl"))] == [2]
  with pytest.raises(evaluate.EvaluationError, match=r"its steps are \[2, 3\]"):
    evaluate.plan_evaluation(config, workdir, step=1)
  with pytest.raises(evaluate.EvaluationError, match="never writes into a run's files"):
    evaluate.plan_evaluation(config, workdir, output=workdir)
  own = os.path.join(workdir, "eval", "step_3")  # the training's own evaluation at step 3
  with pytest.raises(evaluate.EvaluationError, match="files a training run wrote"):
    evaluate.plan_evaluation(config, workdir, step=3, output=own)
  with pytest.raises(evaluate.EvaluationError, match="no such run.*--initial_policy"):
    evaluate.plan_evaluation(config, workdir + "-typo", weights_named=False)
  before = _run_files(workdir)
  with pytest.raises(FileExistsError, match="never writes into a run's files"):
    trainer.run_evaluation(config, workdir, plan.params_from)  # the library call guards too
  assert _run_files(workdir) == before


def test_evaluate_refuses_a_run_without_checkpoints_as_output(trained, tmp_path):
  from sdar_jax.run import evaluation as evaluate

  _, config, _ = trained
  run = tmp_path / "young_run"
  run.mkdir()
  (run / "config.json").write_text("{}")  # a training run that has not saved yet
  with pytest.raises(evaluate.EvaluationError, match="holds a training run"):
    evaluate.plan_evaluation(config, str(run))
  with pytest.raises(evaluate.EvaluationError, match="holds no checkpoint"):
    evaluate.plan_evaluation(config, str(run), step=3)
  plan = evaluate.plan_evaluation(config, str(run), output=str(tmp_path / "results"))
  assert plan.params_from is None and plan.output == str(tmp_path / "results")
  with pytest.raises(evaluate.EvaluationError, match="eval.num_tasks=0"):
    evaluate.plan_evaluation(_config(1, **{"eval.num_tasks": 0}), str(tmp_path / "results"))


def _cli(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  return subprocess.run(
    [sys.executable, "-m", "sdar_jax.evaluate", *args],
    capture_output=True,
    text=True,
    cwd=_REPO,
    env=env,
    timeout=600,
    check=False,
  )


def test_evaluate_cli_dry_run_names_the_checkpoint_with_timestamps(trained, tmp_path):
  """The CLI resolves the latest checkpoint, logs it on a timestamped line, writes nothing; an
  explicit --verbosity=-1 (warnings only) hides that INFO line."""
  workdir, _, _ = trained
  out = tmp_path / "out"
  args = (
    "--config=configs/alfworld.py:model=tiny,local=True",
    f"--workdir={workdir}",
    f"--output={out}",
    "--dry_run",
  )
  result = _cli(*args)
  assert result.returncode == 0, result.stderr
  assert f"checkpoint step 3 of {workdir}/checkpoints" in result.stdout
  info = [line for line in result.stderr.splitlines() if "evaluating checkpoint step 3" in line]
  assert info and re.match(r"I\d{4} \d\d:\d\d:\d\d\.\d+ ", info[0]), result.stderr
  assert not out.exists()
  quiet = _cli(*args, "--verbosity=-1")
  assert quiet.returncode == 0, quiet.stderr
  assert "evaluating checkpoint step 3" not in quiet.stderr


# ------------------------------------------------------------------------------------ failures
@pytest.fixture(scope="module")
def broken_data(tmp_path_factory):
  """The generated games with every training game's PDDL problem cut off: each env fails at
  reset (a Fast Downward parse error)."""
  from envs.alfworld.data import offline_dir

  source = offline_dir(_config(1).env)
  data = str(tmp_path_factory.mktemp("broken") / "alfworld")
  shutil.copytree(source, data)
  for path in glob.glob(os.path.join(data, "train", "*", "*", "game.tw-pddl")):
    with open(path) as f:
      game = json.load(f)
    game["pddl_problem"] = "(define (problem cut-off"
    with open(path, "w") as f:
      json.dump(game, f)
  return data


def _broken(iterations: int, data: str, **overrides):
  return _config(
    iterations,
    **{"env.data_dir": data, "train.eval_every": 0, "train.eval_before_train": False, **overrides},
  )


def test_every_env_failing_stops_the_run(broken_data, tmp_path, caplog):
  from sdar_jax.run import trainer
  from sdar_jax.run.guards import EnvFailureError
  from sdar_jax.run.workdir_lock import WorkdirLock

  workdir = str(tmp_path / "run")
  config = _broken(5, broken_data, **{"train.max_failed_iterations": 2})
  with (
    caplog.at_level(logging.INFO, logger="sdar_jax"),
    pytest.raises(EnvFailureError) as e,
  ):
    trainer.run(config, workdir)
  msg = str(e.value)
  assert "every environment failed in 2 consecutive iterations" in msg
  assert "train.max_failed_iterations=2" in msg
  assert "ParseError" in msg and os.path.join(broken_data, "train") in msg and "game.tw-pddl" in msg
  shown = [r for r in caplog.records if "failed: env raised during reset: ParseError" in r.message]
  assert len(shown) == 1  # the first error of its kind, once, with its env and game file
  assert shown[0].levelno == logging.WARNING
  assert "episode env " in shown[0].message and "game.tw-pddl" in shown[0].message
  rows = _rows(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [1]  # iteration 2 raised before its row
  assert rows[0]["episode/env_failures"] == 2
  WorkdirLock(workdir).acquire().release()  # the lock was released on the way out


def test_checkpoint_every_zero_saves_at_the_end(broken_data, tmp_path):
  from sdar_jax.run import trainer
  from sdar_jax.run.checkpoint import CheckpointManager

  workdir = str(tmp_path / "run")
  with pytest.raises(NothingTrainedError):  # every env failed: no update, nothing exported
    trainer.run(_broken(2, broken_data, **{"checkpoint.every": 0}), workdir)
  with CheckpointManager(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
    assert ckpt.all_steps() == [2]


def test_kill_between_row_and_checkpoint_logs_each_step_once(broken_data, tmp_path, monkeypatch):
  from sdar_jax.run import trainer

  workdir = str(tmp_path / "run")
  config = _broken(3, broken_data, **{"checkpoint.every": 2, "train.max_failed_iterations": 10})
  real_save = trainer.Trainer.save

  def killed_at_3(self, force=False):
    if self.loop_state.iteration == 3:
      raise KeyboardInterrupt("killed after logging row 3, before checkpoint 3")
    real_save(self, force)

  monkeypatch.setattr(trainer.Trainer, "save", killed_at_3)
  with pytest.raises(KeyboardInterrupt):
    trainer.run(config, workdir)
  assert [r["step"] for r in _rows(os.path.join(workdir, "metrics.jsonl"))] == [1, 2, 3]
  monkeypatch.undo()
  with pytest.raises(NothingTrainedError):  # resumes at checkpoint 2 and runs iteration 3 again
    trainer.run(config, workdir)
  assert [r["step"] for r in _rows(os.path.join(workdir, "metrics.jsonl"))] == [1, 2, 3]


def test_wandb_offline_gets_every_row_and_the_config_and_resume_continues_it(
  broken_data, tmp_path, monkeypatch
):
  """logging.wandb=True in W&B's offline mode: the W&B run holds the run config and every row of
  metrics.jsonl; the run resumed on its workdir logs into the same W&B run (its id kept there)."""
  from sdar_jax.run import trainer

  wandb_dir = wandb_offline_env(monkeypatch, tmp_path)
  workdir = str(tmp_path / "run")
  on = {"logging.wandb": True, "logging.wandb_tags": "test", "checkpoint.every": 1}
  on["train.max_failed_iterations"] = 10  # every env fails: rows without an update
  with pytest.raises(NothingTrainedError):  # every env failed: still logged, nothing exported
    trainer.run(_broken(2, broken_data, **on), workdir)
  with open(os.path.join(workdir, "wandb_run_id")) as f:
    run_id = f.read().strip()
  with pytest.raises(NothingTrainedError):
    trainer.run(_broken(3, broken_data, **on), workdir)  # resumes at checkpoint 2
  with open(os.path.join(workdir, "wandb_run_id")) as f:
    assert f.read().strip() == run_id

  first, resumed = wandb_offline_runs(wandb_dir, run_id)  # one folder per start, the same id
  rows = _rows(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows] == [1, 2, 3]
  np.testing.assert_equal(wandb_history(first), rows[:2])  # NaN == NaN here
  np.testing.assert_equal(wandb_history(resumed), rows[2:])
  with open(os.path.join(workdir, "config.json")) as f:
    config = json.load(f)  # the resumed run's (train.iterations=3)
  for records, iterations in ((first, 2), (resumed, 3)):
    meta = wandb_run_record(records)
    assert meta.run_id == run_id and meta.resume
    assert (meta.project, meta.display_name, list(meta.tags)) == ("sdar-jax", "run", ["test"])
    logged = {i.key: json.loads(i.value_json) for i in meta.config.update if i.key != "_wandb"}
    assert logged == {**config, "train": {**config["train"], "iterations": iterations}}


def test_second_trainer_on_a_workdir_is_refused(broken_data, tmp_path):
  from sdar_jax.run import trainer
  from sdar_jax.run.workdir_lock import WorkdirLock, WorkdirLockedError

  workdir = tmp_path / "run"
  refused = pytest.raises(WorkdirLockedError, match=f"pid {os.getpid()} on host")
  with WorkdirLock(workdir, purpose="training"), refused:
    trainer.Trainer(_broken(1, broken_data), str(workdir))
  assert sorted(os.listdir(workdir)) == []  # nothing written by the refused trainer


def test_max_staleness_is_refused_before_anything_is_written(tmp_path):
  from sdar_jax.run import trainer

  config = _config(1, **{"train.max_staleness": 2, "algo.recompute_old_logp": True})
  with pytest.raises(ValueError, match=r"train.max_staleness=2 with algo.recompute_old_logp"):
    trainer.Trainer(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_whole_split_in_batches_repeated_and_a_second_split(trained, tmp_path, monkeypatch):
  """eval.num_tasks=-1 plays every game of valid_seen (6, one per task type) in batches of 4 (a
  trailing batch of 2), twice over (eval.repeats=2), and valid_unseen as well under val_unseen/:
  each rate is over all of its prefix's episodes, as the outcomes file lists them. Killed in
  valid_unseen and run again, the evaluation plays only valid_unseen and gives the same row."""
  import copy

  from sdar_jax.observe.transcripts import read_outcomes
  from sdar_jax.run import trainer

  workdir, config, _ = trained
  protocol = copy.deepcopy(config)
  protocol.eval.num_tasks, protocol.eval.batch_size, protocol.eval.repeats = -1, 4, 2
  protocol.eval.splits = "valid_unseen"
  out = str(tmp_path / "eval")
  row = trainer.run_evaluation(protocol, out, (os.path.join(workdir, "checkpoints"), 3))
  for prefix, split in (("val", "valid_seen"), ("val_unseen", "valid_unseen")):
    outcomes = read_outcomes(os.path.join(out, f"outcomes_{prefix}.csv"))
    assert {r["split"] for r in outcomes} == {split}
    for k in (0, 1):  # every game, once per repeat
      assert sorted(r["task_id"] for r in outcomes if r["repeat"] == k) == list(range(6))
    assert row[f"{prefix}/success_rate"] == sum(r["success"] for r in outcomes) / 12
    assert row[f"{prefix}/success_rate_repeat_sd"] >= 0.0

  # Killed in its second split, run again: only that split is played, the row is the same.
  from sdar_jax.run import evaluation

  played, play, kill = [], evaluation.EvaluationMixin._play_validation, ["val_unseen"]

  def dies_in_unseen(self, loop, tasks, params, key, prefix):
    played.append(prefix)
    if prefix in kill:  # once
      kill.remove(prefix)
      raise _Killed
    return play(self, loop, tasks, params, key, prefix)

  again = str(tmp_path / "again")
  checkpoint = (os.path.join(workdir, "checkpoints"), 3)
  monkeypatch.setattr(evaluation.EvaluationMixin, "_play_validation", dies_in_unseen)
  with pytest.raises(_Killed):
    trainer.run_evaluation(protocol, again, checkpoint)
  parts = os.path.join(again, evaluation.FINISHED_PARTS)
  with open(parts) as f:
    killed_parts = f.read()
  resumed = trainer.run_evaluation(protocol, again, checkpoint)
  assert played == ["val"] * 2 + ["val_unseen"] * 3  # val's 2 repeats once; unseen again
  assert {k: v for k, v in resumed.items() if "seconds" not in k} == {
    k: v for k, v in row.items() if "seconds" not in k
  }
  assert not os.path.exists(parts)  # finished: evaluating again plays everything
  with open(parts, "w") as f:  # as the killed run left it
    f.write(killed_parts)
  other = copy.deepcopy(protocol)
  other.eval.seed = 5  # another evaluation into the folder reads nothing of that one's parts
  played.clear()
  kill.append("val")
  with pytest.raises(_Killed):
    trainer.run_evaluation(other, again, checkpoint)
  assert played == ["val"]  # played, not read back


def test_evaluation_with_lost_episodes_is_not_finished(trained, tmp_path, monkeypatch):
  """An evaluation-only run whose valid_unseen lost an episode to its env (as ENOSPC did on
  2026-12-06) exits with EvalEnvFailureError naming the mode and count, records valid_seen alone
  as finished and no finished evaluation; the same command then plays valid_unseen only and
  finishes. eval.max_env_failures=1 accepts the loss."""
  import copy

  from sdar_jax.run import evaluation, trainer
  from sdar_jax.run.guards import EvalEnvFailureError

  workdir, config, _ = trained
  protocol = copy.deepcopy(config)
  protocol.eval.num_tasks, protocol.eval.splits = 2, "valid_unseen"
  checkpoint = (os.path.join(workdir, "checkpoints"), 3)
  played, play, fail = [], evaluation.EvaluationMixin._play_validation, ["val_unseen"]

  def loses_one(self, loop, tasks, params, key, prefix):
    played.append(prefix)
    episodes = play(self, loop, tasks, params, key, prefix)
    if prefix in fail:  # once
      fail.remove(prefix)
      episodes[0].env_error = "OSError: [Errno 28] No space left on device"
    return episodes

  monkeypatch.setattr(evaluation.EvaluationMixin, "_play_validation", loses_one)
  out = str(tmp_path / "eval")
  with pytest.raises(EvalEnvFailureError, match="val_unseen 1 of its panel"):
    trainer.run_evaluation(protocol, out, checkpoint)
  assert not evaluation.eval_finished(out)
  with open(os.path.join(out, evaluation.FINISHED_PARTS)) as f:
    assert set(json.load(f)["parts"]) == {"val"}
  row = trainer.run_evaluation(protocol, out, checkpoint)
  assert played == ["val", "val_unseen", "val_unseen"] and row["val_unseen/env_failures"] == 0
  assert evaluation.eval_finished(out)

  accepting = copy.deepcopy(protocol)
  accepting.eval.max_env_failures = 1
  fail.append("val")
  row = trainer.run_evaluation(accepting, str(tmp_path / "accepted"), checkpoint)
  assert row["val/env_failures"] == 1
