"""Configs: argument parsing, reference values, every method / gate / form selectable, locked keys,
validation messages, the paper table, and the train CLI (in a subprocess). The model section and
the choices validation refuses: test_configs_model.py."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import jax
import pytest

from configs import alfworld, common, default, paper, search_qa, webshop
from sdar_jax.algos import (
  ADVANTAGE_ESTIMATORS,
  AGG_MODES,
  ALGO_PRESETS,
  GATES,
  KL_PENALTIES,
  SDAR_FORMS,
  VOCAB_FORMS,
  AlgoConfig,
  get_preset,
)
from sdar_jax.models import ModelConfig
from sdar_jax.run.config_validation import (
  IMPLEMENTED_ENVS,
  ConfigError,
  model_config_from,
  validate,
)
from sdar_jax.text.tokenizer import (
  Tokenizer,
)
from sdar_jax.train import unknown_override_keys
from tests.helpers import config_problems

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV_MODULES = {"alfworld": alfworld, "webshop": webshop, "search_qa": search_qa}


def _local(algo: str = "sdar"):
  return alfworld.get_config(f"algo={algo},local=True")


def _validate_as_far_as_possible(config, num_devices: int = 8) -> ModelConfig | None:
  """validate(config) for configs that name a real model without a local copy (random weights are
  asked for here) or an environment that is not implemented yet: those must fail with exactly that
  one problem; everything else in them must be valid."""
  if not config.model.path:
    config.model.random_init = True
  if config.env.name in IMPLEMENTED_ENVS:
    return validate(config, num_devices=num_devices)
  msg = config_problems(config, num_devices)
  assert msg.startswith("1 problem(s)"), msg
  assert f"env.name={config.env.name!r}" in msg and "not implemented yet" in msg, msg
  return None


# ------------------------------------------------------------------------------------ parse_arg
def test_parse_arg_types_and_defaults():
  arg = common.parse_arg(
    "model=qwen3-1.7b,local=True,steps=7,lr=1e-5",
    model="qwen2.5-3b",
    local=False,
    steps=150,
    lr=1e-6,
  )
  assert (arg.model, arg.local, arg.steps, arg.lr) == ("qwen3-1.7b", True, 7, 1e-5)
  assert isinstance(arg.steps, int) and isinstance(arg.lr, float)
  assert common.parse_arg("", model="x", local=False).to_dict() == {"model": "x", "local": False}
  assert common.parse_arg("local", local=False).local is True  # a bare key means True
  free = common.parse_arg("a=1,b=0.5,c=none,d=False,e=qwen2.5-3b")
  assert free.to_dict() == {"a": 1, "b": 0.5, "c": None, "d": False, "e": "qwen2.5-3b"}


def test_parse_arg_rejects_unknown_and_mistyped():
  with pytest.raises(ValueError, match=r"unknown config argument 'modle'.*\['local', 'model'\]"):
    common.parse_arg("modle=qwen2.5-3b", model="qwen2.5-3b", local=False)
  with pytest.raises(ValueError, match="local='yes' must be True or False"):
    common.parse_arg("local=yes", local=False)
  with pytest.raises(ValueError, match="unknown algo 'sdarr'"):
    alfworld.get_config("algo=sdarr")
  with pytest.raises(ValueError, match="unknown model 'qwen9'"):
    alfworld.get_config("model=qwen9")


# ---------------------------------------------------------------------------- reference values
def test_reference_hyperparameters_per_env():
  """docs/reference.md §6: the values the authors' scripts use."""
  a, w, s = (m.get_config() for m in (alfworld, webshop, search_qa))
  assert (a.env.history, a.env.max_turns, a.env.group_size, a.env.tasks_per_iteration) == (
    2,
    50,
    8,
    16,
  )
  assert (w.env.history, w.env.max_turns, w.env.group_size, w.env.tasks_per_iteration) == (
    2,
    15,
    8,
    16,
  )
  assert (s.env.history, s.env.max_turns, s.env.group_size, s.env.tasks_per_iteration) == (
    4,
    4,
    8,
    128,
  )
  assert (a.algo.kl_coef, w.algo.kl_coef, s.algo.kl_coef) == (0.01, 0.01, 0.001)
  assert (
    a.rollout.shaping.invalid_penalty,
    w.rollout.shaping.invalid_penalty,
    s.rollout.shaping.invalid_penalty,
  ) == (
    0.1,
    0.1,
    0.01,
  )
  assert (a.rollout.max_prompt_len, w.rollout.max_prompt_len, s.rollout.max_prompt_len) == (
    2048,
    4096,
    4096,
  )
  assert (a.rollout.val_temperature, w.rollout.val_temperature, s.rollout.val_temperature) == (
    0.4,
    0.4,
    0.0,
  )
  assert (a.optim.warmup_iterations, s.optim.warmup_iterations) == (0, 15)
  assert s.rollout.prompt_truncation == "left" and a.rollout.prompt_truncation == "error"
  for c in (a, w, s):
    assert (c.algo.beta, c.algo.lam, c.algo.gate, c.algo.teacher_source) == (
      5.0,
      0.01,
      "gap",
      "rollout",
    )
    assert (c.optim.lr, c.optim.weight_decay, c.optim.clip_norm) == (1e-6, 0.01, 1.0)
    assert (c.algo.entropy_coef, c.algo.ppo.clip_c, c.rollout.temperature) == (0.001, 3.0, 1.0)
    assert c.train.iterations == 150 and c.rollout.max_new_tokens == 512


@pytest.mark.parametrize("env", sorted(ENV_MODULES))
@pytest.mark.parametrize("local", [False, True])
def test_env_configs_validate(env, local):
  config = ENV_MODULES[env].get_config(f"local={local}")
  assert config.model.random_init == local  # the tiny model asks for random weights itself
  _validate_as_far_as_possible(config)
  assert model_config_from(config).name == ("tiny" if local else "Qwen2.5-3B-Instruct")
  assert config.env.name == env


def test_default_is_the_offline_demo():
  """The demo: a small Qwen3 model on the compact tokenizer, 48+ validation episodes."""
  config = default.get_config()
  model_config = validate(config, num_devices=1)
  assert (config.env.name, config.algo.name, config.env.data_dir) == (
    "alfworld",
    "sdar_vocab",
    None,
  )
  assert (config.algo.form, config.algo.teacher_weights) == ("vocab", "initial")
  assert model_config.family == "qwen3" and model_config.num_params < 20_000_000
  tokenizer = Tokenizer.from_dir(config.model.tokenizer_dir)
  assert tokenizer.vocab_size <= model_config.vocab_size < 151669  # the compact ids all fit
  assert config.eval.num_tasks >= 48
  assert default.get_config("algo=grpo").algo.name == "grpo"


# ------------------------------------------------------------------------------------ selection
@pytest.mark.parametrize("name", sorted(ALGO_PRESETS))
def test_every_algo_preset_is_selectable(name):
  config = _local(name)
  preset = dataclasses.asdict(get_preset(name))
  assert config.algo.to_dict() == {**preset, "kl_coef": 0.01}
  if name.startswith("grsd_reflect") or name == "opid":  # an endpoint the user names
    config.algo.reflection.url = "http://127.0.0.1:8000/v1"
  assert config.rollout.shaping.invalid_penalty == 0.1  # ALFWorld's, the rollout's setting
  validate(config, num_devices=8)


@pytest.mark.parametrize("name", sorted(ALGO_PRESETS))
def test_algo_section_feeds_the_train_step(name):
  """The update reads config.algo as is: every field of the section reaches its AlgoConfig."""
  config = _local(name)
  preset = get_preset(name)
  if not (preset.turn_advantages or preset.retires):  # those read the teacher at θ_old
    config.algo.teacher_source = "update"
  algo = AlgoConfig.from_config(config.algo)
  assert dataclasses.asdict(algo) == config.algo.to_dict()


def test_algo_section_is_generated_from_the_dataclass():
  """One schema: the section's keys are AlgoConfig's fields, its defaults the preset's values."""
  section = common.algo("rlsd")
  assert sorted(section) == sorted(f.name for f in dataclasses.fields(AlgoConfig))
  assert section.to_dict() == dataclasses.asdict(get_preset("rlsd"))
  assert (section.advantage, section.teacher, section.teacher_source) == ("rlsd", None, "rollout")
  assert AlgoConfig.from_config(section).scores_teacher  # RLSD's advantages read the teacher


def test_algo_section_key_typos_name_the_closest_field():
  algo = dict(common.algo("sdar"), lamda=0.1)
  want = r"algo.lamda: not an algorithm setting \(did you mean 'lam'\?\)"
  with pytest.raises(ValueError, match=want):
    AlgoConfig.from_config(algo)


@pytest.mark.parametrize(
  "key,names",
  [
    ("gate", GATES.names()),
    ("form", SDAR_FORMS.names()),
    ("agg", AGG_MODES.names()),
    ("kl_kind", KL_PENALTIES.names()),
    ("advantage", ADVANTAGE_ESTIMATORS.names()),
    ("teacher_source", ["update", "rollout"]),
    ("teacher_weights", ["current", "initial", "ema"]),
  ],
)
def test_every_registered_name_is_selectable(key, names):
  for name in names:
    config = _local("sdar")
    config.algo[key] = name
    vocab_form = key == "form" and name in VOCAB_FORMS
    if vocab_form or (key, name) == ("teacher_weights", "ema"):  # the teacher scored in the update
      config.algo.teacher_source = "update"
    validate(config, num_devices=8)
    assert config.algo[key] == name


@pytest.mark.parametrize(
  "key,registry",
  [
    ("gate", GATES),
    ("form", SDAR_FORMS),
    ("agg", AGG_MODES),
    ("kl_kind", KL_PENALTIES),
    ("advantage", ADVANTAGE_ESTIMATORS),
    ("distill", None),
    ("teacher_source", None),
    ("teacher_weights", None),
  ],
)
def test_unknown_names_list_the_valid_ones(key, registry):
  config = _local()
  config.algo[key] = "nope"
  msg = config_problems(config)
  assert f"algo.{key}='nope'" in msg
  valid = (
    registry.names()
    if registry
    else {
      "distill": ["none", "sdar", "sdpo", "skill_sd", "ucob"],
      "teacher_source": ["rollout", "update"],
      "teacher_weights": ["current", "initial", "ema", "frozen", "old"],
    }[key]
  )
  assert str(sorted(valid)) in msg


# ------------------------------------------------------------------------------------ locking
def test_configs_are_locked_against_typos():
  config = _local()
  with pytest.raises(AttributeError, match="betta"):
    config.algo.betta = 2.0
  with pytest.raises(KeyError, match="algoo"):
    common.override(config, {"algoo.beta": 2.0})
  with pytest.raises(KeyError, match=r"unknown config key 'algo.betta'.*'beta'"):
    common.override(config, {"algo.betta": 2.0})
  common.override(config, {"algo.beta": 2.0})
  assert config.algo.beta == 2.0


def test_unknown_override_keys_names_them():
  config = _local()
  argv = [
    "prog",
    "--config.algo.betta=2",
    "--config.algoo.beta=1",
    "--config.algo.beta=3",
    "--config.env.skills.strategy=bm25",
  ]
  problems = unknown_override_keys(config, argv)
  assert len(problems) == 2
  assert "--config.algo.betta" in problems[0] and "Did you mean 'beta'" in problems[0]
  assert "config has no key 'algoo'" in problems[1] and "'algo'" in problems[1]


def test_renamed_keys_and_values_are_refused_naming_the_new_ones():
  """ "step" meant an iteration in some keys and an optimizer update in a value; each old name is
  refused on the command line and in `override`, with its new one."""
  config = _local()
  renamed = {
    "train.total_steps=3": "train.iterations",
    "optim.warmup_steps=2": "optim.warmup_iterations",
    "env.tasks_per_step=2": "env.tasks_per_iteration",
    "algo.rlsd.warmdown_steps=9": "algo.rlsd.warmdown_iterations",
    "algo.rlsd_warmdown_steps=9": "algo.rlsd.warmdown_iterations",  # moved twice
    "algo.teacher_source=step": "--config.algo.teacher_source=update",
  }
  argv = ["prog", *(f"--config.{arg}" for arg in renamed), "--config.algo.teacher_source=rollout"]
  problems = unknown_override_keys(config, argv)
  assert len(problems) == len(renamed)
  for problem, (arg, new) in zip(problems, renamed.items()):
    assert problem.startswith(f"--config.{arg.split('=')[0]}") and new in problem, problem
  with pytest.raises(KeyError, match=r"train.total_steps: this setting moved to train.iterations"):
    common.override(config, {"train.total_steps": 3})
  with pytest.raises(KeyError, match=r"algo.teacher_source=step: this value is now 'update'"):
    common.override(config, {"algo.teacher_source": "step"})
  with pytest.raises(ValueError, match=r"algo.teacher_source='step': this value is now 'update'"):
    AlgoConfig(teacher_source="step")


def test_scoring_temperature_follows_the_rollout():
  config = _local()
  config.rollout.temperature = 0.7
  assert config.algo.temperature == 0.7
  validate(config, num_devices=8)


# --------------------------------------------------------------------------- impossible values
@pytest.mark.parametrize(
  "overrides,expected",
  [
    ({"algo.beta": -1.0}, ["algo.beta=-1.0", ">= 0"]),
    ({"algo.lam": -0.5}, ["algo.lam=-0.5"]),
    ({"rollout.temperature": -1.0}, ["rollout.temperature=-1.0", "algo.temperature=-1.0"]),
    ({"rollout.temperature": 0.0}, ["rollout.temperature=0.0", "val_temperature=0"]),
    ({"rollout.val_temperature": -0.1}, ["rollout.val_temperature=-0.1"]),
    ({"train.mini_batch_size": 20}, ["train.mini_batch_size=20", "micro_batch_size=8"]),
    (
      {"train.micro_batch_size": 4, "train.mini_batch_size": 16},
      ["train.micro_batch_size=4", "8 x 1 = 8"],
    ),
    ({"env.tasks_per_iteration": 3}, ["env.tasks_per_iteration=3", "3 x 4 = 12", "multiple of 8"]),
    ({"mesh.data": 3}, ["product of the axes is 3", "8 devices"]),
    ({"mesh.data": -1, "mesh.fsdp": -1}, ["only one axis may be -1"]),
    ({"mesh.fsdp": 3}, ["multiple of 3 devices", "8 are available"]),
    ({"algo.teacher": False}, ["algo.teacher=False", "need teacher log-probs"]),
    ({"algo.ppo.clip_c": 1.0}, ["algo.ppo.clip_c=1.0", "> 1"]),
    ({"algo.ppo.clip_low": 1.0}, ["algo.ppo.clip_low=1.0"]),
    ({"env.skills.strategy": "magic"}, ["env.skills.strategy='magic'", "'bm25'"]),
    ({"eval.skills": "sometimes"}, ["eval.skills='sometimes'", "'both'"]),
    ({"env.name": "minecraft"}, ["env.name='minecraft'", "'search_qa'"]),
    ({"model.preset": "qwen9"}, ["model.preset='qwen9'", "qwen2.5-3b"]),
    ({"model.tiny.vocab_size": 512}, ["model.tiny.vocab_size=512", "151669"]),
    (
      {"rollout.max_prompt_len": 8192},
      ["max_prompt_len + max_new_tokens = 8240", "max_position_embeddings=8192"],
    ),
    ({"env.data_dir": "/no/such/dir"}, ["env.data_dir='/no/such/dir'", "no such directory"]),
    ({"optim.b2": 1.0}, ["optim.b2=1.0"]),
    ({"checkpoint.keep": 0}, ["checkpoint.keep=0"]),
    ({"checkpoint.every": -1}, ["checkpoint.every=-1", "use 0 to save only at the end"]),
    ({"rollout.row_step": -64}, ["rollout.row_step=-64", "use 0 for powers of two"]),
    (
      {"logging.wandb": True, "logging.wandb_mode": "cloud"},
      ["logging.wandb_mode='cloud'", "'offline'"],
    ),
  ],
)
def test_impossible_values_are_named(overrides, expected):
  config = common.override(_local(), overrides)
  msg = config_problems(config)
  for text in expected:
    assert text in msg, (text, msg)


def test_lam_without_a_distill_term_is_refused():
  config = _local("grpo")
  config.algo.lam = 0.1
  assert "algo.lam=0.1" in config_problems(config)


def test_all_problems_are_reported_at_once():
  config = common.override(
    _local(), {"algo.beta": -1.0, "algo.gate": "nope", "env.tasks_per_iteration": 3}
  )
  msg = config_problems(config)
  assert msg.startswith("3 problem(s)")


def test_mesh_resolution():
  config = common.override(_local(), {"mesh.data": 1, "mesh.fsdp": -1, "mesh.tensor": 2})
  validate(config, num_devices=8)  # batch shards 1 x 4 = 4 divide 8 episodes and micro 8


# ------------------------------------------------------------------------------------ sweeps, paper
@pytest.mark.parametrize("module", [alfworld, webshop, search_qa])
def test_sweeps_apply_and_validate(module):
  points = module.sweep()
  # 3 β-dependent gates x 4 β x 3 λ, and the constant gate (no β) x 3 λ
  assert len(points) == 39 and len({tuple(sorted(p.items())) for p in points}) == 39
  # every gate but the paper's literal formulas and the earlier ln V versions (kept for
  # comparison: sdar_jax.algos.gates)
  assert {p["algo.gate"] for p in points} == set(GATES.names()) - {
    "entropy_paper",
    "soft_or_paper",
    "entropy_lnv",
    "soft_or_lnv",
  }
  for point in points[::7]:
    _validate_as_far_as_possible(common.override(module.get_config("local=True"), point))


def test_paper_rows():
  rows = paper.rows()
  assert len(rows) == len(set(rows)) == 10 * 3 * 3
  for row in rows:
    _validate_as_far_as_possible(paper.get_config(row))
  sdar = paper.get_config("row=sdar,model=qwen2.5-3b,env=alfworld")
  assert sdar.algo.name == "sdar" and sdar.paper.reported["avg"] == 84.4
  assert sdar.env.skills.rules_version == "pre_fix"  # the paper predates the retrieval fix
  assert paper.get_config("row=sdar,model=qwen2.5-7b,env=search_qa").paper.reported["avg"] == 49.0
  assert paper.get_config("row=grpo,model=qwen3-1.7b,env=webshop").paper.reported.to_dict() == {
    "score": 67.3,
    "acc": 38.3,
  }
  vanilla = paper.get_config("row=vanilla,model=qwen2.5-3b,env=search_qa")
  assert vanilla.train.iterations == 0 and vanilla.train.eval_before_train
  plain = paper.get_config("row=skill_grpo,model=qwen2.5-3b,env=alfworld")
  star = paper.get_config("row=skill_grpo_star,model=qwen2.5-3b,env=alfworld")
  assert plain.algo.skills_in_student and plain.eval.skills == "both"
  assert (plain.paper.reads, star.paper.reads) == ("without", "with")
  assert {k: v for k, v in plain.to_dict().items() if k != "paper"} == {
    k: v for k, v in star.to_dict().items() if k != "paper"
  }  # one training run, read two ways
  with pytest.raises(ValueError, match="unknown row 'sdar2'"):
    paper.get_config("row=sdar2")


# ------------------------------------------------------------------------------------ CLI
def _cli(*args: str, module: str = "sdar_jax.train") -> subprocess.CompletedProcess:
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  return subprocess.run(
    [sys.executable, "-m", module, *args],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_cli_dry_run_applies_overrides():
  out = _cli(
    "--config=configs/default.py",
    "--config.algo.beta=2.0",
    "--config.algo.gate=entropy",
    "--dry_run",
  )
  assert out.returncode == 0, out.stderr
  algo = re.split(r"\n(?=\S)", out.stdout.split("algo:\n", 1)[1], maxsplit=1)[0]  # the algo section
  assert {"  beta: 2.0", "  gate: entropy"} <= set(algo.splitlines()), out.stdout
  assert "mesh: {'data': 8, 'fsdp': 1, 'tensor': 1} over 8 device(s)" in out.stdout
  assert "dry run: config valid" in out.stdout


def test_cli_unknown_key_is_named():
  out = _cli("--config.algo.betta=2.0", "--dry_run")
  assert out.returncode != 0
  assert "--config.algo.betta" in out.stderr and "Did you mean 'beta'" in out.stderr
  assert "Traceback" not in out.stderr


def test_cli_unknown_gate_lists_valid_gates():
  out = _cli("--config=configs/alfworld.py:local=True", "--config.algo.gate=nope", "--dry_run")
  assert out.returncode != 0
  assert "algo.gate='nope'" in out.stderr and str(GATES.names()) in out.stderr


def test_cli_indivisible_batch_names_values():
  out = _cli("--config.env.tasks_per_iteration=3", "--config.env.group_size=4", "--dry_run")
  assert out.returncode != 0
  assert "env.tasks_per_iteration=3" in out.stderr and "3 x 4 = 12" in out.stderr
  assert "data x fsdp = 8 x 1 = 8" in out.stderr


def test_xla_cache_dir_keeps_compiled_programs_per_cpu(tmp_path):
  """A program compiled with the cache on lands under <dir>/cpu-<fingerprint>; a bad value is
  named by the validation."""
  from jax._src import compilation_cache

  from sdar_jax.train import cpu_fingerprint, use_xla_cache

  keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
  saved = {k: getattr(jax.config, k) for k in keys}
  try:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    compilation_cache.reset_cache()
    folder = use_xla_cache(str(tmp_path / "xla"))
    assert folder == str(tmp_path / "xla" / cpu_fingerprint())
    assert re.fullmatch(r"cpu-[0-9a-f]{12}", cpu_fingerprint())
    jax.jit(lambda x: x * 3 + 1)(jax.numpy.arange(7.0)).block_until_ready()
    assert os.listdir(folder)  # the compiled program was written
  finally:
    for k, v in saved.items():
      jax.config.update(k, v)
    compilation_cache.reset_cache()
  config = default.get_config()
  with config.unlocked():  # the CLI refuses a non-str already; a config built in code may not
    del config.train["xla_cache_dir"]
    config.train.xla_cache_dir = 3
  with pytest.raises(ConfigError, match=r"train.xla_cache_dir=3: must be a folder path.*Fix"):
    validate(config)


def test_evaluate_cli_turns_training_off():
  out = _cli(
    "--config=configs/default.py",
    "--config.eval.num_tasks=2",
    "--dry_run",
    module="sdar_jax.evaluate",
  )
  assert out.returncode == 0, out.stderr
  for line in ("iterations: 0", "eval_before_train: true", "export_hf: false", "num_tasks: 2"):
    assert line in out.stdout, line


def test_cli_refuses_a_model_folder_without_weights_and_writes_nothing(tmp_path):
  """Validation (also under --dry_run) checks the weight files, and a run that fails validation
  leaves no trace in its workdir."""
  model_dir = tmp_path / "model"
  model_dir.mkdir()
  tiny = ModelConfig.tiny(**dict(default.get_config().model.tiny))
  with open(model_dir / "config.json", "w") as f:
    json.dump(tiny.to_hf_config(), f)  # the right architecture, but no weights
  workdir = tmp_path / "run"
  flags = (f"--config.model.path={model_dir}", "--config.model.random_init=False")
  for extra in (("--dry_run",), (f"--workdir={workdir}",)):
    out = _cli("--config=configs/default.py", *flags, *extra)
    assert out.returncode != 0
    assert f"model.path='{model_dir}'" in out.stderr and "No model.safetensors" in out.stderr
    assert "Traceback" not in out.stderr
  assert not workdir.exists()


def test_cli_dry_run_accepts_webshop():
  out = _cli("--config=configs/webshop.py:local=True", "--dry_run")
  assert out.returncode == 0, out.stderr
  assert "dry run: config valid" in out.stdout + out.stderr
