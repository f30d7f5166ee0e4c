"""Search-QA's retrieval server when it misbehaves, against real HTTP servers on 127.0.0.1: dead
(nothing listens), slow (answers after the timeout), failing (HTTP 500) and one that returns a
2 MB passage. The start check names the URL and the fix, `env.search_timeout_s` and
`env.search_retries` bound each search, a failed search is counted in `rollout/search_errors` and
logged once per kind, and every passage is cut to `env.search_max_passage_chars` characters."""

from __future__ import annotations

import http.server
import json
import logging
import socket
import threading
import time
import types

import pytest

from envs.errors import EnvInputError
from envs.search_qa import SearchQAEnv, family
from envs.search_qa.data import QARecord
from envs.search_qa.retrieval import (
  RetrievalServerClient,
  SearchError,
  check_server,
  cut_passage,
)

RECORDS = [QARecord("Where was Evan Morris born?", ("Glen Rock",), "nq", "q0")]
PASSAGE = '"Evan Morris"\nEvan Morris was a lobbyist born in Glen Rock.'
HUGE = '"Big"\n' + "x" * 2_000_000  # a 2 MB passage


class _Server:
  """A real HTTP server on an ephemeral port of 127.0.0.1: `mode` "ok" answers Search-R1's
  protocol with `contents`, "slow" answers the same after `delay` seconds, "error" answers 500."""

  def __init__(self, mode: str, contents: str = PASSAGE, delay: float = 0.0):
    self.requests = 0
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server.requests += 1
        if mode == "slow":
          time.sleep(delay)
        status = 500 if mode == "error" else 200
        doc = {"document": {"id": "0", "contents": contents}, "score": 1.0}
        payload = {"result": [[doc] for _ in body["queries"]]} if status == 200 else {}
        data = json.dumps(payload).encode()
        try:
          self.send_response(status)
          self.send_header("Content-Type", "application/json")
          self.send_header("Content-Length", str(len(data)))
          self.end_headers()
          self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
          pass  # the client gave up (timeout)

      def log_message(self, *args):
        pass

    self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/retrieve"
    self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
    self.thread.start()

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()
    self.thread.join(timeout=5)


@pytest.fixture
def server():
  started = []

  def start(*args, **kwargs):
    started.append(_Server(*args, **kwargs))
    return started[-1]

  yield start
  for s in started:
    s.close()


@pytest.fixture
def dead_url():
  """A URL where nothing listens: a port that was free a moment ago."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  return f"http://127.0.0.1:{port}/retrieve"


# --------------------------------------------------------------------------------- start check
def test_start_check_names_the_url_and_the_fix(server, dead_url):
  check_server(server("ok").url)  # a working server passes
  cases = [
    (dead_url, "nothing answers there", {}),
    (
      server("slow", delay=1.0).url,
      "the server did not answer a test query within env.search_timeout_s=0.2 s",
      {"timeout_s": 0.2},
    ),
    (server("error").url, "the server's answer to a test query is not usable (HTTP 500)", {}),
  ]
  for url, what, kwargs in cases:
    with pytest.raises(EnvInputError) as e:
      check_server(url, **kwargs)
    msg = str(e.value)
    assert msg.startswith(f"env.search_url={url!r}: {what}"), msg
    assert "Fix: start the retrieval server" in msg and "--config.env.retriever=bm25" in msg
  with pytest.raises(EnvInputError, match="env.search_url='localhost:8000'.*http://"):
    check_server("localhost:8000")


def test_validate_runs_the_start_check_and_dry_run_does_too(dead_url, server):
  """The run's config validation (what `--dry_run` runs) asks the server before anything is built;
  its own keys are range-checked."""
  from configs import search_qa
  from configs.common import override
  from sdar_jax.run.config_validation import ConfigError, validate

  config = search_qa.get_config("local=True")
  override(config, {"env.retriever": "server", "env.search_url": dead_url})
  with pytest.raises(EnvInputError, match="nothing answers there"):
    validate(config)
  config.env.search_url = server("ok").url
  validate(config)
  override(
    config,
    {"env.search_timeout_s": 0.0, "env.search_retries": -1, "env.search_max_passage_chars": -5},
  )
  with pytest.raises(ConfigError) as e:
    validate(config)
  for key in ("search_timeout_s=0.0", "search_retries=-1", "search_max_passage_chars=-5"):
    assert f"env.{key}: must be" in str(e.value)


# ------------------------------------------------------------------------- timeout and retries
def test_timeout_and_retries_bound_each_search(server, dead_url):
  slow = server("slow", delay=1.0)
  client = RetrievalServerClient(slow.url, timeout_s=0.2, max_attempts=2, retry_delay_s=0.0)
  with pytest.raises(SearchError) as e:
    client.search(["q"])
  assert e.value.kind == "timeout" and "failed after 2 attempts" in str(e.value)
  assert slow.requests == 2
  failing = server("error")
  client = RetrievalServerClient(failing.url, max_attempts=3, retry_delay_s=0.0)
  with pytest.raises(SearchError) as e:
    client.search(["q"])
  assert e.value.kind == "HTTP 500" and failing.requests == 3
  client = RetrievalServerClient(dead_url, max_attempts=1)
  with pytest.raises(SearchError) as e:
    client.search(["q"])
  assert e.value.kind == "unreachable" and "ConnectionRefusedError" in str(e.value)


def test_config_keys_reach_the_client_and_the_env(server):
  from configs import search_qa

  config = search_qa.get_config("local=True")
  env_cfg = config.env
  assert (env_cfg.search_timeout_s, env_cfg.search_retries) == (30.0, 3)
  env_cfg.retriever, env_cfg.search_url = "server", server("ok").url
  env_cfg.search_timeout_s, env_cfg.search_retries, env_cfg.search_max_passage_chars = 7.5, 0, 99
  import envs

  env = envs.make("search_qa", **family.env_kwargs(env_cfg, "test"))
  assert (env.retriever.timeout_s, env.retriever.max_attempts) == (7.5, 1)
  assert env.max_passage_chars == 99


# --------------------------------------------------------------------------------- passages cut
def test_a_2mb_passage_is_cut_and_the_cut_is_marked(server):
  big = server("ok", contents=HUGE)
  env = SearchQAEnv(RECORDS, RetrievalServerClient(big.url), max_passage_chars=500)
  env.reset(task=0)
  obs = env.step("<search>big</search>")[0]
  shown = json.loads(obs.removeprefix("<information>").removesuffix("</information>"))["result"]
  cut = f"{HUGE[:500]} [... {len(HUGE) - 500} more characters cut]"
  assert shown == f"Doc 1: {cut}\n"
  assert len(obs) < 700
  whole = SearchQAEnv(RECORDS, RetrievalServerClient(big.url), max_passage_chars=0)
  whole.reset(task=0)
  assert len(whole.step("<search>big</search>")[0]) > 2_000_000
  assert (
    cut_passage("short", 500) == "short"
    and cut_passage("abcdef", 2) == "ab [... 4 more characters cut]"
  )


# -------------------------------------------------------------------------- count and warnings
def test_failed_searches_are_counted_and_warned_about_once_per_kind(server, dead_url, caplog):
  from sdar_jax.observe.metrics import search_error_count
  from sdar_jax.rollout.agent_loop import AgentLoop
  from sdar_jax.rollout.trajectory import Episode
  from sdar_jax.run.guards import RunGuards

  envs_ = [
    SearchQAEnv(RECORDS, RetrievalServerClient(url, max_attempts=1, retry_delay_s=0.0))
    for url in (dead_url, server("error").url, dead_url)
  ]
  episodes = []
  for env in envs_:  # each env's two searches fail, then it answers; as the agent loop folds them
    ep, views = Episode(env_index=0, task_id=0, group_id=0), [None]
    obs, info = env.reset(task=0)
    result = types.SimpleNamespace(observation=obs, reward=0.0, done=False, info=info, failed=False)
    AgentLoop._record_env_result(ep, views, 0, result, first=True)
    for action in ("<search>a</search>", "<search>b</search>", "<answer>x</answer>"):
      obs, reward, done, info = env.step(action)
      result = types.SimpleNamespace(observation=obs, reward=reward, done=done, info=info)
      result.failed = False
      AgentLoop._record_env_result(ep, views, 0, result, first=False)
    episodes.append(ep)
  assert [[kind for kind, _ in ep.search_errors] for ep in episodes] == [
    ["unreachable"] * 2,
    ["HTTP 500"] * 2,
    ["unreachable"] * 2,
  ]
  assert search_error_count(episodes) == 6.0
  guards = RunGuards()
  with caplog.at_level(logging.WARNING, logger="sdar_jax"):
    for _ in range(2):  # two iterations: still one warning per kind
      guards.report_search_errors(episodes, "training")
  warned = [r.getMessage() for r in caplog.records if "a search failed" in r.getMessage()]
  assert len(warned) == 2
  assert "(unreachable)" in warned[0] and dead_url in warned[0]
  assert "(HTTP 500)" in warned[1] and "rollout/search_errors" in warned[1]
