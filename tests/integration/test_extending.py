"""docs/extending.md, proven: a gate and a loss term registered here (as a user would in their own
module) are selected by name through `AlgoConfig` / a run config and used by the update. Truth is
the full-logits `forward` and jax.grad of the formula written here, never the step's helpers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import alfworld, common
from sdar_jax.algos import DISTILL_LOSSES, GATES, AlgoConfig, agg_loss, masked_mean
from sdar_jax.core.batch import TurnBatch
from sdar_jax.core.loss import loss_and_grads
from sdar_jax.core.train_state import create_train_state, make_optimizer
from sdar_jax.core.train_step import TrainStep
from sdar_jax.models import ModelConfig, forward, init_params
from sdar_jax.run.config_validation import ConfigError, validate
from tests.helpers import tiny_run_config

CONFIG = ModelConfig.tiny(
  "qwen3",
  vocab_size=64,
  hidden_size=32,
  intermediate_size=64,
  num_layers=1,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
)
PS, PT, R = 3, 5, 4  # student prompt, teacher prompt (2 skill tokens + the prompt), response slots
LAM = 0.5


@pytest.fixture(scope="module")
def params():
  return init_params(CONFIG, jax.random.key(0), std=0.2)


@pytest.fixture(scope="module")
def batch():
  rng = np.random.default_rng(0)
  prompts = rng.integers(1, CONFIG.vocab_size, (4, PS))
  skills = rng.integers(1, CONFIG.vocab_size, (4, PT - PS))
  responses = rng.integers(1, CONFIG.vocab_size, (4, R))
  response_mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], np.float32)
  student = np.concatenate([prompts, responses], 1).astype(np.int32)
  teacher = np.concatenate([skills, prompts, responses], 1).astype(np.int32)
  return TurnBatch(
    student_tokens=student,
    student_mask=np.concatenate([np.ones((4, PS)), response_mask], 1).astype(np.int32),
    response_mask=response_mask,
    old_logp=np.zeros((4, R), np.float32),
    advantages=np.zeros(4, np.float32),
    teacher_tokens=teacher,
    teacher_mask=np.concatenate([np.ones((4, PT)), response_mask], 1).astype(np.int32),
  )


def response_logp(params, tokens, mask):
  """Log-probs [B, R] of the response tokens from the full [B, T, V] logits."""
  prompt = tokens.shape[1] - R
  logits = forward(CONFIG, params, tokens, mask)[:, prompt - 1 : prompt - 1 + R]
  logp = jax.nn.log_softmax(logits, axis=-1)
  return jnp.take_along_axis(logp, jnp.asarray(tokens)[:, prompt:, None], axis=-1)[..., 0]


def toy_algo(**fields) -> AlgoConfig:
  """Only the toy term: no policy gradient, entropy or KL; the teacher scored inside the step."""
  off = {"pg_coef": 0.0, "entropy_coef": 0.0, "kl_coef": 0.0}
  return AlgoConfig(**off, lam=LAM, teacher_source="update", **fields)


def close_to_scale(actual, desired):
  scale = float(np.max(np.abs(desired)))
  np.testing.assert_allclose(actual, desired, rtol=0, atol=1e-5 * scale + 1e-9)


# ------------------------------------------------------------------------------------ a gate
@pytest.fixture
def linear_gap_gate():
  """docs/extending.md "Adding a gate": g = clip(0.5 + Δ/10, 0, 1)."""

  @GATES.register("linear_gap")
  def linear_gap(beta, gap, entropy=None, vocab_size=None):
    del beta, entropy, vocab_size
    return jnp.clip(0.5 + gap / 10.0, 0.0, 1.0)

  yield "linear_gap"
  GATES.unregister("linear_gap")


@pytest.mark.slow
def test_a_registered_gate_drives_the_sdar_term(params, batch, linear_gap_gate):
  algo = toy_algo(distill="sdar", gate=linear_gap_gate)
  grads, metrics = jax.jit(lambda p: loss_and_grads(CONFIG, algo, p, batch))(params)

  m = jnp.asarray(batch.response_mask)
  student = response_logp(params, batch.student_tokens, batch.student_mask)
  teacher = response_logp(params, batch.teacher_tokens, batch.teacher_mask)
  gate = np.clip(0.5 + (teacher - student) / 10.0, 0.0, 1.0)  # constants of the surrogate

  def surrogate(p):  # SDAR's reference form λ·g·(sg(lT) − lθ): gradient −λ·g·∇lθ
    return -LAM * jnp.sum(gate * response_logp(p, batch.student_tokens, batch.student_mask) * m)

  want = jax.grad(surrogate)(params)
  jax.tree.map(
    lambda a, b: close_to_scale(np.asarray(a), np.asarray(b) / float(m.sum())), grads, want
  )
  np.testing.assert_allclose(metrics["sdar/gate_mean"], np.sum(gate * m) / m.sum(), rtol=1e-5)


@pytest.mark.slow
def test_a_registered_gate_is_selectable_from_a_run_config(params, batch, linear_gap_gate):
  config = common.override(alfworld.get_config("local=True"), {"algo.gate": linear_gap_gate})
  validate(config, num_devices=8)
  algo = AlgoConfig.from_config(config.algo, teacher_source="update", kl_coef=0.0)
  optimizer = make_optimizer(lr=1e-3)
  step = TrainStep(CONFIG, algo, optimizer)
  state = create_train_state(jax.tree.map(jnp.copy, params), optimizer)  # the step donates it
  state, metrics = step(state, batch)
  assert int(state.step) == 1 and np.isfinite(float(metrics["train/loss"]))
  assert 0.0 < float(metrics["sdar/gate_mean"]) < 1.0


def test_an_unregistered_gate_is_refused_naming_the_valid_ones():
  config = common.override(alfworld.get_config("local=True"), {"algo.gate": "linear_gap"})
  with pytest.raises(ConfigError, match=r"algo.gate='linear_gap': unknown name") as e:
    validate(config, num_devices=8)
  assert str(GATES.names()) in str(e.value)


# ------------------------------------------------------------------------------- a loss term
@pytest.fixture
def squared_gap_term():
  """docs/extending.md "Adding a loss term": ℓ = (lθ − sg(lT))², aggregated like every term."""

  @DISTILL_LOSSES.register("squared_gap")
  def squared_gap(*, student_logp, teacher_logp, mask, agg, denom=None, num_seqs=None, **unused):
    del unused
    per_token = (student_logp - jax.lax.stop_gradient(teacher_logp)) ** 2
    loss = agg_loss(per_token, mask, agg, denom, num_seqs)
    return loss, {"squared_gap/loss": loss, "squared_gap/mean": masked_mean(per_token, mask, denom)}

  yield "squared_gap"
  DISTILL_LOSSES.unregister("squared_gap")


@pytest.mark.slow
def test_a_registered_loss_term_is_added_with_weight_lam(params, batch, squared_gap_term):
  algo = toy_algo(distill=squared_gap_term)
  assert (
    algo.scores_teacher
  )  # a distillation term reads the teacher: it is scored without being asked
  grads, metrics = jax.jit(lambda p: loss_and_grads(CONFIG, algo, p, batch, micro_batch_size=2))(
    params
  )
  m = jnp.asarray(batch.response_mask)
  teacher = response_logp(params, batch.teacher_tokens, batch.teacher_mask)

  def surrogate(p):
    student = response_logp(p, batch.student_tokens, batch.student_mask)
    return LAM * jnp.sum((student - teacher) ** 2 * m) / jnp.sum(m)

  value, want = jax.value_and_grad(surrogate)(params)
  jax.tree.map(lambda a, b: close_to_scale(np.asarray(a), np.asarray(b)), grads, want)
  np.testing.assert_allclose(metrics["train/loss"], value, rtol=1e-5)
  np.testing.assert_allclose(LAM * metrics["squared_gap/loss"], value, rtol=1e-5)


# ------------------------------------------------------------------------ adding an environment
class SayTheWordAdapter:
  """The toy adapter of docs/extending.md: the observation and the words, the first word out."""

  def user_text(self, view, history_length):
    del history_length
    return f"{view.observation}\nSay one of: {' '.join(view.admissible)}."

  def project(self, text):
    words = text.split()
    return (words[0], True) if words else ("", False)

  def skill_query(self, view):
    return view.task


@pytest.fixture
def dummy_family():
  """envs/dummy.py's say-the-word env registered as a family, as docs/extending.md shows; the
  splits it was asked for are recorded."""
  import envs
  from envs.base import _FAMILIES
  from envs.dummy import WORDS

  asked: list[str] = []

  def split(env_cfg, split_name):
    asked.append(split_name)
    return envs.EnvSplit(env_kwargs={"slow_s": 0.0}, task_names=[f"say {w}" for w in WORDS])

  family = envs.register_family(
    envs.EnvFamily(name="dummy", split=split, adapter=SayTheWordAdapter, skills="dummy")
  )
  yield family, asked
  _FAMILIES.pop("dummy")


@pytest.mark.slow
def test_a_registered_environment_is_trained_for_one_iteration(tmp_path, dummy_family):
  """The dummy env, registered through envs.register_family only, is played and trained on by the
  real Trainer for one iteration: its splits were asked for, its task type shows in the metrics."""
  import json

  from sdar_jax.run import trainer
  from sdar_jax.run.config_validation import validate

  family, asked = dummy_family
  overrides = {"env.name": "dummy", "eval.skills": "without", "rollout.max_new_tokens": 8}
  config = tiny_run_config(1, algo="grpo", **overrides)
  validate(config)  # no configs/ entry: the registered family makes the name known
  run = trainer.Trainer(config, str(tmp_path))
  try:
    assert run.env_family is family
    assert isinstance(run.loop.adapter, SayTheWordAdapter)
    run.run()
  finally:
    run.close()
  assert asked[0] == "train" and config.eval.split in asked
  with open(tmp_path / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  trained = [r for r in rows if "episode/say_word_success_rate" in r]
  assert trained, rows
  assert np.isfinite(trained[-1]["episode/length_mean"]) and trained[-1]["episode/length_mean"] >= 1


def test_an_env_name_needs_a_config_or_a_registered_family(dummy_family):
  from envs.base import env_section_problems

  assert env_section_problems({"name": "dummy"}, ("alfworld",)) == []  # registered, no config
  for name in ("nope", "web.shop"):  # no family; not even a module name (nothing imported)
    [line] = env_section_problems({"name": name}, ("alfworld",))
    assert line.startswith(f"env.name={name!r}: unknown name. Fix: use one of ['alfworld']")
    assert "register an envs.EnvFamily" in line
