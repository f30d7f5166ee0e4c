"""Objective library, part 1: aggregation, GRPO / RLSD advantages, dual-clip PPO, KL, entropy (the
presets: test_presets.py). Every check is against an independent float64 NumPy implementation
written here or against numbers worked by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdar_jax.algos import (
  agg_loss,
  apply_invalid_penalty,
  entropy_from_logits,
  entropy_loss,
  grpo_advantages,
  kl_loss,
  kl_penalty,
  policy_loss,
  rlsd_lambda,
  rlsd_token_advantages,
  token_advantages,
)

AGGS = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
LENGTHS = [9, 1, 4, 0, 7, 2]  # ragged; row 3 fully masked
B, R = len(LENGTHS), 9


# ----------------------------------------------------------------------------- numpy truth
def np_agg(v, m, mode, denom=None, num_seqs=None):
  v, m = np.asarray(v, np.float64), np.asarray(m, np.float64)
  vm = np.where(m > 0, v, 0.0) * m
  if mode == "token-mean":
    d = m.sum() if denom is None else denom
    return vm.sum() / d if d > 0 else 0.0
  rows = m.sum(-1) > 0
  n = rows.sum() if num_seqs is None else num_seqs
  if mode == "seq-mean-token-sum":
    per_row = vm.sum(-1)
  else:
    per_row = np.array([vm[i].sum() / m[i].sum() if rows[i] else 0.0 for i in range(len(m))])
  return per_row.sum() / n if n > 0 else 0.0


def np_masked_mean(x, m):
  return np_agg(x, m, "token-mean")


def make_mask(lengths=LENGTHS, r=R):
  return (np.arange(r)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


def random_logps(seed, shape=(B, R)):
  rng = np.random.default_rng(seed)
  logp = -np.abs(rng.normal(size=shape)) * 2.0
  old = logp + rng.normal(size=shape) * 0.3
  return rng, logp.astype(np.float32), old.astype(np.float32)


def with_padding_garbage(x, mask, value=-50.0):
  """Values at masked-out positions that would change any result that forgot the mask."""
  return np.where(mask > 0, x, value).astype(np.float32)


# ----------------------------------------------------------------------------- aggregation
@pytest.mark.parametrize("mode", AGGS)
def test_agg_loss_matches_numpy(mode):
  rng = np.random.default_rng(0)
  mask = make_mask()
  v = with_padding_garbage(rng.normal(size=(B, R)), mask, 1e3)
  np.testing.assert_allclose(agg_loss(v, mask, mode), np_agg(v, mask, mode), rtol=1e-6)
  np.testing.assert_allclose(
    agg_loss(v, mask.astype(bool), mode, denom=100.0, num_seqs=10.0),
    np_agg(v, mask, mode, denom=100.0, num_seqs=10.0),
    rtol=1e-6,
  )


@pytest.mark.parametrize("mode", AGGS)
def test_agg_loss_all_masked_is_zero_with_finite_grad(mode):
  v = jnp.ones((3, 4)) * 7.0
  mask = jnp.zeros((3, 4))
  assert float(agg_loss(v, mask, mode)) == 0.0
  g = jax.grad(lambda x: agg_loss(x, mask, mode))(v)
  assert np.all(np.asarray(g) == 0.0)


@pytest.mark.parametrize("mode", AGGS)
def test_micro_batch_shares_sum_to_whole_batch(mode):
  rng = np.random.default_rng(1)
  mask = make_mask()
  v = rng.normal(size=(B, R)).astype(np.float32)
  denom, nseq = mask.sum(), float((mask.sum(-1) > 0).sum())
  parts = [
    agg_loss(v[s], mask[s], mode, denom=denom, num_seqs=nseq)
    for s in (slice(0, 2), slice(2, 5), slice(5, 6))
  ]
  np.testing.assert_allclose(sum(parts), np_agg(v, mask, mode), rtol=1e-6)


def test_agg_loss_errors_name_the_problem():
  with pytest.raises(ValueError, match="seq-mean-token-mean"):
    agg_loss(jnp.ones((2, 2)), jnp.ones((2, 2)), "token_mean")
  with pytest.raises(ValueError, match="mask shape"):
    agg_loss(jnp.ones((2, 2)), jnp.ones((2, 3)))


# ----------------------------------------------------------------------------- GRPO
def np_grpo(scores, ids, norm_by_std=True, eps=1e-6):
  """verl's compute_grpo_outcome_advantage, written as its loops over a dict of groups."""
  groups = {}
  for s, i in zip(scores, ids):
    groups.setdefault(int(i), []).append(float(s))
  stats = {}
  for i, vals in groups.items():
    if len(vals) == 1:
      stats[i] = (0.0, 1.0)
    else:
      stats[i] = (np.mean(vals), np.std(vals, ddof=1))
  out = []
  for s, i in zip(scores, ids):
    mu, sd = stats[int(i)]
    out.append((s - mu) / (sd + eps) if norm_by_std else s - mu)
  return np.array(out)


def test_grpo_worked_by_hand():
  # group 10: [1, 2, 3] -> mean 2, unbiased std 1; group -3: a single sample -> mean 0, std 1
  scores, ids = jnp.array([1.0, 2.0, 3.0, 5.0]), jnp.array([10, 10, 10, -3])
  np.testing.assert_allclose(
    grpo_advantages(scores, ids), [-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6), 5 / (1 + 1e-6)], rtol=1e-6
  )
  np.testing.assert_allclose(grpo_advantages(scores, ids, norm_by_std=False), [-1, 0, 1, 5])
  # contiguous ids with a static group count take the other path, same answer
  np.testing.assert_allclose(
    grpo_advantages(scores, jnp.array([0, 0, 0, 1]), num_groups=2),
    grpo_advantages(scores, ids),
    rtol=1e-7,
  )


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_random_groups_match_numpy_under_jit(norm_by_std):
  rng = np.random.default_rng(2)
  ids = rng.choice([4, 17, 99, 5, 1000], size=40)  # uneven sizes, non-contiguous
  ids[-1] = 31337  # a singleton group
  scores = rng.integers(0, 2, size=40) * 10.0 - 0.1 * rng.integers(0, 2, size=40)
  fn = jax.jit(grpo_advantages, static_argnames=("norm_by_std",))
  got = fn(jnp.asarray(scores, jnp.float32), jnp.asarray(ids), norm_by_std=norm_by_std)
  np.testing.assert_allclose(got, np_grpo(scores, ids, norm_by_std), rtol=1e-5, atol=1e-5)


def test_grpo_sample_mask_leaves_padding_out():
  scores = jnp.array([1.0, 2.0, 3.0, 100.0, 5.0])
  ids = jnp.array([0, 0, 0, 0, 1])
  got = grpo_advantages(scores, ids, sample_mask=jnp.array([1, 1, 1, 0, 1]))
  expected = np.append(np_grpo([1, 2, 3], [0, 0, 0]), [0.0, 5 / (1 + 1e-6)])
  np.testing.assert_allclose(got, expected[[0, 1, 2, 3, 4]], rtol=1e-6)


def test_grpo_rejects_float_ids():
  with pytest.raises(ValueError, match="integers"):
    grpo_advantages(jnp.ones(3), jnp.array([0.0, 0.0, 1.0]))


def test_invalid_penalty_is_per_turn():
  np.testing.assert_allclose(
    apply_invalid_penalty(jnp.array([10.0, 10.0, 0.0]), jnp.array([1, 0, 0]), 0.1),
    [10.0, 9.9, -0.1],
    rtol=1e-6,
  )


# ----------------------------------------------------------------------------- RLSD
def np_rlsd(seq_adv, lt, lold, m, lam, eps):
  w = np.clip(np.exp(np.sign(seq_adv)[:, None] * (lt - lold)), 1 - eps, 1 + eps)
  return np.where(m > 0, seq_adv[:, None] * ((1 - lam) + lam * w) * m, 0.0)


def test_rlsd_lambda_schedule():
  np.testing.assert_allclose(
    [float(rlsd_lambda(s)) for s in (0, 1, 50, 99, 100, 150)],
    [0.5, 0.495, 0.25, 0.005, 0.0, 0.0],
    atol=1e-7,
  )
  traced = jax.jit(lambda s: rlsd_lambda(s, 0.5, 100))(jnp.int32(1))
  np.testing.assert_allclose(traced, 0.495, rtol=1e-6)
  assert float(rlsd_lambda(500, 0.3, 0)) == pytest.approx(0.3)  # no warm-down


def test_rlsd_token_advantages_by_hand_and_random():
  # A=2, gap=ln 1.1 -> w=1.1 -> 2*(0.5+0.55)=2.1;  A=-1, gap=1 -> exp(-1) clipped to 0.8 -> -0.9
  got = rlsd_token_advantages(
    jnp.array([2.0, -1.0]),
    jnp.array([[math.log(1.1)], [1.0]]),
    jnp.zeros((2, 1)),
    jnp.ones((2, 1)),
    teacher_weight=0.5,
  )
  np.testing.assert_allclose(got, [[2.1], [-0.9]], rtol=1e-6)

  rng, lt, lold = random_logps(3)
  mask = make_mask()
  seq_adv = rng.normal(size=B).astype(np.float32)
  seq_adv[1] = 0.0
  fn = jax.jit(rlsd_token_advantages)
  got = fn(seq_adv, with_padding_garbage(lt, mask, 80.0), lold, mask, 0.3)
  np.testing.assert_allclose(got, np_rlsd(seq_adv, lt, lold, mask, 0.3, 0.2), rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(got)[1] == 0.0)  # A = 0 -> exactly 0


def test_rlsd_with_zero_advantage_gives_zero_loss_and_gradient():
  _, lt, lold = random_logps(4)
  mask = make_mask()
  adv = rlsd_token_advantages(jnp.zeros(B), lt, lold, mask, 0.5)
  assert np.all(np.asarray(adv) == 0.0)
  loss, grad = jax.value_and_grad(lambda lp: policy_loss(lp, lold, adv, mask)[0])(jnp.asarray(lold))
  assert float(loss) == 0.0 and np.all(np.asarray(grad) == 0.0)


def test_token_advantages_registry():
  _, lt, lold = random_logps(5)
  mask, seq_adv = make_mask(), np.linspace(-1, 1, B).astype(np.float32)
  np.testing.assert_allclose(token_advantages("grpo", seq_adv, mask), seq_adv[:, None] * mask)
  # lam = 0 -> RLSD is exactly GRPO
  np.testing.assert_allclose(
    token_advantages("rlsd", seq_adv, mask, teacher_logp=lt, old_logp=lold, teacher_weight=0.0),
    seq_adv[:, None] * mask,
  )
  with pytest.raises(ValueError, match="teacher_logp"):
    token_advantages("rlsd", seq_adv, mask)
  with pytest.raises(ValueError, match="grpo"):
    token_advantages("gae", seq_adv, mask)


# ----------------------------------------------------------------------------- PPO
def np_ppo(logp, old, adv, m, cl=0.2, ch=0.2, c=3.0, mode="token-mean"):
  d = np.clip(logp.astype(np.float64) - old, -20, 20)
  ratio = np.exp(d)
  per_tok = np.empty_like(ratio)
  clipped = np.zeros_like(ratio)
  lower = np.zeros_like(ratio)
  for idx in np.ndindex(ratio.shape):  # branch by branch, as the formula reads
    a, r = adv[idx], ratio[idx]
    unclipped, clipped_term = -a * r, -a * min(max(r, 1 - cl), 1 + ch)
    loss = max(unclipped, clipped_term)
    clipped[idx] = clipped_term > unclipped
    if a < 0:
      lower[idx] = loss > -a * c
      loss = min(loss, -a * c)
    per_tok[idx] = loss
  return (
    np_agg(per_tok, m, mode),
    np_masked_mean(clipped, m),
    np_masked_mean(lower, m),
    np_masked_mean(-d, m),
  )


def test_dual_clip_branches_worked_by_hand():
  ratio = np.array([[1.5, 0.5, 1.5, 5.0, 0.5]])
  adv = jnp.array([[1.0, 1.0, -1.0, -1.0, -1.0]])
  logp = jnp.asarray(np.log(ratio), jnp.float32)
  old, mask = jnp.zeros((1, 5)), jnp.ones((1, 5))
  # per token: -1.2 (upper clip), -0.5, 1.5, 3.0 (dual clip c=3), 0.8 (lower clip)
  (loss, metrics), grad = jax.value_and_grad(
    lambda lp: policy_loss(lp, old, adv, mask), has_aux=True
  )(logp)
  np.testing.assert_allclose(loss, 3.6 / 5, rtol=1e-6)
  np.testing.assert_allclose(metrics["actor/pg_loss"], 3.6 / 5, rtol=1e-6)
  np.testing.assert_allclose(metrics["actor/pg_clipfrac"], 2 / 5, rtol=1e-6)
  np.testing.assert_allclose(metrics["actor/pg_clipfrac_lower"], 1 / 5, rtol=1e-6)
  np.testing.assert_allclose(metrics["actor/ppo_kl"], -np.log(ratio).mean(), rtol=1e-6)
  # d/dlogp of -A*ratio is -A*ratio on unclipped tokens, 0 on clipped ones; /5 token-mean
  np.testing.assert_allclose(grad, [[0.0, -0.5 / 5, 1.5 / 5, 0.0, 0.0]], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", AGGS)
def test_policy_loss_matches_numpy(mode):
  rng, logp, old = random_logps(6)
  old[0, :3] = logp[0, :3] + np.array([1.5, -1.5, 25.0])  # big ratios: clips and clamp
  mask = make_mask()
  adv = rng.normal(size=(B, R)).astype(np.float32)
  loss, metrics = jax.jit(policy_loss, static_argnames="agg")(
    with_padding_garbage(logp, mask), old, adv, mask, agg=mode
  )
  ref = np_ppo(logp, old, adv, mask, mode=mode)
  np.testing.assert_allclose(loss, ref[0], rtol=1e-5, atol=1e-6)
  for key, want in zip(["actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"], ref[1:]):
    np.testing.assert_allclose(metrics[key], want, rtol=1e-5, atol=1e-6)


def test_policy_loss_sample_advantages_broadcast_and_custom_clips():
  rng, logp, old = random_logps(7)
  mask = make_mask()
  seq_adv = rng.normal(size=B).astype(np.float32)
  tok_adv = np.repeat(seq_adv[:, None], R, 1)
  a, _ = policy_loss(logp, old, seq_adv, mask, clip_low=0.1, clip_high=0.28, clip_c=2.0)
  b, _ = policy_loss(logp, old, tok_adv, mask, clip_low=0.1, clip_high=0.28, clip_c=2.0)
  np.testing.assert_allclose(a, b)
  np.testing.assert_allclose(a, np_ppo(logp, old, tok_adv, mask, 0.1, 0.28, 2.0)[0], rtol=1e-5)
  with pytest.raises(ValueError, match="clip_c"):
    policy_loss(logp, old, seq_adv, mask, clip_c=1.0)


# ----------------------------------------------------------------------------- KL, entropy
def np_kl(logp, ref, kind):
  logp, ref = logp.astype(np.float64), ref.astype(np.float64)
  if kind in ("kl", "k1"):
    return logp - ref
  if kind == "abs":
    return np.abs(logp - ref)
  if kind in ("mse", "k2"):
    return 0.5 * (logp - ref) ** 2
  k = ref - logp
  return np.clip(np.exp(k) - k - 1, -10, 10)


@pytest.mark.parametrize("kind", ["low_var_kl", "k3", "kl", "k1", "mse", "k2", "abs"])
def test_kl_penalty_matches_numpy(kind):
  _, logp, ref = random_logps(8)
  ref[0, :2] = logp[0, :2] + np.array([5.0, -30.0])  # k3 clamps to 10 in both directions
  np.testing.assert_allclose(
    kl_penalty(logp, ref, kind), np_kl(logp, ref, kind), rtol=1e-5, atol=1e-6
  )


@pytest.mark.parametrize("mode", AGGS)
def test_kl_loss_aggregates_and_stays_finite(mode):
  _, logp, ref = random_logps(9)
  mask = make_mask()
  ref[0, 0] = logp[0, 0] + 200.0  # exp would overflow without the inner clamp
  loss, metrics = kl_loss(logp, ref, mask, "low_var_kl", mode)
  np.testing.assert_allclose(loss, np_agg(np_kl(logp, ref, "low_var_kl"), mask, mode), rtol=1e-5)
  np.testing.assert_allclose(metrics["actor/kl_loss"], loss)
  grad = jax.grad(lambda lp: kl_loss(lp, ref, mask)[0])(jnp.asarray(logp))
  assert np.all(np.isfinite(np.asarray(grad))) and float(grad[0, 0]) == 0.0
  with pytest.raises(ValueError, match="low_var_kl"):
    kl_penalty(logp, ref, "k4")


def test_entropy_from_logits_matches_numpy_and_is_stable():
  rng = np.random.default_rng(10)
  logits = rng.normal(size=(2, 3, 11)) * 3.0
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  want = -(p * np.log(p)).sum(-1)
  np.testing.assert_allclose(entropy_from_logits(logits.astype(np.float32)), want, rtol=1e-5)
  np.testing.assert_allclose(entropy_from_logits(jnp.zeros((1, 7))), [math.log(7)], rtol=1e-6)
  big = jnp.array([[1e4, 0.0, 0.0], [5e4, 5e4, 5e4]])
  np.testing.assert_allclose(entropy_from_logits(big), [0.0, math.log(3)], atol=1e-5)


def test_entropy_gradient_matches_hand_derivation():
  # H = lse(z) - sum_j p_j z_j  =>  dH/dz_i = -p_i (z_i - sum_j p_j z_j)
  rng = np.random.default_rng(12)
  z = rng.normal(size=(2, 5)) * 2.0 + 30.0
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  want = -p * (z - (p * z).sum(-1, keepdims=True))
  got = jax.jit(jax.grad(lambda x: jnp.sum(entropy_from_logits(x))))(jnp.asarray(z, jnp.float32))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("mode", AGGS)
def test_entropy_loss(mode):
  rng = np.random.default_rng(11)
  mask = make_mask()
  h = np.abs(rng.normal(size=(B, R))).astype(np.float32)
  value, metrics = entropy_loss(h, mask, mode)
  np.testing.assert_allclose(value, np_agg(h, mask, mode), rtol=1e-6)
  np.testing.assert_allclose(metrics["actor/entropy"], value)


# ----------------------------------------------------------------------------- no token loops
@pytest.mark.parametrize("fn", ["policy_loss", "grpo", "rlsd", "kl"])
def test_traced_program_size_does_not_grow_with_length(fn):
  def n_eqns(r):
    x = jnp.zeros((4, r))
    m = jnp.ones((4, r))
    f = {
      "policy_loss": lambda: policy_loss(x, x, x, m)[0],
      "grpo": lambda: grpo_advantages(jnp.zeros(r), jnp.zeros(r, jnp.int32)),
      "rlsd": lambda: rlsd_token_advantages(jnp.zeros(4), x, x, m, 0.5),
      "kl": lambda: kl_loss(x, x, m)[0],
    }[fn]
    return len(jax.make_jaxpr(f)().jaxpr.eqns)

  assert n_eqns(3) == n_eqns(64)


def test_every_loss_runs_under_jit_and_equals_eager():
  from sdar_jax.algos import skill_sd_loss

  rng, logp, old = random_logps(13)
  mask = make_mask()
  h = np.abs(rng.normal(size=(B, R))).astype(np.float32)
  calls = {
    "agg_loss": (agg_loss, (h, mask), dict(agg="seq-mean-token-mean")),
    "kl_loss": (kl_loss, (logp, old, mask), dict(kind="mse", agg="seq-mean-token-sum")),
    "entropy_loss": (entropy_loss, (h, mask), dict(agg="token-mean")),
    "skill_sd_loss": (skill_sd_loss, (logp, old, old + 0.2, mask), dict(agg="token-mean")),
    "apply_invalid_penalty": (apply_invalid_penalty, (h[:, 0], mask[:, 0]), dict(coef=0.1)),
  }
  for name, (fn, args, static) in calls.items():
    jitted = jax.jit(lambda *a, fn=fn, static=static: fn(*a, **static))
    np.testing.assert_allclose(
      jax.tree.leaves(jitted(*args)), jax.tree.leaves(fn(*args, **static)), rtol=1e-6, err_msg=name
    )


def test_grpo_constant_group_gives_exactly_zero_advantages():
  # 64 turn-samples that all scored -0.1 (every turn invalid, no win): summing -0.1 in float32
  # is not exact, and (rounding noise) / (0 + 1e-6) would be O(1e-2) advantages.
  scores = np.full((64,), -0.1, np.float32)
  scores[40:] = np.float32(10.0 - 0.1)  # a second group, also constant
  groups = np.array([0] * 40 + [1] * 24, np.int32)
  adv = np.asarray(grpo_advantages(scores, groups))
  assert np.all(adv == 0.0)
