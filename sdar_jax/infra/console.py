"""What goes to the terminal: progress bars only when stderr is one.

tqdm redraws a bar with carriage returns; written to a log file (a cluster job's output, `make
demo > log`), every redraw becomes a frame in the file. Bars are therefore drawn only on a
terminal; a log gets the run's own one-line-per-iteration progress (sdar_jax.observe.progress)."""

from __future__ import annotations

import sys
from typing import TextIO


def show_progress_bars(wanted: bool = True, stream: TextIO | None = None) -> bool:
  """Whether to draw a progress bar: `wanted` and `stream` (default stderr) is a terminal."""
  stream = sys.stderr if stream is None else stream
  isatty = getattr(stream, "isatty", None)
  return bool(wanted and isatty is not None and isatty())
