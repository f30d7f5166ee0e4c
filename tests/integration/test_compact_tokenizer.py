"""The compact ALFWorld tokenizer (sdar_jax/assets/tokenizers/alfworld_compact) and its build script.

Environment text from games generated here (a seed the committed corpus did not use) round-trips
exactly, also as the token bytes the sampler matches stop strings on; the Qwen3 chat template keeps
its tokens as single ids and transformers (the published jinja template, its own tokenizer class)
renders and encodes the same; an HF export carries the folder; prompts are shorter than with the
full Qwen tokenizer; the build script is deterministic on a tiny corpus, across processes.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess
import sys

import pytest

from sdar_jax.core.stop_strings import stop_string_table
from sdar_jax.text.chat_templates import ChatTemplate
from sdar_jax.text.tokenizer import Tokenizer
from sdar_jax.tools import build_compact_tokenizer as build

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
SKILLS_DIR = REPO / "envs" / "skills" / "alfworld"
QWEN3_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
ACTION_TAGS = ("<action>", "</action>")
QWEN3 = ChatTemplate.builtin("qwen3")


@pytest.fixture(scope="module")
def compact() -> Tokenizer:
  return Tokenizer.from_dir(build.DEFAULT_OUT_DIR)


def _single_id(tokenizer: Tokenizer, text: str) -> int:
  """The one id `text` encodes to (an added token's id)."""
  (token_id,) = tokenizer.encode(text)
  return token_id


@pytest.fixture(scope="module")
def games(tmp_path_factory) -> list[dict]:
  """Two games generated with seed 11 (the committed corpus used seed 0), each step's observation
  and admissible commands from the walkthrough, plus a short random walk on the env."""
  from envs.alfworld import AlfworldEnv
  from envs.alfworld import engine as engine_lib
  from envs.alfworld.generator import generate_game

  out = str(tmp_path_factory.mktemp("compact_tokenizer_games"))
  engine = engine_lib.start_engine()
  try:
    made = [
      generate_game(out, "train", "pick_heat_then_place_in_recep", 0, seed=11, engine=engine),
      generate_game(out, "valid_unseen", "look_at_obj_in_light", 0, seed=11, engine=engine),
    ]
  finally:
    engine.close()
    engine_lib.release_engine(engine)
  env = AlfworldEnv([g.gamefile for g in made], seed=0, max_steps=50)
  rng = random.Random(0)
  records = []
  try:
    for index, game in enumerate(made):
      walk = []
      observation, info = env.reset(task=index)
      for _ in range(6):
        action = rng.choice(info["admissible_commands"] + ["jump around"])
        walk.append((observation, list(info["admissible_commands"]), action))
        observation, _, done, info = env.step(action)
        if done:
          break
      records.append(
        {
          "task": game.task,
          "task_type": game.task_type,
          "expert": [(s["observation"], s["admissible_commands"], s["action"]) for s in game.steps],
          "walk": walk,
        }
      )
  finally:
    env.close()
  return records


def _prompts(record: dict, which: str) -> list[str]:
  """Chat-templated (Qwen3, non-thinking) user turns of one episode, as the agent loop builds them."""
  from envs.alfworld.prompts import build_prompt

  history, out = [], []
  for observation, admissible, action in record[which]:
    user = build_prompt(record["task"], history, observation, admissible, step=len(history))
    out.append(QWEN3.render([{"role": "user", "content": user}]))
    history.append((observation, action))
  return out


def _environment_strings(games: list[dict]) -> list[str]:
  texts = []
  for record in games:
    texts.append(record["task"])
    for which in ("expert", "walk"):
      for observation, admissible, action in record[which]:
        texts.extend([observation, action, *admissible])
      texts.extend(_prompts(record, which))
  texts.extend(p.read_text(encoding="utf-8") for p in sorted(SKILLS_DIR.glob("*.md")))
  return texts


# ------------------------------------------------------------------------------------ vocabulary
def test_size_added_tokens_and_special_ids(compact):
  assert 1024 <= compact.vocab_size <= build.VOCAB_SIZE
  added = [*QWEN3_TOKENS, *ACTION_TAGS]
  last_ids = range(compact.vocab_size - len(added), compact.vocab_size)
  assert [_single_id(compact, text) for text in added] == list(last_ids)
  ids = {text: _single_id(compact, text) for text in added}
  # Only <|endoftext|>, <|im_start|> and <|im_end|> are special: decoding skips them alone.
  every_added = compact.decode(list(last_ids), skip_special_tokens=True)
  assert every_added == "<think></think><action></action>"
  assert compact.eos_token_ids == (ids["<|im_end|>"], ids["<|endoftext|>"])
  assert compact.pad_token_id == ids["<|endoftext|>"] != 0
  # Every byte on its own is a token, so any string (not only the corpus's) can be encoded.
  singles = {b for b in compact.all_token_bytes() if len(b) == 1}
  assert singles == {bytes([i]) for i in range(256)}


# ----------------------------------------------------------------------------------- round trip
ODD_STRINGS = (
  "",
  " ",
  "  leading and trailing spaces  ",
  "tabs\tand\r\nwindows newlines\n\n\n",
  "café naïve Å (decomposed: cafe\u0301)",
  "你好，世界 🌍🤖 ∑∞ emoji and CJK",
  "\x00\x01\x7f control bytes",
  "<|im_start|>user\n<think></think><action>go to cabinet 27</action><|im_end|>",
  "<action>take apple 123 from countertop 4</action>",
)


def test_environment_strings_round_trip_exactly(compact, games):
  texts = _environment_strings(games) + list(ODD_STRINGS)
  assert len(texts) > 100
  token_bytes = compact.all_token_bytes()
  for text in texts:
    ids = compact.encode(text)
    assert compact.decode(ids) == text
    # The sampler matches stop strings on these bytes: they must spell the text exactly.
    assert b"".join(token_bytes[i] for i in ids) == text.encode("utf-8")
  assert compact.decode_batch([compact.encode(text) for text in texts]) == texts


def test_response_keeps_its_tags_when_special_tokens_are_skipped(compact):
  from envs.alfworld import project_action

  response = "<think>The plate is in the cabinet.</think>\n<action>go to cabinet 3</action>"
  ids = compact.encode(response) + [compact.eos_token_ids[0]]
  assert compact.encode("<action>") == [_single_id(compact, "<action>")]
  text = compact.decode(ids, skip_special_tokens=True)
  assert text == response
  assert project_action(text) == ("go to cabinet 3", True)


# -------------------------------------------------------------------------------- chat template
CONVERSATION = [
  {"role": "system", "content": "You are a household agent."},
  {"role": "user", "content": "Your task is to: put a clean mug in coffeemachine."},
  {"role": "assistant", "content": "<think>\nFind the mug.\n</think>\n\n<action>look</action>"},
  {"role": "user", "content": "You arrive at countertop 1. On the countertop 1, you see a mug 2."},
]


def test_qwen3_template_tokens_are_single_ids(compact):
  text = QWEN3.render(CONVERSATION, add_generation_prompt=True)
  ids = compact.encode(text)
  for token in (*QWEN3_TOKENS, *ACTION_TAGS):
    assert ids.count(_single_id(compact, token)) == text.count(token), token
  assert ids.count(_single_id(compact, "<|im_start|>")) == len(CONVERSATION) + 1  # + generation
  assert ids[0] == _single_id(compact, "<|im_start|>")
  # The non-thinking generation prompt of Qwen3: "<|im_start|>assistant\n<think>\n\n</think>\n\n".
  tail = [
    _single_id(compact, "<|im_start|>"),
    *compact.encode("assistant\n"),
    _single_id(compact, "<think>"),
    *compact.encode("\n\n"),
    _single_id(compact, "</think>"),
    *compact.encode("\n\n"),
  ]
  assert ids[-len(tail) :] == tail
  assert compact.decode(ids) == text


@pytest.mark.parametrize("enable_thinking", [False, True])
def test_transformers_loads_it_and_agrees(compact, enable_thinking):
  transformers = pytest.importorskip("transformers")
  hf = transformers.AutoTokenizer.from_pretrained(str(build.DEFAULT_OUT_DIR))
  rendered = hf.apply_chat_template(
    CONVERSATION, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
  )
  ours = QWEN3.render(CONVERSATION, True, enable_thinking=enable_thinking)
  assert rendered == ours
  assert hf.encode(ours, add_special_tokens=False) == compact.encode(ours)
  assert hf.eos_token == "<|im_end|>" and hf.eos_token_id == compact.eos_token_ids[0]
  assert hf.pad_token_id == compact.pad_token_id
  assert len(hf) == compact.vocab_size
  assert hf.decode(compact.encode(ours)) == ours


# ---------------------------------------------------------------------------------- stop strings
def _first_stop(table, ids: list[int]) -> int | None:
  """Index of the token at which the stop-string automaton first reports a match."""
  state = 0
  for k, token in enumerate(ids):
    code = int(table[state, token])
    state = code >> 1
    if code & 1:
      return k
  return None


def test_stop_string_ends_on_the_closing_action_tag(compact):
  padded = compact.vocab_size + 100  # a model's embedding rows beyond the tokenizer map to b""
  table = stop_string_table(compact.all_token_bytes(size=padded), ("</action>",))
  response = compact.encode("<think>I go.</think>\n<action>go to drawer 2</action>")
  assert _first_stop(table, response) == len(response) - 1
  assert response[-1] == _single_id(compact, "</action>")
  # The tag spelt in ordinary tokens (a model need not emit the single id) still stops at its end.
  spelt = compact.encode("<action>look</") + compact.encode("acti") + compact.encode("on>")
  assert _single_id(compact, "</action>") not in spelt
  assert _first_stop(table, spelt) == len(spelt) - 1
  assert _first_stop(table, compact.encode("<action>look</actio")) is None


# ----------------------------------------------------------------------------------- HF export
def test_hf_export_carries_the_tokenizer(compact, tmp_path):
  import jax

  from sdar_jax.models import ModelConfig, init_params, save_pretrained

  config = ModelConfig.tiny(
    "qwen3",
    vocab_size=compact.vocab_size,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
  )
  params = init_params(config, jax.random.key(0))
  out = pathlib.Path(
    save_pretrained(config, params, tmp_path / "export", tokenizer_dir=compact.path)
  )
  for name in ("tokenizer.json", "tokenizer_config.json"):
    assert (out / name).read_bytes() == (compact.path / name).read_bytes()
  exported = Tokenizer.from_dir(out)
  text = "<|im_start|>user\nYou arrive at fridge 1.<|im_end|>\n"
  assert exported.encode(text) == compact.encode(text)
  # The export's generation_config.json may name ids of another vocabulary; only ids this
  # tokenizer has can end its sequences.
  assert exported.eos_token_ids[:2] == compact.eos_token_ids
  assert all(0 <= i < compact.vocab_size for i in exported.eos_token_ids)


def test_generation_config_ids_outside_the_vocabulary_are_ignored(compact, tmp_path):
  for name in ("tokenizer.json", "tokenizer_config.json"):
    (tmp_path / name).write_bytes((compact.path / name).read_bytes())
  (tmp_path / "generation_config.json").write_text(
    json.dumps({"eos_token_id": [151645, 151643, _single_id(compact, "</action>")]})
  )
  loaded = Tokenizer.from_dir(tmp_path)
  assert loaded.eos_token_ids == (*compact.eos_token_ids, _single_id(compact, "</action>"))


# ----------------------------------------------------------------------------------- lengths
def test_prompts_are_shorter_than_with_the_qwen_tokenizer(compact, games):
  qwen = Tokenizer.bundled_qwen()
  prompts = [p for record in games for w in ("expert", "walk") for p in _prompts(record, w)]
  compact_lengths = [len(compact.encode(prompt)) for prompt in prompts]
  qwen_lengths = [len(qwen.encode(prompt)) for prompt in prompts]
  assert all(c < q for c, q in zip(compact_lengths, qwen_lengths))
  assert sum(compact_lengths) <= 0.85 * sum(qwen_lengths)


# ------------------------------------------------------------------------------- build script
TINY_CORPUS_SCRIPT = """
import pathlib, sys
from sdar_jax.tools import build_compact_tokenizer as build
skills = sorted(pathlib.Path(sys.argv[2]).glob("*.md"))
texts = [p.read_text(encoding="utf-8") for p in skills]
texts += [f"<|im_start|>user\\nYou arrive at cabinet {n}. On the cabinet {n}, you see a mug {n % 3}."
          f"<|im_end|>\\n<think>I look.</think><action>go to cabinet {n}</action>" for n in range(1, 40)]
tokenizer = build.train_tokenizer(texts, vocab_size=600)
build.write_tokenizer_folder(tokenizer, sys.argv[1], {"texts": len(texts), "chars": 0, "games": 0,
                             "seed": 0}, chat_template="{{ messages }}")
"""


def test_build_is_deterministic_on_a_tiny_corpus(tmp_path):
  outs = [tmp_path / "a", tmp_path / "b"]
  env = dict(os.environ, PYTHONHASHSEED="random")
  for out in outs:  # separate processes: fresh hash seeds in Python and in the Rust trainer
    subprocess.run(
      [sys.executable, "-c", TINY_CORPUS_SCRIPT, str(out), str(SKILLS_DIR)],
      check=True,
      env=env,
      cwd=REPO,
      capture_output=True,
    )
  names = sorted(p.name for p in outs[0].iterdir())
  assert names == ["README.md", "tokenizer.json", "tokenizer_config.json"]
  for name in names:
    assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
  tiny = Tokenizer.from_dir(outs[0])
  assert tiny.vocab_size <= 600
  assert tiny.encode("</action>") == [tiny.vocab_size - 1]
  text = (SKILLS_DIR / "heat.md").read_text(encoding="utf-8") + "\n你好 <|im_end|>"
  assert tiny.decode(tiny.encode(text)) == text


def test_committed_folder_is_what_the_script_writes(compact, tmp_path):
  """The committed files equal the script's output for the committed BPE (settings, added tokens,
  serialisation, tokenizer_config.json); the corpus itself is only rebuilt by the script."""
  import tokenizers

  committed = tokenizers.Tokenizer.from_file(str(compact.path / "tokenizer.json"))
  out = build.write_tokenizer_folder(
    committed, tmp_path, {"texts": 0, "chars": 0, "games": 0, "seed": 0}
  )
  for name in ("tokenizer.json", "tokenizer_config.json"):
    assert (out / name).read_bytes() == (compact.path / name).read_bytes(), name
  fresh = json.loads(build.train_tokenizer(["a tiny corpus"], vocab_size=400).to_str())
  stored = json.loads(committed.to_str())
  for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
    assert stored[key] == fresh[key], key
  assert [t["content"] for t in stored["added_tokens"]] == [t for t, _ in build.ADDED_TOKENS]
