"""Search-QA's data: Search-R1 and verl-agent parquet files read and written, and the generated
world (deterministic per seed, disjoint labelled splits, every answer supported by retrievable
passages, an oracle answers every test question within 4 turns, multi-hop answers need the
bridge entity first, the written files read back by make)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import envs
from envs.search_qa import generator as gen
from envs.search_qa import project_action, prompts, read_parquet, success_rates
from envs.search_qa.data import DATA_SOURCES, QARecord, write_parquet


# ---------------------------------------------------------------------------------- parquet
def _search_r1_parquet(path):
  """Rows as Search-R1's qa_search_test_merge.py writes them (FlashRAG columns + added ones)."""
  rows = []
  for i, (q, answers, source) in enumerate(
    [
      ("Where was Evan Morris born?", ["Glen Rock"], "nq"),
      ("capital of france?", ["Paris"], "popqa"),
    ]
  ):
    rows.append(
      {
        "id": f"test_{i}",
        "question": q,
        "golden_answers": answers,
        "metadata": {"note": "flashrag"},
        "data_source": source,
        "prompt": [{"role": "user", "content": prompts.search_r1_prefix(q)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
        "extra_info": {"split": "test", "index": i},
      }
    )
  pq.write_table(pa.Table.from_pylist(rows), path)


def _verl_agent_parquet(path):
  """Rows as verl-agent's preprocess_search_r1_dataset.py writes them (no question column)."""
  rows = []
  for i, (q, answers, source) in enumerate(
    [("Where was Evan Morris born?", ["Glen Rock"], "hotpotqa")]
  ):
    gt = {"target": answers}
    rows.append(
      {
        "data_source": source,
        "prompt": [
          {"role": "system", "content": "You are a helpful and harmless assistant."},
          {"role": "user", "content": q},
        ],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": gt},
        "metadata": None,
        "extra_info": {
          "index": i,
          "need_tools_kwargs": True,
          "question": q,
          "split": "train",
          "tools_kwargs": {
            "search": {"create_kwargs": {"ground_truth": gt, "question": q, "data_source": source}}
          },
        },
        "env_kwargs": {"ground_truth": gt, "question": q, "data_source": source},
      }
    )
  pq.write_table(pa.Table.from_pylist(rows), path)


def test_reads_search_r1_and_verl_agent_parquet(tmp_path):
  _search_r1_parquet(tmp_path / "test.parquet")
  _verl_agent_parquet(tmp_path / "train.parquet")
  records = read_parquet(str(tmp_path / "test.parquet"))
  assert [(r.question, r.golden_answers, r.data_source, r.id) for r in records] == [
    ("Where was Evan Morris born?", ("Glen Rock",), "nq", "test_0"),
    ("capital of france?", ("Paris",), "popqa", "test_1"),
  ]
  (record,) = read_parquet(str(tmp_path / "train.parquet"))
  assert (record.question, record.golden_answers, record.data_source, record.id) == (
    "Where was Evan Morris born?",
    ("Glen Rock",),
    "hotpotqa",
    "0",
  )
  assert read_parquet(str(tmp_path / "test.parquet"), ["popqa"])[0].id == "test_1"


def test_make_reads_a_data_dir_with_parquet_and_wiki18_corpus(tmp_path):
  _search_r1_parquet(tmp_path / "test.parquet")
  passages = [  # the wiki-18 format
    {"id": "0", "contents": '"Evan Morris"\nEvan Morris was a lobbyist born in Glen Rock.'},
    {"id": "1", "contents": '"Paris"\nParis is the capital of France.'},
  ]
  (tmp_path / "wiki-18.jsonl").write_text("".join(json.dumps(p) + "\n" for p in passages))
  env = envs.make("search_qa", data_dir=str(tmp_path), split="test", index_dir=str(tmp_path / "ix"))
  question, info = env.reset(task=0)
  assert (question, info["data_source"]) == ("Where was Evan Morris born?", "nq")
  assert "Glen Rock" in env.step("<search>Evan Morris</search>")[0]
  assert env.step("<answer>glen rock</answer>")[1:3] == (1.0, True)
  with pytest.raises(FileNotFoundError, match="no validation.parquet"):
    envs.make("search_qa", data_dir=str(tmp_path), split="validation")


def test_write_parquet_round_trips(tmp_path):
  records = [QARecord("Q1?", ("a", "b"), "musique", "x1", {"kind": "bridge", "hops": []})]
  write_parquet(records, str(tmp_path / "t.parquet"), "test")
  table = pq.read_table(str(tmp_path / "t.parquet")).to_pylist()
  assert table[0]["reward_model"] == {"style": "rule", "ground_truth": {"target": ["a", "b"]}}
  assert table[0]["prompt"][0]["content"] == prompts.search_r1_prefix("Q1?")
  assert read_parquet(str(tmp_path / "t.parquet")) == records


# --------------------------------------------------------------------------- generated data
@pytest.fixture(scope="module")
def offline():
  return gen.offline_data(0)


def test_generation_is_deterministic_and_seeded(offline):
  again = gen.generate(0)
  assert again.passages == offline.passages
  assert again.splits == offline.splits
  other = gen.generate(1)
  assert other.passages != offline.passages


def test_splits_are_disjoint_and_labelled(offline):
  test, train = offline.splits["test"], offline.splits["train"]
  assert {r.data_source for r in test} == set(DATA_SOURCES)
  assert {r.data_source for r in train} == set(DATA_SOURCES)
  for source in DATA_SOURCES:
    assert sum(r.data_source == source for r in test) == 100
  assert not {(r.data_source, r.question) for r in test} & {
    (r.data_source, r.question) for r in train
  }
  kinds = {r.data_source: set() for r in test}
  for r in test:
    kinds[r.data_source].add(r.metadata["kind"])
  assert kinds["nq"] == kinds["triviaqa"] == kinds["popqa"] == {"single"}
  for source in ("2wikimultihopqa", "musique", "bamboogle"):
    assert "single" not in kinds[source]
  assert kinds["hotpotqa"] == {"bridge", "comparison"}
  assert offline.dropped == 0


def test_every_answer_is_supported_by_corpus_passages(offline):
  by_title = {p["contents"].split("\n")[0].strip('"'): p["contents"] for p in offline.passages}
  for r in offline.splits["test"] + offline.splits["train"]:
    hops = r.metadata["hops"]
    assert 1 <= len(hops) <= 3
    for hop in hops:
      assert hop["reveals"] in by_title[hop["title"]]
    if r.metadata["kind"] != "comparison":
      assert r.golden_answers == (hops[-1]["reveals"],)
      assert r.golden_answers[0] in by_title[hops[-1]["title"]]
    else:
      assert len(hops) == 2 and r.golden_answers[0] in {
        "yes",
        "no",
        hops[0]["title"],
        hops[1]["title"],
      }
    if r.metadata["kind"] != "single":
      assert len(hops) >= 2


def _oracle_answer(record, revealed):
  """What an oracle concludes from the facts it read (not from the gold label)."""
  kind = record.metadata["kind"]
  if kind != "comparison":
    return revealed[-1]
  (a, b), titles = revealed, [h["title"] for h in record.metadata["hops"]]
  if record.question.startswith("Were "):
    return "yes" if a == b else "no"
  return titles[0] if int(a) < int(b) else titles[1]


def test_oracle_answers_every_generated_test_question_within_the_turn_limit(offline):
  env = envs.make("search_qa", split="test")
  won = []
  for task in range(env.num_tasks):
    question, info = env.reset(task=task)
    record = env.records[task]
    revealed = []
    for hop in record.metadata["hops"]:
      # The oracle reads each bridge entity from the passages before it searches with it.
      assert not revealed or revealed[-1] in hop["query"] or record.metadata["kind"] != "bridge"
      action, valid = project_action(f"<think>next link</think>\n<search>{hop['query']}</search>")
      obs, reward, done, info = env.step(action)
      assert valid and not done and reward == 0.0
      assert f'\\"{hop["title"]}\\"' in obs, (question, hop)
      assert hop["reveals"] in obs
      revealed.append(hop["reveals"])
    action, valid = project_action(
      f"<think>done</think><answer>{_oracle_answer(record, revealed)}</answer>"
    )
    obs, reward, done, info = env.step(action)
    assert done and info["steps"] <= 4
    won.append((info["data_source"], info["won"]))
    assert reward == 1.0, (question, revealed, record.golden_answers)
  assert success_rates(won)["success_rate"] == 1.0 and len(won) == 700


def test_multi_hop_answers_need_the_bridge_entity_first(offline):
  """Searching the question itself does not retrieve the answer for most bridge questions."""
  env = envs.make("search_qa", split="test")
  blocked = total = 0
  for task, record in enumerate(env.records):
    if record.metadata["kind"] != "bridge":
      continue
    env.reset(task=task)
    obs = env.step(f"<search>{record.question}</search>")[0]
    final_title = record.metadata["hops"][-1]["title"]
    total += 1
    blocked += record.golden_answers[0] not in obs and f'\\"{final_title}\\"' not in obs
  assert total >= 300 and blocked / total > 0.75


def test_generator_writes_real_formats_that_make_reads(tmp_path):
  spec = gen.WorldSpec(test_per_source=5, train_per_source=5)
  summary = gen.write_dataset(str(tmp_path), seed=2, spec=spec)
  assert summary["test_questions"] == 35 and summary["dropped_unretrievable"] == 0
  with open(tmp_path / "corpus.jsonl") as f:
    first = json.loads(f.readline())
  assert set(first) == {"id", "contents"} and first["contents"].startswith('"')
  env = envs.make("search_qa", data_dir=str(tmp_path), split="test", index_dir=str(tmp_path / "ix"))
  assert env.num_tasks == 35
  record = env.records[0]
  env.reset(task=0)
  hop = record.metadata["hops"][0]
  assert hop["reveals"] in env.step(f"<search>{hop['query']}</search>")[0]
