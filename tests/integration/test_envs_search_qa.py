"""Search-QA: answer normalisation and EM, action projection and malformed actions, the prompt, BM25
over a JSONL corpus (cached on disk), the retrieval-server client against a local stub server,
and the data_source skill rule. The data files and the generated world: test_search_qa_data.py."""

import http.server
import json
import os
import threading

import pytest

import envs
from envs.base import TextEnv
from envs.search_qa import (
  SearchQAEnv,
  project_action,
  prompts,
  retrieval,
  success_rates,
)
from envs.search_qa.data import DATA_SOURCES, QARecord
from envs.search_qa.retrieval import (
  BM25Retriever,
  Passage,
  RetrievalServerClient,
  SearchError,
  information_text,
)
from envs.search_qa.reward import (
  compute_score,
  em_check,
  extract_solution,
  normalize_answer,
  subem_check,
)
from envs.skills import SkillLibrary, SkillRetriever, skills_dir
from envs.skills.data_source_rules import DataSourceSkillRetriever, skill_for_data_source

# A four-passage corpus in the wiki-18 format; the expected observations below are written by hand.
CORPUS = [
  {"id": "0", "contents": '"Evan Morris"\nEvan Morris was a lobbyist born in Glen Rock.'},
  {"id": "1", "contents": '"Glen Rock"\nGlen Rock is a borough in New Jersey.'},
  {"id": "2", "contents": '"Paris"\nParis is the capital of France.'},
  {"id": "3", "contents": '"Lyon"\nLyon is a city in France on the Rhone.'},
]
RECORDS = [
  QARecord("Where was Evan Morris born?", ("Glen Rock",), "nq", "q0"),
  QARecord("What is the capital of France?", ("Paris", "City of Light"), "popqa", "q1"),
]


def _env(**kwargs):
  return SearchQAEnv(RECORDS, BM25Retriever(CORPUS), **kwargs)


# ------------------------------------------------------------------------------- normalisation
@pytest.mark.parametrize(
  "raw, normalized",
  [
    ("The  Eiffel Tower!", "eiffel tower"),
    ("U.S.A.", "usa"),  # punctuation is deleted, not replaced by a space
    ("well-known", "wellknown"),
    ("An apple a day", "apple day"),
    ("theater", "theater"),  # articles only as whole words
    ("Rock 'n' Roll", "rock n roll"),
    ("  Mira\tCastell \n", "mira castell"),
    ("1,000", "1000"),
    ("the", ""),
    ("Los Angeles, CA.", "los angeles ca"),
    ("1977\u20132000", "1977\u20132000"),  # the en dash is not ASCII punctuation
    ("A.B.", "ab"),  # one word once the dots are gone, so no article
  ],
)
def test_normalize_answer_cases(raw, normalized):
  assert normalize_answer(raw) == normalized


def test_normalize_removes_an_article_left_by_punctuation_removal():
  # "A.B." -> "ab" (one word, no article); "A. B." -> "a b" -> " b" -> "b".
  assert normalize_answer("A. B.") == "b"


def test_em_and_subem_checks():
  assert em_check("the Beatles", ["Beatles", "The Who"]) == 1
  assert em_check("Beatles!", "the beatles") == 1  # a single gold string
  assert em_check("Beatles band", ["Beatles"]) == 0
  assert subem_check("Beatles band", ["Beatles"]) == 1
  assert em_check("", ["a"]) == 1  # both normalise to ""
  assert em_check("Paris", []) == 0


def test_extract_solution_takes_the_last_answer_block():
  assert extract_solution("no answer") is None
  assert extract_solution("<answer> x </answer> then <answer>\n y \n</answer>") == "y"
  assert extract_solution("<answer>unclosed") is None


def test_compute_score_accepts_target_dict_or_list():
  assert compute_score("<answer>Paris</answer>", {"target": ["paris"]}) == 1.0
  assert compute_score("<answer>Lyon</answer>", ["Paris"]) == 0.0
  assert compute_score("<search>x</search>", ["Paris"]) == 0.0
  # One answer block is enough (verl-agent), unlike Search-R1's prompt-included scoring.
  assert compute_score("<answer>Paris</answer>", "Paris") == 1.0
  with pytest.raises(ValueError, match="target"):
    compute_score("<answer>Paris</answer>", {"answers": ["Paris"]})


# ---------------------------------------------------------------------------------- projection
@pytest.mark.parametrize(
  "text, action, valid",
  [
    ("<think>hm</think>\n<search> who is evan </search>", "<search>who is evan</search>", True),
    ("<think>ok</think><answer> Paris </answer>", "<answer>Paris</answer>", True),
    ("Paris", "", False),  # no block: empty action
    ("<search>a</search> <answer>b</answer>", "<search>a</search>", False),  # both kinds
    ("<answer>b</answer> <search>a</search>", "<search>a</search>", False),  # search wins
    ("<search>a</search><search>b</search>", "<search>a</search>", False),  # two searches
    ("<answer>a</answer> <answer>b</answer>", "<answer>a</answer>", False),  # two answers
    ("<SEARCH>Big Q</SEARCH>", "<search>Big Q</search>", True),  # tags case-insensitive
    ("<search>unclosed", "", False),
    ("<search>two\nlines</search>", "<search>two\nlines</search>", True),
    ("<answer></answer>", "<answer></answer>", True),
    ("no think tags <answer>x</answer>", "<answer>x</answer>", True),  # <think> not checked
  ],
)
def test_projection_follows_the_reference(text, action, valid):
  assert project_action(text) == (action, valid)


# ------------------------------------------------------------------------------------- the env
def test_make_registers_search_qa_and_follows_the_textenv_contract():
  env = envs.make("search_qa", split="test", seed=3)
  assert isinstance(env, SearchQAEnv) and isinstance(env, TextEnv)
  assert "search_qa" in envs.registered_names()
  question, info = env.reset(task=0)
  assert question == info["task"] and question.endswith("?")
  assert info["admissible_commands"] == [] and info["won"] is False
  assert info["task_type"] == info["data_source"] in DATA_SOURCES
  assert env.num_tasks == 700
  env.close()


def test_data_sources_filter_accepts_a_comma_string():
  env = envs.make("search_qa", split="train", data_sources="nq, hotpotqa")
  sources = {env.reset(task=i)[1]["data_source"] for i in range(env.num_tasks)}
  assert sources == {"nq", "hotpotqa"} and env.num_tasks == 600
  with pytest.raises(ValueError, match="no questions of data sources"):
    envs.make("search_qa", split="train", data_sources="squad")


def test_search_observation_is_verl_agents_json_information_block():
  env = _env()
  env.reset(task=0)
  obs, reward, done, info = env.step("<search>Evan Morris</search>")
  assert obs == (
    '<information>{"result": "Doc 1: \\"Evan Morris\\"\\nEvan Morris was a lobbyist born in Glen '
    'Rock.\\n"}</information>'
  )
  assert (reward, done, info["won"], info["tool_calling"]) == (0.0, False, False, True)
  assert info["postprocessed_action"] == "<search>Evan Morris</search>" and info["steps"] == 1


def test_search_r1_passage_format():
  env = _env(passage_format="search_r1")
  env.reset(task=0)
  obs = env.step("<search>Evan Morris</search>")[0]
  assert obs == (
    '<information>Doc 1(Title: "Evan Morris") Evan Morris was a lobbyist born in Glen Rock.'
    "</information>"
  )


def test_top3_and_no_hit_message():
  env = _env()
  env.reset(task=1)
  obs = env.step("<search>France capital Paris Lyon Glen</search>")[0]
  docs = json.loads(obs[len("<information>") : -len("</information>")])["result"]
  assert docs.count("Doc ") == 3 and docs.startswith('Doc 1: "Paris"')
  obs = env.step("<search>zebra</search>")[0]
  assert obs == '<information>{"result": "No search results found."}</information>'


def test_correct_answer_ends_with_reward_one():
  env = _env()
  env.reset(task=1)
  env.step("<search>capital of France</search>")
  obs, reward, done, info = env.step("<answer>the city of light</answer>")
  assert (obs, reward, done, info["won"], info["tool_calling"]) == ("", 1.0, True, True, False)
  assert info["steps"] == 2
  # A finished episode stays finished and pays nothing more.
  assert env.step("<answer>Paris</answer>")[1:3] == (0.0, True)


def test_wrong_answer_ends_with_reward_zero():
  env = _env()
  env.reset(task=1)
  obs, reward, done, info = env.step("<answer>Lyon</answer>")
  assert (obs, reward, done, info["won"]) == ("", 0.0, True, False)


def test_malformed_actions_are_empty_turns_until_the_fourth():
  env = _env()
  env.reset(task=0)
  for turn in (1, 2, 3):
    action, valid = project_action("I think it is Glen Rock.")
    assert (action, valid) == ("", False)
    obs, reward, done, info = env.step(action)
    assert (obs, reward, done, info["steps"]) == ("", 0.0, False, turn)
  obs, reward, done, info = env.step("")
  assert (obs, reward, done, info["won"]) == ("", 0.0, True, False)


def test_a_search_in_the_last_turn_is_not_run_and_scores_zero():
  env = _env(max_turns=2)
  env.reset(task=0)
  env.step("<search>Evan Morris</search>")
  obs, reward, done, _ = env.step("<search>Glen Rock</search>")
  assert (obs, reward, done) == ("", 0.0, True)


def test_both_tags_in_one_output_run_the_search_after_projection():
  env = _env()
  env.reset(task=0)
  action, valid = project_action("<search>Evan Morris</search><answer>Glen Rock</answer>")
  assert not valid
  obs, reward, done, _ = env.step(action)
  assert reward == 0.0
  assert obs.startswith('<information>{"result": "Doc 1: \\"Evan Morris') and not done
  # Unprojected, the same text ends the episode (it holds both answer tags), as the env's own rule.
  env.reset(task=0)
  assert env.step("<search>Evan Morris</search><answer>Glen Rock</answer>")[1:3] == (1.0, True)


def test_reset_without_task_cycles_through_a_seeded_shuffle():
  def order(seed):
    env = _env(seed=seed)
    return [env.reset()[1]["question_id"] for _ in range(4)]

  first = order(5)
  assert sorted(first[:2]) == ["q0", "q1"] and sorted(first[2:]) == ["q0", "q1"]
  assert order(5) == first
  with pytest.raises(IndexError, match="out of range"):
    _env().reset(task=2)


def test_success_rates_per_data_source():
  rates = success_rates([("nq", True), ("nq", False), ("hotpotqa", True)])
  assert rates == {"hotpotqa_success_rate": 1.0, "nq_success_rate": 0.5, "success_rate": 2 / 3}


# ----------------------------------------------------------------------------------- prompts
FIRST_PROMPT = (
  "You answer questions by reasoning step by step, looking facts up with a search engine when "
  "you need them.\n"
  "Question: Where was Evan Morris born?\n"
  "\n"
  "Respond for this step. Reason first, inside <think> </think> tags.\n"
  "Then do exactly one of the following, not both:\n"
  "(1) to look up facts you are missing, write a search query as <search> your query </search>;\n"
  "(2) once you are sure of the answer, give it alone, with no explanation, inside "
  "<answer> </answer> tags, for example <answer>Lisbon</answer>.\n"
)


def test_first_turn_prompt():
  q = "Where was Evan Morris born?"
  assert prompts.build_prompt(q, [], q) == FIRST_PROMPT
  assert (
    prompts.build_prompt(
      q, [(q, "<search>x</search>")], "<information>y</information>", history_length=0
    )
    == FIRST_PROMPT
  )


def test_later_turn_prompt_shows_step_records():
  q = "Where was Evan Morris born?"
  history = [(q, "<search>Evan Morris</search>"), ("<information>A</information>", "")]
  text = prompts.build_prompt(q, history, "")
  expected_block = (
    "Question: Where was Evan Morris born?\n"
    "\n"
    "Steps taken so far: 2. In the history below your earlier queries appear inside "
    "<search> </search> and what the search engine returned for each inside "
    "<information> </information>. History:\n"
    "Step 1:<search>Evan Morris</search> <information>A</information>\n"
    "\n"
    "Step 2: \n"
    "\n"
    "\n"
    "Respond for this step."
  )
  assert expected_block in text and text.startswith("You answer questions")
  assert text.endswith("<answer>Lisbon</answer>.\n")
  # A window of one record keeps the step numbering.
  short = prompts.build_prompt(q, history, "", history_length=1)
  assert "History:\nStep 2: \n\n\nRespond" in short and "Step 1:" not in short


def test_search_r1_prefix():
  assert prompts.search_r1_prefix("Q?").endswith(
    "For example, <answer> Beijing </answer>. Question: Q?\n"
  )


# ------------------------------------------------------------------------------ BM25 + corpus
def _write_jsonl(path, rows):
  with open(path, "w") as f:
    f.writelines(json.dumps(row) + "\n" for row in rows)


def test_bm25_corpus_file_is_indexed_once_and_cached(tmp_path, monkeypatch):
  corpus = tmp_path / "wiki-18.jsonl"
  _write_jsonl(corpus, CORPUS)
  cache = str(tmp_path / "cache")
  first = BM25Retriever.from_jsonl(str(corpus), cache_dir=cache)
  assert os.path.isfile(os.path.join(first.cache_folder, "meta.json"))
  hits = first.search(["Glen Rock borough", "zebra"], topk=3)
  assert hits[0][0] == Passage("1", CORPUS[1]["contents"], hits[0][0].score) and hits[1] == []

  def no_rebuild(*args, **kwargs):
    raise AssertionError("the cached index was rebuilt")

  monkeypatch.setattr(BM25Retriever, "_build_cache", staticmethod(no_rebuild))
  second = BM25Retriever.from_jsonl(str(corpus), cache_dir=cache)
  assert second.cache_folder == first.cache_folder
  assert second.search(["Glen Rock borough"], 3) == first.search(["Glen Rock borough"], 3)
  monkeypatch.undo()
  # A changed file gets a new index that sees the new passage.
  _write_jsonl(corpus, CORPUS + [{"id": "4", "contents": '"Zebra"\nA zebra is striped.'}])
  third = BM25Retriever.from_jsonl(str(corpus), cache_dir=cache)
  assert third.cache_folder != first.cache_folder
  assert third.search(["zebra"], 3)[0][0].id == "4"
  for r in (first, second, third):
    r.close()


def test_bad_corpus_lines_name_the_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"id": "0", "contents": "\\"A\\"\\ntext"}\n{"id": "1", "text": "no contents"}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl:2 has no string \"contents\""):
    retrieval.read_corpus_jsonl(str(path))
  path.write_text("not json\n")
  with pytest.raises(ValueError, match=r"bad.jsonl:1 is not valid JSON"):
    BM25Retriever.from_jsonl(str(path), cache_dir=str(tmp_path / "c"))


# -------------------------------------------------------------------------- retrieval server
class _StubServer:
  """A retrieval server on 127.0.0.1 (ephemeral port) that records requests and replays answers."""

  def __init__(self, replies):
    self.requests, self.replies = [], list(replies)
    stub = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        stub.requests.append((self.path, body))
        status, payload = stub.replies.pop(0) if stub.replies else (500, {})
        if callable(payload):
          payload = payload(body)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def log_message(self, *args):
        pass

    self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self.server.server_address[1]}/retrieve"
    self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
    self.thread.start()

  def close(self):
    self.server.shutdown()
    self.server.server_close()
    self.thread.join(timeout=5)


@pytest.fixture
def stub():
  servers = []

  def start(*replies):
    servers.append(_StubServer(replies))
    return servers[-1]

  yield start
  for s in servers:
    s.close()


def _search_r1_reply(body):
  """What Search-R1's server answers: one list per query of {"document", "score"}."""
  return {
    "result": [
      [{"document": CORPUS[0], "score": 0.9}, {"document": CORPUS[1], "score": 0.5}]
      for _ in body["queries"]
    ]
  }


def test_server_client_speaks_search_r1s_protocol(stub):
  server = stub((200, _search_r1_reply))
  client = RetrievalServerClient(server.url)
  hits = client.search(["who is evan morris", "glen rock"], topk=3)
  assert server.requests == [
    (
      "/retrieve",
      {"queries": ["who is evan morris", "glen rock"], "topk": 3, "return_scores": True},
    )
  ]
  assert [[p.id for p in h] for h in hits] == [["0", "1"], ["0", "1"]]
  assert hits[0][0] == Passage("0", CORPUS[0]["contents"], 0.9)


def test_server_client_verl_agent_protocol_and_bare_documents(stub):
  server = stub((200, {"result": [[CORPUS[2]]]}))
  client = RetrievalServerClient(server.url, protocol="verl_agent")
  assert client.search(["capital"], topk=3) == [[Passage("2", CORPUS[2]["contents"], 0.0)]]
  assert server.requests == [("/retrieve", {"query": "capital", "topk": 3, "return_scores": True})]


def test_server_client_retries_server_errors(stub):
  server = stub((503, {}), (502, {}), (200, _search_r1_reply))
  client = RetrievalServerClient(server.url, retry_delay_s=0.0)
  assert client.search(["q"])[0][0].id == "0" and len(server.requests) == 3
  server = stub((503, {}), (503, {}))
  client = RetrievalServerClient(server.url, retry_delay_s=0.0, max_attempts=2)
  with pytest.raises(SearchError, match="failed after 2 attempts"):
    client.search(["q"])


def test_env_through_the_server_shows_the_same_observation_and_errors(stub):
  server = stub((200, _search_r1_reply), (400, {"detail": "bad"}))
  client = RetrievalServerClient(server.url, retry_delay_s=0.0)
  env = SearchQAEnv(RECORDS, client)
  env.reset(task=0)
  obs = env.step("<search>Evan Morris</search>")[0]
  assert (
    obs
    == "<information>"
    + information_text([Passage("0", CORPUS[0]["contents"]), Passage("1", CORPUS[1]["contents"])])
    + "</information>"
  )
  obs, _, done, info = env.step("<search>again</search>")
  assert obs.startswith('<information>{"result": "Search error: HTTP 400 from ') and not done
  assert "search_error" in info
  assert env.step("<answer>Glen Rock</answer>")[1] == 1.0


def test_make_with_search_url_uses_the_server(stub):
  server = stub((200, _search_r1_reply))
  env = envs.make("search_qa", split="test", search_url=server.url)
  env.reset(task=0)
  assert '"Evan Morris' in env.step("<search>anything</search>")[0]
  assert server.requests[0][1]["queries"] == ["anything"]


# ----------------------------------------------------------------------------------- skills
SEARCH_FILES = {
  "direct_retrieval": "direct_retrieval.md",
  "multi_hop_reasoning": "multi_hop_reasoning.md",
  "entity_attribute_lookup": "entity_attribute_lookup.md",
  "compare": "compare.md",
}


def _skill_file(name):
  with open(os.path.join(skills_dir("search"), name)) as f:
    return f.read().strip()


def test_search_skill_library_has_the_reference_shape():
  library = SkillLibrary.load("search")
  assert len(library.general.items) == 10
  assert {name: len(f.items) for name, f in library.tasks.items()} == dict.fromkeys(SEARCH_FILES, 5)
  assert library.task_keywords == {}  # Search has no keyword rule (Skill-GRPO: general only)


@pytest.mark.parametrize(
  "source, skill",
  [
    ("popqa", "entity_attribute_lookup"),
    ("nq", "direct_retrieval"),
    ("triviaqa", "direct_retrieval"),
    ("hotpotqa", "multi_hop_reasoning"),
    ("2wikimultihopqa", "multi_hop_reasoning"),
    ("musique", "multi_hop_reasoning"),
    ("bamboogle", "multi_hop_reasoning"),
    ("squad", None),
  ],
)
def test_data_source_rule(source, skill):
  assert skill_for_data_source(source, "When was X founded?") == skill
  general = _skill_file("general_skills.md")
  expected = general + ("\n\n" + _skill_file(SEARCH_FILES[skill]) if skill else "")
  for version in ("pre_fix", "post_fix"):  # the fix did not change Search's rule
    retriever = DataSourceSkillRetriever("search", rules_version=version)
    assert retriever.skill_text(task_type=source, query="When was X founded?") == expected
  if skill:  # the plain retriever's post-fix task mapping agrees
    assert SkillRetriever("search").skill_text(task_type=source) == expected


def test_compare_rule_reads_the_prompt_text():
  question = "Which company was founded first, Alpha Works or Beta Labs?"
  assert skill_for_data_source("musique", question) == "compare"
  assert skill_for_data_source("bamboogle", question) == "compare"
  assert skill_for_data_source("squad", question) == "compare"
  assert skill_for_data_source("hotpotqa", question) == "multi_hop_reasoning"  # checked earlier
  assert skill_for_data_source("nq", question) == "direct_retrieval"
  # "for" anywhere (also inside a word) turns it off; so does the whole verl-agent prompt.
  assert (
    skill_for_data_source("musique", "Which was built before, A or B?") == "multi_hop_reasoning"
  )
  assert (
    skill_for_data_source("musique", "Which was first, A or B, in California?")
    == "multi_hop_reasoning"
  )
  prompt = prompts.build_prompt(question, [], question)
  assert skill_for_data_source("2wikimultihopqa", prompt) == "multi_hop_reasoning"
  block = DataSourceSkillRetriever().privileged_block(task_type="musique", query=question)
  assert block.startswith("[Privileged Skill Information]\n### GENERAL SKILLS ###")
  assert "### TASK: compare ###" in block
