"""The environments' user-error base: a game, data or corpus file that cannot be used, or a
retrieval server that cannot be reached. The message names the file (or URL), what is wrong and
the fix. envs/ imports nothing of sdar_jax, so this is its own base; the commands treat it as a
user error (`sdar_jax.infra.errors.exit_on_user_error(..., extra_types=(EnvInputError,))`), and
the environments' own commands (`python -m envs.datasets`, the generators) run their `main`
through `exit_on_env_error`: one message on stderr and exit status 2, the traceback only with
`--verbosity=1`."""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
from collections.abc import Callable
from typing import Any

EXIT_USER_ERROR = 2
# OS errors that are the user's to fix: a full disk, missing rights, a read-only mount.
_USER_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)


class EnvInputError(ValueError):
  """A bad environment input (file, folder, URL) that the user can fix."""


def add_verbosity_argument(parser: Any) -> None:
  """An argparse `--verbosity` flag (1 or more: a user error's traceback too)."""
  parser.add_argument(
    "--verbosity", type=int, default=0, help="1 or more: also print a user error's traceback"
  )


def _argv_verbosity() -> int:
  for i, arg in enumerate(sys.argv):
    value = arg.split("=", 1)[1] if arg.startswith("--verbosity=") else None
    if arg == "--verbosity" and i + 1 < len(sys.argv):
      value = sys.argv[i + 1]
    if value is not None and value.lstrip("-").isdigit():
      return int(value)
  return 0


def exit_on_env_error(main: Callable[..., Any]) -> Callable[..., Any]:
  """`main` wrapped: an `EnvInputError`, or an `OSError` from a full disk, missing rights or a
  read-only mount, prints one message and exits with status 2 (with `--verbosity=1` or more in
  sys.argv, after its traceback); anything else keeps its traceback."""

  @functools.wraps(main)
  def wrapped(*args: Any, **kwargs: Any) -> Any:
    try:
      return main(*args, **kwargs)
    except (EnvInputError, OSError) as err:
      if not isinstance(err, EnvInputError) and err.errno not in _USER_ERRNOS:
        raise
      if _argv_verbosity() >= 1:
        import traceback

        traceback.print_exc()
      if isinstance(err, EnvInputError):
        print(f"error: {err}", file=sys.stderr, flush=True)
      else:
        where = f" ({err.filename})" if err.filename else ""
        print(
          f"error: {err.strerror or err}{where}: free space, fix the folder's rights, or "
          "write elsewhere (--out).",
          file=sys.stderr,
          flush=True,
        )
      sys.exit(EXIT_USER_ERROR)

  return wrapped


class EnvFileNotFoundError(EnvInputError, FileNotFoundError):
  """A data, game, corpus or skills file (or folder) the settings name that is not there."""


def read_json_file(path: str, what: str, error: type[EnvInputError], fix: str) -> Any:
  """The JSON content of `path`; a file that is not UTF-8 JSON raises `error`, whose message
  names `what` ("ALFWorld game file"), the path, where parsing stopped, the file's size and `fix`
  (a truncated download or an interrupted write is the usual cause)."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as err:
    raise error(
      f"{what} {path!r} is not valid JSON ({err.msg}: line {err.lineno}, column {err.colno}; "
      f"the file has {os.path.getsize(path)} bytes). {fix}"
    ) from None
  except UnicodeDecodeError as err:
    raise error(f"{what} {path!r} is not UTF-8 text ({err}). {fix}") from None
