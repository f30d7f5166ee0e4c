"""Remote workdirs: a run whose workdir is gs:// writes everything there and nothing locally,
resumes from its remote checkpoint, and only the primary process writes the run's files.

The bucket is the fake GCS of tests/fake_gcs.py: one in-memory store behind both fsspec (what
etils.epath and sdar_jax.infra.paths use for gs://) and a local HTTP server speaking the GCS JSON
API (what TensorStore uses for orbax's checkpoint arrays), so the gs:// code paths run unchanged.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from sdar_jax.infra import paths
from tests.fake_gcs import fake_gcs
from tests.helpers import tiny_run_config


@pytest.fixture
def bucket():
  with fake_gcs() as store:
    yield store


# ------------------------------------------------------------------------------------ paths
def test_url_stays_a_url_and_local_paths_become_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert paths.resolve("gs://b/runs/x/") == "gs://b/runs/x"
  assert paths.resolve("runs/x") == os.path.join(str(tmp_path), "runs", "x")
  assert paths.join("gs://b/runs/", "x", "metrics.jsonl") == "gs://b/runs/x/metrics.jsonl"
  assert paths.join("runs", "x") == os.path.join("runs", "x")
  assert paths.is_remote("gs://b/x") and not paths.is_remote("C:/x") and not paths.is_remote("x")


def test_unsupported_scheme_and_missing_package_are_refused_with_the_fix(monkeypatch):
  with pytest.raises(ValueError, match=r"workdir='s3://b/run'.*Fix: use a gs:// path"):
    paths.check_remote_workdir("s3://b/run")
  with fake_gcs():  # fsspec's gs filesystem is there; the extra module is not
    monkeypatch.setitem(paths.EXTRA_MODULES, "gs", (("no_such_module_xyz", "some-package"),))
    with pytest.raises(ImportError, match=r'needs some-package.*pip install -e "\.\[gcs\]"'):
      paths.check_remote_workdir("gs://b/run", "checkpoint.dir")
  paths.check_remote_workdir("/local/run")  # a local path passes


def test_text_files_on_the_bucket(bucket):
  paths.write_text("gs://b/run/config.json", '{"a": 1}')
  paths.append_text("gs://b/run/metrics.jsonl", '{"step": 0}\n')
  paths.append_text("gs://b/run/metrics.jsonl", '{"step": 1}\n')
  assert bucket.objects["b/run/metrics.jsonl"][0] == b'{"step": 0}\n{"step": 1}\n'
  assert paths.read_text("gs://b/run/config.json") == '{"a": 1}'
  assert paths.isfile("gs://b/run/config.json") and paths.isdir("gs://b/run")
  assert paths.listdir("gs://b/run") == ["config.json", "metrics.jsonl"]
  paths.remove("gs://b/run/config.json")
  paths.remove("gs://b/run/config.json")  # already gone: no error
  assert not paths.exists("gs://b/run/config.json")


def test_staged_outputs_are_copied_up_and_the_temporary_folder_removed(bucket, tmp_path):
  with paths.staged_output("gs://b/run/plot.png") as local:
    assert not paths.is_remote(local)
    with open(local, "wb") as f:
      f.write(b"png")
  with paths.staged_output("gs://b/run/export") as local_dir:
    os.makedirs(os.path.join(local_dir, "sub"))
    for rel, data in (("config.json", b"{}"), ("model.bin", b"w"), ("sub/t.txt", b"t")):
      with open(os.path.join(local_dir, rel), "wb") as f:
        f.write(data)
  assert not os.path.exists(local) and not os.path.exists(local_dir)
  assert bucket.objects["b/run/plot.png"][0] == b"png"
  names = bucket.names("b/run/export/")
  assert names == [
    "b/run/export/config.json",
    "b/run/export/model.bin",
    "b/run/export/sub/t.txt",
  ]
  # config.json was written last: its generation is the highest of the export's objects
  generations = {n: bucket.objects[n][1] for n in names}
  assert max(generations, key=generations.get) == "b/run/export/config.json"
  with paths.local_copy("gs://b/run/export") as copy, open(f"{copy}/sub/t.txt", "rb") as f:
    assert f.read() == b"t"
  assert not os.path.exists(copy)
  with paths.staged_output(str(tmp_path / "a" / "plot.png")) as local:  # local: the path itself
    assert local == str(tmp_path / "a" / "plot.png") and os.path.isdir(tmp_path / "a")


def test_local_mirror_copies_new_and_grown_files(bucket):
  mirror = paths.LocalMirror("gs://b/run/tb")
  with open(os.path.join(mirror.local, "events"), "ab") as f:
    f.write(b"1")
  mirror.sync()
  assert bucket.objects["b/run/tb/events"][0] == b"1"
  with open(os.path.join(mirror.local, "events"), "ab") as f:
    f.write(b"2")
  mirror.close()
  assert bucket.objects["b/run/tb/events"][0] == b"12"
  assert not os.path.exists(mirror.local)


def test_collecting_a_sweep_on_the_bucket_matches_collecting_it_locally(bucket, tmp_path):
  """The same two runs, one copy local and one in the bucket: the same table, the plot and the
  launcher's run record written next to them."""
  from sdar_jax.observe import collect

  v = "val/success_rate"
  runs = {
    "beta=1.0,gate=gap": (1.0, [{"step": 0, v: 0.0}, {"step": 4, v: 0.5}]),
    "beta=5.0,gate=gap": (5.0, [{"step": 0, v: 0.25}, {"step": 2, v: 0.75}]),
  }
  for root in (str(tmp_path / "sweep"), "gs://b/sweep"):
    for name, (beta, rows) in runs.items():
      config = {"algo": {"name": "sdar", "gate": "gap", "beta": beta, "lam": 0.01}}
      config["train"] = {"seed": 0, "iterations": 4}
      paths.write_text(paths.join(root, name, "config.json"), json.dumps(config))
      paths.write_text(
        paths.join(root, name, "metrics.jsonl"), "".join(json.dumps(r) + "\n" for r in rows)
      )
  local = collect.collect_sweep(str(tmp_path / "sweep"))
  remote = collect.collect_sweep("gs://b/sweep")
  assert remote == {k: f"gs://b/sweep/sweep.{k}" for k in ("csv", "md", "png")}
  with open(local["csv"]) as f:
    assert paths.read_text(remote["csv"]) == f.read()
  with open(local["md"]) as f:  # the same table; only the root named in the title differs
    assert paths.read_text(remote["md"]).split("\n")[1:] == f.read().split("\n")[1:]
  assert bucket.objects["b/sweep/sweep.png"][0].startswith(b"\x89PNG")
  run = "gs://b/sweep/beta=5.0,gate=gap"  # last step 2 of 4
  assert collect.run_state(run) == "partial" and collect.run_state("gs://b/sweep/none") == "new"
  assert collect.run_and_record(["true"], run, runner=lambda *a, **k: 0, clock=lambda: 7.0) == 0
  assert collect.read_status(run)["finished"] is True and collect.run_state(run) == "finished"


# ------------------------------------------------------------------------------------ runs
def _run_config(iterations: int, **overrides):
  settings = {
    "train.eval_every": 1,
    "checkpoint.every": 1,
    "checkpoint.export_hf": True,
    "logging.plots": True,
    "logging.tensorboard": True,
  }
  return tiny_run_config(iterations, **{**settings, **overrides})


def _rows(text: str) -> list[dict]:
  return [json.loads(line) for line in text.splitlines()]


@pytest.mark.slow
def test_a_run_on_gs_writes_everything_there_and_resumes(bucket, tmp_path, monkeypatch):
  """One iteration, then a resume to two, in gs://bucket/runs/r: config.json, metrics, plots,
  TensorBoard events, diagnostics, the token view, checkpoints and the HF export all land in the
  bucket; an evaluation of its latest checkpoint writes its results there too; the working
  directory and the temporary folder stay empty (no local 'gs:' folder)."""
  from sdar_jax.run import evaluation as evaluate
  from sdar_jax.run import trainer
  from sdar_jax.run.checkpoint import CheckpointManager

  cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
  cwd.mkdir()
  tmp.mkdir()
  monkeypatch.chdir(cwd)
  monkeypatch.setattr(tempfile, "tempdir", str(tmp))
  workdir = "gs://bucket/runs/r"

  trainer.run(_run_config(1), workdir)
  names = set(bucket.names("bucket/runs/r/"))
  rel = {n[len("bucket/runs/r/") :] for n in names}
  for expected in (
    "config.json",
    "metrics.jsonl",
    "metrics.png",
    "diagnostics/histograms.jsonl",
    "diagnostics/histograms.png",
    "diagnostics/histograms_step_1.png",
    "eval/step_1/tokens.html",
    "eval/step_1/episodes_val.jsonl",
    "checkpoints/1/commit_success.txt",
    "hf_export/config.json",
    "hf_export/model.safetensors",
  ):
    assert expected in rel, expected
  assert any(r.startswith("events.out.tfevents") for r in rel)  # TensorBoard, copied up
  assert any(r.startswith("checkpoints/1/state/") for r in rel)  # the arrays, via TensorStore
  assert ".sdar_jax.lock" not in rel  # no lock on a remote workdir
  assert [r["step"] for r in _rows(paths.read_text(workdir + "/metrics.jsonl"))] == [0, 1]
  assert json.loads(paths.read_text(workdir + "/config.json"))["train"]["iterations"] == 1
  assert os.listdir(cwd) == [] and os.listdir(tmp) == []

  # Resume: the remote checkpoint of iteration 1 is restored, iteration 2 is trained.
  trainer.run(_run_config(2), workdir)
  rows = _rows(paths.read_text(workdir + "/metrics.jsonl"))
  assert [r["step"] for r in rows] == [0, 1, 2]
  with CheckpointManager(workdir + "/checkpoints", read_only=True) as ckpt:
    assert ckpt.all_steps() == [1, 2]
    assert ckpt.restore_meta()["extra"]["loop"]["iteration"] == 2

  # Evaluating the remote run's latest checkpoint writes its results next to it, in the bucket.
  config = _run_config(2)
  plan = evaluate.plan_evaluation(config, workdir)
  assert plan.params_from == (workdir + "/checkpoints", 2)
  assert plan.output == workdir + "/evaluations/step_2"
  row = trainer.run_evaluation(config, plan.output, plan.params_from)
  assert row["step"] == 2 and row["val/success_rate"] == rows[-1]["val/success_rate"]
  record = json.loads(paths.read_text(plan.output + "/evaluation.json"))
  assert record["evaluated"] == {"checkpoint_dir": workdir + "/checkpoints", "step": 2}
  assert [r["step"] for r in _rows(paths.read_text(plan.output + "/metrics.jsonl"))] == [2]
  with pytest.raises(evaluate.EvaluationError, match="s3:// paths are not supported"):
    evaluate.plan_evaluation(config, workdir, output="s3://b/out")
  assert os.listdir(cwd) == [] and os.listdir(tmp) == []


@pytest.mark.slow
def test_only_the_primary_process_writes_the_runs_files(tmp_path, monkeypatch):
  """A process that is not the primary one writes checkpoints (orbax coordinates every process)
  and nothing else: no config.json, metrics, plots, TensorBoard events, diagnostics, token view,
  export or lock file."""
  from sdar_jax.run import trainer

  monkeypatch.setattr(paths, "is_primary_process", lambda: False)
  workdir = tmp_path / "run"
  last = trainer.run(_run_config(1), str(workdir))
  assert last["step"] == 1 and "train/loss" in last  # the rows are computed all the same
  assert os.listdir(workdir) == ["checkpoints"]
  assert "1" in os.listdir(workdir / "checkpoints")
