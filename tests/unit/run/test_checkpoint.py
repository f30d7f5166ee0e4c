"""Checkpoints: round trip, keep-N, atomicity under a failed save, restore onto other meshes,
model-config mismatch, Hugging Face export."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import default
from sdar_jax.core import sharding
from sdar_jax.core.train_state import create_train_state, make_optimizer, train_state_shardings
from sdar_jax.models import ModelConfig, forward, init_params
from sdar_jax.run.checkpoint import (
  CheckpointManager,
  abstract_train_state,
  export_hf,
  model_config_mismatches,
)
from tests import hf_fixtures

TINY = hf_fixtures.SMALL_QWEN3


def _optimizer():
  return make_optimizer(lr=1e-2, clip_norm=1.0)


@jax.jit
def _trained_state_unsharded(seed: jax.Array):
  """A state after two real AdamW updates, so moments and counts are non-trivial."""
  opt = _optimizer()
  state = create_train_state(init_params(TINY, jax.random.key(seed), std=0.3), opt)
  for i in range(2):
    grads = jax.tree.map(lambda p, i=i: jnp.cos(p * (i + 1)), state.params)
    updates, opt_state = opt.update(grads, state.opt_state, state.params)
    state = state.replace(
      step=state.step + 1,
      params=optax.apply_updates(state.params, updates),
      opt_state=opt_state,
    )
  return state


def _trained_state(mesh, seed: int):
  """`_trained_state_unsharded(seed)` placed on `mesh` with the training shardings."""
  return jax.device_put(
    _trained_state_unsharded(jnp.int32(seed)),
    train_state_shardings(TINY, _optimizer(), mesh),
  )


def _assert_trees_equal(a, b):
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """A checkpoint dir holding steps 1..4 (keep=2) written from an fsdp-sharded (1, 8, 1) mesh."""
  directory = tmp_path_factory.mktemp("ckpt")
  mesh = sharding.make_mesh((1, 8, 1))
  states = {}
  with CheckpointManager(directory, keep=2) as ckpt:
    for step in range(1, 5):
      states[step] = _trained_state(mesh, seed=step)
      ckpt.save(
        step, states[step], TINY, run_config={"algo": {"beta": 5.0}}, extra={"replay": [step]}
      )
  return directory, states


def test_keep_n_and_steps(saved):
  directory, _ = saved
  ckpt = CheckpointManager(directory, keep=2)
  assert ckpt.all_steps() == [3, 4]
  assert ckpt.latest_step() == 4
  assert sorted(os.listdir(directory)) == ["3", "4"]


def test_round_trip_state_and_meta(saved):
  directory, states = saved
  mesh = sharding.make_mesh((1, 8, 1))
  target = abstract_train_state(TINY, _optimizer(), mesh)
  state, meta = CheckpointManager(directory).restore(step=3, target=target, model_config=TINY)
  _assert_trees_equal(state, states[3])
  assert meta["step"] == 3
  assert meta["run_config"] == {"algo": {"beta": 5.0}}
  assert meta["extra"] == {"replay": [3]}
  assert ModelConfig(**meta["model_config"]) == TINY
  assert int(state.step) == 2  # two updates were applied before saving


@pytest.mark.parametrize("shape", [(2, 2, 2), (1, 1, 1)], ids=["mesh222", "single_device"])
def test_restore_onto_other_mesh(saved, shape):
  directory, states = saved
  devices = jax.devices()[: int(np.prod(shape))]
  mesh = sharding.make_mesh(shape, devices=devices)
  target = abstract_train_state(TINY, _optimizer(), mesh)
  state, _ = CheckpointManager(directory).restore(target=target, model_config=TINY)
  _assert_trees_equal(state, states[4])
  for leaf, want in zip(jax.tree.leaves(state), jax.tree.leaves(target)):
    assert leaf.sharding.is_equivalent_to(want.sharding, leaf.ndim)
  if shape == (2, 2, 2):  # really re-sharded: the embedding is split over fsdp and tensor
    assert len(state.params["embed"].sharding.device_set) == 8
    assert state.params["embed"].addressable_shards[0].data.shape != state.params["embed"].shape


def test_resumed_update_equals_uninterrupted(saved):
  """One more optimizer update from the restored state equals the same update from the original."""
  directory, states = saved
  opt = _optimizer()
  mesh = sharding.make_mesh((2, 2, 2))
  state, _ = CheckpointManager(directory).restore(target=abstract_train_state(TINY, opt, mesh))

  @jax.jit
  def update(s):
    grads = jax.tree.map(jnp.sin, s.params)
    updates, _ = opt.update(grads, s.opt_state, s.params)
    return optax.apply_updates(s.params, updates)

  for x, y in zip(jax.tree.leaves(update(state)), jax.tree.leaves(update(states[4]))):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_other_model_config_is_refused(saved):
  directory, _ = saved
  other = TINY.replace(hidden_size=128, num_layers=1)
  with pytest.raises(ValueError) as e:
    CheckpointManager(directory).restore(model_config=other)
  msg = str(e.value)
  assert "hidden_size=64" in msg and "num_layers=2" in msg
  assert "hidden_size=128" in msg and "num_layers=1" in msg
  assert "vocab_size" not in msg  # only the differing fields are listed


def test_mismatch_ignores_numerics_only_fields():
  stored = TINY.__dict__.copy()
  assert model_config_mismatches(stored, TINY.replace(dtype="bfloat16", remat=True, name="x")) == []
  assert model_config_mismatches(stored, TINY.replace(qk_norm=False, family="qwen3")) == [
    ("qk_norm", True, False)
  ]


def test_missing_checkpoint_messages(tmp_path, saved):
  with pytest.raises(FileNotFoundError, match="No checkpoint in"):
    CheckpointManager(tmp_path / "empty").restore()
  with pytest.raises(FileNotFoundError, match=r"available steps: \[3, 4\]"):
    CheckpointManager(saved[0]).restore(step=1)


def test_failed_save_keeps_latest_good_checkpoint(tmp_path, monkeypatch):
  """A save that dies before its commit leaves the previous checkpoint the latest and intact."""
  from orbax.checkpoint._src.path import atomicity

  mesh = sharding.make_mesh((8, 1, 1))
  good = _trained_state(mesh, seed=1)
  with CheckpointManager(tmp_path, keep=3) as ckpt:
    ckpt.save(1, good, TINY)

  async def crash(self):
    raise RuntimeError("simulated crash before commit")

  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", crash)
  ckpt = CheckpointManager(tmp_path, keep=3)
  with pytest.raises(RuntimeError, match="simulated crash"):
    ckpt.save(2, _trained_state(mesh, seed=2), TINY)
    ckpt.wait_until_finished()
  monkeypatch.undo()
  leftovers = [d for d in os.listdir(tmp_path) if d != "1"]
  assert leftovers and all(".orbax-checkpoint-tmp" in d for d in leftovers)  # the half-written save

  fresh = CheckpointManager(tmp_path, keep=3)  # a restarted run
  assert fresh.all_steps() == [1]
  state, _ = fresh.restore(target=abstract_train_state(TINY, _optimizer(), mesh), model_config=TINY)
  _assert_trees_equal(state, good)
  assert os.listdir(tmp_path) == ["1"]  # the restart cleaned the unfinished save up
  fresh.save(2, good, TINY)
  assert fresh.all_steps() == [1, 2]


def test_async_save_then_restore(tmp_path):
  mesh = sharding.make_mesh((8, 1, 1))
  good = _trained_state(mesh, seed=3)
  run_config = default.get_config()  # a locked ConfigDict with a linked field
  with CheckpointManager(tmp_path, async_save=True, save_interval_steps=2) as ckpt:
    assert ckpt.save(2, good, TINY, run_config=run_config)
    assert not ckpt.save(3, good, TINY)  # off the interval
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [2]
  state, meta = CheckpointManager(tmp_path).restore(
    target=abstract_train_state(TINY, _optimizer(), mesh)
  )
  _assert_trees_equal(state, good)
  assert meta["run_config"] == run_config.to_dict()
  assert meta["run_config"]["algo"]["temperature"] == run_config.rollout.temperature


@pytest.mark.slow
def test_export_hf_loads_in_transformers(saved, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  directory, states = saved
  mesh = sharding.make_mesh((2, 2, 2))
  state, _ = CheckpointManager(directory).restore(
    target=abstract_train_state(TINY, _optimizer(), mesh)
  )
  out = export_hf(TINY, state.params, tmp_path / "hf")
  model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  tokens = np.random.default_rng(0).integers(0, TINY.vocab_size, (2, 7)).astype(np.int32)
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(tokens, dtype=torch.long)).logits.numpy()
  ours = np.asarray(forward(TINY, states[4].params, jnp.asarray(tokens)))
  assert np.abs(ours).max() > 0.1  # not a degenerate near-zero model
  np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=1e-4)


def test_train_state_holds_only_what_an_update_changes():
  """No field that nothing reads (the update needs no PRNG key: rollout keys come from the seed
  and the iteration); the EMA teacher's params only when algo.teacher_weights='ema'."""
  from sdar_jax.core.train_state import TrainState

  assert [f.name for f in dataclasses.fields(TrainState)] == [
    "step",
    "params",
    "opt_state",
    "skipped_updates",
    "ema_params",
  ]
  assert create_train_state(init_params(TINY, jax.random.key(0)), _optimizer()).ema_params is None


def test_restore_params_alone_onto_another_mesh(saved):
  """Evaluation reads the parameters only (no optimizer state), placed by the param rules."""
  directory, states = saved
  mesh = sharding.make_mesh((2, 2, 2))
  params, meta = CheckpointManager(directory, read_only=True).restore_params(TINY, mesh, step=3)
  assert meta["step"] == 3
  _assert_trees_equal(params, states[3].params)
  want = sharding.param_shardings(TINY, mesh)
  for leaf, s in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
    assert leaf.sharding.is_equivalent_to(s, leaf.ndim)
  # Cast to the evaluating run's param dtype.
  bf16 = TINY.replace(param_dtype="bfloat16")
  params, _ = CheckpointManager(directory, read_only=True).restore_params(bf16, mesh)
  for ours, stored in zip(jax.tree.leaves(params), jax.tree.leaves(states[4].params)):
    assert ours.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(stored).astype(jnp.bfloat16))
  with pytest.raises(ValueError, match="hidden_size=64"):
    CheckpointManager(directory, read_only=True).restore_params(TINY.replace(hidden_size=32))


def _tree_snapshot(root) -> dict[str, tuple[int, int]]:
  out = {}
  for folder, dirs, files in os.walk(root):
    for name in dirs + files:
      path = os.path.join(folder, name)
      st = os.stat(path)
      out[os.path.relpath(path, root)] = (st.st_mtime_ns, st.st_size if name in files else 0)
  return out


def test_read_only_manager_leaves_the_directory_untouched(tmp_path):
  """Reading a live run's checkpoints must not clean up the save it is writing right now."""
  import shutil

  mesh = sharding.make_mesh((8, 1, 1))
  with CheckpointManager(tmp_path / "ckpt", keep=3) as ckpt:
    ckpt.save(1, _trained_state(mesh, seed=1), TINY)
  in_progress = tmp_path / "ckpt" / "2.orbax-checkpoint-tmp-123"
  shutil.copytree(tmp_path / "ckpt" / "1", in_progress)  # a save another process is writing
  before = _tree_snapshot(tmp_path)
  reader = CheckpointManager(tmp_path / "ckpt", read_only=True)
  assert reader.all_steps() == [1]
  reader.restore_params(TINY, mesh)
  with pytest.raises(PermissionError, match="read-only"):
    reader.save(3, _trained_state(mesh, seed=1), TINY)
  reader.close()
  assert _tree_snapshot(tmp_path) == before
  assert in_progress.exists()
  CheckpointManager(tmp_path / "missing", read_only=True).close()
  assert not os.path.exists(tmp_path / "missing")  # not created


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_export_dir_has_the_umask_permissions(tmp_path, umask):
  """hf_export/ (and warm_start_policy/, same writer) get the mode os.makedirs would give."""
  params = init_params(TINY, jax.random.key(0))
  old = os.umask(umask)
  try:
    out = export_hf(TINY, params, tmp_path / "run" / "hf_export")
    os.makedirs(tmp_path / "reference")
  finally:
    os.umask(old)
  mode = os.stat(out).st_mode & 0o777
  assert mode == 0o777 & ~umask
  assert mode == os.stat(tmp_path / "reference").st_mode & 0o777


def test_an_ema_state_round_trips_and_a_checkpoint_without_one_starts_it_from_the_params(
  saved, tmp_path
):
  """algo.teacher_weights='ema': the EMA is checkpointed beside the params, restored bit-identically
  onto another mesh in the params' shardings; a checkpoint written without it (the `saved` ones,
  as before the field existed) restores into an EMA target with the EMA = the params."""
  directory, states = saved
  ema = jax.tree.map(lambda p: p * 0.5 + 0.25, states[4].params)  # any values but the params'
  with_ema = states[4].replace(ema_params=ema)
  with CheckpointManager(tmp_path / "ema") as ckpt:
    ckpt.save(1, with_ema, TINY)
  other = sharding.make_mesh((2, 2, 2))
  target = abstract_train_state(TINY, _optimizer(), other, ema=True)
  state, _ = CheckpointManager(tmp_path / "ema").restore(target=target, model_config=TINY)
  _assert_trees_equal(state, with_ema)
  for leaf, param in zip(jax.tree.leaves(state.ema_params), jax.tree.leaves(state.params)):
    assert leaf.sharding.is_equivalent_to(param.sharding, leaf.ndim)
  old, _ = CheckpointManager(directory).restore(step=4, target=target, model_config=TINY)
  _assert_trees_equal(old.replace(ema_params=None), states[4])
  _assert_trees_equal(old.ema_params, states[4].params)
