r"""Training entry point: `python -m sdar_jax.train [--config=FILE[:ARG]] [--config.KEY=VALUE ...]
--workdir=DIR [--dry_run]` (default config: the offline demo, configs/default.py).

Contract: the config is validated before anything is built or written; a user error (a missing or
unparsable config file, an unknown key, an impossible value, an unwritable workdir, a missing
extra) prints one message and exits 2, the traceback only with `--verbosity=1`; `--dry_run`
validates, prints the config and the train state's size, and trains nothing; a run stopped by
SIGTERM or Ctrl-C saves its last finished iteration and exits 128 + the signal; an algorithm with
a first stage (`algo.teacher_stage`, RetireOPD) runs it first in <workdir>/teacher
(sdar_jax.run.stages). This module holds the flags and `main` only (the run itself:
sdar_jax.run.trainer; docs/running.md has the rest).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import logging
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # config files import `configs.common`
  sys.path.insert(0, _REPO)

import ml_collections as mlc  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from envs.errors import EnvInputError  # noqa: E402
from sdar_jax import config_keys  # noqa: E402
from sdar_jax.infra import plugins  # noqa: E402
from sdar_jax.infra.errors import exit_on_user_error  # noqa: E402

DEFAULT_CONFIG = os.path.join(_REPO, "configs", "default.py")
_OVERRIDE = re.compile(r"^--?(?:no)?config\.([^=]+)")


def _load_config(spec: str) -> mlc.ConfigDict:
  """Loads "path/to/file.py[:arg]" the way config_flags does (get_config(arg) or get_config())."""
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_sdar_config_probe", path)
  if module_spec is None or module_spec.loader is None:
    raise FileNotFoundError(path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _config_spec(argv: Sequence[str]) -> str:
  spec = DEFAULT_CONFIG
  for i, arg in enumerate(argv):
    if arg.startswith(("--config=", "-config=")):
      spec = arg.split("=", 1)[1]
    elif arg in ("--config", "-config") and i + 1 < len(argv):
      spec = argv[i + 1]
  return spec


def unknown_override_keys(config: mlc.ConfigDict, argv: Sequence[str]) -> list[str]:
  """A message per `--config.<path>` override whose path is not a key of `config`, with the valid
  keys at that level and the closest match."""
  problems = []
  for arg in argv:
    match = _OVERRIDE.match(arg)
    if not match:
      continue
    path = match.group(1)
    moved = config_keys.renamed_problem(path, arg.split("=", 1)[1] if "=" in arg else None)
    if moved:
      problems.append(f"--config.{moved}")
      continue
    node: Any = config
    for depth, key in enumerate(path.split(".")):
      if not isinstance(node, (mlc.ConfigDict, dict)):
        break
      if key not in node:
        parent = ".".join(["config"] + path.split(".")[:depth])
        valid = sorted(node.keys())
        close = difflib.get_close_matches(key, valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        problems.append(
          f"--config.{path}: {parent} has no key {key!r}.{hint} Valid keys of {parent}: {valid}"
        )
        break
      node = node[key]
  return problems


def _config_file_problem(spec: str) -> tuple[mlc.ConfigDict | None, str | None]:
  """(the config, None), or (None, one line naming what is wrong with the file and the fix)."""
  path = spec.partition(":")[0]
  if not os.path.isfile(path):
    where = "a folder, not a file" if os.path.isdir(path) else "no such file"
    return None, (
      f"--config={spec}: {where}. Fix: pass a config file such as configs/default.py or "
      "configs/alfworld.py:model=qwen2.5-3b (the configs are listed in docs/running.md)"
    )
  try:
    return _load_config(spec), None
  except SyntaxError as e:
    return None, (
      f"--config={spec}: line {e.lineno}: {e.msg} ({(e.text or '').strip()!r}). Fix: correct "
      f"the syntax of {path}"
    )
  except Exception as e:  # noqa: BLE001 - get_config's own error, named with its file
    return None, (
      f"--config={spec}: get_config raised {type(e).__name__}: {e}. Fix: correct {path} or its "
      "argument (after the ':')"
    )


def _check_overrides(argv: Sequence[str]) -> None:
  """Exits with one message (before config_flags, whose error for these is a traceback) when the
  config file is missing, does not parse or fails to build, or an override names a key the
  config does not have."""
  from sdar_jax.run.setup import ConfigError, UnknownConfigKeyError

  config, problem = _config_file_problem(_config_spec(argv))
  if problem:
    raise ConfigError(problem)
  problems = unknown_override_keys(config, argv)
  if problems:
    lines = "\n  ".join(problems)
    raise UnknownConfigKeyError(lines if len(problems) == 1 else "\n  " + lines)


def _define_flags() -> None:
  config_flags.DEFINE_config_file(
    "config",
    DEFAULT_CONFIG,
    "Config file, optionally with an argument: path.py[:arg].",
    lock_config=True,
  )
  flags.DEFINE_string(
    "workdir", None, "Run directory (checkpoints, logs). Default: runs/<date>-<time>."
  )
  flags.DEFINE_bool(
    "distributed",
    False,
    "Multi-host (TPU pod slice, multi-node GPU): call "
    "jax.distributed.initialize() before anything touches the devices.",
  )
  flags.DEFINE_string(
    "coordinator_address",
    None,
    "With --distributed: host:port of process 0's coordinator (default: JAX finds the job).",
  )
  flags.DEFINE_integer(
    "num_processes", None, "With --distributed: how many processes run (default: JAX finds it)."
  )
  flags.DEFINE_integer(
    "process_id", None, "With --distributed: this process's index, 0 .. num_processes - 1."
  )
  flags.DEFINE_string(
    "imports",
    None,
    "Modules of your own that register gates, losses, advantage estimators, method hooks or "
    "environments, comma-separated (e.g. mypkg.methods); imported before the config is read, and "
    "by the env worker processes.",
  )
  flags.DEFINE_bool(
    "dry_run",
    False,
    "Validate, print the resolved config, build the mesh and "
    "the abstract model/train state, then exit without training.",
  )


def _summary(config, model_config, mesh) -> str:
  import jax

  from sdar_jax.algos import AlgoConfig
  from sdar_jax.core.train_state import make_optimizer
  from sdar_jax.run.checkpoint import abstract_train_state

  ema = AlgoConfig.from_config(config.algo).keeps_ema  # the EMA teacher's copy of the params
  state = abstract_train_state(model_config, make_optimizer(**config.optim), mesh, ema=ema)
  leaves = jax.tree.leaves(state)
  total = sum(math.prod(x.shape) * x.dtype.itemsize for x in leaves)
  per_device = sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in leaves)
  memory, where = device_memory()
  fits = f"train state: {total / 2**30:.3f} GiB in all, {per_device / 2**30:.3f} GiB per device"
  if memory:
    share = per_device / memory
    fits += f", {100 * share:.0f}% of {memory / 2**30:.1f} GiB per device ({where})"
    if share >= 1.0:
      fits += (
        "\nWARNING: the train state alone does not fit the devices' memory; this run cannot "
        "start here. Fix: more devices on the fsdp axis (config.mesh), param_dtype bfloat16, or "
        "a smaller model (docs/scaling.md)."
      )
    elif share >= 0.6:
      fits += (
        "\nWARNING: the train state leaves under 40% of the devices' memory for activations, "
        "the sampler's KV cache and the teacher (docs/scaling.md)."
      )
  return (
    f"model: {model_config.name} ({model_config.family}), {model_config.num_params:,} "
    f"parameters\nmesh: {dict(mesh.shape)} over {mesh.devices.size} device(s)\n{fits}"
  )


def device_memory() -> tuple[int | None, str]:
  """(bytes of memory per local device, where the figure comes from): the accelerator's own
  limit (`memory_stats`), else the host's RAM shared by its CPU devices; (None, why) if unknown."""
  import jax

  device = jax.local_devices()[0]
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"]), f"{device.device_kind} memory"
  try:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None, "unknown"
  return ram // max(jax.local_device_count(), 1), "host RAM / CPU devices"


def use_xla_cache(path: str) -> str:
  """Makes JAX keep compiled programs in `path` (user-expanded; local or gs://) and load them in
  later runs of the same program; returns the folder used. A program is kept when it took a
  second or more to compile (JAX's threshold): every sampler and update of a run.

  XLA:CPU compiles for the instruction set of the CPU it runs on, and JAX's cache key does not
  name that CPU, so on the CPU backend the programs go to a subfolder named after the CPU's
  model and feature flags: a cache folder shared by different machines (a home directory on a
  network disk) never hands one CPU the code of another."""
  import jax

  folder = path if "://" in path else os.path.abspath(os.path.expanduser(path))
  if jax.default_backend() == "cpu":
    folder = f"{folder.rstrip('/')}/{cpu_fingerprint()}"
  jax.config.update("jax_compilation_cache_dir", folder)
  logging.getLogger(__name__).info("compiled programs are kept in %s between runs", folder)
  return folder


def cpu_fingerprint() -> str:
  """The name "cpu-<12 hex digits>", a hash of the machine type and the CPU's model name and
  feature flags (from /proc/cpuinfo where there is one)."""
  import hashlib
  import platform

  text = platform.machine() + platform.processor()
  try:
    with open("/proc/cpuinfo") as f:
      text += "".join(
        sorted({line for line in f if line.startswith(("model name", "flags", "Features"))})
      )
  except OSError:
    pass
  return "cpu-" + hashlib.sha256(text.encode()).hexdigest()[:12]


def output_folders(config, workdir: str) -> list[tuple[str, str]]:
  """(name, path) of every folder a run writes into: the workdir, checkpoint.dir, logging.dir."""
  folders = [("workdir", workdir)]
  for key in ("checkpoint", "logging"):
    if config[key].get("dir"):
      folders.append((f"{key}.dir", config[key].dir))
  return folders


def check_output_folders(config, workdir: str) -> None:
  """Refuses, before anything is compiled or written (and in --dry_run), a workdir,
  checkpoint.dir or logging.dir the run could not write into: read-only, missing rights, a file,
  or a gs:// path without the gcs extra (sdar_jax.infra.paths.check_writable_folder)."""
  from sdar_jax.infra import paths

  for what, where in output_folders(config, workdir):
    paths.check_writable_folder(where, what)


@exit_on_user_error(extra_types=(EnvInputError,))
def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from sdar_jax.observe.progress import configure_logging

  configure_logging()  # our INFO lines with timestamps, libraries at WARNING unless --verbosity
  from sdar_jax.core.sharding import make_mesh
  from sdar_jax.run.config_validation import ConfigError, validate

  if flags.FLAGS.distributed:  # every process plays its share (sdar_jax.infra.multihost)
    from sdar_jax.infra import multihost
    from sdar_jax.run.setup import staleness_problems

    processes = flags.FLAGS.num_processes
    refused = staleness_problems(flags.FLAGS.config, processes) if processes else []
    if refused:  # before joining the other processes, which would wait for this one
      raise ConfigError("\n  - ".join(refused))
    multihost.initialize(
      flags.FLAGS.coordinator_address, flags.FLAGS.num_processes, flags.FLAGS.process_id
    )
  elif any(
    flags.FLAGS[name].present for name in ("coordinator_address", "num_processes", "process_id")
  ):
    raise app.UsageError(
      "--coordinator_address, --num_processes and --process_id need --distributed."
    )
  config = flags.FLAGS.config
  model_config = validate(config)  # a ConfigError: one message, exit status 2
  workdir = flags.FLAGS.workdir or os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
  from sdar_jax.run import stages

  stages.validate_stages(config, workdir)  # a first stage's config (algo.teacher_stage), if any
  check_output_folders(config, workdir)
  from sdar_jax.observe import wandb_log

  wandb_log.require(config.logging)  # logging.wandb=True needs the extra: a UserError, exit 2
  print(config)
  mesh = make_mesh(dict(config.mesh))
  if flags.FLAGS.dry_run:
    from sdar_jax.run.setup import dry_run_prompt_check

    summary = _summary(config, model_config, mesh)
    print(summary)
    if dry_run_prompt_check(config, model_config):  # with rollout.prompt_truncation='error'
      print("first prompts fit rollout.max_prompt_len.")
    if "does not fit" in summary:
      print("dry run: config valid, but the train state does not fit here; nothing trained.")
      return
    print("dry run: config valid, nothing trained.")
    return
  if config.train.get("xla_cache_dir"):
    use_xla_cache(config.train.xla_cache_dir)
  from sdar_jax.run.preemption import Preempted

  try:  # the workdir is created only now, after validation; a first stage runs before the run
    stages.run(config, workdir, validated=True)
  except Preempted as stopped:  # SIGTERM / Ctrl-C: the last finished iteration is saved
    print(stopped, file=sys.stderr)
    sys.exit(stopped.exit_code)


@exit_on_user_error(extra_types=(EnvInputError,))
def cli(argv: Sequence[str] | None = None) -> None:
  argv = list(sys.argv if argv is None else argv)
  plugins.load_from_argv(argv)  # the user's registrations, before the config names them
  _check_overrides(argv)
  _define_flags()
  app.run(main, argv=argv)  # main prints a user error's message and exits 2


if __name__ == "__main__":
  cli()
