"""A fake Google Cloud Storage for tests: one in-memory object store reached two ways, as gs://.

* through fsspec (`FakeGcsFileSystem`, registered for the "gs" and "gcs" protocols in place of
  gcsfs), which is how `etils.epath` (and so orbax's own metadata files and `sdar_jax.infra.paths`)
  reads and writes gs:// paths;
* through a local HTTP server speaking the part of the GCS JSON API that TensorStore's `gcs`
  key-value store uses (media download with byte ranges, media upload, delete, list, generation
  preconditions), which is how orbax writes the arrays of a checkpoint. TensorStore is pointed at
  it with `TENSORSTORE_GCS_HTTP_URL` and a fixed token (`GOOGLE_AUTH_TOKEN_FOR_TESTING`).

Like GCS, the store is flat: an object is a name inside a bucket, a "directory" is a name prefix
(plus the empty markers `mkdir` leaves, as gcsfs-style tools do), and a rename is a copy then a
delete. Nothing reaches the network; the server listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib
import io
import json
import os
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import fsspec
from fsspec.spec import AbstractFileSystem

from sdar_jax.infra import paths

__all__ = ["FakeGcsFileSystem", "FakeGcsStore", "fake_gcs"]


class FakeGcsStore:
  """Objects keyed "bucket/name" -> (bytes, generation), and the directory markers of mkdir."""

  def __init__(self):
    self.lock = threading.RLock()
    self.objects: dict[str, tuple[bytes, int]] = {}
    self.dir_markers: set[str] = set()
    self._generation = 0

  def put(self, key: str, data: bytes) -> int:
    with self.lock:
      self._generation += 1
      self.objects[key] = (bytes(data), self._generation)
      return self._generation

  def names(self, prefix: str = "") -> list[str]:
    """Every object name (without the "gs://") under `prefix`, sorted."""
    with self.lock:
      return sorted(k for k in self.objects if k.startswith(prefix))


# The store the filesystem class reaches (set while `fake_gcs()` is active).
_ACTIVE: FakeGcsStore | None = None


def _store() -> FakeGcsStore:
  if _ACTIVE is None:
    raise RuntimeError("FakeGcsFileSystem used outside `with fake_gcs():`.")
  return _ACTIVE


class _ObjectWriter(io.BytesIO):
  """A file opened for writing: the object appears (whole) when it is closed, as on GCS."""

  def __init__(self, key: str, initial: bytes = b""):
    super().__init__(initial)
    self.seek(0, io.SEEK_END)
    self._key = key

  def close(self) -> None:
    if not self.closed:
      _store().put(self._key, self.getvalue())
    super().close()


class FakeGcsFileSystem(AbstractFileSystem):
  """fsspec view of the active `FakeGcsStore` (paths "gs://bucket/name" or "bucket/name")."""

  protocol = ("gs", "gcs")
  root_marker = ""
  cachable = False

  @classmethod
  def _strip_protocol(cls, path: Any) -> str:
    path = os.fspath(path) if not isinstance(path, str) else path
    for prefix in ("gs://", "gcs://"):
      path = path.removeprefix(prefix)
    return path.strip("/")

  # --------------------------------------------------------------------------------- queries
  def _is_dir(self, path: str) -> bool:
    store = _store()
    with store.lock:
      if path in store.dir_markers:
        return True
      prefix = path + "/"
      return any(k.startswith(prefix) for k in store.objects) or any(
        d.startswith(prefix) for d in store.dir_markers
      )

  def info(self, path, **kwargs) -> dict[str, Any]:
    path = self._strip_protocol(path)
    store = _store()
    with store.lock:
      if path in store.objects:
        data, generation = store.objects[path]
        return {"name": path, "size": len(data), "type": "file", "generation": generation}
    if self._is_dir(path) or "/" not in path:  # a bucket always exists
      return {"name": path, "size": 0, "type": "directory"}
    raise FileNotFoundError(path)

  def ls(self, path, detail=True, **kwargs):
    path = self._strip_protocol(path)
    store = _store()
    with store.lock:
      if path in store.objects:
        entries = [self.info(path)]
      else:
        prefix = path + "/" if path else ""
        children: dict[str, dict[str, Any]] = {}
        for name in list(store.objects) + list(store.dir_markers):
          if not name.startswith(prefix) or name == path:
            continue
          child, _, rest = name[len(prefix) :].partition("/")
          full = prefix + child
          if rest or name in store.dir_markers:
            children.setdefault(full, {"name": full, "size": 0, "type": "directory"})
          else:
            children[full] = self.info(full)
        if not children and not self._is_dir(path) and "/" in path:
          raise FileNotFoundError(path)
        entries = [children[k] for k in sorted(children)]
    return entries if detail else [e["name"] for e in entries]

  # --------------------------------------------------------------------------------- changes
  def _open(self, path, mode="rb", **kwargs):
    path = self._strip_protocol(path)
    store = _store()
    if mode == "rb":
      with store.lock:
        if path not in store.objects:
          raise FileNotFoundError(path)
        return io.BytesIO(store.objects[path][0])
    if mode in ("wb", "xb"):
      if mode == "xb" and self.exists(path):
        raise FileExistsError(path)
      return _ObjectWriter(path)
    if mode == "ab":
      with store.lock:
        initial = store.objects.get(path, (b"", 0))[0]
      return _ObjectWriter(path, initial)
    raise ValueError(f"FakeGcsFileSystem: unsupported mode {mode!r}")

  def mkdir(self, path, create_parents=True, **kwargs) -> None:
    path = self._strip_protocol(path)
    store = _store()
    with store.lock:
      parts = path.split("/")
      for i in range(2, len(parts) + 1):  # the bucket (parts[0]) needs no marker
        store.dir_markers.add("/".join(parts[:i]))

  def makedirs(self, path, exist_ok=False) -> None:
    if not exist_ok and self.exists(path):
      raise FileExistsError(path)
    self.mkdir(path)

  def rm_file(self, path) -> None:
    path = self._strip_protocol(path)
    store = _store()
    with store.lock:
      store.objects.pop(path, None)
      store.dir_markers.discard(path)

  def _rm(self, path) -> None:
    self.rm_file(path)

  def rmdir(self, path) -> None:
    path = self._strip_protocol(path)
    with _store().lock:
      _store().dir_markers.discard(path)

  def cp_file(self, path1, path2, **kwargs) -> None:
    path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
    store = _store()
    with store.lock:
      if path1 in store.objects:
        store.put(path2, store.objects[path1][0])
      elif self._is_dir(path1):
        self.mkdir(path2)
      else:
        raise FileNotFoundError(path1)


# ------------------------------------------------------------------------------- the HTTP side
class _GcsJsonApiHandler(http.server.BaseHTTPRequestHandler):
  """The GCS JSON API calls TensorStore's `gcs` driver makes, on the active store."""

  protocol_version = "HTTP/1.1"

  def log_message(self, format, *args) -> None:
    pass  # quiet: the test output stays clean

  # Parsing ---------------------------------------------------------------------------------
  def _parse(self) -> tuple[str, str, dict[str, str]]:
    """-> (bucket, rest of the path after /b/<bucket>, query parameters)."""
    url = urllib.parse.urlsplit(self.path)
    params = {k: v[0] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
    path = url.path
    for prefix in ("/upload/storage/v1/b/", "/storage/v1/b/", "/download/storage/v1/b/"):
      if path.startswith(prefix):
        bucket, _, rest = path[len(prefix) :].partition("/")
        return urllib.parse.unquote(bucket), "/" + rest, params
    return "", path, params

  def _body(self) -> bytes:
    if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
      chunks = []
      while True:
        size = int(self.rfile.readline().strip().split(b";")[0], 16)
        if size == 0:
          self.rfile.readline()
          break
        chunks.append(self.rfile.read(size))
        self.rfile.readline()
      return b"".join(chunks)
    return self.rfile.read(int(self.headers.get("Content-Length") or 0))

  def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
    self.send_response(status)
    for k, v in (headers or {}).items():
      self.send_header(k, v)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    if body and self.command != "HEAD":
      self.wfile.write(body)

  @staticmethod
  def _metadata(bucket: str, name: str, data: bytes, generation: int) -> dict[str, Any]:
    return {
      "kind": "storage#object",
      "name": name,
      "bucket": bucket,
      "generation": str(generation),
      "metageneration": "1",
      "size": str(len(data)),
      "contentType": "application/octet-stream",
      "timeCreated": "2026-01-01T00:00:00.000Z",
      "updated": "2026-01-01T00:00:00.000Z",
    }

  def _json(self, status: int, value: Any) -> None:
    self._send(status, json.dumps(value).encode(), {"Content-Type": "application/json"})

  @staticmethod
  def _precondition_failed(params: dict[str, str], current: int | None) -> bool:
    """GCS's ifGenerationMatch (0: the object must not exist) / ifGenerationNotMatch."""
    if "ifGenerationMatch" in params:
      want = int(params["ifGenerationMatch"])
      if (want == 0 and current is not None) or (want != 0 and want != current):
        return True
    return False

  # Methods ---------------------------------------------------------------------------------
  def do_GET(self) -> None:
    bucket, rest, params = self._parse()
    store = _store()
    if rest in ("/o", "/o/"):
      return self._list(bucket, params)
    if rest in ("", "/"):
      return self._json(200, {"kind": "storage#bucket", "name": bucket})
    name = urllib.parse.unquote(rest[len("/o/") :])
    with store.lock:
      found = store.objects.get(f"{bucket}/{name}")
    current = found[1] if found else None
    if self._precondition_failed(params, current):
      return self._send(412)
    if found is None:
      if params.get("ifGenerationMatch") == "0":
        return self._send(204)
      return self._send(404)
    data, generation = found
    if "ifGenerationNotMatch" in params and int(params["ifGenerationNotMatch"]) == generation:
      return self._send(304)
    if params.get("alt") != "media":
      return self._json(200, self._metadata(bucket, name, data, generation))
    headers = {
      "Content-Type": "application/octet-stream",
      "x-goog-generation": str(generation),
      "x-goog-metageneration": "1",
    }
    byte_range = self.headers.get("Range")
    if byte_range and byte_range.startswith("bytes="):
      first, _, last = byte_range[len("bytes=") :].partition("-")
      if first == "":  # a suffix: the last N bytes
        start, end = max(0, len(data) - int(last)), len(data) - 1
      else:
        start = int(first)
        end = min(int(last), len(data) - 1) if last else len(data) - 1
      if start >= len(data) and len(data) > 0:
        return self._send(416, headers={"Content-Range": f"bytes */{len(data)}"})
      headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
      return self._send(206, data[start : end + 1], headers)
    return self._send(200, data, headers)

  def _list(self, bucket: str, params: dict[str, str]) -> None:
    prefix = params.get("prefix", "")
    start = params.get("pageToken") or params.get("startOffset") or ""
    end = params.get("endOffset")
    items = []
    store = _store()
    with store.lock:
      for key in sorted(store.objects):
        if not key.startswith(bucket + "/"):
          continue
        name = key[len(bucket) + 1 :]
        if not name.startswith(prefix) or name < start or (end is not None and name >= end):
          continue
        if params.get("pageToken") and name == params["pageToken"]:
          continue
        data, generation = store.objects[key]
        items.append(self._metadata(bucket, name, data, generation))
    self._json(200, {"kind": "storage#objects", "items": items})

  def do_POST(self) -> None:
    bucket, _, params = self._parse()
    body = self._body()
    if not self.path.startswith("/upload/") or params.get("uploadType") != "media":
      return self._send(400, b'{"error": {"code": 400, "message": "only media uploads"}}')
    name = params.get("name", "")
    if not name:
      return self._send(400)
    key = f"{bucket}/{name}"
    store = _store()
    with store.lock:
      found = store.objects.get(key)
      current = found[1] if found else None
      if self._precondition_failed(params, current):
        return self._send(412)
      if "ifGenerationNotMatch" in params and current == int(params["ifGenerationNotMatch"]):
        return self._send(412)
      generation = store.put(key, body)
    self._json(200, self._metadata(bucket, name, body, generation))

  def do_DELETE(self) -> None:
    bucket, rest, params = self._parse()
    name = urllib.parse.unquote(rest[len("/o/") :])
    key = f"{bucket}/{name}"
    store = _store()
    with store.lock:
      found = store.objects.get(key)
      if found is None:
        return self._send(404)
      want = params.get("ifGenerationMatch")
      if want is not None and int(want) != found[1]:
        return self._send(412)
      del store.objects[key]
    self._send(204)


class _Server(http.server.ThreadingHTTPServer):
  daemon_threads = True


_SERVER: _Server | None = None


def _server_url() -> str:
  """One server per test process: TensorStore may read its endpoint variable only once."""
  global _SERVER
  if _SERVER is None:
    _SERVER = _Server(("127.0.0.1", 0), _GcsJsonApiHandler)
    threading.Thread(target=_SERVER.serve_forever, name="fake-gcs", daemon=True).start()
  return f"http://127.0.0.1:{_SERVER.server_address[1]}"


@contextlib.contextmanager
def fake_gcs() -> Iterator[FakeGcsStore]:
  """Routes every gs:// path of this process (epath/fsspec and TensorStore) to a fresh in-memory
  store while active; yields the store. Orbax's hierarchical-namespace probe (which would ask the
  real GCS client about the bucket) answers "no", as for an ordinary bucket, so
  `sdar_jax.infra.paths.check_remote_workdir` does not ask for that client either."""
  global _ACTIVE
  from etils.epath import backend as epath_backend
  from orbax.checkpoint._src.path import gcs_utils

  fsspec_registry = importlib.import_module("fsspec.registry")  # the module, not the mapping

  saved_env = {
    k: os.environ.get(k) for k in ("TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING")
  }
  saved_registry = {p: fsspec_registry._registry.get(p) for p in ("gs", "gcs")}
  saved_hns = gcs_utils.is_hierarchical_namespace_enabled
  saved_extra = dict(paths.EXTRA_MODULES)
  _ACTIVE = FakeGcsStore()
  try:
    os.environ["TENSORSTORE_GCS_HTTP_URL"] = _server_url()
    os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = "fake-token"
    for protocol in ("gs", "gcs"):
      fsspec.register_implementation(protocol, FakeGcsFileSystem, clobber=True)
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    gcs_utils.is_hierarchical_namespace_enabled = lambda path: False
    paths.EXTRA_MODULES.pop("gs", None)  # the storage client served only that probe
    yield _ACTIVE
  finally:
    gcs_utils.is_hierarchical_namespace_enabled = saved_hns
    paths.EXTRA_MODULES.clear()
    paths.EXTRA_MODULES.update(saved_extra)
    for protocol, impl in saved_registry.items():
      if impl is None:
        fsspec_registry._registry.pop(protocol, None)
      else:
        fsspec_registry._registry[protocol] = impl
    epath_backend.fsspec_backend._get_filesystem.cache_clear()
    for k, v in saved_env.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
    _ACTIVE = None
