"""Sharded forward on 8 fake CPU devices equals the single-device forward."""

import dataclasses
import warnings

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from sdar_jax.core import sharding
from sdar_jax.models import ModelConfig, forward, init_params
from tests import hf_fixtures
from tests.helpers import TINY_CONFIG

CONFIG = dataclasses.replace(TINY_CONFIG, vocab_size=512)


@pytest.fixture(scope="module")
def reference():
  params = init_params(CONFIG, jax.random.key(0), std=0.1)
  tokens, mask = hf_fixtures.ragged_batch(CONFIG.vocab_size, [9, 3, 6, 1, 9, 2, 5, 7])
  return params, tokens, mask, np.asarray(forward(CONFIG, params, tokens, mask))


def test_eight_fake_devices():
  assert jax.device_count() == 8


@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 4, 1), (1, 2, 4), (2, 2, 2)])
def test_sharded_forward_equals_unsharded(reference, shape):
  params, tokens, mask, expected = reference
  mesh = sharding.make_mesh(shape)
  sharded = sharding.shard_params(params, CONFIG, mesh)
  q_spec = sharded["layers"]["q_proj"].sharding.spec
  if shape[2] > 1:
    assert "tensor" in jax.tree.leaves(tuple(q_spec))
  batch = sharding.batch_sharding(mesh)
  out = forward(CONFIG, sharded, jax.device_put(tokens, batch), jax.device_put(mask, batch))
  np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=0)


@pytest.mark.slow
def test_non_dividing_axis_replicates_with_warning():
  config = ModelConfig.tiny(
    "qwen2",
    vocab_size=256,
    hidden_size=56,
    intermediate_size=64,
    num_layers=1,
    num_heads=14,
    num_kv_heads=2,
    head_dim=4,
  )
  mesh = sharding.make_mesh((2, 1, 4))
  sharding._WARNED.clear()  # each fallback is reported once per process
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    shardings = sharding.param_shardings(config, mesh)
  messages = " ".join(str(w.message) for w in caught)
  assert "q_heads" in messages and "size 14" in messages
  assert shardings["layers"]["q_proj"].spec == P(None, None, None, None)
  assert shardings["layers"]["gate_proj"].spec == P(None, None, "tensor")  # 64 % 4 == 0
  params = init_params(config, jax.random.key(0), std=0.1)
  tokens, mask = hf_fixtures.ragged_batch(256, [4, 2])
  expected = np.asarray(forward(config, params, tokens, mask))
  placed = jax.device_put(params, shardings)
  np.testing.assert_allclose(np.asarray(forward(config, placed, tokens, mask)), expected, atol=2e-5)


def test_rule_collision_is_refused():
  rules = [(k, v) for k, v in sharding.DEFAULT_RULES if k != "mlp"] + [("mlp", "fsdp")]
  mesh = sharding.make_mesh((2, 2, 2))
  with pytest.raises(ValueError, match="collision.*'fsdp'"):
    sharding.param_shardings(CONFIG, mesh, rules)


def test_duplicate_and_unknown_rules_are_refused():
  mesh = sharding.make_mesh((8, 1, 1))
  with pytest.raises(ValueError, match="twice"):
    sharding.param_shardings(CONFIG, mesh, list(sharding.DEFAULT_RULES) + [("vocab", None)])
  with pytest.raises(ValueError, match="unknown mesh axes"):
    sharding.param_shardings(CONFIG, mesh, [("vocab", "model")])


def test_mesh_shape_errors_name_the_problem():
  with pytest.raises(ValueError, match="needs 6 devices but 8"):
    sharding.make_mesh((3, 2, 1))
  assert sharding.make_mesh({"data": -1, "tensor": 2}).shape == {"data": 4, "fsdp": 1, "tensor": 2}
  with pytest.raises(ValueError, match="Unknown mesh axes"):
    sharding.make_mesh({"model": 8})
  with pytest.raises(ValueError, match="axis sizes must be >= 1"):
    sharding.make_mesh((-2, -4, 1))  # the product is 8, but no axis may be negative
  with pytest.raises(ValueError, match="only one axis may be -1"):
    sharding.make_mesh((-1, -1, 8))


def test_mesh_resolution_and_batch_divisor():
  assert sharding.resolve_mesh_shape({"data": -1, "fsdp": 2, "tensor": 1}, 8) == {
    "data": 4,
    "fsdp": 2,
    "tensor": 1,
  }
  assert sharding.resolve_mesh_shape((2, -1, 2), 8) == {"data": 2, "fsdp": 2, "tensor": 2}
  # the batch splits over data x fsdp, not over tensor: from axis sizes and from a mesh alike
  assert sharding.batch_divisor({"data": 4, "fsdp": 2, "tensor": 2}) == 8
  assert sharding.batch_divisor(sharding.make_mesh((2, 2, 2))) == 4


def test_train_state_shardings_follow_the_params():
  """Adam's moments are placed like the parameters they track; step and counters replicated."""
  from sdar_jax.core.train_state import make_optimizer, train_state_shardings

  mesh = sharding.make_mesh((1, 2, 4))
  optimizer = make_optimizer()
  state = train_state_shardings(CONFIG, optimizer, mesh)
  params = sharding.param_shardings(CONFIG, mesh)
  adam = state.opt_state[1][0]  # chain(clip, chain(scale_by_adam, ...)): ScaleByAdamState
  assert jax.tree.leaves(adam.mu) == jax.tree.leaves(params)
  assert jax.tree.leaves(adam.nu) == jax.tree.leaves(params)
  assert adam.count.spec == P()
  assert state.step.spec == P() and state.skipped_updates.spec == P()
  assert state.params["embed"].spec == P("tensor", "fsdp")


def test_a_custom_rules_table_places_params_state_and_loaded_weights(tmp_path):
  """The `rules=` parameter (a logical-axis table other than DEFAULT_RULES) is honoured by the
  update's state shardings and by load_pretrained, not only by the default path."""
  from sdar_jax.algos import get_preset
  from sdar_jax.core.train_state import make_optimizer
  from sdar_jax.core.train_step import TrainStep
  from sdar_jax.models import load_pretrained, save_pretrained

  # Pure data parallelism: nothing sharded but the batch.
  custom = tuple(
    (name, ("data", "fsdp", "tensor") if name == "batch" else None)
    for name, _ in sharding.DEFAULT_RULES
  )
  mesh = sharding.make_mesh((1, 2, 4))
  step = TrainStep(CONFIG, get_preset("grpo"), make_optimizer(), mesh=mesh, rules=custom)
  state = step.state_shardings()
  for leaf in jax.tree.leaves(state.params):
    assert leaf.spec == P() or all(axis is None for axis in leaf.spec), leaf.spec
  assert sharding.batch_divisor(mesh, custom) == 8

  save_pretrained(CONFIG, init_params(CONFIG, jax.random.key(0)), tmp_path / "m")
  _, default_placed = load_pretrained(tmp_path / "m", mesh=mesh)
  _, custom_placed = load_pretrained(tmp_path / "m", mesh=mesh, rules=custom)
  assert default_placed["embed"].sharding.spec == P("tensor", "fsdp")
  assert all(axis is None for axis in custom_placed["embed"].sharding.spec)
