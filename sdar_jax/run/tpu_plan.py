"""TPU compile-and-fit planning: three programs of a training iteration compiled for a TPU slice
from abstract inputs, their per-device memory against the chip's HBM, and their model FLOPs.

`plan(config, topology)` lays the config's ('data', 'fsdp', 'tensor') mesh over the slice's
compile-only devices (`sdar_jax.infra.tpu_slices`) and compiles `update` (THE update, built by
`train_step_from_config` as the trainer builds it, on one mini-batch at the config's largest
bucket), `teacher` (`TrainStep.score_teacher`, with teacher_source="rollout") and `sampler` (the
rollout's prefill + decode loop) from `jax.ShapeDtypeStruct`s: no array is allocated, no weights
are read. Each `PartReport` holds XLA's memory analysis plus what stays resident on the chip
while that program runs; FLOPs come from `sdar_jax.models.flops`. `format_plan` / `markdown_row`
print it (docs/tpu_planning.md's table). The command is `python -m sdar_jax.aot`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from sdar_jax.core import sharding
from sdar_jax.core.batch import TurnBatch, batch_bucket, new_tokens_bucket, prompt_bucket
from sdar_jax.core.sampling import Sampler
from sdar_jax.core.train_state import create_train_state
from sdar_jax.core.train_step import train_step_from_config
from sdar_jax.infra.tpu_slices import GiB, Slice, parse_topology, topology_devices
from sdar_jax.models import ModelConfig, param_shapes
from sdar_jax.models.flops import decode_flops, forward_flops, update_flops
from sdar_jax.run.config_validation import model_config_from

PARTS = ("update", "teacher", "sampler")


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
    rollout_rows=int(config.env.tasks_per_iteration) * int(config.env.group_size),
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
  # a teacher read from a folder, or θ_old, handed to the update as its own params
  passed = algo.passes_teacher_params and algo.teacher_source == "step"
  teacher_params = state.params if passed else None
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
    distill_weight=rows(B, R, dtype=jnp.float32) if algo.reads_distill_weight else None,
  )
  # On the chip through the whole iteration but not an argument of teacher scoring / sampling.
  params_bytes = per_device_bytes(state.params)
  resident_besides_params = per_device_bytes(state) - params_bytes
  if with_ref:
    resident_besides_params += params_bytes
  if passed or (algo.passes_teacher_params and algo.teacher_weights == "frozen"):
    resident_besides_params += params_bytes  # the teacher's own copy
  peak = tpu_slice.num_chips * tpu_slice.chip.peak_bf16_tflops * 1e12
  reports = []

  if "update" in parts:
    teacher_in_update = algo.scores_teacher and algo.teacher_source == "update"
    flops = sum(
      update_flops(
        model_config,
        B,
        Ps,
        R,
        with_ref=algo.measures_kl,  # the KL term's reference forward (a frozen teacher's
        # forward is the teacher's, counted below)
        teacher_prompt_len=Pt if teacher_in_update else None,
      ).values()
    )
    log(f"compiling the update ({flops / 1e15:.1f} PFLOP, {flops / peak:.2f} ideal s) ...")
    reports.append(
      _compile_part(
        "update",
        lambda: step.lower(state, batch, ref_params, teacher_params=teacher_params),
        (state, batch, ref_params, teacher_params),
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
    row_step = int(config.rollout.get("row_step", 0))
    sampler = Sampler(
      model_config, mesh, max_prompt_len=int(config.rollout.max_prompt_len), row_step=row_step
    )
    divisor = sharding.batch_divisor(mesh)
    rows_bucket = batch_bucket(shapes.rollout_rows, divisor, row_step)
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
