"""Source "reflection" (GRSD's reflections and contrastive prior) on hand-made episodes, against
pure-Python versions of the authors' rules (BinbZheng1/GRSD@393213a): how a judge's reply becomes
a score, Norm_G, which groups get a prior; the oracle's exact texts; the trajectory's budget; the
"openai" reflector against a local http.server stub (answer, retry, timeout, the message naming
the URL)."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time

import numpy as np
import pytest

from sdar_jax import algos
from sdar_jax.algos.contexts import compose_teacher_contexts, load_templates
from sdar_jax.algos.reflection import (
  Reflection,
  group_normalized,
  reflect_episodes,
  steps_text,
  writers,
)
from sdar_jax.algos.reflectors import ORACLE_LABEL, OracleWriter, Written, parse_score
from sdar_jax.infra.chat_endpoint import ChatEndpoint, EndpointError
from sdar_jax.rollout.trajectory import Episode, Turn

T = load_templates()


def _turn(obs: str, action: str) -> Turn:
  return Turn([1, 2], [3, 4], [-0.5, -0.5], action, True, 0, observation=obs)


def _episode(group: int, won: bool, steps, final: str, task="put a apple in fridge", **kw):
  turns = [_turn(o, a) for o, a in steps]
  return Episode(0, 0, group, task=task, turns=turns, won=won, final_observation=final, **kw)


def _group0():
  won = _episode(
    0,
    True,
    [
      ("You are in a room.", "go to countertop 1"),
      ("On the countertop 1, you see a apple 1.", "take apple 1 from countertop 1"),
    ],
    "You put the apple 1 in fridge 1.",
  )
  lost = _episode(
    0,
    False,
    [("You are in a room.", "open drawer 9"), ("Nothing happens.", "go to fridge 1")],
    "Nothing happens.",
    info={"expert_plan": ["go to countertop 1", "take apple 1 from countertop 1"]},
  )
  lost.final_observation = "You arrive at fridge 1."
  return won, lost


# ------------------------------------------------------------------------------ authors' rules
def _authors_parse(content):  # ReflectionJudge._parse_score
  if content is None:
    return None
  m = re.search(r"[0-3]", content)
  return None if m is None else int(m.group(0))


def _authors_norm_g(rewards, group_ids, valid, epsilon=1e-6):  # compute_group_normalized_advantage
  adv = [0.0] * len(rewards)
  for g in sorted(set(group_ids)):
    idx = [i for i in range(len(rewards)) if group_ids[i] == g and valid[i]]
    if len(idx) < 2:
      continue
    vals = [rewards[i] for i in idx]
    mean = sum(vals) / len(vals)
    std = (sum((v - mean) ** 2 for v in vals) / len(vals)) ** 0.5
    for i in idx:
      adv[i] = (rewards[i] - mean) / (std + epsilon)
  return adv


def test_a_judges_reply_becomes_a_score_as_the_authors_parse_it():
  for text in ["3", " 2.", "Score: 1", "9 then 0", "none", "", None, "4 5 6 7 3"]:
    assert parse_score(text) == _authors_parse(text)


def test_group_normalized_scores_equal_the_authors_norm_g():
  rng = np.random.default_rng(0)
  scores = rng.integers(0, 4, 12).astype(float).tolist()
  groups = [0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 3]
  valid = [True, True, False, True, True, True, True, True, False, True, True, True]
  scores[9:] = [2.0, 2.0, 2.0]  # no spread: all 0
  np.testing.assert_allclose(
    group_normalized(scores, groups, valid), _authors_norm_g(scores, groups, valid), atol=1e-6
  )


# ------------------------------------------------------------------------------ oracle, priors
def test_the_oracle_writes_its_exact_reflections_and_prior():
  won, lost = _group0()
  assert OracleWriter().write([reflect_request_for(won)])[0].text == "\n".join(
    [
      ORACLE_LABEL,
      "1. Do `take apple 1 from countertop 1`: it finished the task.",
      "2. Do `go to countertop 1`: it showed the apple.",
      "3. Do `take apple 1 from countertop 1`: it showed the fridge.",
    ]
  )
  assert OracleWriter().write([reflect_request_for(lost)])[0].text == "\n".join(
    [
      ORACLE_LABEL,
      "1. Avoid `open drawer 9`: it changed nothing.",
      "2. Do `go to countertop 1` next: the environment's plan from where the attempt stopped.",
    ]
  )
  episodes = [won, lost]
  round_ = reflect_episodes(episodes, Reflection(reflector="oracle"), OracleWriter(), None, T)
  prior = "\n".join(
    [
      ORACLE_LABEL,
      "DO:",
      "- Do `take apple 1 from countertop 1`: it finished the task.",
      "- Do `go to countertop 1`: it showed the apple.",
      "- Do `take apple 1 from countertop 1`: it showed the fridge.",
      "AVOID:",
      "- Avoid `open drawer 9`: it changed nothing.",
    ]
  )
  assert round_.priors == {0: prior}
  assert won.reflection_prior == lost.reflection_prior == prior
  counts = compose_teacher_contexts(episodes, algos.get_preset("grsd_reflect"), _enc, _dec, T)
  assert counts["with_context"] == counts["turn_samples"] == 4
  text = T["reflection"].format(prior=prior) + "\n\n"
  assert won.turns[0].teacher_prompt_ids == _enc(text) + [1, 2]


def reflect_request_for(ep):
  from sdar_jax.algos.reflection import reflect_request

  return reflect_request(ep, Reflection(), T)


def _enc(text):
  return [ord(c) for c in text]


def _dec(ids):
  return "".join(map(chr, ids))


def test_only_groups_with_both_outcomes_get_a_prior_and_the_rest_are_counted():
  won, lost = _group0()
  both_won = [_episode(1, True, [("a", "b")], "c"), _episode(1, True, [("a", "d")], "c")]
  both_lost = [_episode(2, False, [("a", "b")], "c"), _episode(2, False, [("a", "d")], "c")]
  failed = _episode(3, False, [("a", "b")], "c", env_error="boom")
  episodes = [won, *both_won, lost, *both_lost, failed]
  asked = []

  class Recorder(OracleWriter):
    def write(self, requests):
      asked.append([r.kind for r in requests])
      return super().write(requests)

  round_ = reflect_episodes(episodes, Reflection(), Recorder(), None, T)
  assert asked == [["reflect"] * 6, ["prior"]]  # every live episode reflected, one prior
  assert set(round_.priors) == {0}
  assert round_.metrics["reflection/groups_with_prior"] == 1.0
  assert round_.metrics["reflection/groups_without_prior"] == 2.0
  assert [e.reflection_prior is None for e in episodes] == [
    False,
    True,
    True,
    False,
    True,
    True,
    True,
  ]
  counts = compose_teacher_contexts(episodes, algos.get_preset("grsd_reflect"), _enc, _dec, T)
  assert counts["with_context"] == 4 and counts["turn_samples"] == 8
  # the external reflector's form: only the mixed group is reflected
  asked.clear()
  reflect_episodes(episodes, Reflection(every_episode=False), Recorder(), None, T)
  assert asked == [["reflect"] * 2, ["prior"]]


def test_evaluation_episodes_get_no_prior_and_no_reflector_call():
  """The token view of an evaluation (each game played once: no group with both outcomes): the
  hook gives every episode no prior, so the contexts compose without a round or a model call."""
  algo = algos.get_preset("grsd_reflect")
  episodes = list(_group0())
  algos.build_hooks(algo)["reflection"].before_evaluation_contexts(algo, episodes)
  assert [ep.reflection_prior for ep in episodes] == [None, None]
  counts = compose_teacher_contexts(episodes, algo, _enc, _dec, T)
  assert counts["with_context"] == 0


def test_the_trajectory_is_cut_to_its_budget():
  steps = [("x" * 50, "y" * 30)] * 5
  ep = _episode(0, False, steps, "")
  text = steps_text(ep, Reflection(max_turns=2, obs_chars=10, action_chars=4), T)
  assert text == "\n".join(
    f"Step {k}. Saw: {'x' * 10} ...[cut]\nStep {k}. Did: yyyy ...[cut]" for k in range(2)
  )


def test_the_judges_scores_and_the_training_rows():
  won, lost = _group0()
  empty = _episode(0, True, [("a", "b")], "c")

  class Policy(OracleWriter):  # writes ids as the policy would; the third reflection is empty
    def write(self, requests):
      if requests[0].kind != "reflect":
        return super().write(requests)
      out = super().write(requests)
      out[2] = Written("")
      return [Written(w.text, [1], [2, 3], [-1.0, -1.0]) for w in out]

  judged = []

  class Judge(OracleWriter):
    def write(self, requests):
      judged.extend(r.episode for r in requests)
      return [Written("score: 2"), None]  # the second judge call failed

  round_ = reflect_episodes([won, lost, empty], Reflection(), Policy(), Judge(), T)
  assert judged == [won, lost]  # the empty reflection is not sent
  assert round_.scores == {0: 2.0, 1: None, 2: 0.0}
  assert round_.metrics["reflection/judge_failed"] == 1.0
  norm = _authors_norm_g([2.0, 0.0, 0.0], [0, 0, 0], [True, False, True])
  rows = round_.training_rows(0.01)
  assert [r["advantage"] for r in rows] == pytest.approx([0.01 * a for a in norm])
  assert rows[0]["response_ids"] == [2, 3] and rows[0]["prompt_ids"] == [1]


def test_settings_are_checked():
  bad = Reflection(reflector="gpt", judge="x", tokens=0, loss_coef=0.01)
  problems = algos.reflection.reflection_problems(type("A", (), {"reflection": bad})())
  assert any("reflector='gpt'" in p for p in problems)
  assert any("judge='x'" in p for p in problems)
  assert any("tokens=0" in p for p in problems)
  assert any("loss_coef=0.01" in p for p in problems)
  hooks = algos.build_hooks(algos.get_preset("grsd_reflect"))["reflection"]
  cfg = type("C", (), {"algo": algos.get_preset("grsd_reflect")})()
  assert any("judge_url" in p for p in hooks.run_problems(cfg))


# ------------------------------------------------------------------------------ openai endpoint
class _Stub(http.server.BaseHTTPRequestHandler):
  plan: list = []  # per request: "ok", "500", "slow"
  seen: list = []

  def do_POST(self):  # noqa: N802
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    _Stub.seen.append((self.path, body, self.headers.get("Authorization")))
    what = _Stub.plan.pop(0) if _Stub.plan else "ok"
    if what == "slow":
      time.sleep(0.5)
    if what == "500":
      self.send_response(500)
      self.end_headers()
      return
    reply = {"choices": [{"message": {"content": " 2 "}}]}
    data = json.dumps(reply).encode()
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    try:
      self.wfile.write(data)
    except OSError:
      pass

  def log_message(self, *args):
    pass


@pytest.fixture
def stub():
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  _Stub.plan, _Stub.seen = [], []
  yield f"http://127.0.0.1:{server.server_address[1]}/v1"
  server.shutdown()
  server.server_close()


def test_the_openai_reflector_and_judge_talk_to_an_endpoint(stub, monkeypatch):
  monkeypatch.setenv("STUB_KEY", "k")
  won, lost = _group0()
  s = Reflection(reflector="openai", judge="openai", url=stub, model="m", api_key_env="STUB_KEY")
  writer, judge = writers(s)
  round_ = reflect_episodes([won, lost], s, writer, judge, T)
  assert round_.scores == {0: 2.0, 1: 2.0} and round_.priors == {0: "2"}
  path, body, auth = _Stub.seen[0]
  assert path == "/v1/chat/completions" and auth == "Bearer k"
  assert body["model"] == "m" and body["max_tokens"] == 512 and body["temperature"] == 1.0
  assert [m["role"] for m in body["messages"]] == ["system", "user"]
  judged = [b for _, b, _ in _Stub.seen if b["max_tokens"] == 16]
  assert len(judged) == 2 and all(b["temperature"] == 0.0 for b in judged)


def test_the_endpoint_retries_then_names_its_url(stub):
  end = ChatEndpoint(stub, "m", timeout=0.2, retries=2, backoff=0.0)
  _Stub.plan = ["500", "slow"]  # a server error, then a timeout, then an answer
  assert end.complete([{"role": "user", "content": "hi"}]) == " 2 "
  assert end.calls == 3 and end.failures == 0
  _Stub.plan = ["500"] * 3
  with pytest.raises(EndpointError, match=re.escape(stub + "/chat/completions")):
    end.complete([{"role": "user", "content": "hi"}])
  assert end.failures == 1


def test_a_reflector_whose_endpoint_never_answers_stops_with_its_url():
  s = Reflection(reflector="openai", url="http://127.0.0.1:9/v1", timeout=0.2, retries=0)
  writer, _ = writers(s)
  won, lost = _group0()
  with pytest.raises(EndpointError, match=r"http://127\.0\.0\.1:9/v1/chat/completions"):
    reflect_episodes([won, lost], s, writer, None, T)
