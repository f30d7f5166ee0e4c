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
  (an evaluation-only run writes `tokens.html` into its own results directory): the response
  tokens flow as the text the model wrote, each shaded by what drives the distillation term's
  gradient at its position in the run's algo.form, with the teacher's 3 most likely tokens and
  the scores on hover. The forms that weight the sampled token ("reference", "reverse_kl") shade
  it by its gate g (white 0 → green 1). The forms that sum over the teacher's distribution
  ("vocab", "topk": `algos.vocab_distill_term`) move every logit at a position, by
  −∇_z ℓ = w − W·pθ with w_v = pT(v)·g_v the gated teacher weights and W = Σ_v w_v; their shade
  is the size of that move, ½‖w − W·pθ‖₁ (the probability mass the term shifts there, in
  [0, W] ⊂ [0, 1]; `vocab_drive`), green where it raises the sampled token and red where it
  lowers it (the teacher's weight lies on other tokens), and the hover names the teacher's
  weight on the sampled token against the token it weights most.
  The episode is the first won one of the first evaluation mode, else its first finished one.
  The teacher prompt of each turn is the one training builds (`AgentLoop` with a teacher: the
  privileged skill block before the student prompt as the student got it), recorded while the
  episode is played (`with_teacher_prompts`). Log-probs are scored at the evaluated parameters and
  algo.temperature, the gate is the run's algo.gate at algo.beta (`sdar_jax.algos.compute_gate`),
  in one compiled pass over both branches' response positions (`score_turns`) that also takes the
  teacher's top 3 and, for "vocab" / "topk", the drive.
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
import jax.numpy as jnp
import numpy as np

from sdar_jax import algos
from sdar_jax.core.batch import TurnSample, batch_bucket
from sdar_jax.core.histograms import HISTOGRAM_EDGES, METRIC_PREFIX
from sdar_jax.core.train_step import response_hidden
from sdar_jax.infra import multihost, paths
from sdar_jax.models import logits_from_hidden
from sdar_jax.observe.metrics import read_history
from sdar_jax.rollout.batching import pack_batch

log = logging.getLogger(__name__)

Array = jax.Array

DIAGNOSTICS_DIR = "diagnostics"
TOKEN_VIEW_FILE = "tokens.html"

# Token colour: white at gate 0, this green at gate 1, linear in between (each channel monotone).
GATE_LOW_RGB = (255, 255, 255)
GATE_HIGH_RGB = (46, 160, 67)
# Forms "vocab" / "topk": white at drive 0, green (sampled token raised) or this red (lowered) at 1.
DRIVE_DOWN_RGB = (214, 55, 62)
VIEW_TOP = 3  # the teacher's most likely tokens listed on each token's hover
VIEW_CHUNK = 64  # response positions per lm_head pass of the view (bounds its [B, c, V] arrays)


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
  return _blend(gate, GATE_HIGH_RGB)


def drive_colour(drive: float, push: float) -> str:
  """'#rrggbb' for forms "vocab" / "topk": white at drive 0, linear to GATE_HIGH_RGB at 1 where
  the term raises the sampled token (`push` >= 0), to DRIVE_DOWN_RGB where it lowers it; '' for
  a value that is not finite."""
  if not math.isfinite(push):
    return ""
  return _blend(drive, GATE_HIGH_RGB if push >= 0 else DRIVE_DOWN_RGB)


def _blend(value: float, high: tuple[int, int, int]) -> str:
  if not math.isfinite(value):
    return ""
  v = min(max(float(value), 0.0), 1.0)
  rgb = [round(lo + v * (hi - lo)) for lo, hi in zip(GATE_LOW_RGB, high)]
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


def token_text(tokenizer, token_id: int) -> str:
  """One token's bytes on its own (a partial UTF-8 character shows as U+FFFD)."""
  table = tokenizer.all_token_bytes()
  return (table[token_id] if 0 <= token_id < len(table) else b"").decode("utf-8", "replace")


@dataclasses.dataclass
class Drive:
  """Forms "vocab" / "topk" at each response token of a turn (`vocab_drive`), all [n]."""

  drive: np.ndarray  # ½‖w − W·pθ‖₁: the probability mass the term moves at the position
  push: np.ndarray  # w_y − W·pθ(y): how much it raises (> 0) or lowers the sampled token y
  sampled_weight: np.ndarray  # w_y = pT(y)·g_y (0 outside the teacher's top k)
  total_weight: np.ndarray  # W = Σ_v w_v
  preferred: list[str]  # the text of the token the teacher weights most (argmax_v w_v)
  preferred_weight: np.ndarray  # its weight


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
  teacher_top: list[list[tuple[str, float]]] | None = None  # per token: the teacher's top 3
  drive: Drive | None = None  # forms "vocab" / "topk": what drives the gradient (the shade)

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


def vocab_drive(
  student_log_softmax: jax.typing.ArrayLike,
  teacher_log_softmax: jax.typing.ArrayLike,
  targets: jax.typing.ArrayLike,
  *,
  beta: float,
  gate: str,
  entropy: jax.typing.ArrayLike | None = None,
  vocab_size: int | None = None,
  top_k: int | None = None,
) -> dict[str, Array]:
  """What drives the gradient of SDAR's form "vocab" (`top_k` None: `algos.vocab_distill_term`)
  or "topk" (`algos.topk_distill_term`) at each position: [..., V] x 2 and sampled tokens [...]
  -> dict of [...] arrays.

  The term's gradient w.r.t. the student's (temperature-scaled) logits z is −w + W·pθ, with
  w_v = pT(v)·g_v (each entry gated by its own gap, 0 outside the teacher's top k) and W = Σ_v w_v;
  a descent step moves z along d = w − W·pθ (Σ_v d_v = 0). Returned: "drive" ½‖d‖₁ (the mass
  moved, in [0, W]), "push" d_y at the sampled token y, "sampled_weight" w_y, "total_weight" W,
  "preferred" argmax_v w_v and "preferred_weight" its w.
  """
  ls = jnp.asarray(student_log_softmax, jnp.float32)
  lt = jnp.asarray(teacher_log_softmax, jnp.float32)
  targets = jnp.asarray(targets, jnp.int32)
  if top_k is None:
    lt_k, ls_k, idx = lt, ls, None
  else:
    lt_k, idx = jax.lax.top_k(lt, min(int(top_k), lt.shape[-1]))
    ls_k = jnp.take_along_axis(ls, idx, axis=-1)
  if entropy is not None:
    entropy = jnp.asarray(entropy, jnp.float32)[..., None]
  g = algos.compute_gate(gate, beta=beta, gap=lt_k - ls_k, entropy=entropy, vocab_size=vocab_size)
  w = jnp.exp(lt_k) * g
  total = jnp.sum(w, axis=-1)
  p_k = jnp.exp(ls_k)
  drive = 0.5 * jnp.sum(jnp.abs(w - total[..., None] * p_k), axis=-1)
  if idx is None:
    w_y = jnp.take_along_axis(w, targets[..., None], axis=-1)[..., 0]
    best = jnp.argmax(w, axis=-1)
  else:  # the entries outside the top k have w = 0 and d_v = −W·pθ(v)
    drive = drive + 0.5 * total * jnp.maximum(1.0 - jnp.sum(p_k, axis=-1), 0.0)
    w_y = jnp.sum(jnp.where(idx == targets[..., None], w, 0.0), axis=-1)
    best = jnp.take_along_axis(idx, jnp.argmax(w, axis=-1)[..., None], axis=-1)[..., 0]
  p_y = jnp.exp(jnp.take_along_axis(ls, targets[..., None], axis=-1)[..., 0])
  return {
    "drive": drive,
    "push": w_y - total * p_y,
    "sampled_weight": w_y,
    "total_weight": total,
    "preferred": best,
    "preferred_weight": jnp.max(w, axis=-1),
  }


def _view_head(model_config, options, params, teacher_params, hidden, teacher_hidden, targets):
  """Per response position [B, c]: the student's log-prob and entropy and, with a teacher, the
  teacher's log-prob, its top VIEW_TOP (ids and probabilities) and the forms' drive; from each
  branch's [B, c, V] log-softmax at the temperature (what `response_logprobs` takes)."""
  temperature, form, top_k, gate, beta = options

  def log_softmax(p, h):
    z = logits_from_hidden(model_config, p, h)
    z = z if temperature == 1.0 else z / temperature
    return jax.nn.log_softmax(z, axis=-1), z

  ls, z = log_softmax(params, hidden)
  out = {
    "student": jnp.take_along_axis(ls, targets[..., None], axis=-1)[..., 0],
    "entropy": algos.entropy_from_logits(z),
  }
  if teacher_hidden is None:
    return out
  lt, _ = log_softmax(teacher_params, teacher_hidden)
  out["teacher"] = jnp.take_along_axis(lt, targets[..., None], axis=-1)[..., 0]
  top_lp, out["top_ids"] = jax.lax.top_k(lt, VIEW_TOP)
  out["top_probs"] = jnp.exp(top_lp)
  if form in algos.VOCAB_FORMS:
    drive = vocab_drive(
      ls,
      lt,
      targets,
      beta=beta,
      gate=gate,
      entropy=out["entropy"],
      vocab_size=model_config.vocab_size,
      top_k=top_k if form == "topk" else None,
    )
    out.update({f"drive/{k}": v for k, v in drive.items()})
  return out


_SCORE_FNS: dict[Any, Any] = {}


def _score_fn(model_config, options: tuple, with_teacher: bool):
  """The view's jitted scoring of one model, options and branch set (compiled once per shape
  bucket): both branches' hidden states, then `_view_head` over chunks of VIEW_CHUNK response
  positions (so only one chunk's [B, c, V] arrays are live)."""
  key = (model_config, options, with_teacher)
  if key in _SCORE_FNS:
    return _SCORE_FNS[key]

  def run(params, teacher_params, batch_arrays, response_len):
    student_tokens, student_mask, teacher_tokens, teacher_mask = batch_arrays
    hidden, targets = response_hidden(
      model_config, params, student_tokens, student_mask, response_len
    )
    teacher_hidden = None
    if with_teacher:
      teacher_hidden, _ = response_hidden(
        model_config, teacher_params, teacher_tokens, teacher_mask, response_len
      )
    chunk = min(VIEW_CHUNK, response_len)
    num = -(-response_len // chunk)

    def split(x):  # [B, R, ...] -> [num, B, chunk, ...], the last chunk zero-padded
      x = jnp.pad(x, [(0, 0), (0, num * chunk - response_len)] + [(0, 0)] * (x.ndim - 2))
      return x.reshape(x.shape[0], num, chunk, *x.shape[2:]).swapaxes(0, 1)

    def body(xs):
      h, t, th = xs
      return _view_head(model_config, options, params, teacher_params, h, th, t)

    if num == 1:  # one chunk: no loop
      return body((hidden, targets, teacher_hidden))
    xs = (split(hidden), split(targets), None if teacher_hidden is None else split(teacher_hidden))
    outs = jax.lax.map(body, xs)
    return {
      k: v.swapaxes(0, 1).reshape(v.shape[1], num * chunk, *v.shape[3:])[:, :response_len]
      for k, v in outs.items()
    }

  _SCORE_FNS[key] = jax.jit(run, static_argnums=(3,))
  return _SCORE_FNS[key]


def score_turns(
  model_config,
  params,
  turns: Sequence[Any],
  algo,
  pad_id: int = 0,
  teacher_params=None,
) -> list[dict[str, np.ndarray]]:
  """Each turn's scores of its response tokens under `params` (the teacher's under
  `teacher_params` when given: a frozen teacher), at algo.temperature, as the update scores
  them: "student" (log-probs [n]) and, when every turn has a teacher prompt, "teacher" (log-probs
  [n]), "gate" (algo.gate at algo.beta, with the student's entropy for the entropy gates),
  "top_ids" and "top_probs" (the teacher's VIEW_TOP most likely tokens [n, 3]) and, for
  algo.form "vocab" / "topk", `vocab_drive`'s arrays under "drive/<name>"."""
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
  options = (
    float(algo.temperature),
    str(algo.form),
    int(algo.top_k),
    str(algo.gate),
    float(algo.beta),
  )
  score = _score_fn(model_config, options, with_teacher)
  arrays = (batch.student_tokens, batch.student_mask, batch.teacher_tokens, batch.teacher_mask)
  if not with_teacher:
    arrays = (batch.student_tokens, batch.student_mask, None, None)
  teacher = params if teacher_params is None else teacher_params
  got = {k: np.asarray(v) for k, v in score(params, teacher, arrays, batch.response_len).items()}
  if with_teacher:
    got["gate"] = np.asarray(
      algos.compute_gate(
        algo.gate,
        beta=algo.beta,
        gap=got["teacher"] - got["student"],
        entropy=got["entropy"],
        vocab_size=model_config.vocab_size,
      )
    )
  del got["entropy"]
  return [{k: v[i, : len(t.response_ids)] for k, v in got.items()} for i, t in enumerate(turns)]


def _legend(form: str, top_k: int | None) -> str:
  """The legend naming what the shade means for `form` (HTML)."""
  steps = np.linspace(0, 1, 6)
  green = "".join(f'<span style="background:{gate_colour(v)}">{v:.1f}</span>' for v in steps)
  if form in algos.VOCAB_FORMS:
    red = "".join(f'<span style="background:{drive_colour(v, -1.0)}">{v:.1f}</span>' for v in steps)
    over = f"the teacher's top {top_k} tokens" if form == "topk" else "the whole vocabulary"
    return (
      f"<b>shade: the drive</b> of form {html.escape(form)}: how much probability its gradient "
      "moves at this position, ½‖w − W·pθ‖₁ over the student's logits (w<sub>v</sub> = "
      f"pT(v)·g<sub>v</sub>, the teacher's gated weights over {over}; W = Σ w); 0 where the "
      "student's distribution is already proportional to w."
      f"<br>green, the term raises the sampled token: {green}"
      f"<br>red, it lowers it (the teacher's weight is on other tokens): {red}"
    )
  what = "its weight in g·(lT − lθ)" if form == "reference" else "the term weighs −lθ by g·Δ"
  return (
    f"<b>shade: the gate g</b> on the sampled token (form {html.escape(form)}: {what}): {green}"
  )


def _hover(turn: TurnScores, i: int) -> tuple[str, str]:
  """(title text, background colour) of response token i of `turn`."""
  lines = []
  colour = ""
  if turn.drive is not None:
    d = turn.drive
    push = float(d.push[i])
    verb = "raises" if push >= 0 else "lowers"
    moves = f"{verb} the sampled token by {abs(push):.3f}"
    if abs(push) < 5e-4:
      moves = "leaves the sampled token as it is"
    lines.append(
      f"drive {d.drive[i]:.3f}: the term {moves} (teacher "
      f"weight w {d.sampled_weight[i]:.3f} on it, student p {math.exp(turn.student_logp[i]):.3f}"
      f"); the teacher weights {d.preferred[i]!r} most (w {d.preferred_weight[i]:.3f}; "
      f"W {d.total_weight[i]:.3f})"
    )
    colour = drive_colour(float(d.drive[i]), push)
  tip = f"student log p {turn.student_logp[i]:.3f}"
  if turn.teacher_logp is not None:
    gap = turn.teacher_logp[i] - turn.student_logp[i]
    tip = (
      f"gap {gap:+.3f}, gate {turn.gate[i]:.3f}, teacher log p {turn.teacher_logp[i]:.3f}, {tip}"
    )
    if turn.drive is None:
      colour = gate_colour(float(turn.gate[i]))
  lines.append(tip)
  if turn.teacher_top is not None:
    top = ", ".join(f"{piece!r} {p:.3f}" for piece, p in turn.teacher_top[i])
    lines.append(f"teacher's top {len(turn.teacher_top[i])}: {top}")
  return "\n".join(lines), colour


def render_token_view(
  turns: Sequence[TurnScores],
  *,
  title: str,
  facts: Sequence[tuple[str, str]] = (),
  note: str = "",
  form: str = "reference",
  top_k: int | None = None,
) -> str:
  """A self-contained HTML page: each turn's observation, then its response as one run of inline
  spans, one per token (nothing between them, so the text flows as the model wrote it), shaded by
  the gate or, for form "vocab" / "topk", by the drive (`_legend`); each token's title (hover)
  holds its scores and the teacher's top tokens. All text escaped."""
  esc = html.escape
  parts = [
    "<!DOCTYPE html>",
    '<html lang="en"><head><meta charset="utf-8">',
    f"<title>{esc(title)}</title>",
    "<style>",
    "body{font-family:sans-serif;margin:1.5em;max-width:70em}",
    ".obs{color:#555;white-space:pre-wrap;font-size:90%;margin:.3em 0}",
    ".resp{font-family:monospace;white-space:pre-wrap;line-height:1.8;padding:.4em;"
    + "border:1px solid #ddd}",
    ".resp span{display:inline;border-radius:2px}",
    ".resp span:hover{outline:1px solid #333}",
    ".turn{margin:1em 0}",
    ".legend{line-height:1.8}",
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
  if any(t.teacher_logp is not None for t in turns):
    parts.append(f'<p class="legend">{_legend(form, top_k)}</p>')
  skill_block = next((t.skill_block for t in turns if t.skill_block), "")
  if skill_block:
    parts.append(
      "<details><summary>the teacher's privileged block (before the student prompt, first "
      f"turn)</summary><pre>{esc(skill_block)}</pre></details>"
    )
  for k, turn in enumerate(turns):
    parts.append(f'<div class="turn"><b>turn {k + 1}</b>')
    spans = []
    for i, piece in enumerate(turn.pieces):
      tip, colour = _hover(turn, i)
      style = f' style="background:{colour}"' if colour else ""
      tip = esc(tip, quote=True).replace("\n", "&#10;")
      spans.append(f'<span{style} title="{tip}">{esc(piece)}</span>')
    # One line: a newline between the spans would be text inside `white-space: pre-wrap`.
    parts.append(f'<div class="obs">{esc(turn.observation)}</div>')
    parts.append(f'<div class="resp">{"".join(spans)}</div>')
    validity = "valid" if turn.valid else "invalid format"
    parts.append(f"<div>action sent: <code>{esc(turn.action)}</code> ({validity})</div>")
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
  for turn, got in zip(turns, scores):
    block = ""
    if turn.teacher_prompt_ids is not None:
      extra = len(turn.teacher_prompt_ids) - len(turn.prompt_ids)
      block = tokenizer.decode(turn.teacher_prompt_ids[:extra]) if extra > 0 else ""
    top = drive = None
    if "top_ids" in got:
      top = [
        [(token_text(tokenizer, int(v)), float(p)) for v, p in zip(ids, probs)]
        for ids, probs in zip(got["top_ids"], got["top_probs"])
      ]
    if "drive/drive" in got:
      drive = Drive(
        drive=got["drive/drive"],
        push=got["drive/push"],
        sampled_weight=got["drive/sampled_weight"],
        total_weight=got["drive/total_weight"],
        preferred=[token_text(tokenizer, int(v)) for v in got["drive/preferred"]],
        preferred_weight=got["drive/preferred_weight"],
      )
    shown.append(
      TurnScores(
        observation=turn.observation,
        action=turn.action,
        valid=turn.valid,
        pieces=token_pieces(tokenizer, turn.response_ids),
        student_logp=got["student"],
        teacher_logp=got.get("teacher"),
        gate=got.get("gate"),
        skill_block=block,
        teacher_top=top,
        drive=drive,
      )
    )
  facts = [
    ("run", run),
    ("step", str(step)),
    (
      "algorithm",
      f"{algo.name} (form {algo.form}, gate {algo.gate}, beta {algo.beta:g}, "
      + f"lambda {algo.lam:g})",
    ),
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
    shade = (
      "the drive of the form's gradient (legend)"
      if algo.form in algos.VOCAB_FORMS
      else "the gate g (white 0, green 1)"
    )
    note = (
      f"Each response token is shaded by {shade}; hover for the gap lT - lθ (teacher minus "
      "student log-prob of the token), g, both log-probs and the teacher's top "
      f"{VIEW_TOP} tokens with their probabilities, scored at this step's parameters and "
      f"temperature {algo.temperature:g}."
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
  page = render_token_view(
    shown,
    title=f"Token view, step {step}",
    facts=facts,
    note=note,
    form=algo.form,
    top_k=algo.top_k,
  )
  if not paths.is_primary_process():  # every process scored the episode (collectives)
    return None
  paths.write_text(path, page)
  log.info("token view of validation task %d written to %s", episode.task_id, path)
  return path
