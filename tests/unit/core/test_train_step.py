"""The compiled update: index map, loss composition, teacher sources, accumulation, sharding,
non-finite skip, compilation count. Truth comes from the full-logits `forward` and plain numpy /
jax.grad formulations written here, never from the step's own helpers."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdar_jax import algos
from sdar_jax.algos import AlgoConfig, get_preset
from sdar_jax.core import sharding
from sdar_jax.core.batch import TurnBatch
from sdar_jax.core.loss import loss_and_grads
from sdar_jax.core.scoring import response_logprobs
from sdar_jax.core.train_state import make_optimizer
from sdar_jax.core.train_step import TrainStep, train_step_from_config
from sdar_jax.models import forward
from tests.helpers import RESPONSE_LEN as R
from tests.helpers import SDAR_LOSS as SDAR
from tests.helpers import STUDENT_PROMPT_LEN as PS
from tests.helpers import TINY_CONFIG as CONFIG
from tests.helpers import fresh_state, full_logp, to_np
from tests.helpers import make_turn_batch as make_batch


@pytest.fixture(scope="module")
def params(tiny_params):
  return tiny_params


# ------------------------------------------------------------------------------- index map
def test_response_logprobs_match_full_forward(params):
  batch = make_batch(params, seed=1)
  logp, ent = jax.jit(
    lambda p: response_logprobs(CONFIG, p, batch.teacher_tokens, batch.teacher_mask, R, 0.7, True)
  )(params)
  want_logp, want_ent = full_logp(params, batch.teacher_tokens, batch.teacher_mask, R, 0.7)
  m = batch.response_mask > 0
  np.testing.assert_allclose(np.asarray(logp)[m], want_logp[m], atol=2e-5)
  np.testing.assert_allclose(np.asarray(ent)[m], want_ent[m], atol=2e-5)


# ------------------------------------------------------------------ one-device update loop
@pytest.fixture(scope="module")
def sdar_step():
  """SDAR (KL term on frozen ref params), AdamW lr 1e-3 with warm-up, micro-batches of 4."""
  step = train_step_from_config(
    CONFIG,
    _run_config(
      dataclasses.asdict(get_preset("sdar")), micro=4, optim=dict(lr=1e-3, warmup_iterations=2)
    ),
  )
  return step, step.optimizer


def _run_config(algo, micro, optim):
  import ml_collections as mlc

  return mlc.ConfigDict(
    dict(algo=dict(algo, teacher_source="update"), optim=optim, train=dict(micro_batch_size=micro))
  )


@pytest.mark.slow
def test_loss_decreases_on_a_fixed_batch(params, sdar_step):
  step, optimizer = sdar_step
  batch = make_batch(params, seed=2)
  state = fresh_state(params, optimizer)
  losses, lrs = [], []
  for _ in range(6):
    state, metrics = step(state, batch, ref_params=params)
    losses.append(float(metrics["train/loss"]))
    lrs.append(float(metrics["train/lr"]))
    assert float(metrics["train/skipped_update"]) == 0.0
  assert lrs[:3] == [0.0, pytest.approx(5e-4), pytest.approx(1e-3)]  # warm-up 0 -> lr over 2
  assert losses[-1] < losses[0] - 0.05, losses
  assert int(state.step) == 6 and int(state.skipped_updates) == 0
  m = batch.response_mask
  assert float(metrics["train/tokens"]) == m.sum()


def test_nonfinite_gradient_skips_the_update(params, sdar_step):
  step, optimizer = sdar_step
  state, _ = step(fresh_state(params, optimizer), make_batch(params, seed=3), ref_params=params)
  before = to_np((state.params, state.opt_state))
  state, metrics = step(state, make_batch(params, seed=4, nan_row=5), ref_params=params)
  assert float(metrics["train/skipped_update"]) == 1.0
  assert not np.isfinite(float(metrics["train/grad_norm"]))
  assert int(state.step) == 1 and int(state.skipped_updates) == 1
  jax.tree.map(np.testing.assert_array_equal, to_np((state.params, state.opt_state)), before)
  state, metrics = step(state, make_batch(params, seed=4), ref_params=params)  # recovers
  assert float(metrics["train/skipped_update"]) == 0.0 and int(state.step) == 2


@pytest.mark.slow
def test_varying_lengths_within_a_bucket_do_not_recompile(params, sdar_step):
  step, optimizer = sdar_step
  state = fresh_state(params, optimizer)
  state, _ = step(state, make_batch(params, seed=5), ref_params=params)
  traces = step.num_traces
  for seed in (6, 7):  # other prompt / response lengths, same bucket shapes
    state, _ = step(state, make_batch(params, seed=seed, min_prompt=seed - 4), ref_params=params)
  assert step.num_traces == traces
  state, _ = step(state, make_batch(params, seed=8, r=R + 2), ref_params=params)  # a new bucket
  assert step.num_traces == traces + 1


# ------------------------------------------------------------------------ teacher sources
@pytest.mark.slow
def test_update_and_rollout_teacher_sources_agree(params):
  optimizer = make_optimizer(lr=1e-3)
  batch = make_batch(params, seed=9)
  on_update = TrainStep(CONFIG, dict(SDAR, teacher_source="update"), optimizer)
  on_rollout = TrainStep(CONFIG, dict(SDAR, teacher_source="rollout"), optimizer)
  teacher_logp = on_rollout.score_teacher(params, batch)
  want = full_logp(params, batch.teacher_tokens, batch.teacher_mask, R)[0]
  m = batch.response_mask > 0
  np.testing.assert_allclose(np.asarray(teacher_logp)[m], want[m], atol=2e-5)
  state_a, metrics_a = on_update(fresh_state(params, optimizer), batch)
  with pytest.raises(ValueError, match="teacher_logp"):
    on_rollout(fresh_state(params, optimizer), batch)
  state_b, metrics_b = on_rollout(
    fresh_state(params, optimizer), batch.replace(teacher_logp=teacher_logp)
  )
  assert set(metrics_a) == set(metrics_b) and "sdar/gate_mean" in metrics_a
  for k in metrics_a:
    np.testing.assert_allclose(float(metrics_a[k]), float(metrics_b[k]), atol=1e-6, err_msg=k)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
    to_np(state_a.params),
    to_np(state_b.params),
  )


# ---------------------------------------------------------------------- gradient identities
def close_to_scale(actual, desired, rtol=1e-5):
  """Equal up to float32 summation order: tolerance relative to the array's largest entry."""
  scale = float(np.max(np.abs(desired)))
  np.testing.assert_allclose(actual, desired, rtol=0, atol=rtol * scale + 1e-9)


EPS32 = float(np.finfo(np.float32).eps)


def metric_atol(batch: TurnBatch, ulps: float = 4.0) -> float:
  """Absolute tolerance for the loss metrics of two different programs (micro-batched or sharded
  vs one batch on one device), bounded by the magnitude of the summands, not of the result.

  Every metric is a token mean of terms built from float32 log-probs (or, like the entropy, of
  the same size), and each program rounds a log-prob differently by a few ulp of its magnitude
  (up to 2.3 ulp measured here). Two such means therefore differ by at most a few eps times the
  mean |log-prob|, however small the mean itself comes out: actor/ppo_kl = mean(old - new) cancels
  to ~1e-8, below one ulp of its terms, so no tolerance relative to its value can hold."""
  real = np.asarray(batch.response_mask) > 0
  return ulps * EPS32 * float(np.mean(np.abs(np.asarray(batch.old_logp)[real])))


@pytest.mark.slow
def test_micro_batch_accumulation_equals_one_batch(params):
  """RLSD advantages + SDAR term + entropy + KL (from batch ref_logp); ragged responses, so the
  micro-batches hold different token counts and only a global denominator makes them add up."""
  lc = AlgoConfig.from_config(SDAR, advantage="rlsd", entropy_coef=0.01, kl_coef=0.01)
  one_batch, accumulated = (
    jax.jit(lambda p, b, m=micro: loss_and_grads(CONFIG, lc, p, b, micro_batch_size=m, iteration=3))
    for micro in (None, 2)
  )
  # Seed 12: a batch where actor/ppo_kl of the two programs differs by 1.9e-7 (a quarter of eps
  # times its log-prob terms), which an absolute 1e-7 on the cancelled mean called a mismatch.
  for seed in (10, 12):
    batch = make_batch(params, seed=seed)
    batch = batch.replace(ref_logp=batch.old_logp - 0.3 * batch.response_mask)
    g_one, m_one = to_np(one_batch(params, batch))
    g_acc, m_acc = to_np(accumulated(params, batch))
    jax.tree.map(close_to_scale, g_acc, g_one)
    assert set(m_one) == set(m_acc)
    atol = metric_atol(batch)
    for k in m_one:
      np.testing.assert_allclose(m_acc[k], m_one[k], rtol=1e-5, atol=atol, err_msg=k)
    np.testing.assert_allclose(m_one["rlsd/lambda"], 0.5 * (1 - 3 / 100), rtol=1e-6)
    assert m_one["train/tokens"] == batch.response_mask.sum()


def _distillation_alone(lam: float, beta: float, **changes) -> AlgoConfig:
  """SDAR's term alone (pg, entropy and KL off), the teacher scored in the step."""
  return AlgoConfig(
    pg_coef=0.0,
    distill="sdar",
    lam=lam,
    beta=beta,
    entropy_coef=0.0,
    kl_coef=0.0,
    teacher_source="update",
    **changes,
  )


@pytest.mark.slow
def test_sdar_gradient_is_minus_lambda_gate_times_score(params):
  """pg, entropy and KL off: the step's gradient equals jax.grad of -λ·Σ g·lθ·m / Σm with the
  gate g = σ(β(lT − lθ)) evaluated as constants from the full-logits forward."""
  lam, beta = 0.5, 5.0
  lc = _distillation_alone(lam, beta)
  batch = make_batch(params, seed=11)
  remat = CONFIG.replace(remat=True)  # the rematerialised path, against an independent truth
  grads, metrics = jax.jit(lambda p: loss_and_grads(remat, lc, p, batch, micro_batch_size=4))(
    params
  )
  student = full_logp(params, batch.student_tokens, batch.student_mask, R)[0]
  teacher = full_logp(params, batch.teacher_tokens, batch.teacher_mask, R)[0]
  m = batch.response_mask
  gate = 1.0 / (1.0 + np.exp(-beta * (teacher - student)))
  prompt = PS

  def surrogate(p):
    logits = forward(CONFIG, p, batch.student_tokens, batch.student_mask)
    logp = jax.nn.log_softmax(logits[:, prompt - 1 : prompt - 1 + R], axis=-1)
    lt = jnp.take_along_axis(logp, batch.student_tokens[:, prompt:, None], axis=-1)[..., 0]
    return -lam * jnp.sum(gate * lt * m) / m.sum()

  want = jax.grad(surrogate)(params)
  jax.tree.map(close_to_scale, to_np(grads), to_np(want))
  np.testing.assert_allclose(
    float(metrics["sdar/gate_mean"]), (gate * m).sum() / m.sum(), rtol=1e-5
  )


@pytest.mark.slow
@pytest.mark.parametrize("remat", [False, True])
def test_sdar_vocab_form_gradient_is_the_gated_forward_kl_over_the_vocabulary(params, remat):
  """Form "vocab" (pg, entropy and KL off): the step's gradient equals jax.grad of
  −λ·Σ_t m_t·Σ_v w_v·lθ_v / Σm, w_v = pT_v·σ(β(lT_v − lθ_v)) taken as constants from the
  full-logits forward of both prompts; the sampled-token metrics are unchanged."""
  lam, beta = 0.5, 5.0
  lc = _distillation_alone(lam, beta, form="vocab")
  batch = make_batch(params, seed=11)
  model = CONFIG.replace(remat=remat)
  grads, metrics = jax.jit(lambda p: loss_and_grads(model, lc, p, batch, micro_batch_size=4))(
    params
  )

  def response_log_softmax(p, tokens, mask):
    logits = forward(CONFIG, p, tokens, mask)
    prompt = tokens.shape[1] - R
    return jax.nn.log_softmax(logits[:, prompt - 1 : prompt - 1 + R], axis=-1)

  ls = np.asarray(
    response_log_softmax(params, batch.student_tokens, batch.student_mask), np.float64
  )
  lt = np.asarray(
    response_log_softmax(params, batch.teacher_tokens, batch.teacher_mask), np.float64
  )
  w = np.exp(lt) / (1.0 + np.exp(-beta * (lt - ls)))
  m = np.asarray(batch.response_mask, np.float64)

  def surrogate(p):
    lsm = response_log_softmax(p, batch.student_tokens, batch.student_mask)
    return -lam * jnp.sum(jnp.sum(w * lsm, axis=-1) * m) / m.sum()

  want = jax.grad(surrogate)(params)
  jax.tree.map(close_to_scale, to_np(grads), to_np(want))
  student = full_logp(params, batch.student_tokens, batch.student_mask, R)[0]
  teacher = full_logp(params, batch.teacher_tokens, batch.teacher_mask, R)[0]
  gate = 1.0 / (1.0 + np.exp(-beta * (teacher - student)))
  np.testing.assert_allclose(
    float(metrics["sdar/gate_mean"]), (gate * m).sum() / m.sum(), rtol=1e-5
  )
  per_position = (w * (lt - ls)).sum(-1)
  scale = (np.abs(w * (lt - ls)).sum(-1) * m).sum() / m.sum()
  assert abs(float(metrics["sdar/loss"]) - (per_position * m).sum() / m.sum()) <= 1e-5 * scale


@pytest.mark.slow
@pytest.mark.parametrize("form", ["reference", "vocab"])
def test_a_frozen_teacher_reads_the_initial_params_and_the_student_the_current_ones(params, form):
  """teacher_weights='initial': the gap the gate reads is lT(ref_params) − lθ(params), from the
  full-logits forward of each; with ref_params = params it is the 'current' teacher's exactly."""
  lc = AlgoConfig(distill="sdar", lam=0.1, kl_coef=0.0, teacher_source="update", form=form)
  frozen = dataclasses.replace(lc, teacher_weights="initial")
  assert frozen.needs_ref_params and not lc.needs_ref_params
  batch = make_batch(params, seed=15)
  ref = jax.tree.map(lambda x: x * 1.05, params)
  run = jax.jit(lambda a, p, r: loss_and_grads(CONFIG, a, p, batch, ref_params=r), static_argnums=0)
  _, m_frozen = run(frozen, params, ref)
  student = full_logp(params, batch.student_tokens, batch.student_mask, R)[0]
  teacher = full_logp(ref, batch.teacher_tokens, batch.teacher_mask, R)[0]
  m = np.asarray(batch.response_mask, np.float64)
  gap = (teacher - student).astype(np.float64)
  scale = (np.abs(teacher) + np.abs(student)).mean()
  want = (gap * m).sum() / m.sum()
  assert abs(float(m_frozen["sdar/teacher_gap_mean"]) - want) <= 1e-5 * scale
  g_same, m_same = to_np(run(frozen, params, params))
  g_cur, m_cur = to_np(run(lc, params, params))
  jax.tree.map(close_to_scale, g_same, g_cur)
  for key in m_cur:
    np.testing.assert_allclose(m_same[key], m_cur[key], rtol=1e-6, atol=1e-7, err_msg=key)
  with pytest.raises(ValueError, match="teacher_weights='initial'.*ref_params="):
    loss_and_grads(CONFIG, frozen, params, batch)
  step = TrainStep(CONFIG, frozen, make_optimizer(), micro_batch_size=4)
  with pytest.raises(ValueError, match="teacher_weights='initial'.*ref_params="):
    step.check_batch(batch)
  # scored with the rollout, the teacher's log-probs ride in the batch: no ref_params needed (traced
  # only: running it op by op would compile each of its operations)
  if form == "reference":
    rollout = dataclasses.replace(frozen, teacher_source="rollout")
    rollout_batch = batch.replace(teacher_logp=batch.old_logp)
    jax.eval_shape(lambda p: loss_and_grads(CONFIG, rollout, p, rollout_batch), params)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["sdar_vocab", "sdar_topk"])
def test_vocab_and_topk_forms_in_chunks_equal_the_unchunked_update(params, preset):
  """algo.vocab_chunk over the R = 6 response slots: chunks of 4 (the last one padded)
  against one pass over all of them (vocab_chunk 0), the whole preset's loss (PPO, entropy, KL,
  the gated term on the frozen teacher; top-k with k = 5 of 256) on a ragged batch: gradients
  within float32 summation order of each leaf's largest entry, metrics within a few ulp of their
  log-prob summands (`metric_atol`), never relative to a result that may cancel."""
  algo = dataclasses.replace(get_preset(preset), top_k=5, vocab_chunk=0)
  batch = make_batch(params, seed=21)
  ref = jax.tree.map(lambda x: x * 1.05, params)
  run = jax.jit(
    lambda a, p: loss_and_grads(CONFIG, a, p, batch, ref_params=ref),
    static_argnums=0,
  )
  g_full, m_full = to_np(run(algo, params))
  assert m_full["sdar/loss"] != 0
  g_chunk, m_chunk = to_np(run(dataclasses.replace(algo, vocab_chunk=4), params))
  jax.tree.map(close_to_scale, g_chunk, g_full)
  assert set(m_chunk) == set(m_full)
  for k in m_full:
    np.testing.assert_allclose(m_chunk[k], m_full[k], rtol=1e-5, atol=metric_atol(batch), err_msg=k)


@pytest.mark.slow
def test_ema_teacher_reads_the_ema_and_each_update_moves_it_by_hand(params):
  """teacher_weights='ema': the gap the gate reads is lT(ema) − lθ(params) (full-logits forward);
  a fresh state gets its EMA from the params (shard_state). algo.ema.every='update': after each
  applied update ema = d·ema + (1 − d)·params, worked out here in float64 from the states before
  and after. SDPO's cadence (the default, 'iteration'): an update leaves the EMA alone and
  `move_teacher_ema`, the trainer's call after an iteration's updates, moves it once."""
  decay = 0.75
  algo = AlgoConfig(
    distill="sdar",
    lam=0.1,
    kl_coef=0.0,
    teacher_source="update",
    teacher_weights="ema",
    ema={"decay": decay, "every": "update"},
  )
  batch = make_batch(params, seed=23)
  ema = jax.tree.map(lambda x: x * 1.05, params)
  _, metrics = jax.jit(lambda p, e: loss_and_grads(CONFIG, algo, p, batch, ema_params=e))(
    params, ema
  )
  student = full_logp(params, batch.student_tokens, batch.student_mask, R)[0]
  teacher = full_logp(ema, batch.teacher_tokens, batch.teacher_mask, R)[0]
  m = np.asarray(batch.response_mask, np.float64)
  want = ((teacher - student).astype(np.float64) * m).sum() / m.sum()
  scale = (np.abs(teacher) + np.abs(student)).mean()
  assert abs(float(metrics["sdar/teacher_gap_mean"]) - want) <= 1e-5 * scale
  with pytest.raises(ValueError, match="teacher_weights='ema'.*ema_params="):
    loss_and_grads(CONFIG, algo, params, batch)

  optimizer = make_optimizer(lr=1e-2)
  step = TrainStep(CONFIG, algo, optimizer)
  state = step.shard_state(fresh_state(params, optimizer))
  assert fresh_state(params, optimizer).ema_params is None
  jax.tree.map(np.testing.assert_array_equal, to_np(state.ema_params), to_np(params))
  for _ in range(2):
    before = to_np(state.ema_params)
    state, metrics = step(state, batch)
    assert float(metrics["train/skipped_update"]) == 0.0
    after, new = to_np(state.ema_params), to_np(state.params)

    def check(got, old, p):
      want = decay * old.astype(np.float64) + (1 - decay) * p.astype(np.float64)
      np.testing.assert_allclose(got, want, rtol=0, atol=2 * EPS32 * (np.abs(want).max() + 1e-30))

    jax.tree.map(check, after, before, new)
  assert not np.array_equal(after["embed"], new["embed"])  # the EMA lags the params

  sdpo = TrainStep(CONFIG, dataclasses.replace(algo, ema={"decay": decay}), optimizer)
  assert AlgoConfig().ema == algos.EMA(decay=0.95, every="iteration")
  state, metrics = sdpo(state, batch)
  assert float(metrics["train/skipped_update"]) == 0.0
  jax.tree.map(np.testing.assert_array_equal, to_np(state.ema_params), after)  # not moved
  params_now = to_np(state.params)
  state = sdpo.move_teacher_ema(state)
  jax.tree.map(check, to_np(state.ema_params), after, params_now)
  jax.tree.map(np.testing.assert_array_equal, to_np(state.params), params_now)


def test_sdar_vocab_form_refuses_a_rollout_scored_teacher():
  with pytest.raises(ValueError, match="algo.teacher_source='rollout'.*teacher_source=update"):
    AlgoConfig(distill="sdar", lam=0.1, form="vocab", teacher_source="rollout")


# --------------------------------------------------------------------------------- sharding
@pytest.fixture(scope="module")
def one_device_update(params):
  # AdamW's first step is ~lr*sign(g): with eps=1e-8 a gradient entry near 0 turns float32
  # summation-order noise into a visible parameter difference. eps=1e-4 bounds d(update)/dg by
  # lr/eps, so parameters compare at the gradients' precision.
  optimizer = make_optimizer(lr=1e-3, eps=1e-4)
  batch = make_batch(params, B=16, seed=13)
  step = TrainStep(CONFIG, SDAR, optimizer, micro_batch_size=8)
  state, metrics = step(fresh_state(params, optimizer), batch)
  return optimizer, batch, to_np(state.params), to_np(metrics)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 2, 2), (1, 2, 4)])
def test_sharded_step_equals_one_device_step(params, one_device_update, shape):
  optimizer, batch, want_params, want_metrics = one_device_update
  mesh = sharding.make_mesh(shape)
  step = TrainStep(CONFIG, SDAR, optimizer, mesh=mesh, micro_batch_size=8)
  state = step.shard_state(fresh_state(params, optimizer))
  state, metrics = step(state, step.shard_batch(batch))
  q = state.params["layers"]["q_proj"].sharding.spec
  assert ("tensor" in jax.tree.leaves(tuple(q))) == (shape[2] > 1)
  atol = metric_atol(batch)  # sdar/teacher_gap_mean cancels to ~1e-3 of its log-prob terms
  for k, v in want_metrics.items():
    np.testing.assert_allclose(float(metrics[k]), v, rtol=1e-5, atol=atol, err_msg=k)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), to_np(state.params), want_params
  )


# ------------------------------------------------------------------------------ host checks
def test_config_and_batch_errors(params):
  with pytest.raises(ValueError, match="lamda"):
    AlgoConfig.from_config(dict(SDAR, lamda=0.1))
  with pytest.raises(ValueError, match="teacher_source"):
    AlgoConfig(teacher_source="later")
  sdar = dict(dataclasses.asdict(get_preset("sdar")), teacher_source="update")
  step = TrainStep(CONFIG, sdar, make_optimizer(), micro_batch_size=3)
  batch = make_batch(None, seed=14)
  with pytest.raises(ValueError, match="ref_params"):
    step.check_batch(batch)
  with pytest.raises(ValueError, match="micro_batch_size=3"):
    step.check_batch(batch, ref_params=params)
  with pytest.raises(ValueError, match="teacher_tokens"):
    step.check_batch(batch.replace(teacher_tokens=None), ref_params=params)
