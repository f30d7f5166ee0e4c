"""An OpenAI-compatible chat-completions endpoint, on the standard library alone (urllib, json,
threads): POST <url>/chat/completions with {"model", "messages", "temperature", "max_tokens"} and
read choices[0].message.content. What the reflection reflectors and judges of kind "openai" call
(`sdar_jax.algos.reflectors`); any server that speaks this protocol serves (vLLM, SGLang, a hosted
API).

Every request has a timeout and is tried 1 + `retries` times, `backoff`·attempt seconds apart; an
answer without text counts as a failure. A request that never succeeds raises `EndpointError`,
whose message names the URL, the last failure and the fix. The API key, when one is needed, is
read from the environment variable the caller names (never from a config file).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sdar_jax.infra.errors import UserError


class EndpointError(UserError):
  """A chat-completions endpoint that did not answer (after its retries)."""

  heading = "Endpoint not answering"


@dataclasses.dataclass
class ChatEndpoint:
  """One endpoint: `url` is the API base (e.g. http://127.0.0.1:8000/v1), `model` the served
  model's name; `api_key_env` names the environment variable holding the key ("" or unset: no
  Authorization header)."""

  url: str
  model: str = ""
  api_key_env: str = ""
  timeout: float = 60.0
  retries: int = 2
  backoff: float = 1.0
  concurrency: int = 16
  extra_body: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  calls: int = 0  # HTTP requests made (retries included)
  failures: int = 0  # requests that never succeeded
  _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

  @property
  def address(self) -> str:
    return self.url.rstrip("/") + "/chat/completions"

  def _post(self, body: bytes) -> str:
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
    if key:
      headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(self.address, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=self.timeout) as response:
      answer = json.loads(response.read().decode("utf-8"))
    content = answer["choices"][0]["message"].get("content")
    if not isinstance(content, str) or not content.strip():
      raise ValueError(f"an answer without text: {json.dumps(answer)[:200]}")
    return content

  def complete(
    self, messages: Sequence[Mapping[str, str]], temperature: float = 0.0, max_tokens: int = 512
  ) -> str:
    """The endpoint's reply to `messages` (dicts with "role" and "content"), or EndpointError."""
    payload = {
      "model": self.model,
      "messages": [dict(m) for m in messages],
      "temperature": float(temperature),
      "max_tokens": int(max_tokens),
      **dict(self.extra_body),
    }
    body = json.dumps(payload).encode("utf-8")
    last = ""
    for attempt in range(int(self.retries) + 1):
      with self._lock:
        self.calls += 1
      try:
        return self._post(body)
      except urllib.error.HTTPError as err:
        last = f"HTTP {err.code} {err.reason}"
      except (urllib.error.URLError, OSError, TimeoutError) as err:
        last = f"{type(err).__name__}: {getattr(err, 'reason', err)}"
      except (ValueError, KeyError, IndexError, TypeError) as err:
        last = f"{type(err).__name__}: {err}"
      if attempt < self.retries:
        time.sleep(self.backoff * (attempt + 1))
    with self._lock:
      self.failures += 1
    raise EndpointError(
      f"the chat-completions endpoint at {self.address} did not answer after "
      f"{int(self.retries) + 1} tries of {self.timeout:g} s each (last: {last}). Fix: start the "
      f"server that serves {self.url!r} (OpenAI-compatible, model {self.model!r}), or point the "
      "setting at one that answers"
    )

  def complete_many(
    self,
    conversations: Sequence[Sequence[Mapping[str, str]]],
    temperature: float = 0.0,
    max_tokens: int = 512,
  ) -> list[str | EndpointError]:
    """`complete` of each conversation, `concurrency` at a time, in their order; a conversation
    that failed gives its EndpointError in its place (the caller decides)."""

    def one(messages):
      try:
        return self.complete(messages, temperature, max_tokens)
      except EndpointError as err:
        return err

    if len(conversations) <= 1 or self.concurrency <= 1:
      return [one(m) for m in conversations]
    with ThreadPoolExecutor(max_workers=min(int(self.concurrency), len(conversations))) as pool:
      return list(pool.map(one, conversations))
