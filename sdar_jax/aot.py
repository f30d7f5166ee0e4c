r"""TPU compile-and-fit planning on any machine: no TPU needed, only the `tpu-plan` extra (libtpu).

    python -m sdar_jax.aot --config=configs/alfworld.py:model=qwen2.5-3b,algo=sdar \
        --topology=v5p-8 --config.mesh.data=1 --config.mesh.fsdp=4 --config.model.remat=True

libtpu compiles for a TPU slice it is not running on: `jax.experimental.topologies` describes the
slice's chips as compile-only devices, the config's ('data', 'fsdp', 'tensor') mesh is laid over
them, and three programs of a training iteration are lowered and compiled from abstract inputs
(`jax.ShapeDtypeStruct`s with their shardings; no array is ever allocated):

* `update`: THE update (`TrainStep`, built by `train_step_from_config` exactly as the trainer
  builds it) on one mini-batch: train state (fp32 master weights, AdamW moments), the batch at the
  config's shapes, the frozen reference params when the KL term is on;
* `teacher`: `TrainStep.score_teacher`, the teacher forward on the skill-prompted rows, once per
  iteration at θ_old (algo.teacher_source="rollout"; with "step" it is inside the update);
* `sampler`: the rollout sampler's compiled function, prefill and `while_loop` decode together,
  for the rollout batch (env.tasks_per_step x env.group_size rows, every prompt distinct: the
  later turns' case) at max_prompt_len + max_new_tokens.

For each it prints XLA's per-device memory (arguments, temporaries, generated code, outputs not
aliased to donated arguments) plus what stays resident on the chip while that program runs but is
not one of its arguments (the AdamW moments and the reference params during teacher scoring and
sampling), against the chip's HBM, and whether it fits.

FLOPs come from the model formula, not from XLA's cost analysis (which counts a scanned loop body
once): a forward pass over rows x T tokens costs 2 x (matmul parameters of the decoder layers) per
token, plus 4 x T x heads x head_dim per token per layer for the two attention products (the
implementation computes the full T x T score matrix, masked), plus 2 x hidden x vocab for each of
the R response positions that go through the lm_head. The update is 3 student forwards (forward +
backward) plus the reference forward; teacher scoring is one forward at the teacher's length.
Rematerialisation recomputes one more student forward on the hardware; the figures are model
FLOPs, without it. "ideal s" is the time at 100% of the slice's peak bf16 FLOP/s.

No weights are read (the preset gives the architecture). docs/tpu_planning.md has the fit table
of the paper's models on common slices and the commands that made it.

Length: topology parsing, abstract inputs for three programs, the memory read-out and the CLI
are one tool; each part is small and only this file uses them.

Why one file of ~720 lines: planning is one pipeline (topology, mesh, abstract inputs, the three
compiled programs, memory against HBM, model-formula FLOPs, the table and the CLI) whose steps
share one plan object.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from envs.errors import EnvInputError
from sdar_jax.core import sharding
from sdar_jax.core.batch import batch_bucket, new_tokens_bucket, prompt_bucket
from sdar_jax.infra.errors import UserError, exit_on_user_error
from sdar_jax.models import ModelConfig, param_shapes

GiB = 2**30
PARTS = ("update", "teacher", "sampler")


# ------------------------------------------------------------------------------------ topologies
@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation: per-chip HBM (Google Cloud's published figure, and what XLA's TPU
  compiler lets a program use, read from its out-of-memory message: the budget a plan must fit),
  peak dense bf16 FLOP/s, how libtpu spells its topologies, and whether a slice name counts
  TensorCores (v4 and v5p: two per chip, run as one "megacore" device) or chips (v5e, v6e)."""

  name: str
  hbm_gib: float
  usable_hbm_gib: float
  peak_bf16_tflops: float
  topology_prefix: str
  megacore: bool

  @property
  def hbm_bytes(self) -> int:
    """The budget: the HBM XLA lets one program use."""
    return int(self.usable_hbm_gib * GiB)


CHIPS: dict[str, Chip] = {
  "v4": Chip("v4", 32, 30.75, 275, "v4", megacore=True),
  "v5e": Chip("v5e", 16, 15.75, 197, "v5e", megacore=False),
  "v5p": Chip("v5p", 95, 95.74, 459, "v5", megacore=True),
  "v6e": Chip("v6e", 32, 31.25, 918, "v6e", megacore=False),
}

# Chip grid of each slice size (v4 / v5p: 3-D torus of chips; v5e / v6e: 2-D).
_GRIDS_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4)}
_GRIDS_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16)}


@dataclasses.dataclass(frozen=True)
class Slice:
  """A TPU slice: its name (e.g. "v5e-16"), chip generation and chip grid."""

  name: str
  chip: Chip
  grid: tuple[int, ...]

  @property
  def num_chips(self) -> int:
    return math.prod(self.grid)

  @property
  def topology_name(self) -> str:
    """libtpu's spelling, e.g. "v5e:4x4" or "v5:2x2x1"."""
    return f"{self.chip.topology_prefix}:{'x'.join(map(str, self.grid))}"

  @property
  def host_bounds(self) -> tuple[int, int, int]:
    """Chips per host: 2x2, the whole slice when it is smaller, 2x4 on single-host v5e-8 /
    v6e-8."""
    if self.grid == (2, 4):
      return (2, 4, 1)
    return (min(self.grid[0], 2), min(self.grid[1], 2), 1)

  def describe(self) -> str:
    return (
      f"{self.name}: {self.num_chips} x TPU {self.chip.name} ({self.topology_name}), "
      f"{self.chip.hbm_gib:g} GiB HBM ({self.chip.usable_hbm_gib:g} GiB usable by XLA) and "
      f"{self.chip.peak_bf16_tflops:g} bf16 TFLOP/s per chip"
    )


def known_slices() -> list[str]:
  names = []
  for chip in CHIPS.values():
    grids = _GRIDS_3D if chip.megacore else _GRIDS_2D
    names += [f"{chip.name}-{n * 2 if chip.megacore else n}" for n in grids]
  return names


def parse_topology(name: str) -> Slice:
  """A slice by its Cloud TPU name: "v5e-16", "v5p-8", "v6e-8", "v4-8", ... (v4 / v5p count
  TensorCores, two per chip; v5e / v6e count chips)."""
  generation, _, size = name.strip().lower().partition("-")
  chip = CHIPS.get(generation)
  grids = None if chip is None else (_GRIDS_3D if chip.megacore else _GRIDS_2D)
  count = int(size) if size.isdigit() else -1
  if chip is not None and chip.megacore and count % 2 == 0:
    count //= 2
  if grids is None or count not in grids:
    raise ValueError(
      f"--topology={name!r} is not a TPU slice this planner knows. Fix: use one of "
      f"{known_slices()}."
    )
  return Slice(name.strip().lower(), chip, grids[count])


def topology_devices(tpu_slice: Slice) -> list[Any]:
  """The slice's chips as compile-only devices (needs libtpu; no TPU has to be attached)."""
  if importlib.util.find_spec("libtpu") is None:
    raise RuntimeError(
      "Compiling for a TPU slice without a TPU needs libtpu. Fix: pip install -e '.[tpu-plan]' "
      "(or `make test-tpu-plan`)."
    )
  from jax.experimental import topologies

  # libtpu takes a machine-wide lock on load, meant for processes that drive the chips; compiling
  # for a described slice drives none, so several planners (and a test's subprocess) may load it.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  desc = topologies.get_topology_desc(
    tpu_slice.topology_name,
    "tpu",
    chip_config_name="megacore" if tpu_slice.chip.megacore else "default",
    chips_per_host_bounds=tpu_slice.host_bounds,
    num_slices=1,
    wrap=(False, False, False),
  )
  devices = list(desc.devices)
  if len(devices) != tpu_slice.num_chips:
    raise RuntimeError(
      f"libtpu described {tpu_slice.topology_name} as {len(devices)} devices, expected "
      f"{tpu_slice.num_chips} chips."
    )
  return devices


# ---------------------------------------------------------------------------------------- FLOPs
def forward_flops(config: ModelConfig, rows: int, length: int, head_positions: int) -> int:
  """Model FLOPs of one forward over rows x length tokens with `head_positions` positions per row
  through the lm_head (see the module docstring for the formula). Every layer is counted at every
  position, as the scanned layers of TPU / GPU run them; unrolled (CPU), the update's last layer
  skips the prompt positions (`sdar_jax.models.qwen.apply`'s `keep_last`), so there this counts
  more than is run."""
  L, D, N, K, H, F, V = (
    config.num_layers,
    config.hidden_size,
    config.num_heads,
    config.num_kv_heads,
    config.head_dim,
    config.intermediate_size,
    config.vocab_size,
  )
  layer_matmul_params = D * N * H + 2 * D * K * H + N * H * D + 3 * D * F
  tokens = rows * length
  layers = 2 * layer_matmul_params * L * tokens
  attention = 4 * length * N * H * L * tokens
  head = 2 * D * V * rows * head_positions
  return layers + attention + head


def update_flops(
  config: ModelConfig,
  batch_size: int,
  prompt_len: int,
  response_len: int,
  *,
  with_ref: bool,
  teacher_prompt_len: int | None = None,
) -> dict[str, int]:
  """Model FLOPs of one update: student forward + backward (3 forwards), the reference forward
  when the KL term reads reference params, and the teacher forward when it runs inside the update
  (`teacher_prompt_len` given)."""
  student = forward_flops(config, batch_size, prompt_len + response_len, response_len)
  out = {"student_fwd_bwd": 3 * student}
  if with_ref:
    out["reference_fwd"] = student
  if teacher_prompt_len is not None:
    out["teacher_fwd"] = forward_flops(
      config, batch_size, teacher_prompt_len + response_len, response_len
    )
  return out


def decode_flops(config: ModelConfig, rows: int, cache_size: int, steps: int) -> int:
  """Model FLOPs of `steps` decode steps of `rows` rows: one token per row and step through the
  layers and the lm_head, attending over the whole cache of `cache_size` slots (masked), as the
  sampler's loop does."""
  L, N, H = config.num_layers, config.num_heads, config.head_dim
  one_token = forward_flops(config, 1, 1, 1) - 4 * N * H * L  # layers + lm_head, no attention
  return rows * steps * (one_token + 4 * cache_size * N * H * L)


# -------------------------------------------------------------------------------------- shapes
@dataclasses.dataclass(frozen=True)
class Shapes:
  """The padded shapes of one training iteration."""

  mini_batch: int  # turn-samples per update
  micro_batch: int  # turn-samples per forward / backward
  prompt_len: int  # Ps, student prompt bucket
  teacher_prompt_len: int  # Pt
  response_len: int  # R
  rollout_rows: int  # sampler rows (tasks x group size)

  def describe(self) -> str:
    return (
      f"mini-batch {self.mini_batch} (micro {self.micro_batch}), prompt {self.prompt_len}, "
      f"teacher prompt {self.teacher_prompt_len}, response {self.response_len}, "
      f"rollout {self.rollout_rows} rows"
    )


def shapes_from_config(config, teacher_prompt_len: int | None = None) -> Shapes:
  """The largest bucket a run of `config` compiles: prompts at rollout.max_prompt_len, responses
  at rollout.max_new_tokens; the teacher prompt defaults to 512 tokens of skills on top."""
  prompt = prompt_bucket(int(config.rollout.max_prompt_len))
  teacher = prompt_bucket(int(teacher_prompt_len or config.rollout.max_prompt_len + 512))
  return Shapes(
    mini_batch=int(config.train.mini_batch_size),
    micro_batch=int(config.train.get("micro_batch_size") or config.train.mini_batch_size),
    prompt_len=prompt,
    teacher_prompt_len=teacher,
    response_len=new_tokens_bucket(int(config.rollout.max_new_tokens)),
    rollout_rows=int(config.env.tasks_per_step) * int(config.env.group_size),
  )


def _sds(shape: Sequence[int], dtype, placement) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=placement)


def per_device_bytes(tree) -> int:
  """Bytes of one device's shards of an abstract tree (unpadded)."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
    total += math.prod(shape) * leaf.dtype.itemsize
  return total


# ------------------------------------------------------------------------------------- reports
@dataclasses.dataclass
class PartReport:
  """Per-device memory of one compiled program (bytes) and its model FLOPs."""

  part: str
  arguments: int
  temporaries: int
  generated_code: int
  outputs: int  # outputs not aliased to (donated) arguments
  resident: int  # on the chip during this program, not among its arguments
  hbm: int
  flops: int
  compile_seconds: float
  compiled: bool = True
  xla_usable_hbm: int = 0  # what XLA said it could use, when it refused to compile
  note: str = ""

  @property
  def total(self) -> int:
    return self.arguments + self.temporaries + self.generated_code + self.outputs + self.resident

  @property
  def fits(self) -> bool:
    return self.total <= self.hbm

  def as_dict(self) -> dict[str, Any]:
    return dict(dataclasses.asdict(self), total=self.total, fits=self.fits)


_OOM = re.compile(
  r"HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)"
)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _compile_part(
  part: str,
  lower: Callable[[], Any],
  arguments: Any,
  resident: int,
  hbm: int,
  flops: int,
) -> PartReport:
  """Compiles one program and reads XLA's per-device memory. When XLA refuses to compile because
  the temporaries alone exceed the chip's HBM, the report carries the temporaries from its message
  and the unpadded per-device size of `arguments` (an abstract tree), marked not compiled."""
  start = time.perf_counter()
  lowered = lower()
  try:
    compiled = lowered.compile()
  except Exception as e:  # XlaRuntimeError; its class moves between jaxlib releases
    match = _OOM.search(str(e))
    if "RESOURCE_EXHAUSTED" not in str(e) or match is None:
      raise
    temporaries = float(match.group(1)) * _UNITS[match.group(2)]
    available = float(match.group(3)) * _UNITS[match.group(4)]
    return PartReport(
      part=part,
      arguments=per_device_bytes(arguments),
      temporaries=int(temporaries),
      generated_code=0,
      outputs=0,
      resident=resident,
      hbm=hbm,
      flops=flops,
      compile_seconds=time.perf_counter() - start,
      compiled=False,
      xla_usable_hbm=int(available),
      note=(
        f"XLA refused to compile: temporaries {temporaries / GiB:.1f} GiB exceed the "
        f"{available / GiB:.2f} GiB it can use; arguments are the unpadded shard sizes"
      ),
    )
  seconds = time.perf_counter() - start
  stats = compiled.memory_analysis()
  if stats is None:
    raise RuntimeError(f"XLA gave no memory analysis for the {part} program.")
  return PartReport(
    part=part,
    arguments=int(stats.argument_size_in_bytes),
    temporaries=int(stats.temp_size_in_bytes),
    generated_code=int(stats.generated_code_size_in_bytes),
    outputs=max(0, int(stats.output_size_in_bytes) - int(stats.alias_size_in_bytes)),
    resident=resident,
    hbm=hbm,
    flops=flops,
    compile_seconds=seconds,
  )


def _lower_sampler(sampler, mesh, params, rows: int, prompt_len: int, new_tokens: int):
  """The sampler's one compiled function (prefill + decode loop) lowered for `rows` distinct
  prompts of `prompt_len` tokens and `new_tokens` new ones, sampling at temperature > 0 without
  top-k / top-p / stop strings (the training rollout's settings), from abstract arguments."""
  replicated = sharding.replicated(mesh)

  def batch(*shape: int, dtype=jnp.int32) -> jax.ShapeDtypeStruct:
    return _sds(shape, dtype, sharding.batch_sharding(mesh, len(shape)))

  def scalar(dtype) -> jax.ShapeDtypeStruct:
    return _sds((), dtype, replicated)

  key = jax.eval_shape(lambda: jax.random.key(0))
  # Sampler.generate's call of its jitted body, with abstract arguments.
  return sampler._run_jit.lower(
    params,
    batch(rows, prompt_len),  # prompt tokens
    batch(rows, prompt_len),  # prompt mask
    batch(rows),  # row -> prefilled prompt
    batch(rows, dtype=jnp.bool_),  # real rows
    batch(rows),  # row ids (each row's random stream)
    scalar(jnp.int32),  # max_new_tokens
    scalar(jnp.float32),  # temperature
    scalar(jnp.float32),  # top_p
    _sds((sampler.config.vocab_size,), jnp.bool_, replicated),  # stop-token table
    _sds((1, 1), jnp.int32, replicated),  # no stop strings
    jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated),  # rng key
    new_bucket=new_tokens,
    greedy=False,
    top_k=0,
    use_top_p=False,
    use_stop_strings=False,
  )


# ------------------------------------------------------------------------------------ planning
@dataclasses.dataclass
class Plan:
  tpu_slice: Slice
  model_config: ModelConfig
  mesh_shape: dict[str, int]
  shapes: Shapes
  reports: list[PartReport]


def plan(
  config,
  topology: str,
  parts: Sequence[str] = PARTS,
  teacher_prompt_len: int | None = None,
  log: Callable[[str], None] = lambda _: None,
) -> Plan:
  """Compiles `parts` of a training iteration of `config` (a run config, as `sdar_jax.train`
  takes) for the TPU slice `topology` and measures each one's per-device memory."""
  from sdar_jax.core.batch import TurnBatch
  from sdar_jax.core.train_state import create_train_state
  from sdar_jax.core.train_step import train_step_from_config
  from sdar_jax.run.config_validation import model_config_from

  unknown = sorted(set(parts) - set(PARTS))
  if unknown:
    raise ValueError(f"--parts names {unknown}; choose from {list(PARTS)}.")
  tpu_slice = parse_topology(topology)
  devices = topology_devices(tpu_slice)
  model_config = model_config_from(config)
  if model_config.layer_loop == "auto":  # resolve for the TPU target, not for this host's CPU
    model_config = model_config.replace(layer_loop="scan")
  mesh = sharding.make_mesh(dict(config.mesh), devices=devices)
  shapes = shapes_from_config(config, teacher_prompt_len)
  hbm = tpu_slice.chip.hbm_bytes
  log(tpu_slice.describe())
  log(
    f"model {model_config.name}: {model_config.num_params / 1e9:.2f} B parameters, "
    f"params {model_config.param_dtype}, compute {model_config.dtype}, remat "
    f"{model_config.remat}; mesh {dict(mesh.shape)}"
  )
  log(f"shapes: {shapes.describe()}")

  step = train_step_from_config(model_config, config, mesh)
  algo = step.algo_config
  state_sh = step.state_shardings()
  abstract_state = jax.eval_shape(
    lambda p: create_train_state(p, step.optimizer, step.algo_config.keeps_ema),
    param_shapes(model_config),
  )
  state = jax.tree.map(lambda a, s: _sds(a.shape, a.dtype, s), abstract_state, state_sh)
  with_ref = algo.needs_ref_params  # the trainer passes the frozen initial params (KL, teacher)
  ref_params = state.params if with_ref else None
  B, Ps, Pt, R = (
    shapes.mini_batch,
    shapes.prompt_len,
    shapes.teacher_prompt_len,
    shapes.response_len,
  )

  def rows(n: int, *tail: int, dtype=jnp.int32):
    return _sds((n, *tail), dtype, sharding.batch_sharding(mesh, 1 + len(tail)))

  teacher_rows = algo.scores_teacher
  batch = TurnBatch(
    student_tokens=rows(B, Ps + R),
    student_mask=rows(B, Ps + R),
    response_mask=rows(B, R, dtype=jnp.float32),
    old_logp=rows(B, R, dtype=jnp.float32),
    advantages=rows(B, dtype=jnp.float32),
    teacher_tokens=rows(B, Pt + R) if teacher_rows else None,
    teacher_mask=rows(B, Pt + R) if teacher_rows else None,
    teacher_logp=(
      rows(B, R, dtype=jnp.float32) if teacher_rows and algo.teacher_source == "rollout" else None
    ),
  )
  # On the chip through the whole iteration but not an argument of teacher scoring / sampling.
  params_bytes = per_device_bytes(state.params)
  resident_besides_params = per_device_bytes(state) - params_bytes
  if with_ref:
    resident_besides_params += params_bytes
  peak = tpu_slice.num_chips * tpu_slice.chip.peak_bf16_tflops * 1e12
  reports = []

  if "update" in parts:
    teacher_in_update = algo.scores_teacher and algo.teacher_source == "step"
    flops = sum(
      update_flops(
        model_config,
        B,
        Ps,
        R,
        with_ref=bool(algo.kl_coef),  # the KL term's reference forward (a frozen teacher's
        # forward is the teacher's, counted below)
        teacher_prompt_len=Pt if teacher_in_update else None,
      ).values()
    )
    log(f"compiling the update ({flops / 1e15:.1f} PFLOP, {flops / peak:.2f} ideal s) ...")
    reports.append(
      _compile_part(
        "update",
        lambda: step.lower(state, batch, ref_params),
        (state, batch, ref_params),
        0,
        hbm,
        flops,
      )
    )
    log(format_report(reports[-1], peak))

  if "teacher" in parts and not (algo.scores_teacher and algo.teacher_source == "rollout"):
    log("teacher: no separate scoring pass (this algo scores no teacher, or inside the update)")
  elif "teacher" in parts:
    flops = forward_flops(model_config, B, Pt + R, R)
    log(f"compiling teacher scoring ({flops / 1e15:.1f} PFLOP) ...")
    reports.append(
      _compile_part(
        "teacher",
        lambda: step.lower_score("teacher", state.params, batch),
        (state.params, batch.teacher_tokens, batch.teacher_mask),
        resident_besides_params,
        hbm,
        flops,
      )
    )
    log(format_report(reports[-1], peak))

  if "sampler" in parts:
    from sdar_jax.core.sampling import Sampler

    sampler = Sampler(model_config, mesh, max_prompt_len=int(config.rollout.max_prompt_len))
    divisor = sharding.batch_divisor(mesh)
    rows_bucket = batch_bucket(shapes.rollout_rows, divisor)
    new = shapes.response_len
    flops = forward_flops(model_config, rows_bucket, Ps, 1) + decode_flops(
      model_config, rows_bucket, Ps + new, new
    )
    log(f"compiling the sampler ({rows_bucket} rows, {flops / 1e15:.2f} PFLOP) ...")
    reports.append(
      _compile_part(
        "sampler",
        lambda: _lower_sampler(sampler, mesh, state.params, rows_bucket, Ps, new),
        state.params,
        resident_besides_params,
        hbm,
        flops,
      )
    )
    log(format_report(reports[-1], peak))

  return Plan(tpu_slice, model_config, dict(mesh.shape), shapes, reports)


# -------------------------------------------------------------------------------------- output
def _gib(n: int) -> str:
  return f"{n / GiB:.2f}"


def format_report(r: PartReport, peak_flops: float) -> str:
  verdict = "fits" if r.fits else "DOES NOT FIT"
  return (
    f"  {r.part:8s} per device: arguments {_gib(r.arguments)} GiB, temporaries "
    f"{_gib(r.temporaries)} GiB, generated code {_gib(r.generated_code)} GiB, outputs "
    f"{_gib(r.outputs)} GiB, resident {_gib(r.resident)} GiB = {_gib(r.total)} GiB of "
    f"{_gib(r.hbm)} GiB of HBM usable: {verdict}; {r.flops / 1e12:,.0f} TFLOP "
    f"({r.flops / peak_flops:.2f} s at peak); compiled in {r.compile_seconds:.0f} s"
    + (f"\n           {r.note}" if r.note else "")
  )


def format_plan(result: Plan) -> str:
  """The plan as a table: one row per compiled program, the verdict, and the plan as one row of
  the markdown table in docs/tpu_planning.md."""
  peak = result.tpu_slice.num_chips * result.tpu_slice.chip.peak_bf16_tflops * 1e12
  mc = result.model_config
  header = (
    f"{'program':8s} {'args':>7s} {'temps':>7s} {'code':>6s} {'out':>6s} {'resident':>8s} "
    f"{'total':>7s} {'HBM':>6s}  {'fits':4s} {'TFLOP':>8s} {'ideal s':>7s}  (GiB per chip)"
  )
  lines = [
    result.tpu_slice.describe(),
    (
      f"model {mc.name} ({mc.num_params / 1e9:.2f} B parameters, remat {mc.remat}), mesh "
      f"{result.mesh_shape}; {result.shapes.describe()}"
    ),
    "",
    header,
  ]
  for r in result.reports:
    lines.append(
      f"{r.part:8s} {_gib(r.arguments):>7s} {_gib(r.temporaries):>7s} "
      f"{_gib(r.generated_code):>6s} {_gib(r.outputs):>6s} {_gib(r.resident):>8s} "
      f"{_gib(r.total):>7s} {_gib(r.hbm):>6s}  {'yes' if r.fits else 'NO':4s} "
      f"{r.flops / 1e12:>8,.0f} {r.flops / peak:>7.2f}"
    )
    if r.note:
      lines.append(f"{'':8s} {r.note}")
  fits = all(r.fits for r in result.reports)
  verdict = "nothing compiled" if not result.reports else "fits" if fits else "does NOT fit"
  lines += [
    "",
    (
      f"{verdict} on {result.tpu_slice.name} with mesh "
      f"{result.mesh_shape}, micro-batch {result.shapes.micro_batch} and remat={mc.remat}"
    ),
    "",
    "table row: " + markdown_row(result),
  ]
  return "\n".join(lines)


def markdown_row(result: Plan) -> str:
  """| model | shapes | slice | mesh | micro | remat | update | teacher | sampler | fits | TFLOP |
  ideal s |, memory as total GiB per chip (a program not compiled: "-")."""
  by_part = {r.part: r for r in result.reports}
  peak = result.tpu_slice.num_chips * result.tpu_slice.chip.peak_bf16_tflops * 1e12
  shapes = result.shapes

  def cell(part: str) -> str:
    r = by_part.get(part)
    if r is None:
      return "-"
    return f"{r.total / GiB:.1f}" + ("" if r.fits else " ✗")

  mesh = result.mesh_shape
  update = by_part.get("update")
  cells = [
    result.model_config.name,
    f"{shapes.prompt_len}/{shapes.teacher_prompt_len}+{shapes.response_len}",
    f"{result.tpu_slice.name} ({result.tpu_slice.chip.usable_hbm_gib:g})",
    f"{mesh['data']}/{mesh['fsdp']}/{mesh['tensor']}",
    f"{shapes.micro_batch}/{shapes.mini_batch}",
    str(result.model_config.remat),
    cell("update"),
    cell("teacher"),
    cell("sampler"),
    "yes" if all(r.fits for r in result.reports) else "no",
    f"{update.flops / 1e12:,.0f}" if update else "-",
    f"{update.flops / peak:.1f}" if update else "-",
  ]
  return "| " + " | ".join(cells) + " |"


# ------------------------------------------------------------------------------------------ CLI
def _define_flags() -> None:
  from absl import flags
  from ml_collections import config_flags

  from sdar_jax import train

  config_flags.DEFINE_config_file(
    "config",
    train.DEFAULT_CONFIG,
    "Run config, optionally with an argument: path.py[:arg]; --config.<key>=value overrides "
    "(e.g. --config.mesh.fsdp=4 --config.model.remat=False).",
    lock_config=True,
  )
  flags.DEFINE_string("topology", None, f"TPU slice, one of {known_slices()}.", required=True)
  flags.DEFINE_list("parts", list(PARTS), f"Programs to compile, from {list(PARTS)}.")
  flags.DEFINE_integer(
    "teacher_prompt_len",
    None,
    "Teacher prompt length (skills + prompt); default rollout.max_prompt_len + 512, bucketed.",
  )
  flags.DEFINE_string("json", None, "Also write the plan as JSON to this file.")


class PlanError(UserError):
  """A plan that cannot be made (an unknown slice, a part that does not compile)."""

  heading = "sdar_jax.aot"


@exit_on_user_error(extra_types=(EnvInputError,))
def main(argv: Sequence[str]) -> None:
  import json

  from absl import app, flags

  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  FLAGS = flags.FLAGS
  try:
    result = plan(
      FLAGS.config,
      FLAGS.topology,
      parts=FLAGS.parts,
      teacher_prompt_len=FLAGS.teacher_prompt_len,
      log=lambda line: print(line, flush=True),
    )
  except (ValueError, RuntimeError) as e:  # a plan that cannot be made: its message, status 2
    if isinstance(e, (UserError, EnvInputError)):
      raise
    raise PlanError(str(e)) from e
  print()
  print(format_plan(result), flush=True)
  if FLAGS.json:
    record = {
      "topology": result.tpu_slice.name,
      "chip": result.tpu_slice.chip.name,
      "model": result.model_config.name,
      "remat": result.model_config.remat,
      "mesh": result.mesh_shape,
      "shapes": dataclasses.asdict(result.shapes),
      "reports": [r.as_dict() for r in result.reports],
      "fits": all(r.fits for r in result.reports),
      "table_row": markdown_row(result),
    }
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.json)), exist_ok=True)
    with open(FLAGS.json, "w") as f:
      json.dump(record, f, indent=2)


@exit_on_user_error
def cli(argv: Sequence[str] | None = None) -> None:
  from absl import app

  from sdar_jax import train

  argv = list(sys.argv if argv is None else argv)
  if "JAX_PLATFORMS" not in os.environ:  # plan on the host CPU, never grab an attached TPU
    jax.config.update("jax_platforms", "cpu")
  train._check_overrides(argv)  # unknown --config.* keys: a message, not a traceback
  _define_flags()
  app.run(main, argv=argv)


if __name__ == "__main__":
  cli()
