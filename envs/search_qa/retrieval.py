"""Passage retrieval for Search-QA: BM25 (bm25s) over a JSONL corpus, or a Search-R1 retrieval server.

Corpus format (wiki-18, Search-R1's corpus): one JSON object per line, ``{"id": "0", "contents":
"\\"Title\\"\\ntext"}``; `contents` is the quoted title, a newline, then the passage text.

- `BM25Retriever(passages)` indexes passages held in memory (the generated corpus).
- `BM25Retriever.from_jsonl(path)` indexes a corpus file once and caches the index on disk, under a
  key made of the file's absolute path, size and modification time (and the BM25 settings): a
  changed file is re-indexed, an unchanged one is loaded memory-mapped. Passages are read back from
  the corpus file by byte offset, so a large corpus is not held in memory after indexing. Building
  is guarded by a file lock, so pool workers that start together index once. Indexing holds the
  corpus text in memory once: for the full wiki-18 (21M passages, ~14 GB) that is a long one-time
  job on a large machine; the reference retriever for it is the e5 server below.
- `RetrievalServerClient(url)` talks to Search-R1's retrieval server (e5 + FAISS over wiki-18):
  POST ``{"queries": [...], "topk": k, "return_scores": true}`` and read
  ``{"result": [[{"document": {"id", "contents"}, "score": s}, ...] per query]}``
  (protocol "search_r1"); or verl-agent's server, one POST per query with ``{"query": q, ...}``
  (protocol "verl_agent"). Server errors 500/502/503/504, connection errors and timeouts are
  retried up to `max_attempts` times, waiting `retry_delay_s` x attempt between tries; what still
  fails raises `SearchError`, whose `kind` ("unreachable", "timeout", "HTTP 500", "bad reply", ...)
  says what went wrong in a word. `check_server(url, ...)` sends one test query at start and
  raises `envs.errors.EnvInputError` naming the URL and the fix when it gets no usable answer.

`information_text(results, passage_format, max_chars)` renders a search result for the env:
verl-agent's JSON (`{"result": "Doc 1: <contents>\\nDoc 2: ...\\n"}`) or Search-R1's
``Doc i(Title: <title>) <text>`` lines (docs/reference.md §5), each passage cut to `max_chars`
characters with a marker saying how many were left out (`cut_passage`).

BM25 uses Lucene's default parameters (k1 = 0.9, b = 0.4, as pyserini, Search-R1's BM25 option),
lower-casing, English stop words and no stemming.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from envs.common import file_lock, import_bm25s
from envs.errors import EnvFileNotFoundError, EnvInputError

__all__ = [
  "PASSAGE_FORMATS",
  "SERVER_PROTOCOLS",
  "BM25Retriever",
  "Passage",
  "RetrievalServerClient",
  "Retriever",
  "SearchError",
  "check_server",
  "cut_passage",
  "default_cache_dir",
  "information_text",
  "read_corpus_jsonl",
]

PASSAGE_FORMATS = ("verl_agent", "search_r1")
SERVER_PROTOCOLS = ("search_r1", "verl_agent")
RETRY_STATUS = (500, 502, 503, 504)
BM25_K1, BM25_B = 0.9, 0.4
_INDEX_FORMAT = 1  # bump when the on-disk cache layout changes


DEFAULT_MAX_PASSAGE_CHARS = 2000  # a wiki-18 passage (100 words) is about 600 characters


class SearchError(RuntimeError):
  """A search that could not be answered. `kind` names the failure in a word or two
  ("unreachable", "timeout", "HTTP 500", "bad reply"): one warning per kind is enough."""

  def __init__(self, message: str, kind: str = "error", detail: str = ""):
    super().__init__(message)
    self.kind = kind
    self.detail = detail or message  # the cause alone, without the URL and the attempts


@dataclasses.dataclass(frozen=True)
class Passage:
  """One retrieved passage: its corpus id, its `contents` ('"Title"\\ntext') and the retrieval score."""

  id: str
  contents: str
  score: float = 0.0

  @property
  def title(self) -> str:
    """The first line of `contents` (quotes kept, as Search-R1 shows it)."""
    return self.contents.split("\n")[0]

  @property
  def text(self) -> str:
    """Everything after the first line of `contents`."""
    return "\n".join(self.contents.split("\n")[1:])


class Retriever(Protocol):
  """Anything that returns the top passages for each query."""

  def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]: ...

  def close(self) -> None: ...


def cut_passage(contents: str, max_chars: int | None) -> str:
  """`contents` cut to its first `max_chars` characters, followed by a marker that says how many
  were left out; as it is when it is no longer, or when `max_chars` is 0 or None."""
  if not max_chars or len(contents) <= max_chars:
    return contents
  return f"{contents[:max_chars]} [... {len(contents) - max_chars} more characters cut]"


def information_text(
  passages: Sequence[Passage], passage_format: str = "verl_agent", max_chars: int | None = None
) -> str:
  """The text placed between <information> and </information> for one query's passages, each
  passage's contents cut to `max_chars` characters (`cut_passage`; None or 0: whole)."""
  if max_chars:
    passages = [
      dataclasses.replace(p, contents=cut_passage(p.contents, max_chars)) for p in passages
    ]
  if passage_format == "verl_agent":
    if not passages:
      return json.dumps({"result": "No search results found."})
    body = "".join(f"Doc {i + 1}: {p.contents.strip()}\n" for i, p in enumerate(passages))
    return json.dumps({"result": body})
  if passage_format == "search_r1":
    return "".join(f"Doc {i + 1}(Title: {p.title}) {p.text}\n" for i, p in enumerate(passages))
  raise ValueError(f"unknown passage_format {passage_format!r}; choose one of {PASSAGE_FORMATS}")


def error_text(message: str, passage_format: str = "verl_agent") -> str:
  """The information text for a failed search."""
  if passage_format == "verl_agent":
    return json.dumps({"result": f"Search error: {message}"})
  return f"Search error: {message}"


# ------------------------------------------------------------------------------------------ BM25
def default_cache_dir() -> str:
  """Where corpus indexes are cached: $SDAR_CACHE_DIR/search_qa_bm25, else ~/.cache/sdar_jax/..."""
  root = os.environ.get("SDAR_CACHE_DIR") or os.path.join(
    os.path.expanduser("~"), ".cache", "sdar_jax"
  )
  return os.path.join(root, "search_qa_bm25")


def _iter_corpus_lines(path: str) -> Iterator[tuple[int, int, dict[str, Any]]]:
  """(line number, byte offset, record) for every non-empty line of a JSONL corpus."""
  with open(path, "rb") as f:
    offset = 0
    for number, line in enumerate(f, 1):
      start, offset = offset, offset + len(line)
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError as e:
        raise EnvInputError(
          f"{path}:{number} is not valid JSON ({e}); expected one passage per line"
        ) from e
      if not isinstance(record, dict) or not isinstance(record.get("contents"), str):
        raise EnvInputError(
          f'{path}:{number} has no string "contents"; each line must be {{"id": ..., "contents": '
          '"\\"Title\\"\\ntext"}} (the wiki-18 format)'
        )
      yield number, start, record


def read_corpus_jsonl(path: str) -> list[dict[str, str]]:
  """All passages of a JSONL corpus as {"id", "contents"} dicts (ids default to the line index)."""
  if path.endswith(".gz"):
    raise EnvInputError(f"{path} is compressed; decompress it first (gunzip -k {path})")
  return [
    {"id": str(record.get("id", i)), "contents": record["contents"]}
    for i, (_, _, record) in enumerate(_iter_corpus_lines(path))
  ]


def _tokenize_corpus(bm25s: Any, texts: Sequence[str]) -> Any:
  return bm25s.tokenize(list(texts), stopwords="en", show_progress=False)


class BM25Retriever:
  """BM25 over passages in memory, or over a JSONL corpus file (see `from_jsonl`)."""

  def __init__(self, passages: Sequence[Mapping[str, Any]], k1: float = BM25_K1, b: float = BM25_B):
    if not passages:
      raise ValueError("BM25Retriever needs at least one passage")
    bm25s = import_bm25s()
    self._passages = [
      Passage(str(p.get("id", i)), str(p["contents"])) for i, p in enumerate(passages)
    ]
    self._file: Any = None
    self._offsets: np.ndarray | None = None
    self._lock = threading.Lock()
    self._bm25 = bm25s.BM25(k1=k1, b=b)
    self._bm25.index(
      _tokenize_corpus(bm25s, [p.contents for p in self._passages]), show_progress=False
    )
    self._num_docs = len(self._passages)

  @classmethod
  def from_jsonl(
    cls, path: str, cache_dir: str | None = None, k1: float = BM25_K1, b: float = BM25_B
  ) -> BM25Retriever:
    """Indexes `path` (or loads its cached index) and reads passages from the file by offset."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
      raise EnvFileNotFoundError(
        f"corpus file {path} does not exist; pass the wiki-18 style .jsonl"
      )
    if path.endswith(".gz"):
      raise EnvInputError(f"{path} is compressed; decompress it first (gunzip -k {path})")
    stat = os.stat(path)
    bm25s = import_bm25s()
    key_fields = {
      "path": path,
      "size": stat.st_size,
      "mtime_ns": stat.st_mtime_ns,
      "k1": k1,
      "b": b,
      "bm25s": getattr(bm25s, "__version__", "?"),
      "format": _INDEX_FORMAT,
    }
    key = hashlib.sha256(json.dumps(key_fields, sort_keys=True).encode()).hexdigest()[:20]
    root = cache_dir or default_cache_dir()
    folder = os.path.join(root, key)
    if not os.path.isfile(os.path.join(folder, "meta.json")):
      with file_lock(os.path.join(root, f"{key}.lock")):
        if not os.path.isfile(os.path.join(folder, "meta.json")):
          cls._build_cache(bm25s, path, folder, key_fields, k1, b)
    self = cls.__new__(cls)
    self._passages = []
    self._bm25 = bm25s.BM25.load(folder, mmap=True, show_progress=False)
    self._offsets = np.load(os.path.join(folder, "offsets.npy"), mmap_mode="r")
    self._num_docs = int(self._offsets.shape[0])
    self._file = open(path, "rb")
    self._lock = threading.Lock()
    self.cache_folder = folder
    return self

  @staticmethod
  def _build_cache(bm25s: Any, path: str, folder: str, meta: dict, k1: float, b: float) -> None:
    offsets, texts = [], []
    for _, offset, record in _iter_corpus_lines(path):
      offsets.append(offset)
      texts.append(record["contents"])
    if not texts:
      raise EnvInputError(f"corpus file {path} has no passages")
    bm25 = bm25s.BM25(k1=k1, b=b)
    bm25.index(_tokenize_corpus(bm25s, texts), show_progress=False)
    del texts
    tmp = f"{folder}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    bm25.save(tmp, show_progress=False)
    np.save(os.path.join(tmp, "offsets.npy"), np.asarray(offsets, dtype=np.int64))
    with open(os.path.join(tmp, "meta.json"), "w") as f:
      json.dump({**meta, "num_passages": len(offsets)}, f, indent=1)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)

  @property
  def num_passages(self) -> int:
    return self._num_docs

  def _passage(self, index: int, score: float) -> Passage:
    if self._offsets is None:
      p = self._passages[index]
      return Passage(p.id, p.contents, score)
    with self._lock:
      self._file.seek(int(self._offsets[index]))
      record = json.loads(self._file.readline())
    return Passage(str(record.get("id", index)), record["contents"], score)

  def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Passage]]:
    """The top `topk` passages with a positive score for each query (fewer when fewer match)."""
    if topk < 1:
      raise ValueError(f"topk must be >= 1, got {topk}")
    bm25s = import_bm25s()
    vocab = self._bm25.vocab_dict
    tokens = bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
    kept = [[t for t in query if t and t in vocab] for query in tokens]
    results: list[list[Passage]] = [[] for _ in queries]
    asked = [i for i, query in enumerate(kept) if query]
    if not asked:
      return results
    k = min(topk, self._num_docs)
    ids, scores = self._bm25.retrieve(
      [kept[i] for i in asked], k=k, show_progress=False, backend_selection="numpy", n_threads=0
    )
    for row, i in enumerate(asked):
      results[i] = [
        self._passage(int(doc), float(score))
        for doc, score in zip(ids[row], scores[row])
        if score > 0
      ]
    return results

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None


# ------------------------------------------------------------------------------ server client
class RetrievalServerClient:
  """Client of a running retrieval server (Search-R1's e5 + FAISS server, or verl-agent's).

  Args:
    url: the endpoint, e.g. "http://127.0.0.1:8000/retrieve".
    protocol: "search_r1" (one request, {"queries": [...]}) or "verl_agent" (one request per
      query, {"query": q}).
    timeout_s: per-request timeout (verl-agent: 60 s).
    max_attempts: tries per request for retryable failures (verl-agent: 10).
    retry_delay_s: wait retry_delay_s x attempt number between tries (verl-agent: 1 s).
  """

  def __init__(
    self,
    url: str,
    protocol: str = "search_r1",
    timeout_s: float = 60.0,
    max_attempts: int = 10,
    retry_delay_s: float = 1.0,
  ):
    if protocol not in SERVER_PROTOCOLS:
      raise ValueError(f"unknown server protocol {protocol!r}; choose one of {SERVER_PROTOCOLS}")
    if not url.startswith(("http://", "https://")):
      raise ValueError(f"search_url {url!r} must start with http:// or https://")
    if max_attempts < 1:
      raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    self.url = url
    self.protocol = protocol
    self.timeout_s = timeout_s
    self.max_attempts = max_attempts
    self.retry_delay_s = retry_delay_s

  def _post(self, payload: dict[str, Any]) -> Any:
    data = json.dumps(payload).encode("utf-8")
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    last_error, kind, detail = "no attempt made", "error", ""
    for attempt in range(1, self.max_attempts + 1):
      request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
      try:
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
          body = response.read()
      except urllib.error.HTTPError as e:
        if e.code not in RETRY_STATUS:
          detail = e.read()[:200].decode("utf-8", "replace")
          raise SearchError(f"HTTP {e.code} from {self.url}: {detail}", f"HTTP {e.code}") from e
        kind = detail = f"HTTP {e.code}"
        last_error = f"server error {e.code} on attempt {attempt}/{self.max_attempts}"
      except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(e, TimeoutError) or isinstance(reason, TimeoutError):
          kind, detail = "timeout", f"no answer within {self.timeout_s:g} s"
          last_error = (
            f"no answer within env.search_timeout_s={self.timeout_s:g} s on attempt "
            f"{attempt}/{self.max_attempts}"
          )
        else:
          cause = reason if isinstance(reason, BaseException) else e
          kind, detail = "unreachable", f"{type(cause).__name__}: {cause}"
          last_error = f"{detail} on attempt {attempt}/{self.max_attempts}"
      else:
        try:
          return json.loads(body)
        except ValueError as e:
          raise SearchError(
            f"reply from {self.url} is not JSON: {body[:200]!r}", "bad reply"
          ) from e
      if attempt < self.max_attempts:
        time.sleep(self.retry_delay_s * attempt)
    attempts = f"{self.max_attempts} attempt{'s' if self.max_attempts > 1 else ''}"
    raise SearchError(f"{self.url} failed after {attempts}: {last_error}", kind, detail)

  def _parse(self, reply: Any, expected: int) -> list[list[Passage]]:
    if not isinstance(reply, dict) or not isinstance(reply.get("result"), list):
      raise SearchError(
        f'reply from {self.url} has no "result" list: {str(reply)[:200]}', "bad reply"
      )
    lists = reply["result"]
    if len(lists) != expected:
      raise SearchError(
        f"{self.url} answered {len(lists)} result lists for {expected} queries", "bad reply"
      )
    parsed = []
    for items in lists:
      passages = []
      for item in items:
        doc = item.get("document", item) if isinstance(item, dict) else None
        if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
          raise SearchError(
            f'{self.url} returned an item without document "contents": {item!r:.200}', "bad reply"
          )
        score = float(item.get("score", 0.0)) if "document" in item else 0.0
        passages.append(Passage(str(doc.get("id", "")), doc["contents"], score))
      parsed.append(passages)
    return parsed

  def search(self, queries: Sequence[str], topk: int = 3) -> list[list[Passage]]:
    """The server's top `topk` passages for each query; raises SearchError when it cannot answer."""
    if not queries:
      return []
    if self.protocol == "search_r1":
      reply = self._post({"queries": list(queries), "topk": topk, "return_scores": True})
      return self._parse(reply, len(queries))
    out = []
    for query in queries:
      reply = self._post({"query": query, "topk": topk, "return_scores": True})
      out.extend(self._parse(reply, 1))
    return out

  def close(self) -> None:
    pass


def check_server(url: str, protocol: str = "search_r1", timeout_s: float = 30.0) -> None:
  """Sends one test query to the retrieval server at `url` (one attempt, `timeout_s`); raises
  `EnvInputError` naming the URL, what went wrong and the fix when no usable answer comes back.
  A run calls it at start, before anything is compiled (and --dry_run does too)."""
  where = f"env.search_url={url!r}"
  try:
    client = RetrievalServerClient(url, protocol=protocol, timeout_s=timeout_s, max_attempts=1)
  except ValueError as e:
    raise EnvInputError(f"{where}: {e}. Fix: give the server's full http:// URL.") from None
  try:
    client.search(["test"], topk=1)
  except SearchError as e:
    if e.kind == "unreachable":
      what = f"nothing answers there ({e.detail})"
    elif e.kind == "timeout":
      what = f"the server did not answer a test query within env.search_timeout_s={timeout_s:g} s"
    else:
      what = f"the server's answer to a test query is not usable ({e.detail})"
    raise EnvInputError(
      f"{where}: {what}. Fix: start the retrieval server (Search-R1's e5 server serves "
      "POST /retrieve, by default on port 8000) and check the URL and env.server_protocol="
      f"{protocol!r}; raise env.search_timeout_s for a slow server; or search a local corpus "
      "with --config.env.retriever=bm25 --config.env.search_url=None."
    ) from None


CORPUS_NAMES = ("corpus.jsonl", "wiki-18.jsonl")  # a prepared data folder's passage corpus


def corpus_in(data_dir: str) -> str:
  """The passage corpus of a prepared data folder: the first of `CORPUS_NAMES` it holds."""
  for name in CORPUS_NAMES:
    path = os.path.join(os.path.expanduser(data_dir), name)
    if os.path.isfile(path):
      return path
  raise EnvFileNotFoundError(
    f"no corpus in {data_dir} (looked for {', '.join(CORPUS_NAMES)}); pass corpus_path=<wiki-18 "
    "style .jsonl> or search_url=<retrieval server /retrieve endpoint>"
  )
