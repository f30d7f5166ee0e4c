"""The token view: one validation episode as an HTML page, `<workdir>/eval/step_<N>/tokens.html`
(an evaluation-only run: `tokens.html` in its results directory), each response token shaded by
what drives the distillation term's gradient there in the run's algo.form (the gate g for the
sampled-token forms, the drive for "vocab" / "topk"), the scores and the teacher's top tokens on
hover. Holds the evaluation hooks (`with_teacher_prompts`: the loop records each turn's teacher
prompt as training builds it; `token_view_candidates`, `write_token_view`), the choice of episode
(`pick_episode`), and the page (`render_token_view`). The scores come from
`sdar_jax.core.scoring.score_responses` (the update's chunked two-branch head); this module only
packs the turns and renders. Writing never raises (a failure is logged); only the primary process
writes. docs/running.md, "Diagnostics", describes the page.
"""

from __future__ import annotations

import codecs
import copy
import dataclasses
import html
import logging
import math
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from sdar_jax import algos
from sdar_jax.core.batch import TurnSample, batch_bucket
from sdar_jax.core.scoring import VIEW_CHUNK, VIEW_TOP, score_responses
from sdar_jax.infra import multihost, paths
from sdar_jax.rollout.batching import pack_batch

log = logging.getLogger(__name__)

TOKEN_VIEW_FILE = "tokens.html"

# Token colour: white at gate 0, this green at gate 1, linear in between (each channel monotone).
GATE_LOW_RGB = (255, 255, 255)
GATE_HIGH_RGB = (46, 160, 67)
# Forms "vocab" / "topk": white at drive 0, green (sampled token raised) or this red (lowered) at 1.
DRIVE_DOWN_RGB = (214, 55, 62)


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
  skill_block: str = ""  # the teacher's context: its prompt before the student prompt (decoded)
  sources: tuple[str, ...] = ()  # the context sources that gave it (algo.context)
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


def score_turns(
  model_config,
  params,
  turns: Sequence[Any],
  algo,
  pad_id: int = 0,
  teacher_params=None,
  chunk: int = VIEW_CHUNK,
) -> list[dict[str, np.ndarray]]:
  """Each turn's scores of its response tokens under `params` (the teacher's under
  `teacher_params` when given: a frozen teacher), `sdar_jax.core.scoring.score_responses`' arrays
  cut to the turn's tokens: "student" and, when every turn has a teacher prompt, "teacher",
  "gate", "top_ids" / "top_probs" and, for algo.form "vocab" / "topk", "drive/<name>". `chunk`:
  response positions per lm_head pass."""
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
  arrays = (batch.student_tokens, batch.student_mask, batch.teacher_tokens, batch.teacher_mask)
  if not with_teacher:
    arrays = (batch.student_tokens, batch.student_mask, None, None)
  got = score_responses(
    model_config, algo, params, arrays, batch.response_len, teacher_params, chunk=chunk
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
  shown_block = None
  for k, turn in enumerate(turns):
    parts.append(f'<div class="turn"><b>turn {k + 1}</b>')
    if turn.skill_block != shown_block:  # each turn's teacher context, where it changes
      shown_block = turn.skill_block
      named = f" from {', '.join(turn.sources)}" if turn.sources else ""
      if turn.skill_block:
        parts.append(
          f"<details><summary>the teacher's context{esc(named)} (before the student prompt, "
          f"from this turn on)</summary><pre>{esc(turn.skill_block)}</pre></details>"
        )
      elif turn.teacher_logp is not None:
        parts.append("<p><i>no teacher context from this turn on (no source gave one)</i></p>")
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
  """Episodes among which `pick_episode` picks the one it would pick from every
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
        sources=tuple(getattr(turn, "context_sources", ()) or ()),
        teacher_top=top,
        drive=drive,
      )
    )
  facts = [
    ("run", run),
    ("iteration", str(step)),
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
      f"{VIEW_TOP} tokens with their probabilities, scored at this iteration's parameters and "
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
    title=f"Token view, iteration {step}",
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
