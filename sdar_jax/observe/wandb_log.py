"""Weights & Biases: a run's metric rows and gate histograms, with its config, in one W&B run.

On with `logging.wandb=True` (keys `logging.wandb_*` in configs/common.py). The `wandb` package is
an optional extra (`pip install -e '.[wandb]'`): it is imported only when the option is on, and
`require` turns its absence into a `WandbNotInstalledError` before anything is built.

`WandbRun.start` opens the W&B run with the run config as its W&B config. Its id is kept in
`<workdir>/wandb_run_id` (written before the W&B run starts), and every later start on the same
workdir passes that id with resume="allow": a resumed training run continues the same W&B run.
Every row `sdar_jax.observe.metrics.MetricsLogger` writes goes to W&B as logged, its "step" the
x-axis of every metric (`define_metric`), so the iterations a resumed run plays again (after a kill
between a row and its checkpoint) show as a second point at the same step, not as an error. Only
the primary process starts a W&B run (the caller's choice: `sdar_jax.run.trainer`).
"""

from __future__ import annotations

import os
import secrets
import string
from collections.abc import Mapping, Sequence
from typing import Any

from sdar_jax.infra import paths
from sdar_jax.infra.errors import UserError

RUN_ID_FILE = "wandb_run_id"
PINNED = "wandb==0.31.0"  # what the extra installs (pyproject.toml, requirements-dev.txt)
MODES = ("online", "offline", "disabled")
_MAX_TAG_LEN = 64  # W&B refuses longer tags


class WandbNotInstalledError(UserError):
  """logging.wandb=True where the `wandb` package cannot be imported."""


class WandbStartError(UserError):
  """wandb.init failed (not logged in, no network, a bad entity or project)."""


def import_wandb():
  """The `wandb` module, or a WandbNotInstalledError naming the key and the fix."""
  try:
    import wandb
  except ImportError as e:
    raise WandbNotInstalledError(
      f"logging.wandb=True but the wandb package cannot be imported ({e}). Fix: install the "
      f"extra, pip install -e '.[wandb]' (or pip install {PINNED}), or set "
      "--config.logging.wandb=False"
    ) from None
  return wandb


def require(logging_config: Any) -> None:
  """Raises WandbNotInstalledError when `logging_config.wandb` is on and wandb is missing."""
  if logging_config.get("wandb", False):
    import_wandb()


def wandb_tags(raw: str) -> list[str]:
  """`logging.wandb_tags` ("sdar,beta5") as W&B's list of tags."""
  return [t.strip() for t in str(raw or "").split(",") if t.strip()]


def setting_problems(logging_config: Any) -> list[str]:
  """The logging.wandb_* settings that cannot work, one "<key>=<value>: <problem>. Fix: <fix>"
  line each."""
  c = logging_config
  problems = []
  if not isinstance(c.get("wandb", False), bool):
    return [f"logging.wandb={c.get('wandb')!r}: must be True or False. Fix: use one of them"]
  if not c.get("wandb", False):
    return problems
  for key in ("wandb_project", "wandb_entity", "wandb_name"):
    value = c.get(key)
    if value is None and key != "wandb_project":
      continue
    if not isinstance(value, str) or not value.strip() or "/" in value:
      problems.append(
        f"logging.{key}={value!r}: must be a non-empty name without '/'. Fix: set "
        f"--config.logging.{key}=<name>" + ("" if key == "wandb_project" else ", or leave it unset")
      )
  raw = c.get("wandb_tags", "")
  if not isinstance(raw, str):
    problems.append(
      f"logging.wandb_tags={raw!r}: must be comma-separated tags in one string (a tuple would "
      "not survive the checkpoint's JSON). Fix: e.g. --config.logging.wandb_tags=sdar,alfworld"
    )
  else:
    tags = raw.split(",") if raw.strip() else []
    bad = [t for t in tags if not t.strip() or len(t.strip()) > _MAX_TAG_LEN]
    if bad:
      problems.append(
        f"logging.wandb_tags={tags!r}: {bad!r} not non-empty strings of at most {_MAX_TAG_LEN} "
        "characters. Fix: shorten or drop them"
      )
  mode = c.get("wandb_mode")
  if mode is not None and mode not in MODES:
    problems.append(
      f"logging.wandb_mode={mode!r}: unknown mode. Fix: use one of {list(MODES)}, or leave it "
      "unset (W&B's own default: WANDB_MODE, else online)"
    )
  return problems


def _new_id() -> str:
  alphabet = string.ascii_lowercase + string.digits  # W&B's own id alphabet
  return "".join(secrets.choice(alphabet) for _ in range(8))


def kept_run_id(workdir: str) -> str | None:
  """The W&B run id a previous start on `workdir` kept, or None."""
  path = paths.join(workdir, RUN_ID_FILE)
  if not paths.exists(path):
    return None
  return paths.read_text(path).strip() or None


class WandbRun:
  """One W&B run: `log` a metrics row, `log_histogram`, `finish` (idempotent)."""

  def __init__(self, run: Any, wandb_module: Any):
    self.run = run
    self._wandb = wandb_module
    self.id: str = run.id

  @classmethod
  def start(cls, logging_config: Any, run_config: Mapping[str, Any], workdir: str) -> WandbRun:
    """Opens (or resumes) the W&B run of `workdir` with `run_config` as its config. W&B's local
    files go to $WANDB_DIR, else to `<workdir>/wandb` for a local workdir."""
    wandb = import_wandb()
    c = logging_config
    run_id = kept_run_id(workdir)
    if run_id is None:
      run_id = _new_id()
      paths.write_text(paths.join(workdir, RUN_ID_FILE), run_id + "\n")
    local_dir = None
    if not os.environ.get("WANDB_DIR") and not paths.is_remote(workdir):
      local_dir = workdir
    try:
      run = wandb.init(
        project=c.get("wandb_project") or "sdar-jax",
        entity=c.get("wandb_entity"),
        name=c.get("wandb_name") or os.path.basename(workdir.rstrip("/")),
        tags=wandb_tags(c.get("wandb_tags", "")),
        mode=c.get("wandb_mode"),
        config=dict(run_config),
        id=run_id,
        resume="allow",
        dir=local_dir,
      )
    except Exception as e:  # noqa: BLE001 - wandb raises its own types for each cause
      raise WandbStartError(
        f"logging.wandb=True: W&B could not start run {run_id} ({type(e).__name__}: {e}). Fix: "
        "log in (wandb login, or set WANDB_API_KEY), check logging.wandb_entity and "
        "logging.wandb_project, or run without network with --config.logging.wandb_mode=offline "
        "(wandb sync uploads it later), or set --config.logging.wandb=False"
      ) from e
    run.define_metric("step")
    run.define_metric("*", step_metric="step")
    return cls(run, wandb)

  def log(self, row: Mapping[str, float]) -> None:
    """One metrics row, {"step": k, "<name>": value, ...} (as metrics.jsonl holds it)."""
    self.run.log(dict(row))

  def log_histogram(
    self, name: str, step: int, bucket_limits: Sequence[float], bucket_counts: Sequence[float]
  ) -> None:
    """A histogram in TensorBoard's raw form (`Histogram.tensorboard_fields`: an under-range
    bucket, one per bin, an over-range bucket, each limit the bucket's right edge): W&B gets the
    bins within range."""
    edges = list(bucket_limits[:-1])
    counts = list(bucket_counts[1:-1])
    if len(edges) != len(counts) + 1 or len(counts) > self._wandb.Histogram.MAX_LENGTH:
      return
    self.run.log({"step": int(step), name: self._wandb.Histogram(np_histogram=(counts, edges))})

  def finish(self, exit_code: int = 0) -> None:
    if self.run is not None:
      self.run.finish(exit_code=exit_code)
      self.run = None
