"""Fast Downward's library without its debug sections, for the many private copies TextWorld makes.

TextWorld's `PddlEnv` calls `fast_downward.load_lib()`, which copies `libdownward.so` into a
temporary folder and loads the copy (the library keeps the game in global state, so every engine
needs a library of its own), then deletes the folder. The copy stays mapped, so its disk blocks
stay allocated until the process exits. The shipped library is 33.8 MB, of which 32.4 MB are DWARF
debug sections the loader never maps: an evaluation that plays 640 games at once (one engine each)
held 22 GB of deleted copies, and two such evaluations side by side filled this machine's disk
(2026-12-06: every `reset` of the second split then failed with ENOSPC).

`lean_copy` writes, once per library version, a copy cut to the bytes its program headers
reference (1.1 MB; the ELF header's section-header fields cleared, as `sstrip` does: the dynamic
loader reads program headers only) and `use_lean_library` points `fast_downward`'s loader at it.
The engine's code and data are byte for byte the shipped ones. A library that is not a
little-endian 64-bit ELF shared object, or a folder that cannot be written, keeps the shipped file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import tempfile
import threading

__all__ = ["lean_copy", "use_lean_library", "loaded_path"]

log = logging.getLogger(__name__)
_LOCK = threading.Lock()
_USED: list[str] = []  # the path fast_downward loads, once chosen in this process
_CACHE_ENV = "SDAR_DATA_CACHE"  # the generated games' cache root too (default ~/.cache/sdar_jax)


def _cache_dir() -> str:
  root = os.environ.get(_CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "sdar_jax")
  return os.path.join(root, "fast_downward")


def lean_copy(source: str, folder: str) -> str | None:
  """The path of `source` cut to its loadable bytes in `folder` (written if missing, named by the
  source's hash), or None when `source` is not a little-endian ELF64 shared object."""
  with open(source, "rb") as f:
    data = f.read()
  if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
    return None
  e_type = struct.unpack_from("<H", data, 0x10)[0]
  phoff = struct.unpack_from("<Q", data, 0x20)[0]
  phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
  if e_type != 3 or phnum == 0 or phentsize < 56:  # ET_DYN with program headers
    return None
  end = phoff + phentsize * phnum
  for i in range(phnum):
    _, _, offset, _, _, filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
    end = max(end, offset + filesz)
  if end > len(data):
    return None
  digest = hashlib.sha256(data).hexdigest()[:16]
  path = os.path.join(folder, f"libdownward-{digest}-lean.so")
  if os.path.isfile(path) and os.path.getsize(path) == end:
    return path
  lean = bytearray(data[:end])
  struct.pack_into("<Q", lean, 0x28, 0)  # e_shoff: no section header table
  struct.pack_into("<HHH", lean, 0x3A, 0, 0, 0)  # e_shentsize, e_shnum, e_shstrndx
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
  with os.fdopen(fd, "wb") as f:
    f.write(lean)
  os.chmod(tmp, 0o755)
  os.replace(tmp, path)  # atomic: concurrent workers write the same bytes
  return path


def use_lean_library(folder: str | None = None) -> str:
  """Points `fast_downward.load_lib` at the lean copy (once per process); returns the path it
  loads from now on (the shipped one when no lean copy can be made)."""
  with _LOCK:
    if _USED:
      return _USED[0]
    from fast_downward import interface

    shipped = interface.DOWNWARD_LIB_PATH
    try:
      path = lean_copy(shipped, folder or _cache_dir()) or shipped
    except OSError as e:  # e.g. a read-only home: the shipped library still works
      log.warning("Fast Downward's library stays the shipped %s (no lean copy: %s)", shipped, e)
      path = shipped
    interface.DOWNWARD_LIB_PATH = path
    _USED.append(path)
    return path


def loaded_path() -> str | None:
  """The library path `use_lean_library` chose in this process, if it ran."""
  return _USED[0] if _USED else None
