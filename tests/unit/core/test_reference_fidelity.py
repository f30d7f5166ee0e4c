"""Where the update follows the authors' code: the learning-rate warm-up counts training
iterations, the teacher is scored at θ_old by default, old log-probs can be recomputed after the
rollout, the teacher-old gap is token-weighted over the whole iteration (plus its RMS), the
entropy gates see the model's vocabulary, and the non-thinking Qwen3-Instruct-2507 preset gets
no `<think>` block. Truth comes from optax's own AdamW, a full-logits forward in float64, the
real sampler and hand-worked numbers."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np
import optax
import pytest

from sdar_jax.algos import AlgoConfig, get_preset
from sdar_jax.core.batch import TurnBatch
from sdar_jax.core.loss import loss_and_grads
from sdar_jax.core.sampling import SamplingParams
from sdar_jax.core.train_state import create_train_state, make_optimizer
from sdar_jax.core.train_step import TrainStep, train_step_from_config
from sdar_jax.models import ModelConfig, forward, init_params
from tests.helpers import sample_and_pack

CONFIG = ModelConfig.tiny(
  "qwen3",
  vocab_size=256,
  hidden_size=32,
  intermediate_size=64,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
)
PS, PT, R = 6, 10, 5


@pytest.fixture(scope="module")
def params():
  return init_params(CONFIG, jax.random.key(0), std=0.2)


def full_logp(params, tokens, mask, response_len, temperature=1.0):
  """Log-probs and entropies [B, R] of the last `response_len` tokens, float64, full logits."""
  logits = np.asarray(forward(CONFIG, params, tokens, mask), np.float64) / temperature
  logits -= logits.max(-1, keepdims=True)
  logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  prompt = tokens.shape[1] - response_len
  rows = np.arange(tokens.shape[0])
  logp = np.stack(
    [logp_all[rows, prompt - 1 + r, tokens[:, prompt + r]] for r in range(response_len)], 1
  )
  rows_ent = [logp_all[:, prompt - 1 + r] for r in range(response_len)]
  ent = np.stack([-(np.exp(row) * row).sum(-1) for row in rows_ent], 1)
  return logp, ent


def make_batch(seed: int, B: int = 4, lengths=None) -> TurnBatch:
  """Random left-padded prompts and right-padded responses (`lengths`: response tokens per row);
  the teacher row is a random skills block + the same prompt + the same response."""
  rng = np.random.default_rng(seed)
  lengths = lengths or [int(rng.integers(1, R + 1)) for _ in range(B)]
  st = np.zeros((B, PS + R), np.int32)
  sm = np.zeros_like(st)
  tt = np.zeros((B, PT + R), np.int32)
  tm = np.zeros_like(tt)
  rm = np.zeros((B, R), np.float32)
  for i, n_r in enumerate(lengths):
    n_p = int(rng.integers(2, PS + 1))
    n_s = int(rng.integers(1, PT - n_p + 1))
    prompt = rng.integers(1, CONFIG.vocab_size, n_p)
    resp = rng.integers(1, CONFIG.vocab_size, n_r)
    st[i, PS - n_p : PS], sm[i, PS - n_p : PS] = prompt, 1
    tt[i, PT - n_p - n_s : PT - n_p], tm[i, PT - n_p - n_s : PT] = rng.integers(1, 200, n_s), 1
    tt[i, PT - n_p : PT] = prompt
    st[i, PS : PS + n_r], sm[i, PS : PS + n_r] = resp, 1
    tt[i, PT : PT + n_r], tm[i, PT : PT + n_r] = resp, 1
    rm[i, :n_r] = 1
  return TurnBatch(
    student_tokens=st,
    student_mask=sm,
    response_mask=rm,
    old_logp=np.zeros((B, R), np.float32),
    advantages=rng.normal(size=B).astype(np.float32),
    teacher_tokens=tt,
    teacher_mask=tm,
  )


def fresh_state(params, optimizer):
  return create_train_state(jax.tree.map(jnp.copy, params), optimizer)


# ---------------------------------------------------------------------- learning-rate warm-up
GRPO = dict(dataclasses.asdict(get_preset("grpo")), kl_coef=0.0, entropy_coef=0.0)


@pytest.mark.slow
def test_lr_warmup_counts_iterations_not_optimizer_updates(params):
  """Two mini-batch updates per iteration, warm-up over 2 iterations: the reference's scheduler
  steps once per iteration, so iteration k (1-based) uses lr·min(k − 1, 2)/2 for both updates."""
  lr, eps = 1e-2, 1e-4  # eps 1e-4: updates are smooth in the gradient (see test_train_step.py)
  optim = {"lr": lr, "warmup_iterations": 2, "eps": eps, "weight_decay": 0.01, "clip_norm": 1.0}
  config = mlc.ConfigDict({"algo": GRPO, "optim": optim, "train": {"micro_batch_size": None}})
  step = train_step_from_config(CONFIG, config)
  batches = [make_batch(seed) for seed in range(6)]
  for b in batches:
    b.advantages[:] = np.linspace(-1.0, 1.0, b.batch_size)  # no zero-gradient batch
  iterations = [1, 1, 2, 2, 3, 3]
  want_lr = [0.0, 0.0, lr / 2, lr / 2, lr, lr]

  state = fresh_state(params, step.optimizer)
  lrs, snapshots = [], []
  for b, it in zip(batches, iterations):
    state, metrics = step(state, b, iteration=it)
    lrs.append(float(metrics["train/lr"]))
    snapshots.append(jax.tree.map(np.asarray, state.params))
  np.testing.assert_allclose(lrs, want_lr, rtol=1e-6)
  # lr 0 through the whole first iteration: both of its updates leave the weights exactly alone
  jax.tree.map(np.testing.assert_array_equal, snapshots[1], jax.tree.map(np.asarray, params))

  # Truth: optax's AdamW with the per-update rates above, on the same gradients.
  lc = AlgoConfig.from_config(GRPO)
  rates = jnp.asarray(want_lr)
  adamw = optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.adamw(lambda count: rates[count], eps=eps, weight_decay=0.01),
  )

  @jax.jit  # one program (op by op, every operation of the optimizer would compile on its own)
  def reference_step(p, opt_state, b):
    updates, opt_state = adamw.update(loss_and_grads(CONFIG, lc, p, b)[0], opt_state, p)
    return optax.apply_updates(p, updates), opt_state

  p, opt_state = jax.tree.map(jnp.copy, params), jax.jit(adamw.init)(params)
  for b, got in zip(batches, snapshots):
    p, opt_state = reference_step(p, opt_state, b)
    jax.tree.map(lambda a, w: np.testing.assert_allclose(a, w, rtol=0, atol=1e-3 * lr), got, p)


@pytest.mark.slow
def test_default_iteration_is_one_per_update(params):
  """Without `iteration` each update is its own iteration (one mini-batch per iteration)."""
  optimizer = make_optimizer(lr=1e-2, warmup_iterations=2)
  step = TrainStep(CONFIG, GRPO, optimizer, lr_schedule=lambda k: 1e-2 * jnp.minimum(k, 2) / 2)
  state = fresh_state(params, optimizer)
  lrs = []
  for seed in range(3):
    state, metrics = step(state, make_batch(seed))
    lrs.append(float(metrics["train/lr"]))
  np.testing.assert_allclose(lrs, [0.0, 5e-3, 1e-2], rtol=1e-6)


def test_optimizer_without_warmup_is_optax_adamw():
  rng = np.random.default_rng(0)
  p = {"w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32), "b": jnp.ones(3)}
  ours = make_optimizer(lr=1e-3, weight_decay=0.01, clip_norm=1.0)
  truth = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.01))
  s_ours, s_truth, p_ours, p_truth = ours.init(p), truth.init(p), p, p
  for _ in range(3):
    g = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), p)
    u_ours, s_ours = ours.update(g, s_ours, p_ours)
    u_truth, s_truth = truth.update(g, s_truth, p_truth)
    p_ours, p_truth = optax.apply_updates(p_ours, u_ours), optax.apply_updates(p_truth, u_truth)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9), p_ours, p_truth)


def test_warmup_without_an_iteration_is_refused():
  opt = make_optimizer(lr=1e-3, warmup_iterations=5)
  p = {"w": jnp.ones(3)}
  with pytest.raises(ValueError, match="warmup_iterations=5.*iteration"):
    opt.update(p, opt.init(p), p)


# ------------------------------------------------------------------------------ teacher source
def test_teacher_source_defaults_to_rollout_like_the_configs():
  from configs import common

  assert AlgoConfig().teacher_source == "rollout"
  assert AlgoConfig.from_config(get_preset("sdar")).teacher_source == "rollout"
  assert common.algo("sdar").teacher_source == "rollout"


def test_rollout_source_without_teacher_logp_names_the_fix(params):
  lc = AlgoConfig.from_config(get_preset("sdar"))
  with pytest.raises(ValueError, match="score_teacher"):
    loss_and_grads(CONFIG, lc, params, make_batch(0))


# -------------------------------------------------------------------- recomputed old log-probs
TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def sampled(params):
  """(step, batch): responses from the real sampler (fp32) at TEMPERATURE, packed as the trainer
  packs them, and an update scoring at the same temperature."""
  step = TrainStep(CONFIG, dict(GRPO, temperature=TEMPERATURE), make_optimizer(1e-3))
  rng = np.random.default_rng(0)
  prompts = [list(rng.integers(1, CONFIG.vocab_size, n)) for n in (5, 11, 3)]
  sampling = SamplingParams(max_new_tokens=8, temperature=TEMPERATURE, stop_token_ids=(3,))
  batch, _ = sample_and_pack(CONFIG, params, prompts, sampling, jax.random.key(1))
  return step, batch


@pytest.mark.slow
def test_recompute_old_logp_replaces_the_sampler_logps(params, sampled):
  step, batch = sampled
  mask = batch.response_mask > 0
  new, diff = step.recompute_old_logp(params, batch)
  # fp32 sampler vs fp32 recompute: the same numbers up to summation order
  assert 0.0 <= diff < 1e-4
  np.testing.assert_array_equal(
    np.asarray(new.old_logp), np.asarray(step.score_student(params, batch))
  )
  truth, _ = full_logp(
    params, batch.student_tokens, batch.student_mask, batch.response_len, TEMPERATURE
  )
  np.testing.assert_allclose(np.asarray(new.old_logp)[mask], truth[mask], atol=2e-5)


def test_recompute_reports_the_largest_sampler_mismatch_on_response_tokens(params, sampled):
  """A bf16-like sampler error: the metric is the largest |sampler − recompute| over real
  response tokens (garbage in padded slots does not count)."""
  step, batch = sampled
  exact, _ = step.recompute_old_logp(params, batch)
  noisy = np.asarray(exact.old_logp).copy()
  mask = np.asarray(batch.response_mask) > 0
  rows, cols = np.nonzero(mask)
  noisy[rows[0], cols[0]] += 0.03
  noisy[rows[-1], cols[-1]] -= 0.125
  noisy[~mask] = 7.0
  new, diff = step.recompute_old_logp(params, batch.replace(old_logp=noisy))
  assert diff == pytest.approx(0.125, abs=1e-6)
  np.testing.assert_array_equal(np.asarray(new.old_logp), np.asarray(exact.old_logp))


def test_recompute_old_logp_is_a_config_option():
  from configs import alfworld, common
  from sdar_jax.run.config_validation import validate

  config = alfworld.get_config("local=True")
  assert config.algo.recompute_old_logp is False
  common.override(config, {"algo.recompute_old_logp": True})
  validate(config, num_devices=8)
  algo = AlgoConfig.from_config(config.algo)
  assert algo.recompute_old_logp is True  # the one field it changes
  assert dataclasses.replace(algo, recompute_old_logp=False) == AlgoConfig.from_config(
    {k: v for k, v in config.algo.items() if k != "recompute_old_logp"}
  )


# ------------------------------------------------------------------------- teacher-old gap
def test_teacher_old_gap_is_token_weighted_over_the_iteration_with_its_rms():
  """Two mini-batches with 1 and 3 response tokens. Gaps: [4] and [0, 0, 0] → token mean
  4/4 = 1 (a mean of per-mini-batch means would say (4 + 0)/2 = 2), RMS sqrt(16/4) = 2."""
  from sdar_jax.observe.metrics import teacher_old_gap_metrics

  def mb(gaps, slots=4):
    m = np.zeros((1, slots), np.float32)
    m[0, : len(gaps)] = 1
    old = np.full((1, slots), -1.0, np.float32)
    teacher = old.copy()
    teacher[0, : len(gaps)] += gaps
    teacher[0, len(gaps) :] = 50.0  # padding garbage must not count
    return TurnBatch(
      student_tokens=np.zeros((1, 8), np.int32),
      student_mask=np.zeros((1, 8), np.int32),
      response_mask=m,
      old_logp=old,
      advantages=np.zeros(1, np.float32),
      teacher_logp=teacher,
    )

  got = teacher_old_gap_metrics([mb([4.0]), mb([0.0, 0.0, 0.0])])
  assert got["rollout/teacher_old_gap_mean"] == pytest.approx(1.0)
  assert got["rollout/teacher_old_gap_rms"] == pytest.approx(2.0)
  got = teacher_old_gap_metrics([mb([-1.0, 3.0]), mb([-2.0])])
  assert got["rollout/teacher_old_gap_mean"] == pytest.approx(0.0)
  assert got["rollout/teacher_old_gap_rms"] == pytest.approx(math.sqrt(14 / 3))


# ------------------------------------------------------------------- entropy gates in the step
@pytest.mark.slow
@pytest.mark.parametrize("gate", ["entropy_lnv", "soft_or_lnv"])
def test_step_normalises_the_gate_entropy_by_the_model_vocabulary(params, gate):
  """The step's gate mean equals the gate evaluated on the float64 full-forward entropies with
  V = the model's number of logits; hand-derived: g_entropy_lnv = σ(β(2h/ln V − 1))."""
  lc = AlgoConfig.from_config(
    dict(dataclasses.asdict(get_preset("sdar")), gate=gate, teacher_source="update", kl_coef=0.0)
  )
  batch = make_batch(3)
  _, metrics = jax.jit(lambda p: loss_and_grads(CONFIG, lc, p, batch))(params)
  ls, h = full_logp(params, batch.student_tokens, batch.student_mask, R)
  lt, _ = full_logp(params, batch.teacher_tokens, batch.teacher_mask, R)
  sig = lambda x: 1 / (1 + np.exp(-x))
  b = sig(5.0 * (2 * h / math.log(CONFIG.vocab_size) - 1))
  g = b if gate == "entropy_lnv" else 1 - (1 - sig(5.0 * (lt - ls))) * (1 - b)
  m = batch.response_mask
  np.testing.assert_allclose(float(metrics["sdar/gate_mean"]), (g * m).sum() / m.sum(), rtol=1e-5)


# ------------------------------------------------------------------- Qwen3-Instruct-2507 prompt
def test_qwen3_instruct_2507_preset_gets_no_think_block():
  """The published Qwen3-4B-Instruct-2507 template opens the assistant turn with
  `<|im_start|>assistant\\n` and nothing else; hybrid Qwen3 models run with thinking off get an
  empty think block. The trainer renders prompts from model.chat_template/enable_thinking."""
  from configs import alfworld, models
  from sdar_jax.models import ModelConfig
  from sdar_jax.run.setup import build_chat_template

  def prompt(model_section):
    family = ModelConfig.preset(model_section.preset).family
    return build_chat_template(model_section, family).render(
      [{"role": "user", "content": "go"}],
      add_generation_prompt=True,
      enable_thinking=model_section.enable_thinking,
    )

  user = "<|im_start|>user\ngo<|im_end|>\n"
  for name in ("qwen3-4b-2507", "Qwen3-4B-Instruct-2507"):
    assert prompt(models.model(name)) == user + "<|im_start|>assistant\n"
  config = alfworld.get_config("model=qwen3-4b-2507")
  assert "<think>" not in prompt(config.model)
  for name in ("qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-0.6b"):
    assert prompt(models.model(name)) == user + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
