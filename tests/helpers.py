"""Plain helpers shared by several test modules: the tiny model config most update-step tests use,
a random `TurnBatch` builder whose old log-probs come from the full-logits `forward`, and small
pytree utilities. Objects built from these (parameters, a batch) are fixtures in conftest.py."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np

from configs.common import local_overrides
from envs.alfworld.tasks import TASK_TYPES as ALFWORLD_TASK_TYPES
from sdar_jax.algos import get_preset
from sdar_jax.core.batch import TurnBatch, TurnSample
from sdar_jax.core.sampling import GenerationResult, Sampler, SamplingParams
from sdar_jax.core.train_state import TrainState, create_train_state
from sdar_jax.models import ModelConfig, forward
from sdar_jax.rollout.batching import pack_batch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(relative_path: str, name: str) -> types.ModuleType:
  """A script of the repository that is not in a package (bench/*.py, launch/*.py) imported as
  module `name`, registered in sys.modules (dataclasses look their module up there)."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, relative_path))
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


# A tiny Qwen3-architecture model: GQA with 8 query heads over 4 kv heads, two layers.
TINY_CONFIG = ModelConfig.tiny(
  "qwen3",
  vocab_size=256,
  hidden_size=64,
  intermediate_size=128,
  num_layers=2,
  num_heads=8,
  num_kv_heads=4,
  head_dim=16,
)
# A one-layer Qwen3 with the full Qwen vocabulary, so the real (bundled) tokenizer drives it: the
# agent-loop tests' model.
QWEN_VOCAB_DECODER = ModelConfig.tiny(
  "qwen3",
  vocab_size=151936,
  hidden_size=16,
  intermediate_size=32,
  num_layers=1,
  num_heads=2,
  num_kv_heads=1,
  head_dim=8,
)
# The small shape (GQA 4 q heads over 2 kv heads, two layers) of the checkpoint / Hugging Face
# file tests, the decode step's attention tests, the roofline's and (with either family and an
# attention path) the attention tests': `ModelConfig.tiny(family, **SMALL_SHAPE, ...)`.
SMALL_SHAPE = {
  "vocab_size": 256,
  "hidden_size": 64,
  "intermediate_size": 128,
  "num_layers": 2,
  "num_heads": 4,
  "num_kv_heads": 2,
  "head_dim": 16,
}
SMALL_QWEN3 = ModelConfig.tiny("qwen3", **SMALL_SHAPE)
# One bucket of a turn batch: student prompt, teacher prompt and response slots.
STUDENT_PROMPT_LEN, TEACHER_PROMPT_LEN, RESPONSE_LEN = 7, 12, 6
# The SDAR preset as a loss config, teacher scored inside the update step, no KL term.
SDAR_LOSS = dict(dataclasses.asdict(get_preset("sdar")), kl_coef=0.0, teacher_source="update")


# The splits of the run-wide ALFWorld game set (conftest.alfworld_games): split -> task types.
ALFWORLD_GAME_SPLITS = {
  "train": ALFWORLD_TASK_TYPES,
  "valid_seen": ("pick_heat_then_place_in_recep", "look_at_obj_in_light"),
  "valid_unseen": ("pick_and_place_simple", "pick_heat_then_place_in_recep"),
}


def copy_alfworld_games(games_root: str, out: str, splits: tuple[str, ...]) -> str:
  """`out`: an ALFWorld data folder holding `splits` of the run-wide game set (games and
  walkthrough files), copied so that the test may change it."""
  os.makedirs(os.path.join(out, "walkthroughs"), exist_ok=True)
  for split in splits:
    shutil.copytree(os.path.join(games_root, split), os.path.join(out, split))
    name = os.path.join("walkthroughs", f"{split}.jsonl")
    shutil.copy(os.path.join(games_root, name), os.path.join(out, name))
  return out


def full_logp(
  params, tokens: np.ndarray, mask: np.ndarray, response_len: int, temperature: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
  """Independent truth: log-probs and entropies of the last `response_len` tokens, computed in
  float64 numpy from the full [B, T, V] logits of `forward` on `TINY_CONFIG`."""
  logits = np.asarray(forward(TINY_CONFIG, params, tokens, mask), np.float64) / temperature
  logits -= logits.max(-1, keepdims=True)
  logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  prompt = tokens.shape[1] - response_len
  out = np.zeros((tokens.shape[0], response_len))
  ent = np.zeros_like(out)
  for r in range(response_len):
    row = logp_all[:, prompt - 1 + r]
    out[:, r] = row[np.arange(tokens.shape[0]), tokens[:, prompt + r]]
    ent[:, r] = -(np.exp(row) * row).sum(-1)
  return out.astype(np.float32), ent.astype(np.float32)


def make_turn_batch(
  params,
  B: int = 8,
  seed: int = 0,
  ps: int = STUDENT_PROMPT_LEN,
  pt: int = TEACHER_PROMPT_LEN,
  r: int = RESPONSE_LEN,
  min_prompt: int = 2,
  nan_row: int | None = None,
) -> TurnBatch:
  """Left-padded prompts of random lengths, right-padded responses of random lengths; the teacher
  prompt is a random 'skills' block followed by the same student prompt; old_logp exact (zeros
  when `params` is None). `nan_row` puts a NaN advantage in that row."""
  rng = np.random.default_rng(seed)
  vocab = TINY_CONFIG.vocab_size
  st = np.zeros((B, ps + r), np.int32)
  sm = np.zeros_like(st)
  tt = np.zeros((B, pt + r), np.int32)
  tm = np.zeros_like(tt)
  rm = np.zeros((B, r), np.float32)
  for i in range(B):
    n_p = int(rng.integers(min_prompt, ps + 1))
    n_s = int(rng.integers(1, pt - n_p + 1))
    n_r = int(rng.integers(1, r + 1))
    prompt = rng.integers(1, vocab, n_p)
    resp = rng.integers(1, vocab, n_r)
    st[i, ps - n_p : ps], sm[i, ps - n_p : ps] = prompt, 1
    tt[i, pt - n_p - n_s : pt - n_p] = rng.integers(1, vocab, n_s)  # the skills block
    tt[i, pt - n_p : pt] = prompt
    tm[i, pt - n_p - n_s : pt] = 1
    st[i, ps : ps + n_r], sm[i, ps : ps + n_r] = resp, 1
    tt[i, pt : pt + n_r], tm[i, pt : pt + n_r] = resp, 1
    rm[i, :n_r] = 1
  adv = rng.normal(size=B).astype(np.float32)
  if nan_row is not None:
    adv[nan_row] = np.nan
  old = full_logp(params, st, sm, r)[0] if params is not None else np.zeros((B, r), np.float32)
  return TurnBatch(
    student_tokens=st,
    student_mask=sm,
    response_mask=rm,
    old_logp=old,
    advantages=adv,
    teacher_tokens=tt,
    teacher_mask=tm,
  )


def sample_and_pack(
  config: ModelConfig, params, prompts: list[list[int]], sampling: SamplingParams, key: jax.Array
) -> tuple[TurnBatch, GenerationResult]:
  """The real sampler's responses to `prompts`, one turn-sample per prompt (score and advantage 0,
  the sampler's log-probs as behaviour log-probs), packed as the trainer packs them into 4 rows
  without teacher rows; with the sampler's output."""
  out = Sampler(config).generate(params, prompts, sampling, key)
  samples = [
    TurnSample(
      prompt_ids=prompt,
      response_ids=tokens,
      logprobs=logprobs,
      score=0,
      advantage=0,
      group_id=0,
      policy_version=0,
      valid=True,
    )
    for prompt, tokens, logprobs in zip(prompts, out.tokens, out.logprobs)
  ]
  return pack_batch(samples, batch_size=4, with_teacher=False), out


def fresh_state(params, optimizer) -> TrainState:
  """A step-0 train state over a copy of `params` (the update may donate its inputs)."""
  return create_train_state(jax.tree.map(jnp.copy, params), optimizer)


def to_np(tree):
  """The same pytree with every leaf as a host numpy array."""
  return jax.tree.map(np.asarray, tree)


# What every small run of the real host loop shares: the compact tokenizer (1,642 ids, padded to
# 1,664 logits; byte-level, so any env's text encodes) instead of Qwen's 151,936 (at which the tiny
# model's 9.8M parameters are nearly all embedding), on a (data 2, fsdp 1, tensor 4) mesh of the 8
# fake devices, so that every run also shards its model and batches (one device saved about 2 s of a
# 12 s three-iteration run once the vocabulary was small: too little to give that up).
COMPACT_VOCAB = 1664


# A real-size config's model section made the tiny demo architecture with random weights (asked
# for explicitly: a real preset without model.path is refused): the model keys of the configs'
# own `local=True` shrinking.
SMALL_MODEL = {k: v for k, v in local_overrides("alfworld").items() if k.startswith("model.")}


def small_run_overrides() -> dict:
  """Dotted config keys that shrink any env's `local=True` config to the smallest run the host
  loop plays: one GRPO group of 2 two-turn episodes per iteration, 2 validation episodes, the envs
  in the trainer's process (no worker process to start), no warm start, synchronous checkpoints,
  no HF export, no TensorBoard."""
  from sdar_jax.text.tokenizer import packaged_tokenizer_dir

  return {
    "model.tokenizer_dir": str(packaged_tokenizer_dir("alfworld_compact")),
    "model.tiny.vocab_size": COMPACT_VOCAB,
    "mesh.data": 2,
    "mesh.fsdp": 1,
    "mesh.tensor": 4,
    "env.tasks_per_iteration": 1,
    "env.group_size": 2,
    "env.max_turns": 2,
    "env.num_workers": 0,
    "eval.num_tasks": 2,
    "rollout.max_new_tokens": 16,
    "train.mini_batch_size": 4,
    "train.micro_batch_size": 2,
    "warm_start.steps": 0,
    "checkpoint.async_save": False,
    "checkpoint.export_hf": False,
    "logging.tensorboard": False,
  }


# tiny_run_config overrides for one trained iteration: no evaluation, a checkpoint and a row.
ONE_ITERATION = {
  "train.eval_before_train": False,
  "train.eval_every": 0,
  "checkpoint.every": 1,
  "logging.every": 1,
}


def tiny_run_config(iterations: int, algo: str = "sdar", **overrides):
  """A whole ALFWorld run config for the real host loop, as small as it goes
  (`small_run_overrides`) on one generated game per task type and split. `overrides`: dotted
  config keys, e.g. `**{"train.eval_every": 2}`."""
  from configs import alfworld, common
  from envs.skills.library import skills_dir

  config = alfworld.get_config(f"model=tiny,algo={algo},local=True")
  tiny = {
    **small_run_overrides(),
    "env.offline.num_train": 1,
    "env.offline.num_eval": 1,
    "env.offline.rooms": "small",
    # The demo's brief skills (about 240 tokens), cut to the task's objects: the teacher's
    # prompt is the skill block plus the student's, and the general skills are about 1,900.
    "env.skills.dir": skills_dir("alfworld_brief"),
    "env.skills.places": "task",
    "train.iterations": iterations,
  }
  return common.override(config, {**tiny, **overrides})


# A two-file skills folder in either mapping layout (texts written for the tests): the authors'
# layout names the general file "general_skills" and keys task_keywords by task type; ours names
# it "general" and keys task_keywords by skill.
TEST_GENERAL_SKILLS = (
  "### GENERAL SKILLS ###\n"
  "Habits that help in any household task.\n"
  "\n"
  "1. Read the goal twice: Name the object and the place it must end in before moving. Apply "
  "this when a new task begins.\n"
  "2. Check each receptacle once: Open closed containers you pass and remember what they hold. "
  "Apply this when the object is not yet in sight.\n"
)
TEST_HEAT_SKILLS = (
  "### TASK: heat ###\n"
  "Warming an object before placing it.\n"
  "\n"
  "1. Carry it to the microwave: Hold the object, go to the microwave and heat it there. Apply "
  "this when the goal asks for a hot object.\n"
)
TEST_HEAT_GAME = "pick_heat_then_place_in_recep-Egg-None-Fridge-5"


def write_skills_folder(directory, layout: str = "authors", general: str | None = None) -> str:
  """Writes the test skills (`general`: the general file's text, default TEST_GENERAL_SKILLS)
  into `directory` in `layout` "authors" or "ours"; returns the directory."""
  import json

  os.makedirs(directory, exist_ok=True)
  general_key = {"authors": "general_skills", "ours": "general"}[layout]
  keyword_key = {"authors": "pick_heat_then_place_in_recep", "ours": "heat"}[layout]
  mapping = {
    "skill_files": {general_key: "general_skills.md", "heat": "heat.md"},
    "task_to_skill": {"pick_heat_then_place_in_recep": "heat"},
    "task_keywords": {keyword_key: ["hot", "heat"]},
  }
  with open(os.path.join(directory, "skill_mapping.json"), "w") as f:
    json.dump(mapping, f, indent=2)
  for name, text in (
    ("general_skills.md", general or TEST_GENERAL_SKILLS),
    ("heat.md", TEST_HEAT_SKILLS),
  ):
    with open(os.path.join(directory, name), "w") as f:
      f.write(text)
  return str(directory)


# ------------------------------------------------------------------------ W&B offline run files
def wandb_offline_env(monkeypatch, root) -> str:
  """W&B in offline mode (no network, no login) with every folder it writes under `root`;
  returns $WANDB_DIR (its runs go to <WANDB_DIR>/wandb/offline-run-<time>-<id>/)."""
  folder = os.path.join(str(root), "wandb_dir")
  for name, value in (
    ("WANDB_MODE", "offline"),
    ("WANDB_DIR", folder),
    ("WANDB_CONFIG_DIR", os.path.join(str(root), "wandb_config")),
    ("WANDB_CACHE_DIR", os.path.join(str(root), "wandb_cache")),
    ("WANDB_DATA_DIR", os.path.join(str(root), "wandb_data")),
    ("WANDB_SILENT", "true"),
  ):
    monkeypatch.setenv(name, value)
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  os.makedirs(folder, exist_ok=True)
  return folder


def wandb_records(path: str) -> list:
  """The records of a W&B run file (run-<id>.wandb) as `wandb.proto` Record messages. The file is
  a 7-byte header (":W&B", 0xBEE1 little-endian, version 0) and then LevelDB's log format: 32 KiB
  blocks of chunks, each a 7-byte header (CRC, length, kind: 1 full, 2 first, 3 middle, 4 last)
  and its bytes; a block's tail shorter than a header is padding."""
  import struct

  from wandb.proto import wandb_internal_pb2

  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0), data[:7]
  block, pos, parts, records = 32768, 7, b"", []
  while pos + 7 <= len(data):
    room = block - pos % block
    if room < 7:
      pos += room
      continue
    _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
    if kind == 0:  # zero padding up to the block's end
      pos += room
      continue
    chunk = data[pos + 7 : pos + 7 + length]
    pos += 7 + length
    parts = chunk if kind in (1, 2) else parts + chunk
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(parts)
      records.append(record)
  return records


def wandb_offline_runs(wandb_dir: str, run_id: str) -> list[list]:
  """The records of each offline W&B run of id `run_id` under `wandb_dir`, oldest first (a resumed
  run writes a folder of its own). wandb's service may still be writing a run's file when
  `finish` has returned: `wandb.teardown` waits for it first."""
  import glob

  import wandb

  wandb.teardown()
  pattern = os.path.join(wandb_dir, "wandb", f"offline-run-*-{run_id}", f"run-{run_id}.wandb")
  return [wandb_records(path) for path in sorted(glob.glob(pattern))]


def wandb_history(records) -> list[dict]:
  """The logged rows of `records` (W&B's own "_step", "_runtime", ... left out), values decoded
  from their JSON."""
  import json

  rows = []
  for r in records:
    if r.WhichOneof("record_type") == "history":
      row = {}
      for item in r.history.item:
        key = item.key or ".".join(item.nested_key)
        if not key.startswith("_"):
          row[key] = json.loads(item.value_json)
      rows.append(row)
  return rows


def wandb_run_record(records):
  """The run record of `records` (id, project, name, tags, config)."""
  (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
  return run


def config_problems(config, num_devices: int = 8) -> str:
  """The message of the ConfigError `validate(config)` raises (the calling test fails if none)."""
  import pytest

  from sdar_jax.run.config_validation import ConfigError, validate

  with pytest.raises(ConfigError) as e:
    validate(config, num_devices=num_devices)
  return str(e.value)
