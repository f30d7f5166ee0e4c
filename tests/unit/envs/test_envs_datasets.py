"""The tfds builders of envs.datasets (ArrayRecord, read with tfds.data_source, no TensorFlow):
built from small files written here in the real formats (WebShop's three JSON files, Search-R1's
and verl-agent's parquet files with a wiki-18 JSONL corpus, an ALFWorld folder tree) and from
the generated data; environments built on a dataset play as on the files it came from."""

from __future__ import annotations

import json
import os
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import envs
from envs import datasets
from envs.search_qa import read_parquet
from envs.webshop import data as webshop_data

# ------------------------------------------------------------------------------------ WebShop
OPTIONS = {
  "Color": [{"value": "Navy Blue", "image": None}, {"value": "Red", "image": "https://i/r.jpg"}],
  "Size": [{"value": "Small", "image": None}, {"value": "Large", "image": None}],
}
PRODUCTS = [
  {
    "asin": "B000000001",
    "name": "Cotton Crew Sock",
    "full_description": "Soft socks.",
    "small_description": ["Breathable cotton"],
    "pricing": "$9.99",
    "customization_options": OPTIONS,
    "images": ["https://i/1.jpg"],
    "category": "fashion",
    "query": "socks",
    "product_category": "Clothing › Socks",
  },
  {
    "asin": "B000000002",
    "name": "Steel Water Bottle",
    "full_description": "Keeps cold.",
    "small_description": "Leak proof",
    "pricing": "$15.00 - $25.00",
    "customization_options": None,
    "images": ["https://i/2.jpg"],
    "category": "sports",
    "query": "water bottle",
    "product_category": "Sports › Bottles",
  },
  {  # no instruction in the attribute file: a product without goals
    "asin": "B000000003",
    "name": "Plain Mug",
    "full_description": "",
    "small_description": [],
    "pricing": "",
    "customization_options": None,
    "images": [],
    "category": "home",
    "query": "mug",
    "product_category": "Home › Mugs",
  },
  {"asin": "B000000001", "name": "a duplicate asin", "pricing": "$1.00"},  # dropped
]
ATTRIBUTES = {
  "B000000001": {
    "attributes": ["cotton", "breathable"],
    "instruction": "i need cotton crew socks",
    "instruction_attributes": ["cotton"],
  },
  "B000000002": {
    "attributes": ["leak proof"],
    "instruction": "i want a leak proof steel water bottle",
    "instruction_attributes": ["leak proof"],
  },
  "B000000003": {"attributes": ["ceramic"]},
}
HUMAN = {
  "B000000001": [
    {
      "instruction": "I want red cotton socks, large.",
      "instruction_attributes": ["cotton"],
      "instruction_options": ["red", "large"],
    }
  ]
}


def _write_webshop(folder) -> str:
  os.makedirs(folder, exist_ok=True)
  for name, content in zip(webshop_data.data_file_names(True), (PRODUCTS, ATTRIBUTES, HUMAN)):
    with open(os.path.join(folder, name), "w") as f:
      json.dump(content, f, ensure_ascii=False)
  return str(folder)


def _texts(source, key):
  return [source[k][key].decode() for k in range(len(source))]


def test_webshop_dataset_from_the_real_file_formats(tmp_path):
  files = _write_webshop(tmp_path / "webshop")
  folder = datasets.build("webshop", str(tmp_path / "tfds"), files)
  assert folder == str(tmp_path / "tfds" / "webshop_data" / "1.0.0")
  products = datasets.data_source(folder, "products")
  # Every record of the product file, in file order, kept raw (the loader's cleaning comes later).
  assert [json.loads(p) for p in _texts(products, "product")] == PRODUCTS
  assert json.loads(products[0]["attributes"]) == ATTRIBUTES["B000000001"]
  assert json.loads(products[0]["human_instructions"]) == HUMAN["B000000001"]
  # Synthetic goals: one per option combination of a product with an instruction: 2 x 2 socks
  # goals and 1 bottle goal; the mug has none. 5 goals < 500: all are test goals, no train split.
  test = datasets.data_source(folder, "test")
  assert [int(test[k]["goal_index"]) for k in range(len(test))] == [0, 1, 2, 3, 4]
  instructions = sorted(_texts(test, "instruction_text"))
  assert sum(t.startswith("i need cotton crew socks with color: ") for t in instructions) == 4
  assert sum(t.startswith("i want a leak proof steel water bottle") for t in instructions) == 1
  assert any("color: navy blue, and size: large" in t for t in instructions)
  with pytest.raises(ValueError, match="splits"):
    datasets.data_source(folder, "train")
  # The catalogue rebuilt from the dataset is the one the files give.
  catalogue = datasets.webshop_catalogue(str(tmp_path / "tfds"))
  assert catalogue.goals == webshop_data.load_catalogue(files).goals
  assert [json.loads(g) for g in _texts(test, "goal")] == catalogue.goals


def test_webshop_human_goal_dataset_and_setting_mismatch(tmp_path):
  files = _write_webshop(tmp_path / "webshop")
  out = str(tmp_path / "tfds")
  datasets.build("webshop", out, files, human_goals=True)
  test = datasets.data_source(out + "/webshop_data/1.0.0", "test")
  assert len(test) == 1 and json.loads(test[0]["goal"])["goal_options"] == ["red", "large"]
  with pytest.raises(ValueError, match="built with human_goals=True"):
    envs.make("webshop", data_dir=out, split="test")
  env = envs.make("webshop", data_dir=out, split="test", human_goals=True)
  assert env.reset(task=0)[0].startswith("WebShop [SEP] Instruction: [SEP] I want red cotton socks")


def test_webshop_env_on_a_dataset_plays_as_on_its_files(tmp_path):
  from envs.webshop.generator import write_files

  files = str(tmp_path / "files")
  write_files(files, num_products=150, seed=4)  # the three files in the small-set names
  out = str(tmp_path / "tfds")
  datasets.build("webshop", out, files)
  on_files = envs.make("webshop", data_dir=files, split="train", noun_extractor="rule_based")
  on_dataset = envs.make("webshop", data_dir=out, split="train", noun_extractor="rule_based")
  assert on_files.num_tasks == on_dataset.num_tasks > 0
  for task in (0, on_files.num_tasks - 1):
    first = on_files.reset(task=task)
    assert on_dataset.reset(task=task) == first
    done = False
    while not done:
      action = on_files.expert_action()
      step = on_files.step(action)
      assert on_dataset.step(action) == step
      done = step[2]
    assert step[1] == 10.0


# ------------------------------------------------------------------------------------ Search-QA
CORPUS = [
  {"id": "0", "contents": '"Evan Morris"\nEvan Morris was a lobbyist born in Glen Rock.'},
  {"id": "1", "contents": '"Glen Rock"\nGlen Rock is a borough in New Jersey.'},
  {"id": "2", "contents": '"Paris"\nParis is the capital of France.'},
]


def _search_r1_row(index, question, answers, source, split):
  return {
    "id": f"{split}_{index}",
    "question": question,
    "golden_answers": answers,
    "data_source": source,
    "prompt": [{"role": "user", "content": "Answer the given question. ..."}],
    "ability": "fact-reasoning",
    "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
    "extra_info": {"split": split, "index": index},
  }


def _write_search_qa(folder) -> str:
  os.makedirs(folder, exist_ok=True)
  train = [_search_r1_row(0, "Where was Evan Morris born?", ["Glen Rock"], "nq", "train")]
  test = [
    _search_r1_row(0, "What is the capital of France?", ["Paris"], "popqa", "test"),
    _search_r1_row(1, "In which state is Glen Rock?", ["New Jersey", "NJ"], "hotpotqa", "test"),
  ]
  verl_agent = [  # verl-agent's processed layout: the question and answers in env_kwargs
    {
      "data_source": "bamboogle",
      "prompt": [{"role": "user", "content": "Who was born in Glen Rock?"}],
      "ability": "fact-reasoning",
      "reward_model": {"style": "rule", "ground_truth": {"target": ["Evan Morris"]}},
      "extra_info": {"index": 0, "split": "test"},
      "env_kwargs": {
        "ground_truth": {"target": ["Evan Morris"]},
        "question": "Who was born in Glen Rock?",
        "data_source": "bamboogle",
      },
    }
  ]
  pq.write_table(pa.Table.from_pylist(train), os.path.join(folder, "train.parquet"))
  pq.write_table(pa.Table.from_pylist(test), os.path.join(folder, "test.parquet"))
  pq.write_table(pa.Table.from_pylist(verl_agent), os.path.join(folder, "extra.parquet"))
  with open(os.path.join(folder, "wiki-18.jsonl"), "w") as f:
    f.writelines(json.dumps(p) + "\n" for p in CORPUS)
  return str(folder)


def test_search_qa_dataset_from_search_r1_files(tmp_path):
  files = _write_search_qa(tmp_path / "search_r1")
  out = str(tmp_path / "tfds")
  folder = datasets.build("search_qa", out, files)
  for split in ("train", "test", "extra"):
    assert datasets.search_qa_records(out, split) == read_parquet(f"{files}/{split}.parquet")
  (extra,) = datasets.search_qa_records(out, "extra")
  assert (extra.question, extra.golden_answers) == ("Who was born in Glen Rock?", ("Evan Morris",))
  assert list(datasets.search_qa_passages(folder)) == CORPUS
  # The env on the dataset: BM25 over its corpus split, the answer scored by EM.
  env = envs.make("search_qa", data_dir=out, split="test")
  assert env.reset(task=1)[0] == "In which state is Glen Rock?"
  observation = env.step("<search>Glen Rock borough</search>")[0]
  assert observation.startswith('<information>{"result": "Doc 1: \\"Glen Rock\\"\\nGlen Rock is')
  assert env.step("<answer>nj</answer>")[1:3] == (1.0, True)


def test_search_qa_dataset_of_the_generated_world(tmp_path):
  out = str(tmp_path / "tfds")
  datasets.build("search_qa", out)
  generated = envs.make("search_qa", split="test")
  on_dataset = envs.make("search_qa", data_dir=out, split="test")
  assert on_dataset.records == generated.records and on_dataset.num_tasks == 700
  question = generated.records[5]
  query = f"<search>{question.metadata['hops'][0]['query']}</search>"
  assert generated.reset(task=5) == on_dataset.reset(task=5)
  assert generated.step(query) == on_dataset.step(query)


# ------------------------------------------------------------------------------------ ALFWorld
def _write_alfworld(root) -> list[str]:
  """An ALFWorld json_2.1.1 tree of minimal game files (enough to list them, not to play)."""
  games = []
  for split, folder, solvable in (
    ("train", "pick_and_place_simple-Apple-None-Fridge-1", True),
    ("train", "pick_clean_then_place_in_recep-Cup-None-Sink-2", True),
    ("train", "pick_heat_then_place_in_recep-Egg-None-Microwave-3", False),  # not listed
    ("train", "pick_and_place_simple-Apple-None-Fridge-1-movable", True),  # not listed
    ("valid_seen", "look_at_obj_in_light-Book-None-DeskLamp-4", True),
  ):
    path = os.path.join(root, "json_2.1.1", split, folder, "trial_T1", "game.tw-pddl")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
      json.dump({"pddl_domain": "", "grammar": "", "pddl_problem": "", "solvable": solvable}, f)
    games.append(path)
  return games


def test_alfworld_game_lists(tmp_path):
  root = str(tmp_path / "alfworld")
  games = _write_alfworld(root)
  out = str(tmp_path / "tfds")
  folder = datasets.build("alfworld", out, root)
  assert datasets.alfworld_game_files(out, "train") == sorted(games[:2])
  assert datasets.alfworld_game_files(out, "valid_seen") == [games[4]]
  assert _texts(datasets.data_source(folder, "train"), "task_type") == [
    "pick_and_place_simple",
    "pick_clean_then_place_in_recep",
  ]
  moved = datasets.alfworld_game_files(out, "train", data_dir="/mnt/alfworld")
  assert moved[0] == "/mnt/alfworld/json_2.1.1/train/" + games[0].split("/train/")[1]
  with pytest.raises(ValueError, match="not 'valid_unseen'"):
    datasets.alfworld_game_files(out, "valid_unseen")


# ------------------------------------------------------------------------------------ common
def test_shards_cover_a_task_list_once():
  shards = [datasets.shard(range(10), host, 3) for host in range(3)]
  assert shards == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
  with pytest.raises(ValueError, match="host 3"):
    datasets.shard(range(10), 3, 3)


def test_one_command_builds_and_needs_no_tensorflow(tmp_path, capsys):
  from envs.datasets.__main__ import main

  main(["webshop", "--out", str(tmp_path), "--data_dir", _write_webshop(tmp_path / "files")])
  folder = capsys.readouterr().out.strip().splitlines()[-1]
  assert datasets.find_dataset(str(tmp_path), "webshop_data") == folder
  assert len(datasets.data_source(folder, "test")) == 5
  assert "tensorflow" not in sys.modules  # tensorflow_datasets runs without TensorFlow
  # a --data_dir that does not exist is an error, not a silent build from generated data
  with pytest.raises(SystemExit) as exit_info:
    main(["search_qa", "--out", str(tmp_path), "--data_dir", str(tmp_path / "nowhere")])
  assert exit_info.value.code == 2
  assert "no such folder. Fix: point it at the real search_qa files" in capsys.readouterr().err


def test_missing_dataset_names_the_build_command(tmp_path):
  with pytest.raises(FileNotFoundError, match="python -m envs.datasets webshop"):
    datasets.webshop_catalogue(str(tmp_path))
