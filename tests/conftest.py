"""Test-wide setup (8 fake CPU devices so sharding tests run on one host, fp32 matmuls; the run's
caches in the system's temporary folder), the shared fixtures (a tiny model config, its parameters,
a turn batch, a set of real ALFWorld games; builders in helpers.py) and how `make test` spreads the
tests over its two xdist workers."""

import functools
import os
import re
import shutil
import tempfile

# Everything the suite caches lives in one folder of the system's temporary folder, made by the
# first process of a run (pytest, or xdist's controller before it starts its workers) and inherited
# by every worker and subprocess through the environment:
# - <run>: the offline games of the runs' configs and BM25 indexes (data/), the library caches
#   (alfworld/, matplotlib/) and the `alfworld_games` fixture's games, made once per run and shared
#   by every test (removed at the end of the run);
# - <tmp>/sdar_jax_tests/xla/cpu-<fingerprint>: JAX's persistent compilation cache, so a program
#   compiled once (a Trainer's sampler and update, in-process or in a subprocess) is loaded by
#   every later test that builds the same one. It outlives the run (its keys name the program, the
#   jax version and the CPU) and holds only what this suite compiles.
_OWNER = "SDAR_TEST_RUN_DIR" not in os.environ
if _OWNER:
  os.environ["SDAR_TEST_RUN_DIR"] = tempfile.mkdtemp(prefix="sdar_jax_tests-run-")
_RUN_DIR = os.environ["SDAR_TEST_RUN_DIR"]
for _name, _sub in (
  ("SDAR_DATA_CACHE", "data"),
  ("SDAR_CACHE_DIR", "data"),
  ("ALFWORLD_DATA", "alfworld"),
  ("MPLCONFIGDIR", "matplotlib"),
):
  os.environ[_name] = os.path.join(_RUN_DIR, _sub)
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  from sdar_jax.train import cpu_fingerprint  # noqa: E402

  os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(
    tempfile.gettempdir(), "sdar_jax_tests", "xla", cpu_fingerprint()
  )
# Small programs too: the suite's models are tiny, so most of its programs compile in under
# JAX's default threshold of one second, and compile again in every test that builds them.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
# A developer's reruns after code changes add programs; the least recently used go past 2 GiB.
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 * 2**30))

# Appended, not set by default: a run that restricts XLA (e.g. XLA_FLAGS=--xla_cpu_max_isa=SSE4_2,
# to check tolerances on an older CPU) keeps its 8 fake devices.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()
# The suite's programs compile at XLA's lowest backend optimisation level: with tiny models the
# compilation, not the run, is most of a test's time (docs/testing.md: 2026-12-07, 30 minutes of
# a cold suite at the default level, 21 at level 0). Every comparison is bounded by the size of
# what it sums, so it holds at any level; XLA_FLAGS=--xla_backend_optimization_level=2 make test
# runs the suite as users' programs compile.
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

import pytest  # noqa: E402

from tests.helpers import ALFWORLD_GAME_SPLITS, TINY_CONFIG, make_turn_batch  # noqa: E402


@pytest.fixture(scope="session")
def tiny_config():
  """The tiny Qwen3-architecture `ModelConfig` shared by the update-step tests."""
  return TINY_CONFIG


@pytest.fixture(scope="session")
def tiny_params(tiny_config):
  """Random parameters for `tiny_config` (std 0.1, key 0); jax arrays are immutable, so one set
  serves the whole session."""
  from sdar_jax.models import init_params

  return init_params(tiny_config, jax.random.key(0), std=0.1)


@pytest.fixture(scope="session")
def alfworld_games() -> str:
  """A folder of real ALFWorld games, generated once per test run (generator seed 7, full rooms,
  planner-checked): one train game per task type, valid_seen games of the heat and look types,
  valid_unseen games of the simple and heat types, with their walkthrough files. xdist workers
  share it (the first one generates under a file lock). Read only: `copy_alfworld_games` gives a
  test its own folder of some of the splits."""
  from envs.alfworld import generator
  from envs.common import file_lock

  root = os.path.join(_RUN_DIR, "alfworld_games")
  with file_lock(root + ".lock"):
    if not os.path.exists(os.path.join(root, "COMPLETE")):
      engine = generator.engine_lib.start_engine()
      for split, types in ALFWORLD_GAME_SPLITS.items():
        generator.generate_split(
          root, split, 1, seed=7, engine=engine, progress=False, task_types=types
        )
      open(os.path.join(root, "COMPLETE"), "w").close()
  return root


@pytest.fixture
def tiny_batch(tiny_params):
  """A ragged 8-row `TurnBatch` for `tiny_config` with exact old log-probs (seed 0)."""
  return make_turn_batch(tiny_params, seed=0)


def pytest_collection_modifyitems(items):
  """Modules with slow tests run first, so that under `pytest -n 2` (make test) no long test
  starts last and leaves one worker alone at the end. Within a module the order stays as written."""
  slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
  items.sort(key=lambda item: item.module.__name__ not in slow_modules)


_SHARED_FIXTURE = re.compile(r'@pytest\.fixture\([^)]*scope="(?:module|session)"')


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist ignores it
def pytest_xdist_make_scheduler(config, log):
  """`--dist loadgroup` (make test): the tests of a module that defines a module- or
  session-scoped fixture run on one worker, which builds that fixture once; every other test goes
  to whichever worker is free. (xdist's own loadgroup reads `xdist_group` marks through an
  attribute pytest 9 no longer has.)"""
  if config.getvalue("dist") != "loadgroup":
    return None
  from xdist.scheduler import LoadScopeScheduling

  root = str(config.rootpath)

  @functools.cache
  def shares_fixtures(module_path: str) -> bool:
    try:
      with open(os.path.join(root, module_path)) as f:
        return bool(_SHARED_FIXTURE.search(f.read()))
    except OSError:
      return False

  class ModuleFixtureScheduling(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
      module = nodeid.split("::", 1)[0]
      return module if shares_fixtures(module) else nodeid

  return ModuleFixtureScheduling(config, log)


def pytest_sessionfinish(session, exitstatus):
  """The run's own folder (games, indexes) goes with the process that made it."""
  del session, exitstatus
  if _OWNER:
    shutil.rmtree(_RUN_DIR, ignore_errors=True)
