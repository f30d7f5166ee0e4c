"""TPU compile-and-fit planning (sdar_jax.aot, the command; sdar_jax.run.tpu_plan, the plan;
sdar_jax.infra.tpu_slices, the slices; sdar_jax.models.flops, the FLOP formula).

The FLOP formula and the slice names are checked everywhere; compiling for a TPU slice needs the
`tpu-plan` extra (libtpu), so those tests skip where it is absent (`make test-tpu-plan` installs it
next to .venv and runs this file).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import alfworld, common
from sdar_jax.core.scoring import response_logprobs
from sdar_jax.infra import tpu_slices
from sdar_jax.models import ModelConfig, flops, param_shapes
from sdar_jax.run import tpu_plan

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAVE_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(
  not HAVE_LIBTPU, reason="needs libtpu (the tpu-plan extra): run `make test-tpu-plan`"
)

# The demo's tiny model with a small vocabulary and short sequences: compiles in seconds.
TINY_OVERRIDES = {
  "model.tiny.vocab_size": 4096,
  "rollout.max_prompt_len": 64,
  "rollout.max_new_tokens": 16,
}
TINY_TEACHER_PROMPT = 128


def tiny_config(**overrides):
  config = alfworld.get_config("model=tiny,algo=sdar,local=True")
  return common.override(config, {**TINY_OVERRIDES, **overrides})


# ------------------------------------------------------------------------------- no libtpu needed
def test_forward_flops_hand_worked():
  # D=4, N=2 q heads, K=1 kv head, H=2, F=6, V=10, L=2; 3 rows of 5 tokens, 2 through the head.
  config = ModelConfig(
    family="qwen3",
    vocab_size=10,
    hidden_size=4,
    intermediate_size=6,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=2,
  )
  # Matmul weights per layer: q 4*2*2=16, k 4*1*2=8, v 8, o 2*2*4=16, gate/up/down 3*4*6=72 -> 120.
  # 2 FLOPs per weight per token: 2*120 * 2 layers * 15 tokens = 7,200.
  # Attention: q.k and p.v, 2*5 keys*2 heads*2 dims each = 40 per token per layer; x2 FLOPs/MAC,
  # 2 layers, 15 tokens: 40*2*2*15 = 2,400. lm_head: 2*4*10 per position, 3 rows x 2 = 480.
  assert flops.forward_flops(config, rows=3, length=5, head_positions=2) == 7_200 + 2_400 + 480
  parts = flops.update_flops(config, 3, 3, 2, with_ref=True, teacher_prompt_len=4)
  assert parts["student_fwd_bwd"] == 3 * 10_080  # forward + backward (2 forwards' worth)
  assert parts["reference_fwd"] == 10_080
  # Teacher rows: 4 + 2 = 6 tokens: 2*120*2*18 + (4*6*2*2)*2*18 + 480 = 8,640 + 3,456 + 480.
  assert parts["teacher_fwd"] == 8_640 + 3_456 + 480


def test_forward_flops_match_xla_count_of_a_one_layer_model():
  # With one layer the scanned body runs once, so XLA's cost analysis counts the whole forward;
  # the formula leaves out the element-wise work (norms, RoPE, softmax), a few percent here. The
  # layers scan as on TPU / GPU (the formula's target): unrolled, as on CPU by default, the last
  # layer would skip the prompt positions' queries and MLP. 56 tokens: the "xla" attention forms the
  # whole T x T product the formula counts (from 64 tokens on it forms causal query blocks only).
  config = ModelConfig(
    family="qwen2",
    vocab_size=512,
    hidden_size=256,
    intermediate_size=1024,
    num_layers=1,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    qkv_bias=True,
    layer_loop="scan",
  )
  rows, prompt, response = 2, 40, 16
  tokens = jax.ShapeDtypeStruct((rows, prompt + response), jnp.int32)
  fn = jax.jit(lambda p, t, m: response_logprobs(config, p, t, m, response)[0])
  cost = fn.lower(param_shapes(config), tokens, tokens).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  formula = flops.forward_flops(config, rows, prompt + response, response)
  assert formula <= cost["flops"] <= 1.05 * formula


def test_parse_topology_names():
  cases = {  # name -> (libtpu topology, chips)
    "v5e-16": ("v5e:4x4", 16),
    "v5e-4": ("v5e:2x2", 4),
    "v5p-8": ("v5:2x2x1", 4),  # v5p and v4 names count TensorCores, two per chip
    "v4-8": ("v4:2x2x1", 4),
    "v4-32": ("v4:2x2x4", 16),
    "v6e-8": ("v6e:2x4", 8),
  }
  for name, (topology, chips) in cases.items():
    tpu_slice = tpu_slices.parse_topology(name)
    assert (tpu_slice.topology_name, tpu_slice.num_chips) == (topology, chips), name
  assert tpu_slices.parse_topology("v5p-8").chip.hbm_gib == 95
  assert tpu_slices.parse_topology("v5e-16").chip.hbm_gib == 16
  assert tpu_slices.parse_topology("v5e-16").chip.hbm_bytes == int(15.75 * 2**30)  # XLA's budget


@pytest.mark.parametrize("bad", ["v5e-3", "v7-8", "tpu", "v5p-9"])
def test_unknown_topology_is_named_with_the_fix(bad):
  with pytest.raises(ValueError, match=rf"--topology='{bad}'.*Fix: use one of .*v5e-16"):
    tpu_slices.parse_topology(bad)


def test_missing_libtpu_says_how_to_install_it(monkeypatch):
  monkeypatch.setitem(sys.modules, "libtpu", None)  # import fails as if it were absent
  with pytest.raises(RuntimeError, match=r"needs libtpu.*tpu-plan"):
    tpu_slices.topology_devices(tpu_slices.parse_topology("v5e-4"))


# ---------------------------------------------------------------------------------- with libtpu
@needs_libtpu
def test_topology_devices_are_the_slices_chips():
  expected = {"v5e-4": (4, "TPU v5 lite"), "v5p-8": (4, "TPU v5"), "v6e-8": (8, "TPU v6 lite")}
  for name, (count, kind) in expected.items():
    devices = tpu_slices.topology_devices(tpu_slices.parse_topology(name))
    assert len(devices) == count, name
    assert {d.device_kind for d in devices} == {kind}, name
    assert {d.platform for d in devices} == {"tpu"}, name


@needs_libtpu
@pytest.mark.parametrize("name", ["v4-8", "v5e-4", "v5p-8", "v6e-8"])
def test_usable_hbm_is_what_xla_refuses_beyond(name):
  # A program whose temporaries (a 256 GiB cumulative sum) exceed any chip: XLA refuses it and
  # names the HBM it can use, which must be the planner's budget for that chip.
  tpu_slice = tpu_slices.parse_topology(name)
  mesh = jax.sharding.Mesh(tpu_slices.topology_devices(tpu_slice)[:1], ("x",))
  one = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  columns = jax.ShapeDtypeStruct((2**28,), jnp.float32, sharding=one)

  def huge(x):
    return jnp.cumsum(jnp.broadcast_to(x, (2**8, 2**28)), axis=0)[:, ::100_000]

  fn = jax.jit(huge, in_shardings=one, out_shardings=one)
  report = tpu_plan._compile_part("huge", lambda: fn.lower(columns), columns, 0, 0, 0)
  assert not report.compiled and not report.fits
  assert report.temporaries >= 2**8 * 2**28 * 4  # at least the 256 GiB of the cumulative sum
  assert report.arguments == 2**28 * 4
  assert abs(report.xla_usable_hbm - tpu_slice.chip.hbm_bytes) <= 0.01 * 2**30


@pytest.fixture(scope="module")
def tiny_plan():
  if not HAVE_LIBTPU:
    pytest.skip("needs libtpu (the tpu-plan extra): run `make test-tpu-plan`")
  return tpu_plan.plan(tiny_config(), "v5e-4", teacher_prompt_len=TINY_TEACHER_PROMPT)


@needs_libtpu
@pytest.mark.slow
def test_tiny_model_compiles_every_program_for_a_2x2_v5e(tiny_plan):
  assert [r.part for r in tiny_plan.reports] == ["update", "teacher", "sampler"]
  assert tiny_plan.mesh_shape == {"data": 4, "fsdp": 1, "tensor": 1}
  assert tiny_plan.shapes == tpu_plan.Shapes(
    mini_batch=24,
    micro_batch=8,
    prompt_len=64,
    teacher_prompt_len=128,
    response_len=16,
    rollout_rows=8,
  )
  for report in tiny_plan.reports:
    assert report.compiled and report.fits, report
    assert report.total < 16 * 2**30  # a v5e chip's HBM


@needs_libtpu
@pytest.mark.slow
def test_update_arguments_are_the_state_the_reference_and_a_batch_shard(tiny_plan):
  # Everything is replicated over data=4 except the batch. Counted by hand from the shapes:
  # fp32 params, two fp32 AdamW moments and the fp32 frozen reference params; per batch row
  # student tokens + mask (64+16 int32 each), response mask, old and teacher log-probs (16 fp32
  # each), the advantage, teacher tokens + mask (128+16 int32 each); 24 rows over 4 chips.
  n = tiny_plan.model_config.num_params
  params_bytes = 4 * n
  row_bytes = 2 * 80 * 4 + 3 * 16 * 4 + 4 + 2 * 144 * 4
  expected = 4 * params_bytes + (24 // 4) * row_bytes
  update = tiny_plan.reports[0]
  # XLA's figure includes the step counters and TPU layout padding, which is large relative to
  # this model's 64- and 16-wide dimensions (TPU tiles are 128 lanes wide): at least the raw bytes,
  # at most a quarter more.
  assert expected <= update.arguments <= 1.25 * expected
  # Teacher scoring and sampling take the params; the two moments, the reference params and three
  # int32 counters (update step, skipped updates, Adam's count) stay resident.
  resident = 3 * params_bytes + 3 * 4
  assert tiny_plan.reports[1].resident == resident
  assert tiny_plan.reports[2].resident == resident


@needs_libtpu
@pytest.mark.slow
def test_cli_applies_mesh_overrides_and_writes_json(tmp_path, tiny_plan):
  out = tmp_path / "plan.json"
  overrides = [f"--config.{k}={v}" for k, v in TINY_OVERRIDES.items()]
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "sdar_jax.aot",
      "--config=configs/alfworld.py:model=tiny,algo=sdar,local=True",
      "--topology=v5e-4",
      "--parts=update",
      f"--teacher_prompt_len={TINY_TEACHER_PROMPT}",
      "--config.mesh.data=1",
      "--config.mesh.fsdp=4",
      f"--json={out}",
      *overrides,
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "fits on v5e-4 with mesh {'data': 1, 'fsdp': 4, 'tensor': 1}" in proc.stdout
  record = json.loads(out.read_text())
  assert record["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
  assert [r["part"] for r in record["reports"]] == ["update"]
  # fsdp=4 shards the state and the reference params 4 ways: the arguments drop below half of
  # the replicated (data=4) plan's.
  sharded = record["reports"][0]["arguments"]
  replicated = tiny_plan.reports[0].arguments
  assert sharded < 0.5 * replicated
  assert math.isclose(sharded, replicated / 4, rel_tol=0.35)


@needs_libtpu
@pytest.mark.slow
def test_splash_attention_compiles_for_a_2x2_v5e_without_t_by_t_scores():
  # model.attention=splash through the planner on a data/fsdp/tensor mesh: the Pallas kernel runs
  # under shard_map (batch over fsdp, kv heads over tensor), and the update's temporaries drop
  # against "xla" (without remat, where "xla" keeps the layers' float32 scores [rows, heads, T, T]
  # per chip for the backward pass and splash keeps none). The bound is half of one layer's scores:
  # what the two programs hold apart from the scores differs by compiler version (with the pinned
  # libtpu a whole layer's bound failed: 16.66 MB of splash temporaries against 16.22 MB allowed),
  # while half a layer's T x T scores is far above the splash kernel's O(T) residuals. With remat,
  # as the real presets run, it compiles and fits too.
  prompt = 512
  overrides = {"mesh.data": 1, "mesh.fsdp": 2, "mesh.tensor": 2, "rollout.max_prompt_len": prompt}
  update = {}
  for attention, remat in (("xla", False), ("splash", False), ("splash", True)):
    config = tiny_config(**overrides, **{"model.attention": attention, "model.remat": remat})
    plan = tpu_plan.plan(config, "v5e-4", parts=("update",), teacher_prompt_len=prompt)
    update[attention, remat] = plan.reports[0]
    assert plan.reports[0].compiled and plan.reports[0].fits, (attention, remat)
  T = prompt + TINY_OVERRIDES["rollout.max_new_tokens"]
  rows, heads = plan.shapes.micro_batch // 2, 4 // 2  # the tiny model's 4 q heads over tensor=2
  scores = rows * heads * T * T * 4
  assert update["splash", False].temporaries < update["xla", False].temporaries - scores / 2


@needs_libtpu
def test_splash_attention_lowers_to_the_pallas_kernel():
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  from sdar_jax.models import hidden_states

  chip = tpu_slices.topology_devices(tpu_slices.parse_topology("v5e-4"))[:1]
  one_chip = NamedSharding(Mesh(np.array(chip), ("x",)), PartitionSpec())
  config = ModelConfig.tiny(vocab_size=512, num_layers=1, attention="splash")
  params = jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one_chip), param_shapes(config)
  )
  tokens = jax.ShapeDtypeStruct((2, 200), jnp.int32, sharding=one_chip)
  lowered = jax.jit(lambda p, t, m: hidden_states(config, p, t, m)).lower(params, tokens, tokens)
  assert "tpu_custom_call" in lowered.as_text()
  assert lowered.compile() is not None
