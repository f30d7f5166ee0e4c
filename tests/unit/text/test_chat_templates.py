"""Chat templates: exact built-in strings, the built-ins against the templates the bundled Qwen and
compact tokenizer folders ship, the jinja renderer against transformers, and which template a run
uses (the folder's own under "auto", a named built-in otherwise).

Truth used here: prompt strings written by hand from the published Qwen2.5 / Qwen3 templates, the
published Qwen3 jinja template shipped in the bundled tokenizer_config.json (and copied into the
compact tokenizer's), transformers' own rendering of a folder's template, and known Qwen ids.
"""

import json
import shutil

import pytest

from configs import models
from sdar_jax.core.sampling import SamplingParams
from sdar_jax.rollout import AgentLoop
from sdar_jax.run.setup import build_chat_template
from sdar_jax.text.chat_templates import ChatTemplate, resolve_chat_template
from sdar_jax.text.tokenizer import Tokenizer, bundled_qwen_tokenizer_dir
from sdar_jax.tools.build_compact_tokenizer import DEFAULT_OUT_DIR as COMPACT_DIR

QWEN25 = ChatTemplate.builtin("qwen2.5")
QWEN3 = ChatTemplate.builtin("qwen3")
QWEN25_SYSTEM = (
  "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
  "<|im_end|>\n"
)
# ids of QWEN25_SYSTEM in the Qwen vocabulary
QWEN25_SYSTEM_IDS = [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364]
QWEN25_SYSTEM_IDS += [14817, 13, 1446, 525, 264, 10950, 17847, 13, 151645, 198]

# A template unlike Qwen's, to tell which template rendered a prompt.
MARKED_TEMPLATE = (
  "{% for m in messages %}\n"
  "  [{{ m.role }}] {{ m.content }}\n"
  "{% endfor %}\n"
  "{% if add_generation_prompt %}[assistant]{% if enable_thinking is false %} quiet{% endif %}"
  "{% endif %}"
)


def _transformers_tokenizer(directory):
  transformers = pytest.importorskip("transformers")
  return transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def _folder(tmp_path, name: str, chat_template_jinja: str | None = None, config_template=None):
  """A tokenizer folder (the compact tokenizer's files) with the given templates, or none."""
  out = tmp_path / name
  shutil.copytree(COMPACT_DIR, out)
  config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
  config.pop("chat_template")
  if config_template is not None:
    config["chat_template"] = config_template
  (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
  if chat_template_jinja is not None:
    (out / "chat_template.jinja").write_text(chat_template_jinja, encoding="utf-8")
  return out


# --- built-in templates: exact strings ----------------------------------------------------------


def test_qwen25_single_user():
  msgs = [{"role": "user", "content": "Hello world"}]
  expected = QWEN25_SYSTEM + "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
  assert QWEN25.render(msgs) == expected
  assert QWEN25.render(msgs, enable_thinking=True) == expected  # ignored by Qwen2.5
  no_prompt = QWEN25_SYSTEM + "<|im_start|>user\nHello world<|im_end|>\n"
  assert QWEN25.render(msgs, add_generation_prompt=False) == no_prompt


def test_qwen25_system_and_multi_turn():
  msgs = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Task: find a mug."},
    {"role": "assistant", "content": "<action>go to shelf 1</action>"},
    {"role": "user", "content": "You see a mug."},
  ]
  assert QWEN25.render(msgs) == (
    "<|im_start|>system\nYou are an agent.<|im_end|>\n"
    "<|im_start|>user\nTask: find a mug.<|im_end|>\n"
    "<|im_start|>assistant\n<action>go to shelf 1</action><|im_end|>\n"
    "<|im_start|>user\nYou see a mug.<|im_end|>\n"
    "<|im_start|>assistant\n"
  )


def test_qwen3_single_user():
  msgs = [{"role": "user", "content": "Hello world"}]
  assert QWEN3.render(msgs) == (
    "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
  )
  assert QWEN3.render(msgs, enable_thinking=True) == (
    "<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n"
  )


def test_qwen3_system_and_multi_turn():
  msgs = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?"},
  ]
  assert QWEN3.render(msgs) == (
    "<|im_start|>system\nYou are an agent.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n4<|im_end|>\n"  # past reasoning is dropped
    "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
  )


def test_qwen3_final_assistant_turn_gets_empty_think_block():
  msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
  assert QWEN3.render(msgs, add_generation_prompt=False) == (
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n"
  )


def test_prompt_ids():
  qwen = Tokenizer.bundled_qwen()
  user = [{"role": "user", "content": "Hello world"}]
  # <|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n
  turn = [151644, 872, 198, 9707, 1879, 151645, 198, 151644, 77091, 198]
  assert qwen.encode(QWEN25.render(user)) == QWEN25_SYSTEM_IDS + turn
  assert qwen.encode(QWEN3.render(user, enable_thinking=True)) == turn
  # <think>\n\n</think>\n\n = <think> "\n\n" </think> "\n\n"
  assert qwen.encode(QWEN3.render(user)) == turn + [151667, 271, 151668, 271]


def test_builtin_template_errors():
  with pytest.raises(ValueError, match=r"'qwen2'.*\['qwen2.5', 'qwen3'\]"):
    ChatTemplate.builtin("qwen2")
  with pytest.raises(ValueError, match="role 'tool'"):
    QWEN3.render([{"role": "tool", "content": "x"}])
  with pytest.raises(ValueError, match="no messages"):
    QWEN25.render([])
  with pytest.raises(TypeError, match="content must be a str"):
    QWEN3.render([{"role": "user", "content": [{"type": "text", "text": "x"}]}])
  with pytest.raises(ValueError, match="tool_calls"):
    QWEN3.render([{"role": "assistant", "content": "", "tool_calls": [{"name": "f"}]}])


# --- built-in Qwen3 against the templates the tokenizer folders ship ----------------------------

CONVERSATIONS = [
  [{"role": "user", "content": "Hello world"}],
  [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
  [
    {"role": "system", "content": "You are a household agent."},
    {"role": "user", "content": "Your task is to: put a clean mug in coffeemachine.\nGo."},
    {"role": "assistant", "content": "<think>\nFind the mug.\n</think>\n\n<action>look</action>"},
    {"role": "user", "content": "You arrive at countertop 1. Café 你好 🌍, a mug 2."},
  ],
  [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "q1"},
    {"role": "assistant", "content": "<think>\nr1\n</think>\n\na1"},
    {"role": "user", "content": "q2"},
    {"role": "assistant", "content": "a2 plain"},
  ],
  [
    {"role": "user", "content": "q1"},
    {"role": "assistant", "content": "a1"},
    {"role": "system", "content": "mid system"},
    {"role": "user", "content": "q2"},
    {"role": "assistant", "content": "x", "reasoning_content": "\nthought\n"},
    {"role": "assistant", "content": "\n\ny"},
  ],
  [
    {"role": "user", "content": "<tool_response>r</tool_response>"},
    {"role": "assistant", "content": "a"},
  ],
]


@pytest.mark.parametrize("folder", ["bundled_qwen", "alfworld_compact"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("enable_thinking", [True, False])
def test_builtin_qwen3_matches_the_folders_template(folder, add_generation_prompt, enable_thinking):
  directory = bundled_qwen_tokenizer_dir() if folder == "bundled_qwen" else COMPACT_DIR
  shipped = ChatTemplate.from_folder(directory)
  assert shipped is not None and shipped.name == str(directory / "tokenizer_config.json")
  assert "enable_thinking" in shipped.jinja_source  # the published Qwen3 template
  for messages in CONVERSATIONS:
    expected = shipped.render(messages, add_generation_prompt, enable_thinking)
    assert QWEN3.render(messages, add_generation_prompt, enable_thinking) == expected, messages


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("enable_thinking", [True, False])
def test_jinja_renderer_matches_transformers(tmp_path, add_generation_prompt, enable_thinking):
  folders = [bundled_qwen_tokenizer_dir(), _folder(tmp_path, "marked", MARKED_TEMPLATE)]
  folders.append(_folder(tmp_path, "json", "{{ messages | tojson }}{{ messages[0].content }}"))
  for directory in folders:
    hf = _transformers_tokenizer(directory)
    ours = ChatTemplate.from_folder(directory)
    for messages in CONVERSATIONS:
      expected = hf.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
      )
      assert ours.render(messages, add_generation_prompt, enable_thinking) == expected, messages


def test_template_exceptions_name_the_file(tmp_path):
  folder = _folder(tmp_path, "strict", "{{ raise_exception('needs a system message') }}")
  template = ChatTemplate.from_folder(folder)
  with pytest.raises(ValueError, match="needs a system message") as err:
    template.render([{"role": "user", "content": "hi"}])
  assert str(folder / "chat_template.jinja") in str(err.value)
  assert "model.chat_template" in str(err.value)


# --- which template a folder ships --------------------------------------------------------------


def test_folder_template_file_wins_over_the_tokenizer_config(tmp_path):
  folder = _folder(tmp_path, "both", MARKED_TEMPLATE, config_template="{{ 'from the config' }}")
  shipped = ChatTemplate.from_folder(folder)
  assert shipped.name == str(folder / "chat_template.jinja")
  assert shipped.jinja_source == _transformers_tokenizer(folder).chat_template == MARKED_TEMPLATE


def test_folder_with_named_templates_uses_the_default(tmp_path):
  named = [{"name": "tool_use", "template": "{{ 'tools' }}"}, {"name": "default", "template": "d"}]
  shipped = ChatTemplate.from_folder(_folder(tmp_path, "named", config_template=named))
  assert shipped.jinja_source == "d"
  no_default = _folder(tmp_path, "no_default", config_template=named[:1])
  with pytest.raises(ValueError, match=r"\['tool_use'\]\) and none is named 'default'"):
    ChatTemplate.from_folder(no_default)


def test_folder_without_a_template(tmp_path):
  assert ChatTemplate.from_folder(_folder(tmp_path, "none")) is None


# --- which template a run uses ------------------------------------------------------------------


def test_auto_uses_the_folders_template_and_a_named_builtin_wins(tmp_path):
  marked = _folder(tmp_path, "marked", MARKED_TEMPLATE)
  assert resolve_chat_template("auto", marked, "qwen2").jinja_source == MARKED_TEMPLATE
  assert resolve_chat_template("qwen2.5", marked, "qwen3") == QWEN25
  assert resolve_chat_template("qwen3", marked, "qwen2") == QWEN3
  # No folder (the bundled tokenizer files) or a folder without one: the family's built-in.
  assert resolve_chat_template("auto", None, "qwen2") == QWEN25
  assert resolve_chat_template("auto", None, "qwen3") == QWEN3
  assert resolve_chat_template("auto", _folder(tmp_path, "none"), "qwen2") == QWEN25


def test_unknown_settings_are_refused():
  with pytest.raises(ValueError, match=r"model.chat_template='chatml'.*\['auto', 'qwen2.5'"):
    resolve_chat_template("chatml", None, "qwen3")
  with pytest.raises(ValueError, match="model family 'llama'"):
    resolve_chat_template("auto", None, "llama")


def test_trainer_reads_the_template_where_it_reads_the_tokenizer(tmp_path):
  marked = _folder(tmp_path, "marked", MARKED_TEMPLATE)
  section = models.model("qwen2.5-3b")
  assert section.chat_template == "auto"
  assert build_chat_template(section, "qwen2") == QWEN25  # the bundled tokenizer: no folder
  section.path = str(marked)  # a checkpoint folder: its tokenizer and its template
  assert build_chat_template(section, "qwen2").jinja_source == MARKED_TEMPLATE
  section.path = str(_folder(tmp_path, "none"))
  section.tokenizer_dir = str(marked)  # tokenizer_dir wins over path, as for the tokenizer
  assert build_chat_template(section, "qwen2").jinja_source == MARKED_TEMPLATE
  section.chat_template = "qwen2.5"
  assert build_chat_template(section, "qwen2") == QWEN25


class _FixedUserText:
  """An environment adapter whose user message is always the same."""

  def user_text(self, view, history_length: int) -> str:
    return "Your task is to: look."

  def project(self, text: str) -> tuple[str, bool]:
    return text, True

  def skill_query(self, view) -> str:
    return ""


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_agent_loop_prompts_with_the_given_template(tmp_path, enable_thinking):
  tokenizer = Tokenizer.from_dir(COMPACT_DIR)
  template = ChatTemplate.from_folder(_folder(tmp_path, "marked", MARKED_TEMPLATE))
  loop = AgentLoop(
    pool=None,
    adapter=_FixedUserText(),
    sampler=None,
    tokenizer=tokenizer,
    chat_template=template,
    sampling=SamplingParams(),
    max_turns=1,
    enable_thinking=enable_thinking,
  )
  student, teacher = loop.build_prompts(None, sample_id=0, where="test")
  expected = "  [user] Your task is to: look.\n[assistant]" + ("" if enable_thinking else " quiet")
  assert tokenizer.decode(student) == expected and teacher is None
  with pytest.raises(TypeError, match=r"chat_template='qwen3' is not a ChatTemplate"):
    AgentLoop(None, _FixedUserText(), None, tokenizer, "qwen3", SamplingParams(), max_turns=1)
