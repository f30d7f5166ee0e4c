"""Run logging: metrics.jsonl rows after a resume, TensorBoard event files, progress lines, the
logging levels of the entry points."""

from __future__ import annotations

import glob
import json
import logging
import re
import struct
import subprocess
import sys
import textwrap

from sdar_jax.observe.metrics import FigureClock, MetricsLogger, read_history, validation_summary
from sdar_jax.observe.progress import Progress, configure_logging, format_duration


def _steps(path) -> list[int]:
  with open(path) as f:
    return [json.loads(line)["step"] for line in f]


def test_drop_rows_after_keeps_each_step_once(tmp_path):
  """A run killed after logging step 3 but before checkpoint 3 resumes at 2: row 3 goes, and the
  re-run of iteration 3 leaves one row per step."""
  logger = MetricsLogger(str(tmp_path))
  for step in range(4):
    logger.log(step, {"x": float(step)}, echo=False)
  with open(logger.path, "a") as f:
    f.write('{"step": 4, "x": ')  # torn by the kill mid-write
  assert logger.drop_rows_after(2) == 2
  assert _steps(logger.path) == [0, 1, 2]
  logger.log(3, {"x": 30.0}, echo=False)
  assert _steps(logger.path) == [0, 1, 2, 3]
  assert read_history(logger.path)[3]["x"] == 30.0
  assert logger.drop_rows_after(-1) == 4  # restart before any checkpoint: nothing is kept
  assert _steps(logger.path) == []


def _tfrecords(path):
  """The payloads of a TFRecord file (u64 length, u32 crc, data, u32 crc per record)."""
  with open(path, "rb") as f:
    data = f.read()
  pos = 0
  while pos < len(data):
    (n,) = struct.unpack("<Q", data[pos : pos + 8])
    yield data[pos + 12 : pos + 12 + n]
    pos += 12 + n + 4


def test_a_figure_is_drawn_again_after_plot_every_s_or_when_forced(tmp_path):
  """logging.plot_every_s=60: asked at t = 0, 30, 59, 60, 61, 125 s, metrics.png is drawn at 0,
  60 and 125 (each figure on its own clock), and at 61 only when forced; 0 draws every time;
  logging.plots=False never; a negative value is refused with the fix."""
  import pytest

  now = [0.0]
  clock = FigureClock(True, 60, clock=lambda: now[0])
  drawn = []
  for t in (0, 30, 59, 60, 61, 125):
    now[0] = t
    if clock.due("metrics"):
      drawn.append(t)
  assert drawn == [0, 60, 125]
  assert clock.due("histograms")  # a figure not drawn yet is due at once
  now[0] = 126
  assert not clock.due("metrics") and clock.due("metrics", force=True)
  assert all(FigureClock(True, 0, clock=lambda: 5.0).due("metrics") for _ in range(3))
  assert not FigureClock(False, 0).due("metrics", force=True)
  with pytest.raises(ValueError, match="plot_every_s=-1.*Fix"):
    FigureClock(True, -1)
  logger = MetricsLogger(str(tmp_path))
  logger.log(1, {"episode/success_rate": 0.5}, echo=False)
  clock = FigureClock(True, 60, clock=lambda: now[0])
  assert clock.draw_metrics(logger.path) == str(tmp_path / "metrics.png")
  assert clock.draw_metrics(logger.path, force=False) is None  # not due: nothing drawn
  assert (tmp_path / "metrics.png").stat().st_size > 0


def test_tensorboard_event_file_holds_the_scalars(tmp_path):
  from tensorboardX.proto import event_pb2

  logger = MetricsLogger(str(tmp_path), tensorboard=True)
  logger.log(1, {"train/loss": 0.5, "val/success_rate": 0.25}, echo=False)
  logger.log(2, {"train/loss": 0.125}, echo=False)
  logger.close()
  (events,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
  scalars = {}
  for payload in _tfrecords(events):
    event = event_pb2.Event.FromString(payload)
    for value in event.summary.value:
      scalars[(value.tag, event.step)] = value.simple_value
  assert scalars == {
    ("train/loss", 1): 0.5,
    ("val/success_rate", 1): 0.25,
    ("train/loss", 2): 0.125,
  }


def test_tensorboard_missing_is_a_warning_not_an_error(tmp_path, monkeypatch, caplog):
  import builtins

  real_import = builtins.__import__

  def no_tensorboardx(name, *args, **kwargs):
    if name == "tensorboardX":
      raise ImportError("no tensorboardX")
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, "__import__", no_tensorboardx)
  with caplog.at_level(logging.WARNING, logger="sdar_jax"):
    logger = MetricsLogger(str(tmp_path), tensorboard=True)
  assert "tensorboardX is not installed" in caplog.text
  logger.log(1, {"x": 1.0}, echo=False)
  assert _steps(logger.path) == [1]


def test_progress_line_elapsed_and_eta():
  """Iterations of 30 s after a first one of 100 s (compilation): the ETA uses the 30 s ones."""
  now = [1000.0]
  progress = Progress(total=10, clock=lambda: now[0])
  assert progress.eta(0) is None
  now[0] += 100.0
  assert progress.tick() == 100.0
  assert progress.eta(1) == 9 * 100.0
  for _ in range(2):
    now[0] += 30.0
    progress.tick()
  assert progress.elapsed == 160.0
  assert progress.eta(3) == 7 * 30.0
  assert progress.line(3, 30.0) == ("iteration 3/10 (30%) in 30.0s, elapsed 0:02:40, ETA 0:03:30")


def test_progress_after_resume_counts_remaining_iterations():
  now = [0.0]
  progress = Progress(total=10, clock=lambda: now[0])  # resumed after iteration 6
  now[0] += 12.0
  progress.tick()
  assert progress.eta(7) == 3 * 12.0


def test_format_duration():
  assert format_duration(4.0) == "4.0s"
  assert format_duration(59.0) == "59.0s"
  assert format_duration(3723.0) == "1:02:03"


def test_configure_logging_levels():
  ours, root = logging.getLogger("sdar_jax"), logging.getLogger()
  before = ours.level, root.level
  try:
    root.setLevel(logging.DEBUG)
    configure_logging(verbosity_given=True)  # --verbosity given: inherit absl's root level
    assert ours.level == logging.NOTSET and root.level == logging.DEBUG
    configure_logging(verbosity_given=False)  # default: our INFO lines, others' warnings
    assert ours.level == logging.INFO and root.level == logging.WARNING
  finally:
    ours.setLevel(before[0])
    root.setLevel(before[1])


def test_metrics_logger_echo_goes_through_logging(tmp_path, caplog):
  with caplog.at_level(logging.INFO, logger="sdar_jax"):
    MetricsLogger(str(tmp_path)).log(7, {"episode/success_rate": 0.5, "other": 1.0})
  (record,) = [r for r in caplog.records if r.name == "sdar_jax.observe.metrics"]
  assert record.getMessage() == "[iteration 7] episode/success_rate=0.5"


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "-c", textwrap.dedent(code), *args],
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  )


_ABSL_PROGRAM = """
  import logging
  from absl import app

  def main(argv):
    from sdar_jax.observe.progress import ensure_log_handler

    ensure_log_handler()  # what the Trainer does first
    logging.getLogger("sdar_jax.run.trainer").info("iteration 1/3")
    logging.getLogger("orbax").info("orbax detail")

  app.run(main)
"""


def test_absl_program_shows_our_info_lines_with_timestamps():
  """`python -m sdar_jax.train` shape: absl's handler, default verbosity. Our INFO lines show with
  absl's time prefix; other libraries' INFO stays hidden; --verbosity=-1 hides ours too."""
  out = _python(_ABSL_PROGRAM)
  (line,) = [x for x in out.stderr.splitlines() if "iteration 1/3" in x]
  assert re.match(r"I\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] iteration 1/3$", line), line
  assert "orbax detail" not in out.stderr
  quiet = _python(_ABSL_PROGRAM, "--verbosity=-1")
  assert "iteration 1/3" not in quiet.stderr
  loud = _python(_ABSL_PROGRAM, "--verbosity=0")
  assert "iteration 1/3" in loud.stderr and "orbax detail" in loud.stderr


def test_library_use_gets_a_timestamped_handler():
  out = _python(
    """
    import logging
    from sdar_jax.observe.progress import ensure_log_handler

    ensure_log_handler()
    logging.getLogger("sdar_jax.run.trainer").info("iteration 1/3")
    """
  )
  line = out.stderr.strip()
  assert re.match(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d I sdar_jax.run.trainer\] iteration 1/3$", line
  ), line


def test_validation_summary_reads_the_first_and_last_evaluation(tmp_path):
  path = tmp_path / "metrics.jsonl"
  rows = [
    {"step": 0, "val/success_rate": 0.125},
    {"step": 1, "train/loss": 1.0},
    {"step": 5, "val/success_rate": 0.25},
    {"step": 10, "val/success_rate": 0.375},
  ]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows[:1]) + "{torn\n")
  assert validation_summary(str(path)) is None  # one evaluation only; the torn line is skipped
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert validation_summary(str(path)) == (
    "validation success_rate 0.125 (iteration 0) -> 0.375 (iteration 10), change +0.250"
  )


# ------------------------------------------------------------------ validation rates, outcomes
def _episodes(outcomes, task_type="pick", start=0):
  from sdar_jax.rollout.trajectory import Episode

  return [
    Episode(k, task_id=start + k, group_id=k, task_type=task_type, won=w, reward=10.0 * w)
    for k, w in enumerate(outcomes)
  ]


def test_rates_weigh_every_episode_the_same_and_the_macro_mean_weighs_types():
  """An evaluation played in two batches, 8 episodes (2 won) then a trailing 1 (won), or by two
  processes with unequal shares: the rate is over the 9 episodes, 3/9, not the mean of the
  batches' rates (0.625). The macro rate is the mean of the task types' rates."""
  from sdar_jax.observe.metrics import rollout_metrics

  batches = _episodes([1, 1, 0, 0, 0, 0, 0, 0]) + _episodes([1], task_type="heat", start=8)
  m = rollout_metrics(batches, prefix="val")
  assert m["val/success_rate"] == 3 / 9
  assert m["val/pick_success_rate"] == 2 / 8 and m["val/heat_success_rate"] == 1.0
  assert m["val/macro_success_rate"] == (2 / 8 + 1.0) / 2


def test_outcomes_file_round_trips_one_row_per_finished_episode(tmp_path):
  from sdar_jax.observe.transcripts import OUTCOME_COLUMNS, read_outcomes, write_outcomes

  episodes = _episodes([0, 1, 1])
  episodes[0].gamefile = "valid_seen/pick-Egg-1/game.tw-pddl"
  episodes[2].env_error = "RuntimeError: boom"  # no outcome, no row
  path = write_outcomes(
    str(tmp_path), "val", episodes[::-1], arm="sdar", seed=2, step=8, split="valid_seen"
  )
  with open(path) as f:
    assert f.readline().strip() == ",".join(OUTCOME_COLUMNS)
  rows = read_outcomes(path)
  assert [(r["task_id"], r["success"], r["reward"]) for r in rows] == [(0, 0, 0.0), (1, 1, 10.0)]
  assert rows[0]["gamefile"] == "valid_seen/pick-Egg-1/game.tw-pddl"
  assert [r["turns"] for r in rows] == [len(episodes[0].turns), len(episodes[1].turns)]
  assert {(r["arm"], r["seed"], r["step"], r["split"]) for r in rows} == {
    ("sdar", 2, 8, "valid_seen")
  }


def test_progress_bars_only_on_a_terminal():
  """A log file gets no tqdm frames: bars are drawn only when stderr is a terminal."""
  import io

  from sdar_jax.infra.console import show_progress_bars

  class Terminal(io.StringIO):
    def isatty(self):
      return True

  assert show_progress_bars(True, Terminal()) and not show_progress_bars(False, Terminal())
  assert not show_progress_bars(True, io.StringIO())  # a file or a pipe


def test_a_long_call_writes_a_progress_line_to_a_log_every_so_often():
  """Without a terminal a call's progress goes to the log: nothing before `every` seconds, then
  at most a line per `every` seconds, with the count, the state and the time elapsed."""
  import io
  import logging

  from sdar_jax.infra import console

  lines, now = [], [0.0]
  handler = logging.Handler()
  handler.emit = lambda record: lines.append(record.getMessage())
  console.log.addHandler(handler)
  old_level, console.log.level = console.log.level, logging.INFO
  try:
    progress = console.Progress(
      50, "heldout_seen", every=60, stream=io.StringIO(), clock=lambda: now[0]
    )
    for seconds in (30, 59, 61, 100, 125, 190):
      now[0] = seconds
      progress.update(1, active=600, won=31)
    progress.to(20)
    progress.close()
    quiet = console.Progress(50, "quiet", wanted=False, every=0, stream=io.StringIO())
    quiet.update(3)  # a loop told not to show progress writes nothing
  finally:
    console.log.removeHandler(handler)
    console.log.level = old_level
  assert lines == [
    "heldout_seen: turn 3/50 (active 600, won 31), 0:01:01 elapsed",
    "heldout_seen: turn 5/50 (active 600, won 31), 0:02:05 elapsed",
    "heldout_seen: turn 6/50 (active 600, won 31), 0:03:10 elapsed",
  ]
