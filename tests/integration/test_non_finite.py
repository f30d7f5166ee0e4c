"""Weights that hold NaN or infinity: refused when a Hugging Face folder is loaded (naming the file
and the tensor), when a checkpoint is restored and when a policy would be exported; a run whose
updates keep being skipped (non-finite loss or gradient) stops at `train.max_skipped_updates`."""

from __future__ import annotations

import json
import os
import struct
import types

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from sdar_jax.core.train_state import create_train_state, make_optimizer
from sdar_jax.infra.errors import UserError
from sdar_jax.models import init_params, load_pretrained, save_pretrained
from sdar_jax.models.hf_io import NonFiniteWeightsError, all_finite, first_non_finite
from sdar_jax.run import trainer
from sdar_jax.run.checkpoint import CheckpointManager, abstract_train_state, export_hf
from sdar_jax.run.guards import RunGuards, SkippedUpdatesError
from sdar_jax.run.resume import LoopState
from tests.helpers import SMALL_QWEN3


@pytest.fixture(scope="module")
def params():
  return init_params(SMALL_QWEN3, jax.random.key(0))


def _poke(path: str, tensor: str, flat_index: int, value: float) -> None:
  """Overwrites element `flat_index` of `tensor` in a float32 safetensors file."""
  with open(path, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(n))
  assert header[tensor]["dtype"] == "F32"
  begin = 8 + n + header[tensor]["data_offsets"][0] + 4 * flat_index
  with open(path, "r+b") as f:
    f.seek(begin)
    f.write(struct.pack("<f", value))


def _with(params, ours: tuple, index: tuple, value: float):
  """A copy of `params` whose leaf at path `ours` holds `value` at `index`."""
  node = params
  for key in ours[:-1]:
    node = node[key]
  out = jax.tree.map(lambda x: x, params)  # new containers, same arrays
  target = out
  for key in ours[:-1]:
    target = target[key]
  target[ours[-1]] = node[ours[-1]].at[index].set(value)
  return out


def test_all_finite_matches_numpy_on_every_float_dtype():
  rng = np.random.default_rng(0)
  for dtype in (np.float32, np.float16, ml_dtypes.bfloat16, np.float64):
    x = rng.normal(size=(7, 5)).astype(dtype)
    assert all_finite(x) == bool(np.isfinite(x.astype(np.float64)).all()) is True
    for bad in (np.nan, np.inf, -np.inf):
      y = x.copy()
      y[3, 2] = bad
      assert all_finite(y) is False
  big = np.full((1000,), np.finfo(np.float32).max, np.float32)  # a finite sum in float64
  assert all_finite(big) and all_finite(np.arange(5))


def test_loading_names_the_file_and_the_tensor(params, tmp_path):
  out = save_pretrained(SMALL_QWEN3, params, tmp_path / "model")
  weights = os.path.join(out, "model.safetensors")
  name = "model.layers.1.mlp.down_proj.weight"
  _poke(weights, name, 17, float("nan"))
  with pytest.raises(NonFiniteWeightsError) as e:
    load_pretrained(out)
  assert isinstance(e.value, UserError)
  msg = str(e.value)
  assert weights in msg and repr(name) in msg and "NaN or infinite" in msg and "Fix:" in msg


def test_loading_in_bfloat16_refuses_a_value_beyond_its_range(params, tmp_path):
  out = save_pretrained(SMALL_QWEN3, params, tmp_path / "model")
  _poke(os.path.join(out, "model.safetensors"), "model.norm.weight", 0, 3.4e38)  # finite in f32
  load_pretrained(out, dtype="float32")
  with pytest.raises(NonFiniteWeightsError, match="'model.norm.weight'.*bfloat16"):
    load_pretrained(out, dtype="bfloat16")


def test_first_non_finite_names_the_hugging_face_tensor(params):
  assert first_non_finite(SMALL_QWEN3, params) is None
  cases = [
    (("layers", "down_proj"), (1, 3, 4), np.inf, "model.layers.1.mlp.down_proj.weight"),
    (("layers", "q_proj"), (0, 0, 1, 2), np.nan, "model.layers.0.self_attn.q_proj.weight"),
    (("final_norm",), (5,), -np.inf, "model.norm.weight"),
  ]
  for path, index, value, name in cases:
    assert first_non_finite(SMALL_QWEN3, _with(params, path, index, value)) == name
  # two bad tensors: the first in checkpoint order (the embedding, then layer by layer)
  both = _with(_with(params, ("layers", "up_proj"), (1, 0, 0), np.nan), ("embed",), (2, 3), np.nan)
  assert first_non_finite(SMALL_QWEN3, both) == "model.embed_tokens.weight"


def test_a_non_finite_policy_is_never_exported(params, tmp_path):
  out = tmp_path / "hf_export"
  export_hf(SMALL_QWEN3, params, out)
  before = sorted(os.listdir(out))
  bad = _with(params, ("layers", "v_proj"), (1, 0, 0, 0), np.nan)
  with pytest.raises(NonFiniteWeightsError, match="'model.layers.1.self_attn.v_proj.weight'"):
    export_hf(SMALL_QWEN3, bad, out)
  assert sorted(os.listdir(out)) == before  # the earlier export is untouched
  assert sorted(os.listdir(tmp_path)) == ["hf_export"]  # no half-written folder is left
  np.testing.assert_array_equal(
    np.asarray(load_pretrained(out)[1]["layers"]["v_proj"]), np.asarray(params["layers"]["v_proj"])
  )


def test_restoring_a_non_finite_checkpoint_names_it(params, tmp_path):
  optimizer = make_optimizer(lr=1e-3)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
  good = create_train_state(params, optimizer)
  bad = good.replace(params=_with(params, ("lm_head",), (0, 0), np.nan))
  directory = str(tmp_path / "ckpt")
  with CheckpointManager(directory, keep=None) as ckpt:
    ckpt.save(1, good, SMALL_QWEN3)
    ckpt.save(2, bad, SMALL_QWEN3)
  target = abstract_train_state(SMALL_QWEN3, optimizer, mesh)
  with CheckpointManager(directory, read_only=True) as ckpt:
    state, _ = ckpt.restore(step=1, target=target, model_config=SMALL_QWEN3)
    assert first_non_finite(SMALL_QWEN3, state.params) is None
  # a manager per kind of restore (orbax binds a manager's item to the first kind it reads)
  for restore in (
    lambda ckpt: ckpt.restore(target=target, model_config=SMALL_QWEN3),
    lambda ckpt: ckpt.restore_params(SMALL_QWEN3, mesh),
  ):
    with (
      CheckpointManager(directory, read_only=True) as ckpt,
      pytest.raises(NonFiniteWeightsError) as e,
    ):
      restore(ckpt)
    msg = str(e.value)
    assert f"{directory}/2" in msg and "'lm_head.weight'" in msg and "--step=1" in msg


def _counter(limit: int, latest: int | None = 4):
  """What `RunGuards.count_skipped` reads: the config's limit, the loop state, the checkpoints."""
  guards = RunGuards({"max_skipped_updates": limit})
  fake = types.SimpleNamespace(loop_state=LoopState())
  return fake, lambda skipped, it=5, k=1, n=2: guards.count_skipped(
    fake.loop_state, {"train/skipped_update": np.float32(skipped)}, it, k, n, lambda: latest
  )


def test_skipped_updates_in_a_row_stop_the_run():
  fake, update = _counter(3)
  for skipped in (1, 1, 0, 1, 1):  # a good update resets the count
    update(skipped)
  assert fake.loop_state.skipped_in_a_row == 2
  with pytest.raises(SkippedUpdatesError) as e:
    update(1, it=6, k=2, n=3)
  assert isinstance(e.value, UserError)
  msg = str(e.value)
  assert "3 updates in a row were skipped" in msg and "iteration 6, update 2 of 3" in msg
  assert "train.max_skipped_updates=3" in msg and "iteration 4) is kept" in msg
  assert "max_skipped_updates=0 never stops" in msg
  fake, update = _counter(0, latest=None)
  for _ in range(50):
    update(1)
  assert fake.loop_state.skipped_in_a_row == 50


def test_max_skipped_updates_is_validated():
  from configs import default
  from sdar_jax.run import setup

  config = default.get_config()
  assert config.train.max_skipped_updates == 3
  for value, bad in ((0, False), (7, False), (-1, True)):
    config.train.max_skipped_updates = value
    problems = [p for p in setup.setting_problems(config) if "max_skipped_updates" in p]
    assert bool(problems) == bad, (value, problems)
  assert "use 0 to never stop" in problems[0]


class _NanAdvantages:
  """The run's update, given advantages that are NaN: its loss is not finite, so every update is
  skipped (the state stays as it was)."""

  def __init__(self, step_fn):
    self._step_fn = step_fn

  def __getattr__(self, name):
    return getattr(self._step_fn, name)

  def __call__(self, state, batch, *args, **kwargs):
    nan = batch.replace(advantages=jnp.full_like(batch.advantages, jnp.nan))
    return self._step_fn(state, nan, *args, **kwargs)


@pytest.mark.slow
def test_a_run_whose_updates_keep_failing_stops_and_keeps_its_checkpoints(tmp_path):
  """The probe of a run that trained to the end, exit 0, with every update skipped: from its
  second iteration on the loss is NaN; the run stops at train.max_skipped_updates (1 here, so at
  its first skipped update), before any later checkpoint, and exports nothing. The checkpoint of
  iteration 1 restores with finite parameters."""
  from tests.helpers import tiny_run_config

  workdir = str(tmp_path / "run")
  config = tiny_run_config(
    6,
    **{
      "train.eval_before_train": False,
      "train.eval_every": 0,
      "checkpoint.every": 1,
      "checkpoint.export_hf": True,
      "train.max_skipped_updates": 1,
    },
  )
  run = trainer.Trainer(config, workdir)
  real = run.train_iteration

  def failing_from_the_second(stop=None):
    if run.loop_state.iteration == 1:
      run.step_fn = _NanAdvantages(run.step_fn)
    return real(stop)

  run.train_iteration = failing_from_the_second
  try:
    with pytest.raises(SkippedUpdatesError, match="max_skipped_updates=1") as e:
      run.run()
    stopped_at = run.loop_state.iteration + 1  # the iteration that raised
  finally:
    run.close()
  assert stopped_at == 2 and "the last at iteration 2, update 1 of" in str(e.value)
  assert not os.path.exists(os.path.join(workdir, "hf_export"))
  with CheckpointManager(os.path.join(workdir, "checkpoints"), read_only=True) as ckpt:
    assert ckpt.all_steps() == [1]
    params, _ = ckpt.restore_params(run.model_config)
  assert first_non_finite(run.model_config, params) is None
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows] == [1] and rows[0]["train/skipped_update"] == 0
