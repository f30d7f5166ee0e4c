"""sdar_jax.tools.build_demo_policy: the demo's warm start, built once into a reusable folder."""

import json

import pytest

from sdar_jax.models import load_pretrained
from sdar_jax.text.tokenizer import Tokenizer
from sdar_jax.tools import build_demo_policy


# Heavy (~45 s under make test): the builder's two stages through the real trainer on the demo's
# own 4-layer model, engine and validation; a smaller model would not be the demo's policy.
# Episodes of 4 turns (the demo's 15) keep the validation short: the expert wins none of them,
# which this test does not need (it checks what is built and logged, not how well).
@pytest.mark.slow
def test_build_writes_a_loadable_policy_with_its_metrics(tmp_path, monkeypatch):
  out = tmp_path / "policy"
  small = {
    "env.offline.num_train": 1,
    "env.offline.num_eval": 1,
    "warm_start.expert_holdout": 0.5,
    "eval.num_tasks": 1,
    "env.max_turns": 4,
  }
  metrics = build_demo_policy.build(out, steps=1, overrides=small, stages=2, seed=5)
  config, _ = load_pretrained(str(out))
  assert (config.family, config.num_layers, config.hidden_size) == ("qwen3", 4, 128)
  assert Tokenizer.from_dir(out).vocab_size <= config.vocab_size  # tokenizer files travel along
  saved = json.loads((out / "warm_start_metrics.json").read_text())
  assert saved == json.loads(json.dumps(metrics)) and saved["warm_start/steps"] == 2
  assert saved["warm_start/expert_samples"] > 0 and "warm_start/loss_last" in saved
  assert 0.0 <= saved["val/success_rate"] <= 1.0  # the built policy, validated before any RL
  log = json.loads((out / "build_log.json").read_text())
  assert [(s["steps"], s["seed"], s["init"]) for s in log] == [
    (1, 5, "random weights"),
    (1, 6, "the previous stage"),
  ]
  assert "2. 1 steps, seed 6, from the previous stage" in (out / "README.md").read_text()

  # A run that starts from a built policy logs its warm_start/* metrics at step 0.
  from sdar_jax.run.warm_start import built_policy_metrics

  assert built_policy_metrics(str(out))["warm_start/steps"] == 2.0
  assert built_policy_metrics(str(tmp_path)) == {}
