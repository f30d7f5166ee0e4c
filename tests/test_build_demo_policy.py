"""sdar_jax.tools.build_demo_policy: the demo's warm start, built once into a reusable folder."""

import json

import pytest

from sdar_jax.models import load_pretrained
from sdar_jax.tokenizer import Tokenizer
from sdar_jax.tools import build_demo_policy


@pytest.mark.slow
def test_build_writes_a_loadable_policy_with_its_metrics(tmp_path, monkeypatch):
  monkeypatch.setenv("SDAR_DATA_CACHE", str(tmp_path / "cache"))
  out = tmp_path / "policy"
  small = {
    "env.offline.num_train": 1,
    "env.offline.num_eval": 1,
    "warm_start.expert_holdout": 0.5,
    "eval.num_tasks": 2,
  }
  metrics = build_demo_policy.build(out, steps=2, overrides=small)
  config, params = load_pretrained(str(out))
  assert (config.family, config.num_layers, config.hidden_size) == ("qwen3", 4, 128)
  assert Tokenizer.from_dir(out).vocab_size <= config.vocab_size  # tokenizer files travel along
  saved = json.loads((out / "warm_start_metrics.json").read_text())
  assert saved == json.loads(json.dumps(metrics)) and saved["warm_start/steps"] == 2
  assert saved["warm_start/expert_samples"] > 0 and "warm_start/loss_last" in saved
  assert 0.0 <= saved["val/success_rate"] <= 1.0  # the built policy, validated before any RL
  assert "warm_start/steps" in (out / "README.md").read_text()
