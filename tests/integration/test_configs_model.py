"""Configs, the model section: model.path checked against the preset and its weight files (every
shard present), the presets resolved, real presets without weights refused unless random_init,
each component checking its own sections, and the env and training choices validation refuses."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import pytest

from configs import alfworld, common, default, search_qa, webshop
from sdar_jax.models import ModelConfig, init_params, save_pretrained
from sdar_jax.run.config_validation import ConfigError, model_config_from, validate
from sdar_jax.run.setup import build_chat_template
from sdar_jax.text.chat_templates import ChatTemplate
from sdar_jax.text.tokenizer import packaged_policy_dir, packaged_tokenizer_dir
from tests.helpers import config_problems

ENV_MODULES = {"alfworld": alfworld, "webshop": webshop, "search_qa": search_qa}


def _local(algo: str = "sdar"):
  return alfworld.get_config(f"algo={algo},local=True")


def test_model_path_must_match_the_preset(tmp_path):
  tiny = ModelConfig.tiny(**dict(_local().model.tiny))
  with open(tmp_path / "config.json", "w") as f:
    json.dump(tiny.to_hf_config(), f)
  config = common.override(_local(), {"model.path": str(tmp_path)})
  found = model_config_from(config)
  assert dataclasses.replace(found, name="x") == dataclasses.replace(tiny, name="x")
  common.override(config, {"model.tiny.hidden_size": 128, "model.tiny.num_layers": 3})
  with pytest.raises(
    ConfigError, match=r"hidden_size=64 \(preset: 128\), num_layers=2 \(preset: 3\)"
  ):
    model_config_from(config)
  config = common.override(_local(), {"model.path": str(tmp_path / "missing")})
  assert "model.path=" in config_problems(config) and "no such directory" in config_problems(config)


def test_model_presets_resolve():
  for name in ("qwen2.5-3b", "qwen2.5-7b", "qwen3-1.7b"):
    config = alfworld.get_config(f"model={name}")
    model_config = model_config_from(config)
    assert model_config == ModelConfig.preset(
      name, dtype="bfloat16", param_dtype="float32", remat=True
    )
    # Without a model folder, "auto" prompts with the built-in template of the model's family.
    builtin = "qwen3" if name.startswith("qwen3") else "qwen2.5"
    chat_template = build_chat_template(config.model, model_config.family)
    assert chat_template == ChatTemplate.builtin(builtin)
  assert alfworld.get_config("model=qwen2.5-7b").model.hf_id == "Qwen/Qwen2.5-7B-Instruct"


def test_real_preset_without_weights_is_refused_unless_random_init():
  config = alfworld.get_config("model=qwen2.5-3b")
  assert config.model.path is None and not config.model.random_init
  msg = config_problems(config)
  assert msg.startswith("1 problem(s)"), msg
  assert "model.path=None" in msg and "would train random weights" in msg
  assert "Qwen/Qwen2.5-3B-Instruct" in msg and "--config.model.random_init=True" in msg
  config.model.random_init = True
  validate(config, num_devices=8)


def test_tiny_demo_model_asks_for_random_init():
  """The demo starts from its committed warm-started policy; without it (model.path=None) the
  tiny architecture trains random weights only when asked to."""
  config = default.get_config()
  assert config.model.path == str(packaged_policy_dir("alfworld_demo"))
  assert not config.model.random_init and config.warm_start.steps == 0
  config.model.path = None
  assert "model.path=None" in config_problems(config, num_devices=1)
  config.model.random_init = True
  validate(config, num_devices=1)


def _tiny_model_dir(config, directory, **save_options) -> str:
  """A Hugging Face directory (config.json, safetensors and the compact ALFWorld tokenizer's
  files, written by our save_pretrained) holding the config's tiny architecture with a vocabulary
  that covers the tokenizer's 1,642 ids."""
  common.override(config, {"model.tiny.vocab_size": 1664})
  tiny = ModelConfig.tiny(**dict(config.model.tiny))
  params = init_params(tiny, jax.random.key(0))
  tokenizer_dir = packaged_tokenizer_dir("alfworld_compact")
  return save_pretrained(tiny, params, directory, tokenizer_dir=tokenizer_dir, **save_options)


def test_model_path_weight_files_are_checked(tmp_path):
  config = _local()
  path = _tiny_model_dir(config, tmp_path / "model")
  common.override(config, {"model.path": path, "model.random_init": False})
  validate(config, num_devices=8)  # complete weights: valid

  weights = os.path.join(path, "model.safetensors")
  size = os.path.getsize(weights)
  with open(weights, "r+b") as f:
    f.truncate(size - 1000)
  msg = config_problems(config)
  assert weights in msg and "truncated" in msg and "tensor 'model." in msg, msg

  os.remove(weights)
  msg = config_problems(config)
  assert f"model.path={path!r}" in msg and "No model.safetensors" in msg, msg
  config.model.random_init = True  # a path always supplies the weights: still checked
  assert "No model.safetensors" in config_problems(config)

  os.remove(os.path.join(path, "tokenizer.json"))
  msg = config_problems(config)
  assert f"model.path={path!r}: no tokenizer.json in it" in msg, msg


def test_sharded_weights_need_every_shard(tmp_path):
  config = _local()
  path = _tiny_model_dir(config, tmp_path / "sharded", max_shard_bytes=50_000)
  common.override(config, {"model.path": path, "model.random_init": False})
  validate(config, num_devices=8)
  shard = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))[-1]
  os.remove(os.path.join(path, shard))
  msg = config_problems(config)
  assert "model.safetensors.index.json" in msg and shard in msg, msg


def test_components_check_their_own_sections_and_validate_collects_them():
  """Single-section checks live with what reads the section (the run's setup, the warm start, the
  env registry, the skill retriever); validate() reports their lines with everything else."""
  from envs import env_section_problems
  from envs.skills.retrieval import skills_section_problems
  from sdar_jax.run import setup as run_setup
  from sdar_jax.run import warm_start

  overrides = {
    "checkpoint.keep": 0,
    "env.history": -1,
    "warm_start.lr": 0.0,
    "env.skills.top_k": 0,
    "env.data_dir": "/no/such/dir",
  }
  config = common.override(_local(), overrides)
  assert run_setup.setting_problems(config) == [
    "env.history=-1: must be a number >= 0. Fix: use a value >= 0",
    "checkpoint.keep=0: must be a number >= 1. Fix: use a value >= 1",
  ]
  assert warm_start.setting_problems(config.warm_start) == [
    "warm_start.lr=0.0: must be > 0. Fix: set a positive learning rate"
  ]
  assert skills_section_problems(config.env.skills) == [
    "env.skills.top_k=0: must be a number >= 1. Fix: use a value >= 1"
  ]
  assert env_section_problems(config.env, ["alfworld"]) == [
    "env.data_dir='/no/such/dir': no such directory. Fix: point it at the prepared data, or unset "
    "it for the offline generated data"
  ]
  assert config_problems(config).startswith("5 problem(s)")


def test_unknown_room_size_is_refused():
  msg = config_problems(common.override(_local(), {"env.offline.rooms": "tiny"}))
  assert "env.offline.rooms='tiny': unknown room size" in msg and "'small'" in msg, msg


def test_asynchronous_training_with_recomputed_old_logp_is_refused():
  config = common.override(_local(), {"train.max_staleness": 1, "algo.recompute_old_logp": True})
  msg = config_problems(config)
  assert "train.max_staleness=1 with algo.recompute_old_logp=True" in msg
  assert "Fix: set algo.recompute_old_logp=False" in msg


@pytest.mark.parametrize("env", ["webshop", "search_qa"])
def test_webshop_and_search_qa_are_trainable(env):
  import envs

  assert envs.env_family(env).name == env  # they register an EnvFamily
  assert validate(ENV_MODULES[env].get_config("local=True"), num_devices=8).name == "tiny"


def test_envs_without_a_family_are_refused_at_validation(monkeypatch):
  import envs.base

  envs.env_family("webshop")
  monkeypatch.delitem(envs.base._FAMILIES, "webshop")  # as if its package registered none
  msg = config_problems(webshop.get_config("local=True"))
  assert msg.startswith("1 problem(s)"), msg
  assert "env.name='webshop': this environment is not implemented yet" in msg
  assert "Fix: use one of ['alfworld', 'search_qa']" in msg
