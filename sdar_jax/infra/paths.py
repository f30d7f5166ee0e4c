"""Where a run writes: local folders or gs:// ones, and which process writes.

Every write of a run (checkpoints aside: orbax) goes through this module, so a workdir may be a
local path or `gs://bucket/runs/name` (through `etils.epath`, i.e. gcsfs). Writers that only know
local files write into a local temporary folder copied up (`staged_output`, `LocalMirror`);
readers get a local copy (`local_copy`). Files that describe the whole run are written by the
primary process only (`is_primary_process`); checkpoints by all processes together. On GCS a file
appears whole when closed, an append rewrites the object, and a copied-up directory is not atomic
(its config.json goes last, so a folder with a config.json is complete).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO

import jax
from etils import epath

from sdar_jax.infra.errors import MissingExtraError, UserError, install_extra_hint

__all__ = [
  "LocalMirror",
  "append_text",
  "check_remote_workdir",
  "check_writable_folder",
  "copy_file",
  "exists",
  "getmtime",
  "is_primary_process",
  "is_remote",
  "isdir",
  "isfile",
  "join",
  "listdir",
  "local_copy",
  "makedirs",
  "open_file",
  "read_text",
  "remove",
  "resolve",
  "rmtree",
  "scheme",
  "staged_output",
  "upload_tree",
  "walk_dirs",
  "write_text",
]

# The remote schemes a workdir may use: orbax writes checkpoint arrays through TensorStore and
# gives it a remote driver for gs:// only (another scheme fails there, or becomes a local path).
SUPPORTED_SCHEMES = ("gs",)
# What each scheme needs installed, beyond what epath reaches it with (fsspec's filesystem for the
# scheme, checked separately): orbax asks Google's storage client whether a gs:// bucket has a
# hierarchical namespace before it lists the checkpoint steps. (module, pip package)
EXTRA_MODULES: dict[str, tuple[tuple[str, str], ...]] = {
  "gs": (("google.cloud.storage", "google-cloud-storage"),),
}
_FSSPEC_PACKAGES = {"gs": "gcsfs"}
# The project's optional extra (pyproject.toml) that installs a scheme's packages, pinned.
SCHEME_EXTRAS = {"gs": "gcs"}
# The file of an uploaded directory written last: its presence marks the upload complete.
COMPLETION_MARKER = "config.json"


def is_primary_process() -> bool:
  """True on the process that writes the run's metrics, plots, config.json and exports
  (process 0 of a multi-controller run; the only process otherwise)."""
  return jax.process_index() == 0


# --------------------------------------------------------------------------------- path strings
def scheme(path: str | os.PathLike) -> str | None:
  """'gs' for 'gs://bucket/x'; None for a local path (Windows drive letters included)."""
  head, sep, _ = os.fspath(path).partition("://")
  if sep and len(head) > 1 and head.replace("+", "").replace("-", "").replace(".", "").isalnum():
    return head.lower()
  return None


def is_remote(path: str | os.PathLike) -> bool:
  """Whether `path` is a URL (gs://...) rather than a local path."""
  return scheme(path) is not None


def resolve(path: str | os.PathLike) -> str:
  """The canonical string of `path`: a URL as given (no trailing slash), a local path absolute
  with ~ expanded. Never `os.path.abspath` a URL: it would make 'gs://b/x' a local 'gs:/b/x'."""
  path = os.fspath(path)
  if is_remote(path):
    head, _, rest = path.partition("://")
    return f"{head}://{rest.rstrip('/')}"
  return os.path.abspath(os.path.expanduser(path))


def join(base: str | os.PathLike, *parts: str) -> str:
  """`base`/`parts...` for a URL or a local path."""
  base = os.fspath(base)
  if is_remote(base):
    pieces = [base.rstrip("/")] + [p.strip("/") for p in parts if p]
    return "/".join(pieces)
  return os.path.join(base, *parts)


def _epath(path: str | os.PathLike) -> epath.Path:
  return epath.Path(os.fspath(path))


def check_remote_workdir(path: str | os.PathLike, what: str = "workdir") -> None:
  """Refuses a remote path a run cannot write to, before anything is written: a scheme other
  than gs:// (`UnsupportedPathError`), or a missing package (gcsfs, google-cloud-storage:
  `MissingExtraError`, naming the project's extra that installs them). A local path passes."""
  name = scheme(path)
  if name is None:
    return
  if name not in SUPPORTED_SCHEMES:
    raise UnsupportedPathError(
      f"{what}={os.fspath(path)!r}: remote {name}:// paths are not supported (orbax writes "
      f"checkpoint arrays through TensorStore with a remote driver for "
      f"{', '.join(s + '://' for s in SUPPORTED_SCHEMES)} only). Fix: use a gs:// path, a local "
      "path, or a mounted bucket (a local path)."
    )
  import fsspec

  try:
    fsspec.get_filesystem_class(name)
  except (ImportError, ValueError) as e:
    package = _FSSPEC_PACKAGES.get(name, f"the fsspec filesystem for {name}://")
    raise MissingExtraError(
      f"{what}={os.fspath(path)!r} needs {package}, which is not installed ({e}). "
      f"Fix: {_extra_fix(name)}."
    ) from None
  for module, package in EXTRA_MODULES.get(name, ()):
    if not _module_exists(module):
      raise MissingExtraError(
        f"{what}={os.fspath(path)!r} needs {package} (orbax uses it for {name}:// checkpoint "
        f"directories), which is not installed. Fix: {_extra_fix(name)}."
      )


def _extra_fix(name: str) -> str:
  extra = SCHEME_EXTRAS[name]
  return f"{install_extra_hint(extra)}, the {extra} extra: its pinned packages for {name}:// paths"


class UnsupportedPathError(UserError, ValueError):
  """A remote path whose scheme a run cannot write to."""

  heading = "Unsupported path"


class UnwritableFolderError(UserError, PermissionError):
  """A local folder a command must write into (a workdir, checkpoint.dir) that it cannot."""

  heading = "Cannot write"


def check_writable_folder(path: str | os.PathLike, what: str = "workdir") -> None:
  """Refuses, before anything is written or compiled, a folder a command could not write into: a
  remote one whose packages are missing (`check_remote_workdir`), or a local one that is a file,
  lies under a file, or whose nearest existing folder (itself, else the parent it would be made
  in) takes no new file (read-only mount, missing rights). Nothing is left behind: the probe is an
  unnamed temporary file."""
  if is_remote(path):
    check_remote_workdir(path, what)
    return
  folder = resolve(path)
  probe = folder
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    raise UnwritableFolderError(
      f"{what}={os.fspath(path)!r}: {probe} is a file, not a folder. Fix: point {what} at a "
      "folder (a new one, or one that exists), not at a file or a path under one."
    )
  try:
    with tempfile.TemporaryFile(dir=probe):
      pass
  except OSError as e:
    made = "" if probe == folder else f" (it would be made in {probe})"
    raise UnwritableFolderError(
      f"{what}={os.fspath(path)!r}{made}: cannot write there ({e.strerror or e}). Fix: pass a "
      "folder on a writable disk that you may write to, or fix the folder's rights."
    ) from e


def _module_exists(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:
    return False


# --------------------------------------------------------------------------------- queries
def exists(path: str | os.PathLike) -> bool:
  if not is_remote(path):
    return os.path.exists(path)
  return _epath(path).exists()


def isdir(path: str | os.PathLike) -> bool:
  if not is_remote(path):
    return os.path.isdir(path)
  return _epath(path).is_dir()


def isfile(path: str | os.PathLike) -> bool:
  if not is_remote(path):
    return os.path.isfile(path)
  p = _epath(path)
  return p.exists() and not p.is_dir()


def listdir(path: str | os.PathLike) -> list[str]:
  """The names in directory `path`, sorted ([] when it does not exist)."""
  if not is_remote(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else []
  p = _epath(path)
  return sorted(child.name for child in p.iterdir()) if p.is_dir() else []


def getmtime(path: str | os.PathLike) -> float:
  """The modification time of file `path` (seconds since the epoch)."""
  if not is_remote(path):
    return os.path.getmtime(path)
  return float(_epath(path).stat().mtime)


def walk_dirs(root: str | os.PathLike) -> Iterator[tuple[str, list[str]]]:
  """(directory, its subdirectory names) for `root` and every directory below it, top down; as
  with `os.walk`, removing names from the list skips those subdirectories."""
  root = os.fspath(root)
  if not is_remote(root):
    for dirpath, dirnames, _ in os.walk(root):
      yield dirpath, dirnames
    return
  if not isdir(root):
    return
  subdirs = sorted(child.name for child in _epath(root).iterdir() if child.is_dir())
  yield root, subdirs
  for name in subdirs:
    yield from walk_dirs(join(root, name))


# --------------------------------------------------------------------------------- reading
def open_file(path: str | os.PathLike, mode: str = "r") -> IO:
  """`open` for a local path or a URL (modes r, w, rb, wb; use `append_text` to append, which
  object stores cannot do in place)."""
  if not is_remote(path):
    return open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"}))
  if "a" in mode or "+" in mode:
    raise ValueError(f"open_file({path!r}, {mode!r}): remote files open for r / w only.")
  return _epath(path).open(mode)


def read_text(path: str | os.PathLike) -> str:
  with open_file(path, "rb") as f:
    return f.read().decode("utf-8")


@contextlib.contextmanager
def local_copy(path: str | os.PathLike) -> Iterator[str]:
  """A local path holding `path` (a file or a directory tree): `path` itself when local, else a
  temporary download, removed when the block ends."""
  if not is_remote(path):
    yield os.fspath(path)
    return
  with tempfile.TemporaryDirectory(prefix="sdar_jax-download-") as tmp:
    local = os.path.join(tmp, _epath(path).name or "download")
    if isdir(path):
      _download_tree(_epath(path), local)
    else:
      with open_file(path, "rb") as src, open(local, "wb") as dst:
        shutil.copyfileobj(src, dst)
    yield local


def _download_tree(src: epath.Path, local: str) -> None:
  os.makedirs(local, exist_ok=True)
  for child in src.iterdir():
    target = os.path.join(local, child.name)
    if child.is_dir():
      _download_tree(child, target)
    else:
      with child.open("rb") as f, open(target, "wb") as out:
        shutil.copyfileobj(f, out)


# --------------------------------------------------------------------------------- writing
def makedirs(path: str | os.PathLike) -> None:
  """Creates directory `path` and its parents (no error when it exists)."""
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)
  else:
    _epath(path).mkdir(parents=True, exist_ok=True)


def _parent(path: str) -> str:
  return path.rsplit("/", 1)[0] if is_remote(path) else os.path.dirname(path)


def write_text(path: str | os.PathLike, text: str) -> None:
  """Writes `text` to `path` (parent folders made) so that a reader sees the old content or the
  new, never a part: a temporary file renamed into place locally, one object write remotely."""
  path = os.fspath(path)
  if _parent(path):
    makedirs(_parent(path))
  if is_remote(path):
    with _epath(path).open("wb") as f:
      f.write(text.encode("utf-8"))
    return
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def append_text(path: str | os.PathLike, text: str) -> None:
  """Appends `text` to `path` (created with its parents when missing). Remotely the object is
  rewritten with the new text at its end (object stores cannot append)."""
  path = os.fspath(path)
  if not is_remote(path):
    if _parent(path):
      makedirs(_parent(path))
    with open(path, "a", encoding="utf-8") as f:
      f.write(text)
    return
  old = read_text(path) if exists(path) else ""
  write_text(path, old + text)


def copy_file(src: str | os.PathLike, dst: str | os.PathLike) -> None:
  """Copies one file between any two places (local or remote; parent folders made)."""
  dst = os.fspath(dst)
  if _parent(dst):
    makedirs(_parent(dst))
  if not is_remote(src) and not is_remote(dst):
    shutil.copyfile(src, dst)
    return
  with open_file(src, "rb") as f, open_file(dst, "wb") as out:
    shutil.copyfileobj(f, out)


def remove(path: str | os.PathLike) -> None:
  """Deletes file `path` (no error when it does not exist)."""
  if not is_remote(path):
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)
  else:
    _epath(path).unlink(missing_ok=True)


def rmtree(path: str | os.PathLike) -> None:
  """Deletes directory `path` and everything under it (no error when it does not exist)."""
  if not is_remote(path):
    shutil.rmtree(path, ignore_errors=True)
  elif exists(path):
    _epath(path).rmtree()


def upload_tree(local_dir: str | os.PathLike, dst: str | os.PathLike) -> None:
  """Copies the local folder `local_dir` to `dst` (replacing what was there), the top-level
  config.json last so that its presence means the copy is complete."""
  dst = os.fspath(dst)
  rmtree(dst)
  files = []
  for root, _, names in os.walk(local_dir):
    for name in names:
      files.append(os.path.relpath(os.path.join(root, name), local_dir))
  files.sort(key=lambda rel: (rel == COMPLETION_MARKER, rel))
  makedirs(dst)
  for rel in files:
    copy_file(os.path.join(local_dir, rel), join(dst, *rel.split(os.sep)))


@contextlib.contextmanager
def staged_output(path: str | os.PathLike) -> Iterator[str]:
  """A local path to write `path` through, for writers that only know local files (savefig,
  save_pretrained): `path` itself when local (its parent made); else a path in a temporary folder
  whose file or directory tree is copied to `path` when the block ends without an error."""
  path = os.fspath(path)
  if not is_remote(path):
    makedirs(os.path.dirname(os.path.abspath(path)))
    yield path
    return
  with tempfile.TemporaryDirectory(prefix="sdar_jax-upload-") as tmp:
    local = os.path.join(tmp, path.rstrip("/").rsplit("/", 1)[-1])
    yield local
    if os.path.isdir(local):
      upload_tree(local, path)
    elif os.path.exists(local):
      copy_file(local, path)


class LocalMirror:
  """A local folder mirrored to `directory`, for writers that keep files open and append to them
  (TensorBoard's event files): `local` is `directory` itself when local, else a temporary folder
  whose new or grown files `sync()` copies up; `close()` syncs and removes the temporary folder."""

  def __init__(self, directory: str | os.PathLike):
    self.directory = os.fspath(directory)
    self.remote = is_remote(self.directory)
    self._tmp = tempfile.mkdtemp(prefix="sdar_jax-mirror-") if self.remote else None
    self.local = self._tmp or self.directory
    self._synced: dict[str, tuple[int, int]] = {}

  def sync(self) -> None:
    """Copies every file of `local` that changed since the last sync to `directory`."""
    if not self.remote:
      return
    for root, _, names in os.walk(self.local):
      for name in names:
        full = os.path.join(root, name)
        stat = os.stat(full)
        signature = (stat.st_size, stat.st_mtime_ns)
        if self._synced.get(full) != signature:
          rel = os.path.relpath(full, self.local)
          copy_file(full, join(self.directory, *rel.split(os.sep)))
          self._synced[full] = signature

  def close(self) -> None:
    if self._tmp is None:
      return
    try:
      self.sync()
    finally:
      shutil.rmtree(self._tmp, ignore_errors=True)
      self._tmp = None
