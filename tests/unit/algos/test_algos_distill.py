"""Objective library, part 2: SDAR gates, the SDAR term in its forms, Skill-SD, and the
baselines' gradients, against independent float64 NumPy formulas and hand-derived gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdar_jax.algos import (
  compute_gate,
  distill_loss,
  entropy_loss,
  get_preset,
  kl_loss,
  policy_loss,
  rlsd_lambda,
  sdar_loss,
  skill_sd_loss,
  token_advantages,
  topk_distill_term,
  vocab_distill_term,
)

AGGS = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
GATES = ["gap", "entropy", "soft_or", "constant", "entropy_paper", "soft_or_paper"]
VOCAB = 16  # ln 16 = 2.77 nats: the test entropies cover the whole normalised range [0, 1]
H0 = 1.0  # nats: the entropy at which the "entropy" gate is half open (gates.ENTROPY_SCALE_NATS)
FORMS = ["reference", "reverse_kl"]
LENGTHS = [9, 1, 4, 0, 7, 2]  # ragged; row 3 fully masked
B, R = len(LENGTHS), 9
MASK = (np.arange(R)[None, :] < np.asarray(LENGTHS)[:, None]).astype(np.float32)


# ----------------------------------------------------------------------------- numpy truth
def np_weights(m, mode):
  """d agg(v, m) / d v: how much each token's value counts in the aggregated loss."""
  m = np.asarray(m, np.float64)
  rows = m.sum(-1, keepdims=True)
  nseq = (rows > 0).sum()
  if mode == "token-mean":
    return m / m.sum()
  if mode == "seq-mean-token-sum":
    return m / nseq
  return np.where(rows > 0, m / np.where(rows > 0, rows, 1) / nseq, 0.0)


def np_agg(v, m, mode):
  return float((np.where(m > 0, v, 0.0) * np_weights(m, mode)).sum())


def np_sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def np_gate(name, beta, gap, h):
  """The gates in float64 (their properties are tested in test_algos_gates.py; here they are
  the truth for the loss composition)."""
  b = np_sigmoid(beta * (np.maximum(h, 0) / H0 - 1))  # "entropy"
  if name == "gap":
    return np_sigmoid(beta * gap)
  if name == "entropy":
    return b
  if name == "soft_or":
    return 1 - (1 - np_sigmoid(beta * gap)) * (1 - b)
  if name == "entropy_paper":
    return np_sigmoid(beta * h)
  if name == "soft_or_paper":
    return np_sigmoid(beta * (1 - (1 - h) * (1 - gap)))
  return np.full_like(gap, 0.5)


def np_sdar(ls, lt, h, m, beta, gate, form, mode):
  """Returns (loss, metrics, d loss / d student_logp)."""
  ls, lt, h = (np.asarray(x, np.float64) for x in (ls, lt, h))
  gap = lt - ls
  g = np_gate(gate, beta, gap, h)
  if form == "reference":
    per_tok, dper = g * (lt - ls), -g
  else:
    per_tok, dper = -g * gap * ls, -g * gap
  loss = np_agg(per_tok, m, mode)
  metrics = {
    "sdar/gate_mean": np_agg(g, m, "token-mean"),
    "sdar/gate_active_ratio": np_agg((g > 0.5).astype(float), m, "token-mean"),
    "sdar/teacher_gap_mean": np_agg(gap, m, "token-mean"),
    "sdar/loss": loss,
  }
  return loss, metrics, dper * np_weights(m, mode)


def inputs(seed):
  rng = np.random.default_rng(seed)
  ls = -np.abs(rng.normal(size=(B, R))) * 2.0
  lt = ls + rng.normal(size=(B, R))
  old = ls + rng.normal(size=(B, R)) * 0.3
  h = np.abs(rng.normal(size=(B, R))) * 1.5
  pad = MASK == 0  # garbage in padding that would show if the mask were forgotten
  ls, lt, old = (np.where(pad, -40.0, x).astype(np.float32) for x in (ls, lt, old))
  return ls, lt, old, h.astype(np.float32)


# ----------------------------------------------------------------------------- gates
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("beta", [0.0, 2.5, 5.0])
def test_gate_formulas_and_no_gradient(gate, beta):
  _, lt, _, h = inputs(0)
  gap = np.clip(lt, -3, 3)
  got = compute_gate(gate, beta=beta, gap=gap, entropy=h, vocab_size=VOCAB)
  # float32 gates in [0, 1] built from two terms <= 1: a few ulps of 1 (1.2e-7 each) absolute
  want = np_gate(gate, beta, gap.astype(np.float64), h)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=3e-7)
  d_gap, d_h = jax.grad(
    lambda a, b: jnp.sum(compute_gate(gate, beta=beta, gap=a, entropy=b, vocab_size=VOCAB)),
    argnums=(0, 1),
  )(jnp.asarray(gap), jnp.asarray(h))
  assert np.all(np.asarray(d_gap) == 0.0) and np.all(np.asarray(d_h) == 0.0)


def test_gap_gate_at_beta_zero_is_exactly_the_constant_gate():
  gap = jnp.linspace(-5, 5, 11)
  np.testing.assert_array_equal(
    compute_gate("gap", beta=0.0, gap=gap), compute_gate("constant", beta=5.0, gap=gap)
  )
  assert np.all(np.asarray(compute_gate("gap", beta=0.0, gap=gap)) == 0.5)


def test_gate_errors_name_the_fix():
  with pytest.raises(ValueError, match="entropy="):
    compute_gate("soft_or", beta=1.0, gap=jnp.zeros(3))
  with pytest.raises(ValueError, match="entropy="):
    compute_gate("entropy", beta=1.0, gap=jnp.zeros(3))
  with pytest.raises(ValueError, match="entropy="):
    compute_gate("soft_or_paper", beta=1.0, gap=jnp.zeros(3))
  with pytest.raises(ValueError, match="vocab_size=V"):
    compute_gate("entropy_lnv", beta=1.0, gap=jnp.zeros(3), entropy=jnp.zeros(3))
  with pytest.raises(ValueError, match="vocab_size=1"):
    compute_gate("soft_or_lnv", beta=1.0, gap=jnp.zeros(3), entropy=jnp.zeros(3), vocab_size=1)
  with pytest.raises(
    ValueError, match="'constant', 'entropy', 'entropy_lnv', 'entropy_paper', 'gap', 'soft_or'"
  ):
    compute_gate("sigmoid", beta=1.0, gap=jnp.zeros(3))


# ----------------------------------------------------------------------------- SDAR term
@pytest.mark.parametrize("mode", AGGS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("gate", GATES)
def test_sdar_loss_metrics_and_gradients_match_numpy(gate, form, mode):
  ls, lt, _, h = inputs(1)
  beta = 2.5

  def f(student, teacher, ent):
    kw = dict(beta=beta, gate=gate, entropy=ent, form=form, agg=mode, vocab_size=VOCAB)
    return sdar_loss(student, teacher, MASK, **kw)

  (loss, metrics), (d_student, d_teacher, d_ent) = jax.value_and_grad(
    f, argnums=(0, 1, 2), has_aux=True
  )(jnp.asarray(ls), jnp.asarray(lt), jnp.asarray(h))
  want_loss, want_metrics, want_grad = np_sdar(ls, lt, h, MASK, beta, gate, form, mode)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-7)
  assert set(metrics) == set(want_metrics)
  for key, value in want_metrics.items():
    np.testing.assert_allclose(metrics[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
  np.testing.assert_allclose(d_student, want_grad, rtol=1e-5, atol=1e-8)
  # the teacher and the entropy act only through the detached gate: exactly zero gradient
  assert np.all(np.asarray(d_teacher) == 0.0)
  assert np.all(np.asarray(d_ent) == 0.0)


def test_reference_form_gradient_is_minus_gate_over_token_count():
  ls, lt, _, _ = inputs(2)
  grad = jax.grad(lambda s: sdar_loss(s, lt, MASK, beta=5.0)[0])(jnp.asarray(ls))
  g = np_sigmoid(5.0 * (lt.astype(np.float64) - ls))
  np.testing.assert_allclose(grad, -g * MASK / MASK.sum(), rtol=1e-5, atol=1e-9)


def test_reverse_kl_form_pushes_teacher_rejected_tokens_down():
  ls = jnp.array([[-1.0, -1.0]])
  lt = jnp.array([[-0.5, -3.0]])  # teacher prefers token 0, rejects token 1
  grad = jax.grad(lambda s: sdar_loss(s, lt, jnp.ones((1, 2)), beta=1.0, form="reverse_kl")[0])(ls)
  g = np_sigmoid(np.array([0.5, -2.0]))
  np.testing.assert_allclose(grad, [[-g[0] * 0.5 / 2, g[1] * 2.0 / 2]], rtol=1e-6)
  # descent raises token 0 and lowers token 1
  assert float(grad[0, 0]) < 0 < float(grad[0, 1])


def test_gate_active_ratio_is_zero_at_beta_zero():
  ls, lt, _, _ = inputs(3)
  _, metrics = sdar_loss(ls, lt, MASK, beta=0.0)
  assert float(metrics["sdar/gate_active_ratio"]) == 0.0
  assert float(metrics["sdar/gate_mean"]) == pytest.approx(0.5)


def test_sdar_metrics_cover_the_whole_batch_when_summed_over_micro_batches():
  ls, lt, _, h = inputs(4)
  denom = MASK.sum()
  parts = [
    sdar_loss(
      ls[s], lt[s], MASK[s], beta=5.0, gate="soft_or", entropy=h[s], denom=denom, vocab_size=VOCAB
    )
    for s in (slice(0, 1), slice(1, 4), slice(4, 6))
  ]
  loss, metrics = sdar_loss(ls, lt, MASK, beta=5.0, gate="soft_or", entropy=h, vocab_size=VOCAB)
  np.testing.assert_allclose(sum(p[0] for p in parts), loss, rtol=1e-6)
  for key in metrics:
    np.testing.assert_allclose(
      sum(p[1][key] for p in parts), metrics[key], rtol=1e-6, atol=1e-7, err_msg=key
    )


def test_sdar_loss_jits_with_traced_beta():
  ls, lt, _, h = inputs(5)
  fn = jax.jit(sdar_loss, static_argnames=("gate", "form", "agg", "vocab_size"))
  # The loss is a token mean of g·(lT − lθ), terms of both signs that partly cancel; jit (fused)
  # and eager sum them in different orders, so the bound is a few eps times the mean |lT − lθ|
  # (g ≤ 1), not a fraction of the smaller mean itself.
  atol = 4 * np.finfo(np.float32).eps * np.abs(lt - ls)[MASK > 0].mean()
  for gate in GATES:
    got, _ = fn(ls, lt, MASK, beta=jnp.float32(2.0), gate=gate, entropy=h, vocab_size=VOCAB)
    want, _ = sdar_loss(ls, lt, MASK, beta=2.0, gate=gate, entropy=h, vocab_size=VOCAB)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=atol, err_msg=gate)
  with pytest.raises(ValueError, match="reverse_kl"):
    sdar_loss(ls, lt, MASK, beta=1.0, form="forward_kl")


# ------------------------------------------------------------------- SDAR over the vocabulary
def vocab_inputs(seed, vocab=VOCAB):
  """Student and teacher log-softmax [B, R, vocab] (float32) of random logits."""
  rng = np.random.default_rng(seed)

  def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return (z - np.log(np.exp(z).sum(-1, keepdims=True))).astype(np.float32)

  zs, zt = rng.normal(size=(2, B, R, vocab)) * 2.0
  return log_softmax(zs), log_softmax(zt)


@pytest.mark.parametrize("gate", ["gap", "entropy", "soft_or", "constant"])
def test_vocab_term_and_its_logit_gradient_match_numpy(gate):
  """Per position Σ_v w_v (lT_v − lθ_v), w_v = pT_v·g(β, lT_v − lθ_v, h); d/dz = −w + pθ·Σw."""
  ls, lt = vocab_inputs(7)
  beta = 2.0
  zs = ls + np.random.default_rng(8).normal(size=(B, R, 1)).astype(np.float32)  # any shift

  def term(z):
    lsm = jax.nn.log_softmax(z, axis=-1)
    h = -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)
    return vocab_distill_term(
      lsm, lt, beta=beta, gate=gate, entropy=jax.lax.stop_gradient(h), vocab_size=VOCAB
    )

  got = np.asarray(term(jnp.asarray(zs)))
  grad = np.asarray(jax.grad(lambda z: jnp.sum(term(z) * MASK))(jnp.asarray(zs)))
  ls64, lt64 = ls.astype(np.float64), lt.astype(np.float64)
  h = -(np.exp(ls64) * ls64).sum(-1, keepdims=True)
  w = np.exp(lt64) * np_gate(gate, beta, lt64 - ls64, h)
  want = (w * (lt64 - ls64)).sum(-1)
  # terms of both signs: bound by the size of what is summed
  scale = (w * np.abs(lt64 - ls64)).sum(-1)
  assert np.all(np.abs(got - want) <= 1e-5 * (1 + scale))
  want_grad = (-w + np.exp(ls64) * w.sum(-1, keepdims=True)) * MASK[..., None]
  np.testing.assert_allclose(grad, want_grad, atol=1e-5 * (1 + w.sum(-1).max()))


def test_vocab_term_is_a_forward_kl_with_an_open_gate_and_zero_when_the_branches_agree():
  ls, lt = vocab_inputs(9)
  kl = (np.exp(lt.astype(np.float64)) * (lt - ls.astype(np.float64))).sum(-1)
  half = vocab_distill_term(ls, lt, beta=5.0, gate="constant")
  np.testing.assert_allclose(half, 0.5 * kl, rtol=1e-4, atol=1e-6)
  assert np.all(np.asarray(half) >= 0)
  same = vocab_distill_term(ls, ls, beta=5.0, gate="gap")
  assert np.all(np.abs(np.asarray(same)) <= 1e-6)


def test_vocab_form_raises_a_token_the_student_never_samples_and_the_reference_form_cannot():
  """The student is sure of token 0; the teacher prefers token 2. A descent step on the vocab
  term raises token 2's log-prob and lowers token 0's; the reference form, which sees only the
  sampled token 0 (rejected by the teacher, its gate nearly closed), barely moves token 2."""
  z = jnp.array([[[4.0, 0.0, -1.0, 0.0]]])
  lt = jax.nn.log_softmax(jnp.array([[[0.0, 0.0, 3.0, 0.0]]]), axis=-1)
  one = jnp.ones((1, 1))

  def after(loss_fn):
    z2 = z - 1.0 * jax.grad(loss_fn)(z)
    return np.asarray(jax.nn.log_softmax(z2, axis=-1) - jax.nn.log_softmax(z, axis=-1))[0, 0]

  def vocab_loss(zz):
    term = vocab_distill_term(jax.nn.log_softmax(zz, axis=-1), lt, beta=5.0)
    lsm = jax.nn.log_softmax(zz, axis=-1)
    return sdar_loss(lsm[..., 0], lt[..., 0], one, beta=5.0, form="vocab", vocab_term=term)[0]

  def reference_loss(zz):
    lsm = jax.nn.log_softmax(zz, axis=-1)
    return sdar_loss(lsm[..., 0], lt[..., 0], one, beta=5.0)[0]

  vocab, reference = after(vocab_loss), after(reference_loss)
  assert vocab[2] > 0.5 and vocab[0] < 0
  assert abs(reference[2]) < 0.01


def np_topk_term(ls, lt, k, beta, gate):
  """Float64 truth of the top-k term and its logit gradient, by an explicit loop over positions:
  the teacher's k largest entries (np.argsort), w_v = pT_v·g_v on them and 0 elsewhere."""
  ls, lt = ls.astype(np.float64), lt.astype(np.float64)
  term, w = np.zeros(ls.shape[:-1]), np.zeros_like(ls)
  for b in range(ls.shape[0]):
    for r in range(ls.shape[1]):
      top = np.argsort(-lt[b, r])[:k]
      h = -(np.exp(ls[b, r]) * ls[b, r]).sum()
      gap = lt[b, r, top] - ls[b, r, top]
      w[b, r, top] = np.exp(lt[b, r, top]) * np_gate(gate, beta, gap, h)
      term[b, r] = (w[b, r, top] * gap).sum()
  grad = -w + np.exp(ls) * w.sum(-1, keepdims=True)
  return term, grad, (w * np.abs(lt - ls)).sum(-1)


@pytest.mark.parametrize("gate", ["gap", "entropy"])
@pytest.mark.parametrize("k", [1, 5, VOCAB])
def test_topk_term_loss_and_gradient_match_numpy_on_a_ragged_batch(gate, k):
  """The top-k term and, through `sdar_loss` (form "topk", token-mean over the ragged MASK), the
  loss and its gradient w.r.t. the student's logits, against a loop over positions in float64."""
  ls, lt = vocab_inputs(17)
  beta = 3.0

  def loss(z):
    lsm = jax.nn.log_softmax(z, axis=-1)
    h = jax.lax.stop_gradient(-jnp.sum(jnp.exp(lsm) * lsm, axis=-1))
    term = topk_distill_term(lsm, lt, top_k=k, beta=beta, gate=gate, entropy=h, vocab_size=VOCAB)
    logp = lsm[..., 0]
    out, _ = sdar_loss(
      logp,
      lt[..., 0],
      MASK,
      beta=beta,
      gate=gate,
      entropy=h,
      vocab_size=VOCAB,
      form="topk",
      vocab_term=term,
    )
    return out, term

  (got, term), grad = jax.value_and_grad(loss, has_aux=True)(jnp.asarray(ls))
  want_term, want_grad, scale = np_topk_term(ls, lt, k, beta, gate)
  assert np.all(np.abs(np.asarray(term) - want_term) <= 1e-5 * (1 + scale))
  weights = np_weights(MASK, "token-mean")
  assert abs(float(got) - np_agg(want_term, MASK, "token-mean")) <= 1e-5 * (1 + scale.max())
  np.testing.assert_allclose(grad, want_grad * weights[..., None], atol=1e-6)
  assert np.all(np.asarray(grad)[MASK == 0] == 0)  # padding positions get no gradient


def test_topk_term_with_k_the_vocabulary_size_is_the_vocab_term():
  ls, lt = vocab_inputs(19)
  for gate in ("gap", "soft_or"):
    kw = dict(beta=4.0, gate=gate, entropy=np.ones((B, R), np.float32), vocab_size=VOCAB)
    full = vocab_distill_term(ls, lt, **kw)
    for k in (VOCAB, VOCAB + 100):  # capped at V
      np.testing.assert_allclose(topk_distill_term(ls, lt, top_k=k, **kw), full, rtol=0, atol=2e-6)
    # fewer entries: a different (smaller-weight) sum
    assert not np.allclose(topk_distill_term(ls, lt, top_k=2, **kw), full, atol=1e-3)


def test_topk_form_without_its_term_names_the_fix():
  ls, lt, _, _ = inputs(6)
  with pytest.raises(ValueError, match="form='topk'.*vocab_term"):
    sdar_loss(ls, lt, MASK, beta=1.0, form="topk")


def test_vocab_form_without_its_term_names_the_fix():
  ls, lt, _, _ = inputs(6)
  with pytest.raises(ValueError, match="vocab_term"):
    sdar_loss(ls, lt, MASK, beta=1.0, form="vocab")


# ----------------------------------------------------------------------------- Skill-SD
def np_skill_sd(ls, lt, old, m, mode):
  ls, lt, old = (np.asarray(x, np.float64) for x in (ls, lt, old))
  e = ls - lt
  k3 = np.exp(np.minimum(-e, 20)) - 1 + e
  dk3 = np.where(-e < 20, -np.exp(-e), 0.0) + 1.0
  x = ls - old
  rho = np.exp(np.minimum(x, 10))
  drho = np.where(x < 10, rho, 0.0)
  w = np_weights(m, mode)
  return np_agg(rho * k3, m, mode), (drho * k3 + rho * dk3) * w


@pytest.mark.parametrize("mode", AGGS)
def test_skill_sd_value_and_gradient(mode):
  ls, lt, old, _ = inputs(6)
  old[0, 0] = ls[0, 0] - 12.0  # ratio clamp at exp(10)
  ls[0, 1], lt[0, 1] = -25.0, -1.0  # k3 exponent clamp at 20
  (loss, metrics), (d_s, d_t, d_o) = jax.value_and_grad(
    lambda s, t, o: skill_sd_loss(s, t, o, MASK, mode), argnums=(0, 1, 2), has_aux=True
  )(jnp.asarray(ls), jnp.asarray(lt), jnp.asarray(old))
  want, want_grad = np_skill_sd(ls, lt, old, MASK, mode)
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(metrics["skillsd/loss"], want, rtol=1e-5)
  np.testing.assert_allclose(d_s, want_grad, rtol=1e-5, atol=1e-7)
  assert np.all(np.asarray(d_t) == 0.0) and np.all(np.asarray(d_o) == 0.0)


def test_skill_sd_is_zero_when_teacher_equals_student():
  ls, _, _, _ = inputs(7)
  loss, _ = skill_sd_loss(ls, ls, ls, MASK)
  assert float(loss) == 0.0


# ----------------------------------------------------------------------------- baselines
def preset_loss(preset, logp, old, ref, teacher, seq_adv, ent, step=1):
  """The actor loss a preset describes, composed from the library's registered pieces."""
  p = get_preset(preset)
  lam_k = rlsd_lambda(step, p.rlsd.lam0, p.rlsd.warmdown_iterations)
  adv = token_advantages(
    p.advantage,
    seq_adv,
    MASK,
    teacher_logp=teacher,
    old_logp=old,
    teacher_weight=lam_k,
    clip_eps=p.rlsd.clip_eps,
  )
  pg, _ = policy_loss(logp, old, adv, MASK, p.ppo.clip_low, p.ppo.clip_high, p.ppo.clip_c, p.agg)
  distill, _ = distill_loss(
    p.distill,
    student_logp=logp,
    teacher_logp=teacher,
    old_logp=old,
    mask=MASK,
    beta=p.beta,
    gate=p.gate,
    entropy=ent,
    vocab_size=VOCAB,
    form=p.form,
    agg=p.agg,
  )
  kl, _ = kl_loss(logp, ref, MASK, p.kl_kind, p.agg)
  h, _ = entropy_loss(ent, MASK, p.agg)
  return p.pg_coef * pg + p.lam * distill - p.entropy_coef * h + p.kl_coef * kl


def preset_grad(preset, teacher_shift=0.0, **kw):
  ls, lt, old, h = inputs(8)
  ref = old + 0.1
  seq_adv = np.linspace(-1.5, 1.5, B).astype(np.float32)
  args = dict(old=old, ref=ref, teacher=lt + teacher_shift, seq_adv=seq_adv, ent=h, **kw)
  return np.asarray(jax.grad(lambda s: preset_loss(preset, s, **args))(jnp.asarray(ls)))


def test_grpo_opsd_gradient_is_grpo_plus_half_lambda_per_token():
  lam = get_preset("grpo_opsd").lam
  want = preset_grad("grpo") - lam * 0.5 * MASK / MASK.sum()
  np.testing.assert_allclose(preset_grad("grpo_opsd"), want, rtol=1e-6, atol=1e-9)
  # beta = 0 is exactly the constant gate, and the teacher has no effect on the gradient
  np.testing.assert_array_equal(preset_grad("grpo_opsd"), preset_grad("sdar_constant"))
  np.testing.assert_array_equal(
    preset_grad("grpo_opsd"), preset_grad("grpo_opsd", teacher_shift=3.0)
  )


def test_sdar_and_opsd_gradients():
  ls, lt, _, _ = inputs(8)
  g = np_sigmoid(5.0 * (lt.astype(np.float64) - ls))
  sdar_term = -0.01 * g * MASK / MASK.sum()
  np.testing.assert_allclose(
    preset_grad("sdar"), preset_grad("grpo") + sdar_term, rtol=1e-5, atol=1e-9
  )
  # OPSD: the policy-gradient term weighs 0; what remains is KL + distillation
  _, _, old, _ = inputs(8)
  kl_grad = 0.01 * np.asarray(jax.grad(lambda s: kl_loss(s, old + 0.1, MASK)[0])(jnp.asarray(ls)))
  np.testing.assert_allclose(preset_grad("opsd"), kl_grad + sdar_term, rtol=1e-5, atol=1e-9)


def test_rlsd_after_warmdown_is_grpo_and_differs_before():
  np.testing.assert_allclose(preset_grad("rlsd", step=100), preset_grad("grpo"), rtol=1e-6)
  assert not np.allclose(preset_grad("rlsd", step=1), preset_grad("grpo"))


def test_no_distill_term_is_zero():
  loss, metrics = distill_loss("none", student_logp=jnp.ones((2, 2)), mask=jnp.ones((2, 2)))
  assert float(loss) == 0.0 and metrics == {}
  with pytest.raises(ValueError, match="skill_sd"):
    distill_loss("opd", student_logp=jnp.ones((2, 2)), mask=jnp.ones((2, 2)))


# ----------------------------------------------------------------------------- no token loops
@pytest.mark.parametrize("gate", GATES)
def test_sdar_traced_program_size_does_not_grow_with_length(gate):
  def n_eqns(r):
    x = jnp.zeros((3, r))
    f = lambda: sdar_loss(x, x, jnp.ones((3, r)), beta=5.0, gate=gate, entropy=x, vocab_size=VOCAB)[
      0
    ]
    return len(jax.make_jaxpr(f)().jaxpr.eqns)

  assert n_eqns(2) == n_eqns(50)
