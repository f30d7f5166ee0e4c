"""Gate diagnostics: how the teacher-student gap and the SDAR gate are distributed, and which
tokens of a response the teacher endorses.

Two products, both written by the trainer without any setting (by the primary process only, into a
local or gs:// workdir: sdar_jax.infra.paths):

* Per-iteration histograms of the gap Δ = lT − lθ (teacher minus current student log-prob of each
  sampled response token) and of the gate g over the response tokens of the iteration's updates.
  The counts are taken inside the compiled update on fixed bins (`sdar_jax.core.histograms`: the
  update returns two small integer vectors, never the [B, R] token arrays), summed over
  micro-batches by the update and over mini-batches here (`record_update_histograms`), then written
  to `<workdir>/diagnostics/`: `histograms.jsonl` (one row of counts per iteration),
  `histograms_step_<N>.png` (when logging.plots is on: the iteration's two histograms, with every
  iteration so far as a heat map below them; `histograms.png` is a copy of the latest) and, when
  logging.tensorboard is on, TensorBoard histograms `diagnostics/gap` and `diagnostics/gate`. The
  share of tokens with Δ > 0 is the update's metric `sdar/positive_gap_share`
  (sdar_jax/core/train_step.py). Bins: Δ in [−8, 4] by 0.1 (`GAP_EDGES`), g in [0, 1] by 0.05
  (`GATE_EDGES`), plus one count below and one above the range. The gap is counted whenever the
  algorithm scores the teacher, the gate only when its loss has one (algo.distill="sdar"); plain
  GRPO (and Skill-GRPO) have neither.

* At each evaluation, a token view of one validation episode, `<workdir>/eval/step_<N>/tokens.html`
  (an evaluation-only run writes `tokens.html` into its own results directory): every response
  token shaded by its gate value (white 0 → green 1) with Δ, g and both log-probs on hover.
  The episode is the first won one of the first evaluation mode, else its first finished one.
  The teacher prompt of each turn is the one training builds (`AgentLoop` with a teacher: the
  privileged skill block before the student prompt as the student got it), recorded while the
  episode is played (`with_teacher_prompts`). Log-probs are scored at the evaluated parameters and
  algo.temperature, the gate is the run's algo.gate at algo.beta (`sdar_jax.algos.compute_gate`).
  Algorithms that do not score a teacher in training (grpo, skill_grpo) get the same view: the
  teacher is scored for this view only and the gate shown is the one the run's algo.gate / beta
  would give (for plain GRPO the preset's defaults: the gap gate at β = 5); the page says so.

Why one file of ~600 lines: the histograms (in-jit counts, host sums, PNG, TensorBoard) and the
token view (recording teacher prompts, scoring, HTML) are the one diagnostics feature the trainer
calls into twice.
"""

from __future__ import annotations

import codecs
import copy
import dataclasses
import html
import json
import logging
import math
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from sdar_jax import algos
from sdar_jax.core.batch import TurnSample, batch_bucket
from sdar_jax.core.histograms import HISTOGRAM_EDGES, METRIC_PREFIX
from sdar_jax.core.train_step import response_logprobs
from sdar_jax.infra import multihost, paths
from sdar_jax.observe.metrics import read_history
from sdar_jax.rollout.batching import pack_batch

log = logging.getLogger(__name__)

Array = jax.Array

DIAGNOSTICS_DIR = "diagnostics"
TOKEN_VIEW_FILE = "tokens.html"

# Token colour: white at gate 0, this green at gate 1, linear in between (each channel monotone).
GATE_LOW_RGB = (255, 255, 255)
GATE_HIGH_RGB = (46, 160, 67)


# ------------------------------------------------------------------------ histograms on the host
@dataclasses.dataclass
class Histogram:
  """Fixed-bin counts of one quantity over an iteration's response tokens."""

  name: str  # "gap" or "gate"
  edges: np.ndarray  # [n + 1]
  counts: np.ndarray  # [n] in-range bins
  below: int  # entries < edges[0]
  above: int  # entries > edges[-1]

  @classmethod
  def from_packed(cls, name: str, packed: Sequence[int], edges: np.ndarray) -> Histogram:
    """From `masked_histogram`'s layout [below, bins..., above]."""
    packed = np.asarray(packed, np.int64)
    if packed.shape != (len(edges) + 1,):
      raise ValueError(
        f"histogram {name!r}: {packed.shape[0]} counts for {len(edges)} edges; expected "
        f"{len(edges) + 1} ([below, {len(edges) - 1} bins, above], masked_histogram's layout)."
      )
    return cls(name, np.asarray(edges), packed[1:-1], int(packed[0]), int(packed[-1]))

  @property
  def total(self) -> int:
    return int(self.counts.sum()) + self.below + self.above

  def tensorboard_fields(self) -> dict[str, Any]:
    """`add_histogram_raw` arguments: one bucket per bin plus the two out-of-range buckets (the
    last bucket's limit is the largest float, TensorBoard's convention). min / max / sum /
    sum_squares come from the bins (bin centres; out-of-range counts at half a bin outside)."""
    width = float(self.edges[1] - self.edges[0])
    centres = np.concatenate(
      [
        [self.edges[0] - width / 2],
        (self.edges[:-1] + self.edges[1:]) / 2,
        [self.edges[-1] + width / 2],
      ]
    ).astype(np.float64)
    counts = np.concatenate([[self.below], self.counts, [self.above]]).astype(np.float64)
    limits = [float(e) for e in self.edges] + [float(np.finfo(np.float64).max)]
    filled = np.flatnonzero(counts)
    return {
      "min": float(centres[filled[0]] - width / 2),
      "max": float(centres[filled[-1]] + width / 2),
      "num": float(counts.sum()),
      "sum": float((counts * centres).sum()),
      "sum_squares": float((counts * centres**2).sum()),
      "bucket_limits": limits,
      "bucket_counts": [float(c) for c in counts],
    }


def pop_update_histograms(
  per_batch: Iterable[tuple[dict[str, Any], float]],
) -> dict[str, Histogram]:
  """Removes the histogram counts from each update's metrics (so only scalars remain) and returns
  their sums over the updates, by name ("gap", "gate")."""
  sums: dict[str, np.ndarray] = {}
  for metrics, _ in per_batch:
    for key in [k for k in metrics if k.startswith(METRIC_PREFIX)]:
      counts = np.asarray(metrics.pop(key), np.int64)
      name = key[len(METRIC_PREFIX) :].removesuffix("_counts")
      sums[name] = sums[name] + counts if name in sums else counts
  return {
    name: Histogram.from_packed(name, counts, HISTOGRAM_EDGES[name])
    for name, counts in sorted(sums.items())
  }


def record_update_histograms(
  per_batch: list[tuple[dict[str, Any], float]],
  step: int,
  workdir: str,
  logger=None,
  plots: bool = True,
) -> dict[str, Histogram]:
  """The trainer's hook after an iteration's updates (`per_batch`: each update's metrics as
  numpy, with its token weight). Takes the histogram counts out of the metrics, appends them to
  `<workdir>/diagnostics/histograms.jsonl`, sends them to TensorBoard through `logger`
  (a `MetricsLogger`; nothing without TensorBoard) and, with `plots`, draws
  `histograms_step_<step>.png` and `histograms.png`. Returns the histograms ({} for an algorithm
  without a teacher). Only the primary process writes (`sdar_jax.infra.paths`); `workdir` may be
  remote."""
  hists = pop_update_histograms(per_batch)
  if not hists or not paths.is_primary_process():
    return hists
  out_dir = paths.join(workdir, DIAGNOSTICS_DIR)
  row: dict[str, Any] = {"step": int(step)}
  for h in hists.values():
    row[h.name] = {
      "edges": [float(e) for e in h.edges],
      "counts": [int(c) for c in h.counts],
      "below": h.below,
      "above": h.above,
    }
  path = paths.join(out_dir, "histograms.jsonl")
  paths.append_text(path, json.dumps(row) + "\n")
  if logger is not None and hasattr(logger, "log_histogram"):
    for h in hists.values():
      if h.total:
        logger.log_histogram(f"diagnostics/{h.name}", step, **h.tensorboard_fields())
  if plots:
    try:
      png = paths.join(out_dir, f"histograms_step_{step}.png")
      with paths.staged_output(png) as local_png:
        plot_histograms(hists, step, local_png, history=read_histogram_rows(path, up_to_step=step))
        paths.copy_file(local_png, paths.join(out_dir, "histograms.png"))
    except Exception as e:  # noqa: BLE001 (a plot must never stop training)
      log.warning("could not draw the gate histograms of step %d: %s", step, e)
  return hists


def read_histogram_rows(path: str, up_to_step: int | None = None) -> list[dict[str, Any]]:
  """The rows of histograms.jsonl by step, up to `up_to_step` when given: read as a metrics.jsonl
  is (`sdar_jax.observe.metrics.read_history`), so a later row of a step, as a resumed run logs the
  iterations after its checkpoint again, overwrites the earlier one's histograms and torn lines
  are skipped."""
  rows = read_history(path)
  return [row for row in rows if up_to_step is None or int(row["step"]) <= up_to_step]


_TITLES = {"gap": "teacher - student gap (lT - lθ)", "gate": "gate g"}


def _pyplot():
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def plot_histograms(
  hists: Mapping[str, Histogram],
  step: int,
  out_path: str,
  history: Sequence[Mapping[str, Any]] = (),
) -> str:
  """One column per histogram: the iteration's share of response tokens per bin and, with
  `history` (histograms.jsonl rows), every iteration so far as a heat map below it (x: step,
  y: bin, colour: share of tokens). One figure, drawn once (stairs, no layout pass): it is
  drawn every iteration."""
  plt = _pyplot()
  rows = 2 if history else 1
  fig, axes = plt.subplots(rows, len(hists), figsize=(4.8 * len(hists), 3.0 * rows), squeeze=False)
  fig.subplots_adjust(left=0.08, right=0.97, bottom=0.1, top=0.9, hspace=0.55, wspace=0.3)
  for col, h in enumerate(hists.values()):
    ax = axes[0, col]
    total = max(h.total, 1)
    ax.stairs(h.counts / total, h.edges, fill=True, color="C0")
    note = f"{h.total} tokens"
    if h.name == "gap":
      ax.axvline(0.0, color="k", lw=0.8)
      positive = int(h.counts[h.edges[:-1] >= 0].sum()) + h.above
      note += f", gap >= 0: {positive / total:.1%}"
    if h.below or h.above:
      note += f"; {h.below} below {h.edges[0]:g}, {h.above} above {h.edges[-1]:g}"
    ax.set_title(f"{_TITLES.get(h.name, h.name)}, step {step}\n{note}", fontsize=9)
    ax.set_ylabel("share of tokens")
    ax.grid(alpha=0.3)
    have = [r for r in history if h.name in r]
    if have:
      ax = axes[1, col]
      shares = np.stack(
        [np.asarray(r[h.name]["counts"], float) / max(sum(r[h.name]["counts"]), 1) for r in have],
        1,
      )
      steps = [r["step"] for r in have]
      ax.imshow(
        shares,
        origin="lower",
        aspect="auto",
        cmap="viridis",
        interpolation="nearest",
        extent=(min(steps) - 0.5, max(steps) + 0.5, h.edges[0], h.edges[-1]),
      )
      ax.set_title(f"{_TITLES.get(h.name, h.name)}: share of tokens per step", fontsize=9)
      ax.set_xlabel("step")
  fig.savefig(out_path, dpi=100)
  plt.close(fig)
  return out_path


# ------------------------------------------------------------------------------- token view
def gate_colour(gate: float) -> str:
  """'#rrggbb' for a gate value: GATE_LOW_RGB at 0, GATE_HIGH_RGB at 1, linear in between
  (clipped to [0, 1]); '' for a value that is not finite."""
  if not math.isfinite(gate):
    return ""
  g = min(max(float(gate), 0.0), 1.0)
  rgb = [round(lo + g * (hi - lo)) for lo, hi in zip(GATE_LOW_RGB, GATE_HIGH_RGB)]
  return "#{:02x}{:02x}{:02x}".format(*rgb)


def token_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
  """The text each id adds, in order: the tokenizer's exact bytes per id through an incremental
  UTF-8 decoder, so a character split over several byte-level tokens shows on its last one."""
  table = tokenizer.all_token_bytes()
  decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
  pieces = [decoder.decode(table[i] if 0 <= i < len(table) else b"") for i in ids]
  if pieces:
    pieces[-1] += decoder.decode(b"", final=True)
  return pieces


@dataclasses.dataclass
class TurnScores:
  """One turn of the shown episode, scored token by token."""

  observation: str
  action: str
  valid: bool
  pieces: list[str]  # the text of each response token
  student_logp: np.ndarray  # [n]
  teacher_logp: np.ndarray | None  # [n]; None: no teacher prompt
  gate: np.ndarray | None  # [n]
  skill_block: str = ""  # the teacher's prompt before the student prompt (decoded)

  @property
  def gap(self) -> np.ndarray | None:
    return None if self.teacher_logp is None else self.teacher_logp - self.student_logp


def pick_episode(episodes: Sequence[Any]) -> Any | None:
  """The episode the token view shows: the first won one, else the first finished one with a
  response (None when every episode failed)."""
  finished = [
    ep for ep in episodes if ep.env_error is None and any(t.response_ids for t in ep.turns)
  ]
  won = [ep for ep in finished if ep.won]
  return (won or finished or [None])[0]


_SCORE_FNS: dict[Any, Any] = {}


def _score_fn(model_config):
  """The jitted `response_logprobs` of one model (compiled once per shape bucket)."""
  if model_config not in _SCORE_FNS:
    _SCORE_FNS[model_config] = jax.jit(
      lambda params, tokens, mask, response_len, temperature, with_entropy: response_logprobs(
        model_config, params, tokens, mask, response_len, temperature, with_entropy
      ),
      static_argnums=(3, 4, 5),
    )
  return _SCORE_FNS[model_config]


def score_turns(
  model_config,
  params,
  turns: Sequence[Any],
  algo,
  pad_id: int = 0,
  teacher_params=None,
) -> list[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]:
  """(student log-probs, teacher log-probs or None, gate or None) of each turn's response tokens
  under `params` (the teacher's under `teacher_params` when given: a frozen teacher), at
  algo.temperature, as the update scores them (`response_logprobs`); the gate is algo.gate at
  algo.beta (the student's entropy for the entropy gates)."""
  turns = [t for t in turns if t.response_ids]
  if not turns:
    return []
  with_teacher = all(t.teacher_prompt_ids is not None for t in turns)
  samples = [
    TurnSample(
      prompt_ids=list(t.prompt_ids),
      response_ids=list(t.response_ids),
      logprobs=[0.0] * len(t.response_ids),
      score=0.0,
      advantage=0.0,
      group_id=0,
      policy_version=0,
      valid=t.valid,
      teacher_prompt_ids=None if t.teacher_prompt_ids is None else list(t.teacher_prompt_ids),
    )
    for t in turns
  ]
  batch = pack_batch(samples, batch_bucket(len(samples)), with_teacher, pad_id)
  R = batch.response_len
  score = _score_fn(model_config)
  temperature = float(algo.temperature)
  student, entropy = score(params, batch.student_tokens, batch.student_mask, R, temperature, True)
  student, entropy = np.asarray(student), np.asarray(entropy)
  teacher = gate = None
  if with_teacher:
    teacher = np.asarray(
      score(
        params if teacher_params is None else teacher_params,
        batch.teacher_tokens,
        batch.teacher_mask,
        R,
        temperature,
        False,
      )[0]
    )
    gate = np.asarray(
      algos.compute_gate(
        algo.gate,
        beta=algo.beta,
        gap=teacher - student,
        entropy=entropy,
        vocab_size=model_config.vocab_size,
      )
    )
  out = []
  for i, t in enumerate(turns):
    n = len(t.response_ids)
    out.append(
      (
        student[i, :n],
        None if teacher is None else teacher[i, :n],
        None if gate is None else gate[i, :n],
      )
    )
  return out


def render_token_view(
  turns: Sequence[TurnScores],
  *,
  title: str,
  facts: Sequence[tuple[str, str]] = (),
  note: str = "",
) -> str:
  """A self-contained HTML page: each turn's observation, then its response tokens shaded by
  the gate (`gate_colour`) with gap, gate and log-probs in each token's title (hover); all text
  escaped."""
  esc = html.escape
  parts = [
    "<!DOCTYPE html>",
    '<html lang="en"><head><meta charset="utf-8">',
    f"<title>{esc(title)}</title>",
    "<style>",
    "body{font-family:sans-serif;margin:1.5em;max-width:70em}",
    ".obs{color:#555;white-space:pre-wrap;font-size:90%;margin:.3em 0}",
    ".resp{font-family:monospace;white-space:pre-wrap;line-height:1.7;padding:.4em;"
    + "border:1px solid #ddd}",
    ".resp span{border-right:1px solid #eee}",
    ".turn{margin:1em 0}",
    ".legend span{display:inline-block;width:3.2em;text-align:center;border:1px solid #ccc}",
    "table.facts td{padding:0 1em 0 0}",
    "</style></head><body>",
    f"<h2>{esc(title)}</h2>",
  ]
  if facts:
    parts.append('<table class="facts">')
    parts += [f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in facts]
    parts.append("</table>")
  if note:
    parts.append(f"<p>{esc(note)}</p>")
  legend = "".join(
    f'<span style="background:{gate_colour(g)}">{g:.2f}</span>' for g in np.linspace(0, 1, 6)
  )
  parts.append(f'<p class="legend">gate: {legend}</p>')
  skill_block = next((t.skill_block for t in turns if t.skill_block), "")
  if skill_block:
    parts.append(
      "<details><summary>the teacher's privileged block (before the student prompt, first "
      f"turn)</summary><pre>{esc(skill_block)}</pre></details>"
    )
  for k, turn in enumerate(turns):
    parts.append(f'<div class="turn"><b>turn {k + 1}</b>')
    parts.append(f'<div class="obs">{esc(turn.observation)}</div><div class="resp">')
    gap = turn.gap
    for i, piece in enumerate(turn.pieces):
      tip = f"student log p {turn.student_logp[i]:.3f}"
      style = ""
      if gap is not None:
        tip = (
          f"gap {gap[i]:+.3f}, gate {turn.gate[i]:.3f}, teacher log p "
          f"{turn.teacher_logp[i]:.3f}, {tip}"
        )
        colour = gate_colour(float(turn.gate[i]))
        style = f' style="background:{colour}"' if colour else ""
      parts.append(f'<span{style} title="{esc(tip, quote=True)}">{esc(piece)}</span>')
    validity = "valid" if turn.valid else "invalid format"
    parts.append(f"</div><div>action sent: <code>{esc(turn.action)}</code> ({validity})</div>")
    parts.append("</div>")
  parts.append("</body></html>")
  return "\n".join(parts) + "\n"


# ------------------------------------------------------------------ evaluation hooks
_TEACHER_LOOPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def with_teacher_prompts(loop, retriever):
  """`loop` (an evaluation `AgentLoop`) made to record each turn's teacher prompt as training
  builds it, with the loop's own skill retriever or else `retriever` (the run's; None and none of
  its own: `loop` unchanged, the view has no gate); sampling is unchanged (the same episodes are
  played). One copy per loop, reused."""
  if loop.with_teacher:
    return loop
  if loop not in _TEACHER_LOOPS:
    retriever = loop.retriever or retriever
    if retriever is None:
      return loop
    recording = copy.copy(loop)
    recording.with_teacher, recording.retriever = True, retriever
    _TEACHER_LOOPS[loop] = recording
  return _TEACHER_LOOPS[loop]


def token_view_candidates(episodes: Sequence[Any]) -> list[Any]:
  """Episodes among which `diagnostics.pick_episode` picks the one it would pick from every
  process's episodes (the first won one in process order, else the first finished one): each
  process's first won and first finished episode, in process order, whole. One process:
  `episodes`. A collective."""
  if jax.process_count() == 1:
    return list(episodes)
  won = pick_episode([ep for ep in episodes if ep.won])
  first = pick_episode(episodes)
  mine = [won] if won is not None else []
  if first is not None and first is not won:
    mine.append(first)
  return [ep for part in multihost.allgather(mine) for ep in part]


@dataclasses.dataclass(frozen=True)
class TokenViewSource:
  """What a token view is scored with: the evaluated policy and the run's algorithm."""

  model_config: Any
  params: Any  # the evaluated parameters
  algo: Any  # the run's AlgoConfig (its gate, beta, temperature, teacher_weights)
  tokenizer: Any
  pad_id: int
  initial_params: Any = None  # the frozen initial policy, when the run keeps one


def write_token_view(
  episodes: Sequence[Any], path: str, source: TokenViewSource, *, step: int, run: str
) -> str | None:
  """The hook after the first evaluation mode: scores the shown episode (`pick_episode`) with
  `source` and writes its token view to `path` (`<workdir>/eval/step_<N>/tokens.html`; an
  evaluation-only run: `<workdir>/tokens.html`). `step` and `run` (the workdir) are printed on the
  page. Returns the path (None when no episode finished). Never raises: a failure is logged and
  the evaluation goes on."""
  try:
    return _write_token_view(episodes, path, source, step, run)
  except Exception as e:  # a diagnostic must never stop training (logged with its traceback)
    log.warning("token view not written: %s: %s", type(e).__name__, e, exc_info=True)
    return None


def _write_token_view(
  episodes: Sequence[Any], path: str, source: TokenViewSource, step: int, run: str
) -> str | None:
  episode = pick_episode(episodes)
  if episode is None:
    return None
  algo = source.algo
  turns = [t for t in episode.turns if t.response_ids]
  frozen_teacher = algo.teacher_weights == "initial" and source.initial_params is not None
  scores = score_turns(
    source.model_config,
    source.params,
    turns,
    algo,
    source.pad_id,
    teacher_params=source.initial_params if frozen_teacher else None,
  )
  tokenizer = source.tokenizer
  shown = []
  for turn, (student, teacher, gate) in zip(turns, scores):
    block = ""
    if turn.teacher_prompt_ids is not None:
      extra = len(turn.teacher_prompt_ids) - len(turn.prompt_ids)
      block = tokenizer.decode(turn.teacher_prompt_ids[:extra]) if extra > 0 else ""
    shown.append(
      TurnScores(
        observation=turn.observation,
        action=turn.action,
        valid=turn.valid,
        pieces=token_pieces(tokenizer, turn.response_ids),
        student_logp=student,
        teacher_logp=teacher,
        gate=gate,
        skill_block=block,
      )
    )
  facts = [
    ("run", run),
    ("step", str(step)),
    ("algorithm", f"{algo.name} (gate {algo.gate}, beta {algo.beta:g}, lambda {algo.lam:g})"),
    ("episode", f"validation task {episode.task_id} ({episode.task_type}): {episode.task}"),
    (
      "outcome",
      f"{'won' if episode.won else 'not won'}, reward {episode.reward:g}, "
      + f"{len(episode.turns)} turns",
    ),
  ]
  if any(t.teacher_logp is None for t in shown):
    note = "No teacher prompt (no skill retriever): tokens are not shaded."
  else:
    note = (
      "Each response token is shaded by the gate g (white 0, green 1); hover for the gap "
      "lT - lθ (teacher minus student log-prob of the token), g and both log-probs, scored at "
      f"this step's parameters and temperature {algo.temperature:g}."
    )
    if frozen_teacher:
      note += " The teacher runs on the frozen initial policy (algo.teacher_weights='initial')."
    elif algo.teacher_weights == "initial":  # an evaluation-only run keeps no initial policy
      note += (
        " Training ran this teacher on the frozen initial policy (algo.teacher_weights="
        "'initial'); this evaluation holds no copy of it, so here the teacher runs on the "
        "evaluated weights and g is not the gate training used."
      )
    if not algo.scores_teacher:
      note += (
        f" This algorithm ({algo.name}) does not score a teacher in training: the teacher is "
        f"scored for this view only, and g is what gate {algo.gate!r} at beta {algo.beta:g} "
        "would give."
      )
  page = render_token_view(shown, title=f"Token view, step {step}", facts=facts, note=note)
  if not paths.is_primary_process():  # every process scored the episode (collectives)
    return None
  paths.write_text(path, page)
  log.info("token view of validation task %d written to %s", episode.task_id, path)
  return path
