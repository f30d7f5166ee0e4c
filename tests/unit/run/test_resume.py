"""Save -> restore -> continue gives bit-identical parameters to an uninterrupted run (sharded)."""

import jax
import numpy as np
import pytest

from sdar_jax.core import sharding
from sdar_jax.core.train_state import make_optimizer
from sdar_jax.core.train_step import TrainStep
from sdar_jax.run.checkpoint import CheckpointManager, abstract_train_state
from tests.helpers import SDAR_LOSS, fresh_state, make_turn_batch, to_np


@pytest.mark.slow
def test_save_restore_continue_is_bit_identical(tmp_path, tiny_config, tiny_params):
  params = tiny_params
  mesh = sharding.make_mesh((2, 2, 2))
  optimizer = make_optimizer(lr=1e-3, warmup_iterations=2)
  step = TrainStep(tiny_config, SDAR_LOSS, optimizer, mesh=mesh, micro_batch_size=4)
  batches = [step.shard_batch(make_turn_batch(params, seed=20 + i)) for i in range(3)]

  state = step.shard_state(fresh_state(params, optimizer))
  for batch in batches:
    state, _ = step(state, batch)
  uninterrupted = to_np(state)

  state = step.shard_state(fresh_state(params, optimizer))
  state, _ = step(state, batches[0])
  with CheckpointManager(tmp_path / "ckpt", keep=2) as ckpt:
    ckpt.save(1, state, tiny_config)
  del state  # the "killed" run: only the checkpoint survives
  traces = step.num_traces

  with CheckpointManager(tmp_path / "ckpt", keep=2) as ckpt:
    assert ckpt.latest_step() == 1
    state, _ = ckpt.restore(
      target=abstract_train_state(tiny_config, optimizer, mesh), model_config=tiny_config
    )
  assert int(state.step) == 1
  for batch in batches[1:]:
    state, _ = step(state, batch)
  assert step.num_traces == traces  # the restored state has the step's exact shardings
  jax.tree.map(np.testing.assert_array_equal, to_np(state), uninterrupted)
  assert not np.array_equal(uninterrupted.params["embed"], np.asarray(params["embed"]))


def test_a_run_that_applied_no_update_is_refused_before_the_export():
  """Every env failed (no turn-sample: no update ran) or every update was skipped: the run does
  not end as if it had trained (NothingTrainedError, which the command turns into exit 2)."""
  from sdar_jax.run.guards import NothingTrainedError, RunGuards

  guards = RunGuards()
  guards.failure_kinds["x"] = "OSError: HOME is read-only (env 0, game g)"
  with pytest.raises(NothingTrainedError, match=r"2 iteration\(s\) ran and not one update"):
    guards.check_trained(2)
  guards.count_skipped(_State(), {"train/skipped_update": 1.0}, 1, 1, 1)
  with pytest.raises(NothingTrainedError, match="all 1 updates were skipped"):
    guards.check_trained(1)
  guards.count_skipped(_State(), {"train/skipped_update": 0.0}, 2, 1, 1)
  guards.check_trained(2)  # one applied update: trained
  RunGuards().check_trained(0)  # a resumed run with nothing left to train


class _State:
  skipped_in_a_row = 0
