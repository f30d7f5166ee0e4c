"""SDPO's loss (sdar_jax.algos.sdpo) against a NumPy transcription of SDPO's own function,
lasgroup/SDPO at 0e6d510, verl/trainer/ppo/core_algos.py::compute_self_distillation_loss
(full_logit_distillation with distillation_topk, distillation_add_tail, alpha, is_clip,
loss_agg_mode "token-mean"; the top-k indices are the student's, as its dp_actor gathers the
teacher's log-probs at them), for the three kinds of alpha; its settings' errors; the preset."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from sdar_jax import algos


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _logsumexp(x, axis=-1):
  m = x.max(axis, keepdims=True)
  return (m + np.log(np.exp(x - m).sum(axis, keepdims=True))).squeeze(axis)


def _kl_div(inp, target):  # torch.nn.functional.kl_div(inp, target, log_target=True), "none"
  return np.exp(target) * (target - inp)


def sdpo_reference(student_all, teacher_all, student_logp, old_logp, mask, topk, alpha, is_clip):
  """compute_self_distillation_loss, line by line in NumPy (float64)."""
  idx = np.argsort(-student_all, axis=-1)[..., :topk]
  s = np.take_along_axis(student_all, idx, -1)
  t = np.take_along_axis(teacher_all, idx, -1)

  def add_tail(log_probs):
    log_s = np.minimum(_logsumexp(log_probs)[..., None], -1e-7)
    return np.concatenate([log_probs, np.log(-np.expm1(log_s))], -1)

  s, t = add_tail(s), add_tail(t)
  if alpha == 0.0:
    kl = _kl_div(s, t)
  elif alpha == 1.0:
    kl = _kl_div(t, s)
  else:
    mix = _logsumexp(np.stack([s + np.log(1 - alpha), t + np.log(alpha)]), axis=0)
    kl_teacher, kl_student = _kl_div(mix, t), _kl_div(mix, s)
    kl = kl_student + alpha * (kl_teacher - kl_student)  # torch.lerp
  per_token = kl.sum(-1)
  ratio = np.minimum(np.exp(np.clip(student_logp - old_logp, -20.0, 20.0)), is_clip)
  per_token = per_token * ratio
  return (per_token * mask).sum() / max(mask.sum(), 1.0)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_the_sdpo_loss_is_sdpos_own_function(alpha):
  rng = np.random.default_rng(0)
  B, R, V, k = 3, 5, 40, 7
  student_all = _log_softmax(rng.normal(0, 2, (B, R, V)))
  teacher_all = _log_softmax(rng.normal(0, 2, (B, R, V)))
  targets = rng.integers(0, V, (B, R))
  student_logp = np.take_along_axis(student_all, targets[..., None], -1)[..., 0]
  old_logp = student_logp + rng.normal(0, 1.0, (B, R))  # ratios on both sides of the clip
  mask = (rng.random((B, R)) < 0.8).astype(np.float64)
  want = sdpo_reference(student_all, teacher_all, student_logp, old_logp, mask, k, alpha, 2.0)
  div = algos.sdpo_divergence(student_all, teacher_all, top_k=k, alpha=alpha)
  got, metrics = algos.sdpo_loss(student_logp, old_logp, div, mask, is_clip=2.0)
  assert float(got) == pytest.approx(want, rel=2e-5)
  assert float(metrics["sdpo/ratio_mean"]) <= 2.0


def test_the_divergence_is_zero_for_equal_branches_and_its_gradient_reaches_only_the_student():
  rng = np.random.default_rng(1)
  logp = _log_softmax(rng.normal(0, 1, (2, 3, 16))).astype(np.float32)
  div = algos.sdpo_divergence(logp, logp, top_k=5, alpha=0.5)
  assert np.allclose(np.asarray(div), 0.0, atol=1e-6)
  teacher = _log_softmax(rng.normal(0, 1, (2, 3, 16))).astype(np.float32)
  grad_t = jax.grad(lambda t: algos.sdpo_divergence(logp, t, top_k=5, alpha=0.5).sum())(teacher)
  assert float(np.abs(grad_t).max()) == 0.0


@pytest.mark.parametrize(
  "changes, message",
  [
    ({"alpha": 1.5}, "algo.sdpo.alpha=1.5: must be in [0, 1]. Fix: use 0.5"),
    ({"top_k": 0}, "algo.sdpo.top_k=0: must be an integer >= 1. Fix: use SDPO's 100"),
    ({"is_clip": -1.0}, "algo.sdpo.is_clip=-1.0: must be a number >= 0. Fix:"),
  ],
)
def test_bad_sdpo_settings_are_refused_naming_the_value_and_the_fix(changes, message):
  preset = algos.get_preset("sdpo")
  with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(".", r"\.")):
    dataclasses.replace(preset, sdpo=dataclasses.replace(preset.sdpo, **changes))


def test_the_sdpo_preset_has_sdpos_defaults():
  p = algos.get_preset("sdpo")
  assert (p.distill, p.pg_coef, p.teacher_source, p.teacher_weights) == (
    "sdpo",
    0.0,
    "update",
    "ema",
  )
  assert (p.sdpo.top_k, p.sdpo.alpha, p.sdpo.is_clip, p.sdpo.add_tail) == (100, 0.5, 2.0, True)
  assert p.ema.decay == pytest.approx(1 - 0.05) and p.ema.every == "iteration"
  assert p.context_names == ("sibling_or_hindsight",) and (p.hindsight.k, p.hindsight.outcome) == (
    1,
    False,
  )
