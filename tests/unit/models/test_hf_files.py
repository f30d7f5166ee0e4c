"""Hugging Face directories on disk: damaged safetensors files are named in the error (file and
tensor), and an export carries the source model's tokenizer files and generation config."""

from __future__ import annotations

import json
import os
import struct

import jax
import pytest

from sdar_jax.models import init_params, load_pretrained, save_pretrained
from sdar_jax.models.hf_io import QWEN_GENERATION_CONFIG, SafetensorsFile, verify_checkpoint
from sdar_jax.run.checkpoint import export_hf
from tests.helpers import REPO, SMALL_QWEN3

# The tokenizer files of a Hugging Face model directory, as Qwen publishes them.
TOKENIZER_FILES = (
  "tokenizer.json",
  "tokenizer_config.json",
  "vocab.json",
  "merges.txt",
  "special_tokens_map.json",
  "added_tokens.json",
  "chat_template.jinja",
)


@pytest.fixture(scope="module")
def params():
  return init_params(SMALL_QWEN3, jax.random.key(0))


def _truncate(path: str, keep_bytes: int) -> None:
  with open(path, "r+b") as f:
    f.truncate(keep_bytes)


def _header_end(path: str) -> int:
  with open(path, "rb") as f:
    return 8 + struct.unpack("<Q", f.read(8))[0]


# ------------------------------------------------------------------------------------ damaged files
def test_truncated_weights_name_the_file_and_the_tensor(params, tmp_path):
  out = save_pretrained(SMALL_QWEN3, params, tmp_path / "model")
  weights = os.path.join(out, "model.safetensors")
  _truncate(weights, os.path.getsize(weights) - 4096)  # the last tensors lose their bytes
  for load in (load_pretrained, verify_checkpoint):
    with pytest.raises(ValueError) as e:
      load(out)
    msg = str(e.value)
    assert weights in msg and "truncated" in msg, msg
    assert "tensor 'model.layers." in msg, msg  # the embedding is first and still complete


def test_weights_cut_inside_the_header_name_the_file(params, tmp_path):
  out = save_pretrained(SMALL_QWEN3, params, tmp_path / "model")
  weights = os.path.join(out, "model.safetensors")
  _truncate(weights, _header_end(weights) - 10)
  with pytest.raises(ValueError, match="truncated safetensors file") as e:
    load_pretrained(out)
  assert weights in str(e.value)


def test_truncated_shard_is_named(params, tmp_path):
  out = save_pretrained(SMALL_QWEN3, params, tmp_path / "sharded", max_shard_bytes=50_000)
  shard = os.path.join(out, sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))[0])
  _truncate(shard, _header_end(shard) + 8)
  with pytest.raises(ValueError) as e:
    load_pretrained(out)
  assert shard in str(e.value) and "truncated" in str(e.value)


def test_byte_count_must_match_dtype_and_shape(tmp_path):
  """A hand-written file whose header gives a [2, 3] float32 tensor (24 bytes) 20 bytes."""
  header = json.dumps({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}).encode()
  path = tmp_path / "bad.safetensors"
  path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(24))
  with pytest.raises(ValueError) as e:
    SafetensorsFile(str(path))
  msg = str(e.value)
  assert str(path) in msg and "tensor 'w'" in msg and "needs 24" in msg, msg


# ------------------------------------------------------------------------------------ export
def _source_model_dir(directory) -> dict[str, bytes]:
  """A source model directory: every tokenizer file, a generation config, a README and weights.
  Returns the files an export must carry over (name -> bytes)."""
  os.makedirs(directory)
  carried = {name: f"contents of {name}\n".encode() for name in TOKENIZER_FILES}
  carried["generation_config.json"] = json.dumps(
    {"eos_token_id": [7, 8], "temperature": 0.7, "top_p": 0.8}
  ).encode()
  for name, data in {**carried, "README.md": b"not a tokenizer file\n"}.items():
    with open(os.path.join(directory, name), "wb") as f:
      f.write(data)
  return carried


def test_export_carries_tokenizer_files_and_generation_config(params, tmp_path):
  source = tmp_path / "source"
  carried = _source_model_dir(source)
  out = export_hf(SMALL_QWEN3, params, tmp_path / "export", tokenizer_dir=source, source_dir=source)
  for name, data in carried.items():
    with open(os.path.join(out, name), "rb") as f:
      assert f.read() == data, name
  assert not os.path.exists(os.path.join(out, "README.md"))
  assert os.path.exists(os.path.join(out, "model.safetensors"))


def test_export_without_a_source_writes_the_qwen_generation_config(params, tmp_path):
  tokenizers = tmp_path / "tokenizer"
  _source_model_dir(tokenizers)
  os.remove(tokenizers / "generation_config.json")
  out = export_hf(SMALL_QWEN3, params, tmp_path / "export", tokenizer_dir=tokenizers)
  with open(os.path.join(out, "generation_config.json")) as f:
    assert json.load(f) == QWEN_GENERATION_CONFIG
  assert os.path.exists(os.path.join(out, "chat_template.jinja"))


def test_export_with_another_tokenizer_writes_that_tokenizers_stop_ids(params, tmp_path):
  """A compact tokenizer's <|im_end|> / <|endoftext|> are not Qwen's ids: an export must name the
  exported tokenizer's own ids, or transformers' generate would never stop."""
  compact = os.path.join(REPO, "sdar_jax", "assets", "tokenizers", "alfworld_compact")
  with open(os.path.join(compact, "tokenizer.json")) as f:
    added = {t["content"]: t["id"] for t in json.load(f)["added_tokens"]}
  out = export_hf(SMALL_QWEN3, params, tmp_path / "export", tokenizer_dir=compact)
  with open(os.path.join(out, "generation_config.json")) as f:
    generation = json.load(f)
  with open(os.path.join(out, "config.json")) as f:
    config = json.load(f)
  assert generation["eos_token_id"][0] == config["eos_token_id"] == added["<|im_end|>"]
  assert generation["pad_token_id"] == added["<|endoftext|>"]
  assert max(added.values()) < 151643  # not the Qwen ids


def test_export_with_the_qwen_tokenizer_writes_the_published_qwen_ids(params, tmp_path):
  from sdar_jax.text.tokenizer import Tokenizer

  out = export_hf(
    SMALL_QWEN3, params, tmp_path / "export", tokenizer_dir=Tokenizer.bundled_qwen().path
  )
  with open(os.path.join(out, "generation_config.json")) as f:
    # Qwen2.5-*-Instruct's published generation_config.json ids.
    assert json.load(f) == {
      "bos_token_id": 151643,
      "eos_token_id": [151645, 151643],
      "pad_token_id": 151643,
    }
