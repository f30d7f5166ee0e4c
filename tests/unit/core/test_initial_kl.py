"""The KL from the initial policy as a measure (`algo.measure_kl`): logged as `actor/kl_loss` with
kl_coef 0 and the loss left unchanged. Truth: the k3 estimator in float64 numpy on the two tiny
models' log-probs of the full-logits `forward` (tests.helpers.full_logp)."""

import dataclasses

import jax
import numpy as np
import pytest

from sdar_jax.algos import AlgoConfig, get_preset
from sdar_jax.core.loss import loss_and_grads
from sdar_jax.models import init_params
from tests.helpers import RESPONSE_LEN as R
from tests.helpers import TINY_CONFIG as CONFIG
from tests.helpers import full_logp
from tests.helpers import make_turn_batch as make_batch


def _algo(**changes) -> AlgoConfig:
  return dataclasses.replace(get_preset("grpo"), **changes)


def test_measured_kl_is_k3_to_the_initial_policy_and_leaves_the_loss(tiny_params):
  # the initial policy: the student's weights moved by noise (so the KL is clearly above 0)
  noise = init_params(CONFIG, jax.random.key(7), std=0.02)
  initial = jax.tree.map(lambda a, b: a + b, tiny_params, noise)
  batch = make_batch(tiny_params, seed=3)
  algo = _algo(kl_coef=0.0, measure_kl=True)
  assert algo.needs_ref_params and algo.measures_kl
  assert not _algo(kl_coef=0.0).needs_ref_params  # off by default: nothing kept

  run = jax.jit(
    lambda a, p, ref: loss_and_grads(CONFIG, a, p, batch, micro_batch_size=4, ref_params=ref),
    static_argnums=0,
  )
  grads, metrics = run(algo, tiny_params, initial)
  plain_grads, plain = run(_algo(kl_coef=0.0), tiny_params, None)

  student, _ = full_logp(tiny_params, np.asarray(batch.student_tokens), batch.student_mask, R)
  ref, _ = full_logp(initial, np.asarray(batch.student_tokens), batch.student_mask, R)
  log_ratio = ref.astype(np.float64) - student
  # kl_kind "low_var_kl": k3, each token's value clipped at 10 (random response tokens reach it)
  k3 = np.minimum(np.exp(log_ratio) - log_ratio - 1.0, 10.0)
  mask = np.asarray(batch.response_mask, np.float64)
  want = float((k3 * mask).sum() / mask.sum())
  assert want > 0.01  # two different models: the measure is not trivially 0
  assert float(metrics["actor/kl_loss"]) == pytest.approx(want, rel=1e-4)
  assert "actor/kl_loss" not in plain
  # a measure only: the loss and its gradients are those of the run without it
  assert float(metrics["train/loss"]) == pytest.approx(float(plain["train/loss"]), abs=1e-7)
  for g, h in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads), strict=True):
    np.testing.assert_allclose(np.asarray(g), np.asarray(h), atol=1e-7)
  # at the initial policy itself (the run's first update) the measure is 0
  _, at_start = run(algo, tiny_params, tiny_params)
  assert abs(float(at_start["actor/kl_loss"])) < 1e-6
