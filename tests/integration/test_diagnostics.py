"""Gate diagnostics (sdar_jax/observe/gate_histograms.py, token_view.py; core/scoring.py): histogram counts against numpy.histogram, the
counts the compiled update returns against independently scored log-probs, the TensorBoard
fields, the token view's escaping and colour scale, and a tiny run that writes every file.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import struct

import jax
import numpy as np
import pytest

from sdar_jax.core import scoring
from sdar_jax.core.histograms import GAP_EDGES, GATE_EDGES, masked_histogram
from sdar_jax.observe import gate_histograms, token_view, transcripts
from sdar_jax.observe.gate_histograms import Histogram
from tests.helpers import (
  RESPONSE_LEN,
  SDAR_LOSS,
  TINY_CONFIG,
  fresh_state,
  full_logp,
  tiny_run_config,
)


# ------------------------------------------------------------------------------ histograms
def test_masked_histogram_by_hand():
  """Edges 0, 1, 2: bins [0, 1) and [1, 2] (closed last bin, as numpy), below and above."""
  values = np.array([[-0.5, 0.0, 0.999, 1.0], [2.0, 2.01, np.nan, 7.0]], np.float32)
  mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.float32)  # 7.0 is masked out
  got = np.asarray(masked_histogram(values, mask, np.array([0.0, 1.0, 2.0], np.float32)))
  # below: -0.5 | [0, 1): 0.0, 0.999 | [1, 2]: 1.0, 2.0 | above: 2.01 | NaN: nowhere
  assert got.tolist() == [1, 2, 2, 1]
  assert got.dtype == np.int32


@pytest.mark.parametrize("edges", [GAP_EDGES, GATE_EDGES], ids=["gap", "gate"])
def test_masked_histogram_matches_numpy_histogram(edges):
  rng = np.random.default_rng(0)
  lo, hi = float(edges[0]), float(edges[-1])
  span = hi - lo
  values = rng.uniform(lo - 0.2 * span, hi + 0.2 * span, size=(9, 37)).astype(np.float32)
  values[0, :5] = edges[[0, 1, 7, -2, -1]]  # exactly on edges, the last edge included
  mask = (rng.random((9, 37)) > 0.25).astype(np.float32)
  mask[0, :5] = 1
  got = np.asarray(masked_histogram(values, mask, edges))
  kept = values[mask > 0]
  want, _ = np.histogram(kept, bins=edges)
  assert got[1:-1].tolist() == want.tolist()
  assert got[0] == (kept < edges[0]).sum() and got[-1] == (kept > edges[-1]).sum()
  assert got.sum() == kept.size


def test_histogram_from_packed_and_tensorboard_fields():
  h = Histogram.from_packed("gate", [1, 2, 0, 3], np.array([0.0, 0.5, 1.0]))
  assert h.counts.tolist() == [2, 0] and (h.below, h.above, h.total) == (1, 3, 6)
  tb = h.tensorboard_fields()
  # buckets: below 0 (centre -0.25), [0, 0.5) (0.25), [0.5, 1] (0.75), above 1 (1.25)
  assert tb["bucket_counts"] == [1.0, 2.0, 0.0, 3.0]
  assert tb["bucket_limits"][:3] == [0.0, 0.5, 1.0] and tb["bucket_limits"][3] > 1e300
  assert tb["num"] == 6.0
  assert tb["sum"] == pytest.approx(-0.25 + 2 * 0.25 + 3 * 1.25)
  assert tb["sum_squares"] == pytest.approx(0.0625 + 2 * 0.0625 + 3 * 1.5625)
  assert (tb["min"], tb["max"]) == (-0.5, 1.5)
  with pytest.raises(ValueError, match="expected 4"):
    Histogram.from_packed("gate", [1, 2, 3], np.array([0.0, 0.5, 1.0]))


def test_pop_update_histograms_sums_updates_and_leaves_scalars():
  edges = len(GAP_EDGES) + 1
  a = {"train/loss": 1.0, "diag/gap_counts": np.arange(edges), "diag/gate_counts": np.ones(22)}
  b = {
    "train/loss": 3.0,
    "diag/gap_counts": np.ones(edges, np.int32),
    "diag/gate_counts": np.ones(22),
  }
  hists = gate_histograms.pop_update_histograms([(a, 1.0), (b, 2.0)])
  assert a == {"train/loss": 1.0} and b == {"train/loss": 3.0}
  gap = hists["gap"]
  assert gap.below == 1 and gap.above == edges  # 0 + 1 and (edges - 1) + 1
  assert gap.counts.tolist() == (np.arange(1, edges - 1) + 1).tolist()
  assert hists["gate"].total == 44
  assert gate_histograms.pop_update_histograms([({"train/loss": 1.0}, 1.0)]) == {}


def _edge_distance(values: np.ndarray, edges: np.ndarray) -> float:
  return float(np.min(np.abs(values.reshape(-1, 1) - edges.reshape(1, -1))))


@pytest.mark.slow
def test_update_returns_counts_of_the_gap_and_gate(tiny_params):
  """The compiled update's counts equal numpy.histogram of the gap lT − lθ and the gate σ(βΔ)
  computed from independently scored log-probs (float64 full-logits forward); micro-batching
  gives the same integers; the positive-gap share is the share of tokens with Δ > 0; an update
  built without histograms returns none."""
  from sdar_jax.algos import get_preset
  from sdar_jax.core.train_state import make_optimizer
  from sdar_jax.core.train_step import TrainStep
  from tests.helpers import make_turn_batch

  batch = make_turn_batch(tiny_params, seed=11)  # no value within 1e-3 of a bin edge
  m = batch.response_mask > 0
  student = full_logp(tiny_params, batch.student_tokens, batch.student_mask, RESPONSE_LEN)[0]
  teacher = full_logp(tiny_params, batch.teacher_tokens, batch.teacher_mask, RESPONSE_LEN)[0]
  gap = (teacher.astype(np.float64) - student)[m]
  beta = get_preset("sdar").beta
  gate = 1.0 / (1.0 + np.exp(-beta * gap))
  # float32 programs differ from float64 in the last digits: no value may sit on a bin edge
  assert _edge_distance(gap, GAP_EDGES) > 1e-4 and _edge_distance(gate, GATE_EDGES) > 1e-4
  want_gap = np.histogram(gap, bins=GAP_EDGES.astype(np.float64))[0]
  want_gate = np.histogram(gate, bins=GATE_EDGES.astype(np.float64))[0]

  counts = []
  for micro in (None, 4):
    step = TrainStep(
      TINY_CONFIG, SDAR_LOSS, make_optimizer(1e-3), micro_batch_size=micro, histograms=True
    )
    _, metrics = step(fresh_state(tiny_params, step.optimizer), batch)
    metrics = jax.device_get(metrics)
    got_gap, got_gate = metrics["diag/gap_counts"], metrics["diag/gate_counts"]
    assert got_gap[1:-1].tolist() == want_gap.tolist() and got_gap[0] == got_gap[-1] == 0
    assert got_gate[1:-1].tolist() == want_gate.tolist()
    np.testing.assert_allclose(metrics["sdar/positive_gap_share"], np.mean(gap > 0), atol=1e-6)
    counts.append((got_gap.tolist(), got_gate.tolist()))
  assert counts[0] == counts[1]
  plain = TrainStep(TINY_CONFIG, SDAR_LOSS, make_optimizer(1e-3))
  _, metrics = plain(fresh_state(tiny_params, plain.optimizer), batch)
  assert not [k for k in metrics if k.startswith("diag/")]
  assert "sdar/positive_gap_share" in metrics


def test_record_update_histograms_writes_rows_and_pngs(tmp_path):
  edges = len(GAP_EDGES) + 1
  for step in (1, 2, 2):  # step 2 logged again, as a resumed run does
    per_batch = [({"diag/gap_counts": np.full(edges, step), "diag/gate_counts": np.ones(22)}, 1.0)]
    gate_histograms.record_update_histograms(
      per_batch, step, str(tmp_path), logger=None, plots=True
    )
  out = tmp_path / "diagnostics"
  assert (out / "histograms_step_1.png").stat().st_size > 0
  assert (out / "histograms_step_2.png").stat().st_size > 0
  assert (out / "histograms.png").stat().st_size > 0
  rows = gate_histograms.read_histogram_rows(str(out / "histograms.jsonl"))
  assert [r["step"] for r in rows] == [1, 2]
  assert rows[1]["gap"]["below"] == 2 and rows[1]["gate"]["counts"] == [1] * 20
  # an algorithm without a teacher: nothing to record, nothing written
  empty = tmp_path / "grpo"
  assert gate_histograms.record_update_histograms([({"train/loss": 0.5}, 1.0)], 1, str(empty)) == {}
  assert not empty.exists()


# ------------------------------------------------------------------------------ token view
def _luminance(colour: str) -> float:
  r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
  return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_gate_colour_is_monotone_in_the_gate():
  grid = np.linspace(0.0, 1.0, 101)
  colours = [token_view.gate_colour(g) for g in grid]
  assert colours[0] == "#ffffff" and colours[-1] == "#2ea043"
  lum = [_luminance(c) for c in colours]
  assert all(a > b for a, b in zip(lum[:-1], lum[1:]))  # darker green as the gate rises
  for channel in (1, 3, 5):
    values = [int(c[channel : channel + 2], 16) for c in colours]
    assert all(a >= b for a, b in zip(values[:-1], values[1:]))
  assert token_view.gate_colour(-3.0) == colours[0] and token_view.gate_colour(9.0) == colours[-1]
  assert token_view.gate_colour(float("nan")) == ""


def test_token_view_escapes_text_and_hover_titles():
  nasty = ['<script>alert("x")</script>', " & ", "'q'", "\n"]
  turn = token_view.TurnScores(
    observation='You see a <fridge> & a "box".',
    action='go to "cabinet 1"',
    valid=True,
    pieces=nasty,
    student_logp=np.array([-1.0, -2.0, -0.5, -0.25]),
    teacher_logp=np.array([-0.5, -3.0, -0.5, 0.0]),
    gate=np.array([0.924, 0.007, 0.5, 0.777]),
    skill_block="[Privileged Skill Information]\n<b>skills</b>\n\n",
  )
  page = token_view.render_token_view(
    [turn], title="Token view <1>", facts=[("task", "put a <mug> in & on")], note="n < 2"
  )
  assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
  assert "<script>" not in page and "<fridge>" not in page and "<mug>" not in page
  assert "<b>skills</b>" not in page and "&lt;b&gt;skills&lt;/b&gt;" in page
  assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
  assert "Token view &lt;1&gt;" in page and "n &lt; 2" in page
  spans = re.findall(r'<span style="background:(#[0-9a-f]{6})" title="([^"]*)">', page)
  assert len(spans) == 4
  assert [c for c, _ in spans] == [token_view.gate_colour(g) for g in turn.gate]
  assert spans[0][1].startswith("gap +0.500, gate 0.924, teacher log p -0.500")
  assert spans[1][1].startswith("gap -1.000, gate 0.007")
  assert "http" not in page and "<link" not in page and "src=" not in page  # self-contained


def test_token_view_shows_each_turns_teacher_context_where_it_changes():
  """Hindsight gives each turn its own context: each is shown once, at the turn it starts, with
  the sources that gave it; a turn without one says so."""

  def turn(block, sources):
    return token_view.TurnScores(
      "obs", "look", True, ["a"], np.array([-1.0]), np.array([-0.5]), np.array([0.5]),
      skill_block=block, sources=sources,
    )  # fmt: skip

  turns = [
    turn("[Hindsight]\nThen: A\n\n", ("hindsight",)),
    turn("[Hindsight]\nThen: A\n\n", ("hindsight",)),
    turn("[Hindsight]\nThen: B\n\n", ("hindsight",)),
    turn("", ()),
  ]
  page = token_view.render_token_view(turns, title="t")
  assert page.count("the teacher's context from hindsight") == 2
  assert page.index("Then: A") < page.index("<b>turn 2</b>") < page.index("Then: B")
  assert page.count("no teacher context from this turn on") == 1


def test_token_view_without_teacher_is_unshaded():
  turn = token_view.TurnScores("obs", "look", False, ["a", "b"], np.array([-1.0, -2.0]), None, None)
  page = token_view.render_token_view([turn], title="t")
  assert page.count('<span title="student log p') == 2 and "invalid format" in page


def _view_turn(pieces, drive=True) -> token_view.TurnScores:
  n = len(pieces)
  rng = np.random.default_rng(3)
  top = rng.dirichlet(np.ones(5), size=n)[:, :3]  # three of five probabilities: sum < 1
  top = -np.sort(-top, axis=1)
  d = None
  if drive:
    d = token_view.Drive(
      drive=np.linspace(0.05, 0.9, n),
      push=np.where(np.arange(n) % 2 == 0, 0.2, -0.4),
      sampled_weight=np.full(n, 0.1),
      total_weight=np.full(n, 0.6),
      preferred=[" open"] * n,
      preferred_weight=np.full(n, 0.45),
    )
  return token_view.TurnScores(
    observation="You arrive at desk 1.",
    action="go to desk 1",
    valid=True,
    pieces=pieces,
    student_logp=np.full(n, -0.7),
    teacher_logp=np.full(n, -1.2),
    gate=np.full(n, 0.3),
    teacher_top=[[(f"t{j}", float(p)) for j, p in enumerate(row)] for row in top],
    drive=d,
  )


@pytest.mark.parametrize("form", ["reference", "vocab", "topk"])
def test_token_view_markup_flows_inline(form):
  """The layout a browser gives the response: one run of inline spans with nothing between them
  (a newline between spans inside `white-space: pre-wrap` put every token on its own line); the
  response's own newline stays inside its token. The legend names the form's shade; every hover
  lists the teacher's top 3 with probabilities that sum to at most 1."""
  pieces = ["<think>", "I", " follow", " my plan", ".</think>", "\n", "<action>", "go to", " desk"]
  turn = _view_turn(pieces, drive=form != "reference")
  page = token_view.render_token_view([turn, turn], title="t", form=form, top_k=32)
  bodies = re.findall(r'<div class="resp">(.*?)</div>', page, flags=re.S)
  assert len(bodies) == 2
  for body in bodies:
    spans = re.findall(r"<span[^>]*>[^<]*</span>", body)
    assert "".join(spans) == body  # nothing, not even a newline, between two spans
    assert len(spans) == len(pieces)
    assert [re.sub(r"<[^>]*>", "", s) for s in spans][5] == "\n"
  css = re.search(r"<style>(.*?)</style>", page, flags=re.S).group(1)
  rule = re.search(r"\.resp span\{([^}]*)\}", css).group(1)
  assert "display:inline;" in rule + ";" and "block" not in rule and "flex" not in rule
  assert "white-space:pre-wrap" in re.search(r"\.resp\{([^}]*)\}", css).group(1)
  legend = re.search(r'<p class="legend">(.*?)</p>', page, flags=re.S).group(1)
  if form == "reference":
    assert "shade: the gate g" in legend and "form reference" in legend
  else:
    assert "shade: the drive" in legend and f"form {form}" in legend
    assert ("top 32 tokens" in legend) == (form == "topk")
  titles = re.findall(r'<span style="background:(#[0-9a-f]{6})" title="([^"]*)">', page)
  assert len(titles) == 2 * len(pieces)
  for i, (colour, title) in enumerate(titles[: len(pieces)]):
    assert "\n" not in title and "&#10;" in title  # one hover line per fact
    (top,) = re.findall(r"teacher&#x27;s top 3: (.*)$", title)
    probs = [float(p) for p in re.findall(r"&#x27;t\d&#x27; (\d\.\d{3})", top)]
    assert len(probs) == 3 and sum(probs) <= 1.0 + 1.5e-3  # three roundings of 5e-4
    assert probs == [round(p, 3) for _, p in turn.teacher_top[i]]
    if form == "reference":
      assert colour == token_view.gate_colour(0.3)
    else:
      assert colour == token_view.drive_colour(turn.drive.drive[i], turn.drive.push[i])
      verb = "raises" if turn.drive.push[i] >= 0 else "lowers"
      assert title.startswith(f"drive {turn.drive.drive[i]:.3f}: the term {verb} the sampled")


def test_drive_colour_is_green_up_red_down():
  assert token_view.drive_colour(0.0, 1.0) == token_view.drive_colour(0.0, -1.0) == "#ffffff"
  assert token_view.drive_colour(1.0, 0.0) == token_view.gate_colour(1.0)
  assert token_view.drive_colour(1.0, -1e-9) == "#{:02x}{:02x}{:02x}".format(
    *token_view.DRIVE_DOWN_RGB
  )
  reds = [token_view.drive_colour(v, -0.5) for v in np.linspace(0, 1, 21)]
  lum = [_luminance(c) for c in reds]
  assert all(a > b for a, b in zip(lum[:-1], lum[1:]))
  assert token_view.drive_colour(float("nan"), 1.0) == token_view.drive_colour(0.5, np.nan) == ""


@pytest.mark.parametrize(
  "top_k, gate", [(None, "gap"), (4, "soft_or")], ids=["vocab-gap", "topk-soft_or"]
)
def test_vocab_drive_is_the_terms_gradient(top_k, gate):
  """The drive, the push on the sampled token and the weights against the gradient that JAX
  takes of the training term itself (`vocab_distill_term` / `topk_distill_term`) w.r.t. the
  student's logits, and against a NumPy sum of pT·g over the teacher's entries."""
  from sdar_jax import algos

  rng = np.random.default_rng(7)
  V = 11
  z = rng.normal(size=(2, 3, V)) * 2
  zt = rng.normal(size=(2, 3, V)) * 2
  targets = rng.integers(0, V, size=(2, 3))
  lt = jax.nn.log_softmax(zt)
  entropy = algos.entropy_from_logits(z)
  kw = dict(beta=5.0, gate=gate, entropy=entropy, vocab_size=V)

  def term(logits):
    ls = jax.nn.log_softmax(logits)
    if top_k is None:
      return algos.vocab_distill_term(ls, lt, **kw).sum()
    return algos.topk_distill_term(ls, lt, top_k=top_k, **kw).sum()

  grad = np.asarray(jax.jit(jax.grad(term))(z), np.float64)  # one compile: faster than eager
  drive = jax.jit(lambda ls, y: scoring.vocab_drive(ls, lt, y, top_k=top_k, **kw))
  got = drive(jax.nn.log_softmax(z), targets)
  got = {k: np.asarray(v) for k, v in got.items()}
  np.testing.assert_allclose(got["drive"], 0.5 * np.abs(grad).sum(-1), atol=1e-6)
  push = -np.take_along_axis(grad, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(got["push"], push, atol=1e-6)
  # w_v = pT(v)·g_v in NumPy (g from the gate, the one input not recomputed here)
  ls64, lt64 = (np.asarray(jax.nn.log_softmax(x), np.float64) for x in (z, zt))
  g = np.asarray(
    algos.compute_gate(gate, beta=5.0, gap=lt64 - ls64, entropy=entropy[..., None], vocab_size=V)
  )
  w = np.exp(lt64) * g
  if top_k is not None:
    keep = np.argsort(-lt64, -1)[..., :top_k]
    w = np.where(np.any(np.arange(V) == keep[..., None], axis=-2), w, 0.0)
  np.testing.assert_allclose(got["total_weight"], w.sum(-1), atol=1e-6)
  np.testing.assert_allclose(
    got["sampled_weight"], np.take_along_axis(w, targets[..., None], -1)[..., 0], atol=1e-6
  )
  assert (got["preferred"] == w.argmax(-1)).all()
  np.testing.assert_allclose(got["preferred_weight"], w.max(-1), atol=1e-6)
  assert (got["drive"] <= got["total_weight"] + 1e-6).all()


def test_score_turns_against_float64_truth(tiny_params):
  """The view's one scoring pass over both branches against float64 NumPy from the full logits
  of `forward`: the log-probs the update takes, the teacher's top 3, and the vocab form's drive
  (d = w − W·pθ); positions in chunks of 3, so a chunk boundary and a padded last chunk occur."""
  from sdar_jax.algos import get_preset
  from sdar_jax.models import forward

  @dataclasses.dataclass
  class Turn:
    prompt_ids: list
    response_ids: list
    teacher_prompt_ids: list
    valid: bool = True

  rng = np.random.default_rng(5)
  turns = []
  for n_p, n_r in ((6, 7), (3, 4)):
    prompt = rng.integers(1, TINY_CONFIG.vocab_size, n_p).tolist()
    block = rng.integers(1, TINY_CONFIG.vocab_size, 4).tolist()
    turns.append(
      Turn(prompt, rng.integers(1, TINY_CONFIG.vocab_size, n_r).tolist(), block + prompt)
    )
  algo = get_preset("sdar_vocab")
  got = token_view.score_turns(TINY_CONFIG, tiny_params, turns, algo, chunk=3)

  # float64 log-softmax of every sequence's positions from one `forward` call: the sequences
  # right-padded to one length (causal attention: the padding never reaches a real position)
  seqs = [(t.prompt_ids, t.response_ids) for t in turns]
  seqs += [(t.teacher_prompt_ids, t.response_ids) for t in turns]
  T = max(len(p) + len(r) for p, r in seqs)
  tokens = np.zeros((len(seqs), T), np.int32)
  for i, (p, r) in enumerate(seqs):
    tokens[i, : len(p) + len(r)] = p + r
  logits = np.asarray(forward(TINY_CONFIG, tiny_params, tokens, np.ones_like(tokens)), np.float64)
  logits -= logits.max(-1, keepdims=True)
  logits -= np.log(np.exp(logits).sum(-1, keepdims=True))

  def dist(i):  # [n, V]: the positions of sequence i that predict its response
    p, r = seqs[i]
    return logits[i, len(p) - 1 : len(p) - 1 + len(r)]

  for k, (turn, scores) in enumerate(zip(turns, got)):
    n = len(turn.response_ids)
    y = np.asarray(turn.response_ids)
    ls, lt = dist(k), dist(len(turns) + k)
    np.testing.assert_allclose(scores["student"], ls[np.arange(n), y], atol=1e-4)
    np.testing.assert_allclose(scores["teacher"], lt[np.arange(n), y], atol=1e-4)
    top = np.sort(np.exp(lt), -1)[:, ::-1][:, :3]
    np.testing.assert_allclose(scores["top_probs"], top, atol=1e-5)
    assert (scores["top_ids"][:, 0] == lt.argmax(-1)).all()
    gap = lt - ls
    w = np.exp(lt) / (1 + np.exp(-algo.beta * gap))  # the gap gate σ(β·Δ_v) on every entry
    d = w - w.sum(-1, keepdims=True) * np.exp(ls)
    np.testing.assert_allclose(scores["drive/drive"], 0.5 * np.abs(d).sum(-1), atol=1e-5)
    np.testing.assert_allclose(scores["drive/push"], d[np.arange(n), y], atol=1e-5)
    want_gate = 1 / (1 + np.exp(-algo.beta * gap[np.arange(n), y]))
    np.testing.assert_allclose(scores["gate"], want_gate, atol=1e-4)


def test_token_pieces_join_to_the_decoded_text():
  from sdar_jax.text.tokenizer import Tokenizer

  tokenizer = Tokenizer.bundled_qwen()
  text = "café ✓ 日本語 <|im_end|> go to cabinet 1"
  ids = tokenizer.encode(text)
  pieces = token_view.token_pieces(tokenizer, ids)
  assert len(pieces) == len(ids)
  assert "".join(pieces) == tokenizer.decode(ids) == text


def test_pick_episode_prefers_a_won_one():
  @dataclasses.dataclass
  class T:
    response_ids: list

  @dataclasses.dataclass
  class E:
    won: bool
    env_error: str | None
    turns: list

  failed, lost, won = E(True, "boom", [T([1])]), E(False, None, [T([1])]), E(True, None, [T([2])])
  assert token_view.pick_episode([failed, lost, won]) is won
  assert token_view.pick_episode([failed, lost]) is lost
  assert token_view.pick_episode([failed, E(False, None, [T([])])]) is None


# ------------------------------------------------------------------------------ a tiny run
def _tb_histogram_tags(logdir: str) -> set[str]:
  """Tags of the histogram summaries in the TensorBoard event files (TFRecord framing)."""
  from tensorboardX.proto import event_pb2

  tags = set()
  for path in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
    data = open(path, "rb").read()
    pos = 0
    while pos + 12 <= len(data):
      (length,) = struct.unpack("<Q", data[pos : pos + 8])
      event = event_pb2.Event()
      event.ParseFromString(data[pos + 12 : pos + 12 + length])
      pos += 12 + length + 4
      tags |= {v.tag for v in event.summary.value if v.HasField("histo")}
  return tags


@pytest.mark.slow
def test_a_tiny_run_writes_the_diagnostics(tmp_path, monkeypatch):
  """SDAR, one iteration, evaluations before and after: histograms (JSONL, PNGs, TensorBoard),
  the positive-gap share, a token view per evaluation whose teacher prompts carry the skill
  block; then GRPO evaluated alone writes its token view with the teacher scored for it."""
  from sdar_jax.run import trainer

  def config(algo: str):
    return tiny_run_config(1, algo, **{"train.eval_every": 1, "logging.tensorboard": True})

  run = str(tmp_path / "sdar")
  trainer.run(config("sdar"), run)
  diag = os.path.join(run, "diagnostics")
  for name in ("histograms_step_1.png", "histograms.png", "histograms.jsonl"):
    assert os.path.getsize(os.path.join(diag, name)) > 0, name
  (row,) = gate_histograms.read_histogram_rows(os.path.join(diag, "histograms.jsonl"))
  gap_total = sum(row["gap"]["counts"]) + row["gap"]["below"] + row["gap"]["above"]
  assert gap_total > 0 and sum(row["gate"]["counts"]) == gap_total  # every gate is in [0, 1]
  assert _tb_histogram_tags(run) == {"diagnostics/gap", "diagnostics/gate"}
  with open(os.path.join(run, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert 0.0 <= rows[-1]["sdar/positive_gap_share"] <= 1.0
  assert not [k for r in rows for k in r if k.startswith("diag/")]
  for step in (0, 1):
    page = open(os.path.join(run, "eval", f"step_{step}", "tokens.html"), encoding="utf-8").read()
    assert f"Token view, iteration {step}" in page and "[Privileged Skill Information]" in page
    assert re.search(r'<span style="background:#[0-9a-f]{6}" title="gap [+-]\d', page)
    assert "does not score a teacher" not in page
    # Every validation episode as text; its outcomes are the logged success rate.
    episodes = transcripts.read_transcripts(
      os.path.join(run, "eval", f"step_{step}", "episodes_val.jsonl")
    )
    (logged,) = [
      r["val/success_rate"] for r in rows if r["step"] == step and "val/success_rate" in r
    ]
    assert len(episodes) == 2 and [e["task_id"] for e in episodes] == sorted(
      e["task_id"] for e in episodes
    )
    assert transcripts.summarise(episodes)["all"]["success_rate"] == pytest.approx(logged)
    checked = [t["admissible"] for ep in episodes for t in ep["turns"]]
    (ratio,) = [
      r["val/admissible_action_ratio"]
      for r in rows
      if r["step"] == step and "val/success_rate" in r
    ]
    assert None not in checked and ratio == pytest.approx(sum(checked) / len(checked))
    for ep in episodes:
      assert ep["turns"] and all(t["observation"] and t["response"] for t in ep["turns"])
      for turn, after in zip(
        ep["turns"], ep["turns"][1:]
      ):  # the engine ignores what it did not list
        if turn["admissible"] is False:
          assert after["observation"].strip() == "Nothing happens."
      assert all(t["action"] in t["response"].lower() or not t["valid"] for t in ep["turns"])

  out = str(tmp_path / "grpo_eval")
  trainer.run_evaluation(config("grpo"), out)
  assert os.path.exists(os.path.join(out, "episodes_val.jsonl"))
  page = open(os.path.join(out, "tokens.html"), encoding="utf-8").read()
  assert (
    "grpo (form reference, gate gap, beta 5" in page
    and "does not score a teacher in training" in page
  )
  assert re.search(r'<span style="background:#[0-9a-f]{6}" title="gap [+-]\d', page)
  assert not os.path.exists(os.path.join(out, "diagnostics"))
  assert "frozen initial policy" not in page

  # A frozen-teacher algorithm evaluated alone: the view says its teacher is not training's.
  # Form "vocab": tokens shaded by the drive, the teacher's top 3 on hover.
  out = str(tmp_path / "sdar_vocab_eval")
  trainer.run_evaluation(config("sdar_vocab"), out)
  page = open(os.path.join(out, "tokens.html"), encoding="utf-8").read()
  assert "this evaluation holds no copy of it" in page
  assert "shade: the drive</b> of form vocab" in page
  titles = re.findall(r'<span style="background:#[0-9a-f]{6}" title="([^"]*)">', page)
  assert titles and all(t.startswith("drive ") for t in titles)
  for title in titles:
    probs = [float(p) for p in re.findall(r" (\d\.\d{3})(?:, |$)", title.split("top 3: ")[1])]
    assert len(probs) == 3 and probs == sorted(probs, reverse=True) and sum(probs) <= 1.0015
