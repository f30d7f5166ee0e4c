"""Errors the user can fix, and the one place a command turns them into a message.

A `UserError`'s message names what is wrong (the file or the config key), the bad value and the
fix. The commands (`python -m sdar_jax.train`, `.evaluate`, `.aot`, `.compare`, the tools) run
their `main` through `exit_on_user_error`: such an error prints one message on stderr (headed by
the class's `heading`, e.g. "Invalid config: ...") and exits with status 2; its traceback is shown
only with `--verbosity=1` or more (absl's flag; the argparse commands take the same flag). Any
other exception is a bug and keeps its traceback.

The environments (envs/, which imports nothing of sdar_jax) have their own base,
`envs.errors.EnvInputError`; a command passes it in `extra_types`.
"""

from __future__ import annotations

import errno
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

EXIT_USER_ERROR = 2

# OS errors that are the user's to fix (space, permissions, a read-only mount), not bugs.
_USER_ERRNOS = {
  errno.ENOSPC: "the disk is full: free space on it or point --workdir elsewhere",
  errno.EDQUOT: "the disk quota is exhausted: free space or point --workdir elsewhere",
  errno.EACCES: "permission denied: fix the rights of that file or folder, or use one you may "
  "access (--workdir for the run's outputs)",
  errno.EPERM: "operation not permitted: fix the rights of that file or folder, or use one you "
  "may access (--workdir for the run's outputs)",
  errno.EROFS: "the file system is read-only: point --workdir at a writable folder",
}


class UserError(Exception):
  """A bad input the user can fix. The message names the file or key, the value and the fix."""

  heading = "error"  # what the printed message starts with


class MissingExtraError(UserError, ImportError):
  """A feature the run asks for needs an optional extra of the project that is not installed."""

  heading = "Missing package"


def install_extra_hint(extra: str) -> str:
  """How to install the project's optional extra `extra` (its pinned packages, pyproject.toml)."""
  return f'pip install -e ".[{extra}]" (from the project\'s folder)'


def argv_verbosity(argv: Sequence[str] | None = None) -> int:
  """The value of `--verbosity=N` / `-v N` in `argv` (default sys.argv), 0 when absent."""
  args = list(sys.argv if argv is None else argv)
  level = 0
  for i, arg in enumerate(args):
    value = None
    for name in ("--verbosity", "-verbosity", "-v"):
      if arg.startswith(name + "="):
        value = arg.split("=", 1)[1]
      elif arg == name and i + 1 < len(args):
        value = args[i + 1]
    if value is not None:
      try:
        level = int(value)
      except ValueError:
        pass
  return level


def add_verbosity_argument(parser: Any) -> None:
  """Gives an argparse command the `--verbosity` flag the absl commands have (1: the traceback of
  a user error too)."""
  parser.add_argument(
    "--verbosity", type=int, default=0, help="1 or more: also print a user error's traceback"
  )


def user_error_message(err: BaseException) -> str | None:
  """The one-block message for `err` when it is the user's to fix (a `UserError`, or an
  `OSError` from a full disk, missing permissions or a read-only mount); None for a bug."""
  if isinstance(err, OSError) and not isinstance(err, UserError) and err.errno in _USER_ERRNOS:
    where = f" ({err.filename})" if err.filename else ""
    return f"error: {err.strerror or err}{where}: {_USER_ERRNOS[err.errno]}."
  text = str(err)
  return f"{getattr(err, 'heading', 'error')}:{'' if text.startswith(chr(10)) else ' '}{text}"


def exit_on_user_error(
  main: Callable[..., Any] | None = None,
  *,
  extra_types: Sequence[type[BaseException]] = (),
  verbosity: Callable[[], int] | None = None,
) -> Callable[..., Any]:
  """`main` wrapped: a user error (a `UserError`, one of `extra_types`, or an `OSError` of the
  kinds above, raised anywhere below) prints its message to stderr and exits with status 2. With
  `verbosity() >= 1` (by default absl's `--verbosity` once parsed, else `--verbosity` in
  sys.argv) the traceback is printed first. Also a decorator: `@exit_on_user_error` or
  `@exit_on_user_error(extra_types=(...))`."""
  if main is None:
    return functools.partial(exit_on_user_error, extra_types=extra_types, verbosity=verbosity)
  types = (UserError, OSError, *extra_types)

  def current_verbosity() -> int:
    if verbosity is not None:
      return verbosity()
    try:
      from absl import flags

      if flags.FLAGS.is_parsed():
        return int(flags.FLAGS.verbosity)
    except Exception:  # noqa: BLE001 - absl missing or not set up: read the command line
      pass
    return argv_verbosity()

  @functools.wraps(main)
  def wrapped(*args: Any, **kwargs: Any) -> Any:
    try:
      return main(*args, **kwargs)
    except types as err:
      if isinstance(err, OSError) and not isinstance(err, (UserError, *extra_types)):
        if err.errno not in _USER_ERRNOS:
          raise
      if current_verbosity() >= 1:
        import traceback

        traceback.print_exc()
      print(user_error_message(err), file=sys.stderr, flush=True)
      sys.exit(EXIT_USER_ERROR)

  return wrapped
