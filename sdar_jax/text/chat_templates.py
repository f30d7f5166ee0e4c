"""Chat templates: the prompt text a chat model is trained and sampled on.

A `ChatTemplate` is either a built-in Qwen template ("qwen2.5", "qwen3"; plain Python string
builders for text-only system/user/assistant messages) or the jinja template a model or tokenizer
folder ships (`chat_template.jinja`, else the "chat_template" entry of `tokenizer_config.json`),
rendered the way transformers renders it. `resolve_chat_template` turns the config value
`model.chat_template` into one:

- "auto" (the default): the folder's own template when the run reads its tokenizer from a folder
  that ships one (a real checkpoint is then prompted exactly as its publisher, transformers and
  vLLM prompt it), else the built-in template of the model's family;
- "qwen2.5" | "qwen3": that built-in template, whatever the folder ships.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = [
  "AUTO",
  "BUILTIN_TEMPLATES",
  "CHAT_TEMPLATE_SETTINGS",
  "ChatTemplate",
  "resolve_chat_template",
]

AUTO = "auto"
BUILTIN_TEMPLATES = ("qwen2.5", "qwen3")
CHAT_TEMPLATE_SETTINGS = (AUTO, *BUILTIN_TEMPLATES)  # the values model.chat_template accepts

# ModelConfig.family -> the built-in template of the published chat models of that family.
_FAMILY_TEMPLATES = {"qwen2": "qwen2.5", "qwen3": "qwen3"}

_QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

_TEMPLATE_FILE = "chat_template.jinja"
_TOKENIZER_CONFIG = "tokenizer_config.json"
# Names a message's reasoning goes by, in the order transformers looks them up.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """One chat template; build it with `builtin`, `from_folder` or `resolve_chat_template`.

  Attributes:
    name: the built-in template's name ("qwen2.5" | "qwen3"), or the file the jinja source was
      read from (for log lines and error messages).
    jinja_source: the jinja template text; None for a built-in template.
  """

  name: str
  jinja_source: str | None = None

  @classmethod
  def builtin(cls, name: str) -> ChatTemplate:
    """The built-in Qwen2.5 or Qwen3 template."""
    if name not in BUILTIN_TEMPLATES:
      raise ValueError(
        f"Unknown built-in chat template {name!r}. Fix: use one of {list(BUILTIN_TEMPLATES)}."
      )
    return cls(name)

  @classmethod
  def from_folder(cls, directory: str | pathlib.Path) -> ChatTemplate | None:
    """The template a Hugging Face model or tokenizer folder ships, or None when it has none.

    As transformers reads a folder: `chat_template.jinja` wins over the "chat_template" entry of
    `tokenizer_config.json`; a list of named templates there gives the one named "default".
    """
    directory = pathlib.Path(directory)
    template_file = directory / _TEMPLATE_FILE
    if template_file.is_file():
      return cls(str(template_file), template_file.read_text(encoding="utf-8"))
    config_file = directory / _TOKENIZER_CONFIG
    if not config_file.is_file():
      return None
    with config_file.open(encoding="utf-8") as f:
      entry = json.load(f).get("chat_template")
    if entry is None:
      return None
    if isinstance(entry, list):
      named = {t.get("name"): t.get("template") for t in entry if isinstance(t, Mapping)}
      if "default" not in named:
        raise ValueError(
          f"{config_file} holds named chat templates ({sorted(map(str, named))}) and none is "
          "named 'default'. Fix: write the one to use to chat_template.jinja in that folder, or "
          f"set model.chat_template to a built-in template ({list(BUILTIN_TEMPLATES)})."
        )
      entry = named["default"]
    if not isinstance(entry, str):
      raise TypeError(
        f"{config_file}: chat_template is a {type(entry).__name__}, expected the jinja text. "
        f"Fix: repair the file, or set model.chat_template to one of {list(BUILTIN_TEMPLATES)}."
      )
    return cls(str(config_file), entry)

  def render(
    self,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    enable_thinking: bool = False,
  ) -> str:
    """The prompt text of `messages` (dicts with "role" and "content").

    `add_generation_prompt` appends the opening of the assistant turn. `enable_thinking` is the
    Qwen3 switch: False appends an empty `<think>` block to that opening, which turns thinking
    off; Qwen2.5 templates and the no-think-only Qwen3-*-Instruct-2507 templates ignore it.
    """
    if self.jinja_source is None:
      return _render_builtin(self.name, messages, add_generation_prompt, enable_thinking)
    return _render_jinja(self, messages, add_generation_prompt, enable_thinking)


def resolve_chat_template(
  setting: str, template_dir: str | pathlib.Path | None, model_family: str
) -> ChatTemplate:
  """The template a run prompts with, from the config value `model.chat_template`.

  Args:
    setting: "auto", "qwen2.5" or "qwen3" (see the module docstring for the precedence).
    template_dir: the folder the run reads its tokenizer from (model.tokenizer_dir, else
      model.path); None when it uses the bundled Qwen tokenizer files, whose template belongs
      to no model of the run.
    model_family: `ModelConfig.family` ("qwen2" | "qwen3"), whose built-in template "auto"
      falls back to.
  """
  if setting not in CHAT_TEMPLATE_SETTINGS:
    raise ValueError(
      f"model.chat_template={setting!r}: unknown chat template. Fix: use one of "
      f"{list(CHAT_TEMPLATE_SETTINGS)} ('auto': the model folder's own template, else the "
      "built-in one of the model's family)."
    )
  if setting != AUTO:
    return ChatTemplate.builtin(setting)
  if template_dir is not None:
    shipped = ChatTemplate.from_folder(template_dir)
    if shipped is not None:
      return shipped
  if model_family not in _FAMILY_TEMPLATES:
    raise ValueError(
      f"No built-in chat template for model family {model_family!r}. Fix: use a model folder "
      f"that ships its chat template, or a family among {sorted(_FAMILY_TEMPLATES)}."
    )
  return ChatTemplate.builtin(_FAMILY_TEMPLATES[model_family])


# ---------------------------------------------------------------------------------------------
# Built-in Qwen templates (text-only messages; character for character the published templates)


def _checked_messages(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
  """The messages the built-in templates render; an error naming the message otherwise."""
  messages = list(messages)
  if not messages:
    raise ValueError("The chat template got no messages; give at least one.")
  for i, message in enumerate(messages):
    if not isinstance(message, Mapping):
      raise TypeError(
        f"messages[{i}] is a {type(message).__name__}; expected a dict with 'role' and 'content'."
      )
    role = message.get("role")
    if role not in ("system", "user", "assistant"):
      raise ValueError(
        f"messages[{i}] has role {role!r}; the built-in templates support only 'system', 'user' "
        "and 'assistant' (no tool messages). Fix: map other roles to one of these."
      )
    if not isinstance(message.get("content"), str):
      raise TypeError(
        f"messages[{i}] ({role}) content must be a str, got "
        f"{type(message.get('content')).__name__}. Only plain text content is supported."
      )
    reasoning = message.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
      raise TypeError(f"messages[{i}] reasoning_content must be a str or None.")
    if message.get("tool_calls"):
      raise ValueError(
        f"messages[{i}] has tool_calls, which the built-in templates do not render. Fix: use a "
        "model folder's own template (model.chat_template='auto')."
      )
  return messages


def _turn(role: str, content: str) -> str:
  return f"<|im_start|>{role}\n{content}<|im_end|>\n"


def _render_builtin(
  name: str,
  messages: Sequence[Mapping[str, Any]],
  add_generation_prompt: bool,
  enable_thinking: bool,
) -> str:
  messages = _checked_messages(messages)
  if name == "qwen2.5":
    return _render_qwen25(messages, add_generation_prompt)
  return _render_qwen3(messages, add_generation_prompt, enable_thinking)


def _render_qwen25(messages: list[Mapping[str, Any]], add_generation_prompt: bool) -> str:
  """Qwen2.5: a default system message when the first message is not one."""
  parts = []
  if messages[0]["role"] != "system":
    parts.append(_turn("system", _QWEN25_DEFAULT_SYSTEM))
  parts.extend(_turn(m["role"], m["content"]) for m in messages)
  if add_generation_prompt:
    parts.append("<|im_start|>assistant\n")
  return "".join(parts)


def _is_tool_response(content: str) -> bool:
  return content.startswith("<tool_response>") and content.endswith("</tool_response>")


def _render_qwen3(
  messages: list[Mapping[str, Any]], add_generation_prompt: bool, enable_thinking: bool
) -> str:
  """Qwen3: no default system message; assistant turns before the last user query lose their
  reasoning; thinking off puts an empty `<think>` block in the generation prompt."""
  last_query = len(messages) - 1
  for index in range(len(messages) - 1, -1, -1):
    message = messages[index]
    if message["role"] == "user" and not _is_tool_response(message["content"]):
      last_query = index
      break

  parts = []
  for index, message in enumerate(messages):
    role, content = message["role"], message["content"]
    if role != "assistant":  # system (first or not) and user turns render alike
      parts.append(_turn(role, content))
      continue
    reasoning = message.get("reasoning_content")
    if reasoning is None:
      reasoning = ""
      if "</think>" in content:
        reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        content = content.split("</think>")[-1].lstrip("\n")
    is_last = index == len(messages) - 1
    if index > last_query and (is_last or reasoning):
      body = "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
    else:
      body = content
    parts.append(f"<|im_start|>assistant\n{body}<|im_end|>\n")
  if add_generation_prompt:
    parts.append("<|im_start|>assistant\n")
    if not enable_thinking:
      parts.append("<think>\n\n</think>\n\n")
  return "".join(parts)


# ---------------------------------------------------------------------------------------------
# Jinja templates, rendered as transformers renders them


@functools.lru_cache(maxsize=8)
def _compile(source: str):
  """A jinja template in transformers' environment: sandboxed, immutable, trim_blocks and
  lstrip_blocks, loop controls, a `tojson` that keeps non-ASCII text, `raise_exception`. Not
  given: transformers' `{% generation %}` tag and `strftime_now`, which no Qwen template uses (a
  template that does fails with an error naming it)."""

  def raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
      value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )

  environment = ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
  )
  environment.filters["tojson"] = tojson
  environment.globals["raise_exception"] = raise_exception
  return environment.from_string(source)


def _render_jinja(
  template: ChatTemplate,
  messages: Sequence[Mapping[str, Any]],
  add_generation_prompt: bool,
  enable_thinking: bool,
) -> str:
  """Render a jinja template with the variables transformers gives it for text chats: messages,
  tools=None, documents=None, add_generation_prompt and enable_thinking (no special-token
  variables such as bos_token: Qwen templates use none)."""
  plain = []
  for i, message in enumerate(messages):
    if not isinstance(message, Mapping):
      raise TypeError(
        f"messages[{i}] is a {type(message).__name__}; expected a dict with 'role' and 'content'."
      )
    # As transformers: keys whose value is None are dropped (templates test for absent keys), and
    # a message's reasoning is given under both names templates read it by.
    message = {key: value for key, value in message.items() if value is not None}
    reasoning = next((message[key] for key in _REASONING_KEYS if key in message), None)
    if reasoning is not None:
      message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    plain.append(message)
  try:
    return _compile(template.jinja_source).render(
      messages=plain,
      tools=None,
      documents=None,
      add_generation_prompt=add_generation_prompt,
      enable_thinking=enable_thinking,
    )
  except jinja2.sandbox.SecurityError as err:
    raise ValueError(
      f"The chat template of {template.name} was refused by the sandbox: {str(err).rstrip('.')} "
      "(a template may not reach Python internals). Fix: remove that construct from the "
      f"template, or set model.chat_template to a built-in template ({list(BUILTIN_TEMPLATES)})."
    ) from err
  except jinja2.exceptions.TemplateError as err:
    raise ValueError(
      f"The chat template of {template.name} failed: {str(err).rstrip('.')}. Fix: give it "
      "messages it accepts, or set model.chat_template to a built-in template "
      f"({list(BUILTIN_TEMPLATES)})."
    ) from err
