r"""The TPU planner's command: does a run config fit a TPU slice, and with which mesh?

    python -m sdar_jax.aot --config=configs/alfworld.py:model=qwen2.5-3b,algo=sdar \
        --topology=v5p-8 --config.mesh.data=1 --config.mesh.fsdp=4 --config.model.remat=True

Flags: --config (with --config.<key> overrides, checked as `sdar_jax.train` checks them),
--topology, --parts, --teacher_prompt_len, --json. Runs on any machine with the `tpu-plan` extra
(libtpu) and plans on the host CPU, never on an attached TPU; prints each compiled program's
per-device memory and FLOPs and the plan's row of docs/tpu_planning.md (`sdar_jax.run.tpu_plan`
does the work). A plan that cannot be made ends with its message and exit status 2.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence

import jax

from envs.errors import EnvInputError
from sdar_jax.infra.errors import UserError, exit_on_user_error
from sdar_jax.infra.tpu_slices import known_slices
from sdar_jax.run.tpu_plan import PARTS, format_plan, markdown_row, plan


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
