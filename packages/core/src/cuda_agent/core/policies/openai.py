"""``openai`` policy: any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, hosted APIs)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..agent.loop import ChatReply, PolicyError
from ..agent.toolcalls import parse_tool_calls
from ..interfaces import Policy
from ..types import ToolCall
from .http import RetryingHTTPClient


@dataclass
class OpenAIOptions:
    model: str = ""
    base_url: str = "https://api.openai.com/v1"
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the key (none needed locally)
    timeout: float = 600.0  # seconds for one request
    connect_timeout: float = 10.0
    max_retries: int = 5  # on 408/409/429/5xx, dropped connections and timeouts
    backoff: float = 1.0  # first wait in seconds; doubles each retry (Retry-After wins when given)
    max_backoff: float = 60.0
    requests_per_second: float = 0.0  # client-side rate limit; 0: none
    max_tokens_field: str = "max_tokens"  # "max_completion_tokens" for APIs that want it
    extra_body: dict = field(default_factory=dict)  # merged into each request (e.g. top_k for vLLM)


class OpenAIPolicy(RetryingHTTPClient, Policy):
    """Chat-level policy over HTTP (``POST {base_url}/chat/completions`` with ``tools``).

    Retries with exponential backoff and jitter, honours ``Retry-After``, spaces requests
    to ``requests_per_second``. Tool calls whose arguments are not valid JSON come back as
    calls with ``error`` set (the loop shows the error to the model). Servers that return
    Hermes ``<tool_call>`` text instead of ``tool_calls`` are parsed too.
    """

    name = "openai"
    description = "OpenAI-compatible chat-completions endpoint (vLLM, SGLang, hosted APIs)."
    Options = OpenAIOptions

    def __init__(self, options: OpenAIOptions | None = None):
        super().__init__(options)
        if not self.options.model:
            from ..errors import ConfigError

            raise ConfigError("policy openai needs options.model (the served model name)")
        self._init_http()

    def request_body(self, messages: list[dict], tools: list[dict], sampling: dict) -> dict:
        body: dict[str, Any] = {"model": self.options.model, "messages": messages}
        if tools:
            body["tools"] = tools
        for k, v in sampling.items():
            if k == "max_tokens":
                if v:
                    body[self.options.max_tokens_field] = int(v)
            elif v is not None:
                body[k] = v
        body.update(self.options.extra_body)
        return body

    async def post(self, body: dict) -> dict:
        return await self.post_url(self.options.base_url.rstrip("/") + "/chat/completions", body)

    async def chat(self, messages: list[dict], tools: list[dict], sampling: dict) -> ChatReply:
        data = await self.post(self.request_body(messages, tools, sampling))
        return parse_chat_response(data)


def parse_chat_response(data: dict) -> ChatReply:
    """A chat-completions response turned into a :class:`ChatReply`."""
    try:
        choice = data["choices"][0]
        msg = choice.get("message") or {}
    except (KeyError, IndexError, TypeError):
        raise PolicyError(f"response has no choices: {str(data)[:200]}")
    content = msg.get("content") or ""
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not content and msg.get("refusal"):
        content = str(msg["refusal"])
    calls: list[ToolCall] = []
    for i, tc in enumerate(msg.get("tool_calls") or []):
        fn = (tc or {}).get("function") or {}
        name = fn.get("name") or ""
        raw = fn.get("arguments")
        call_id = tc.get("id") or f"call_{i}"
        if isinstance(raw, dict):
            calls.append(ToolCall(call_id, name, raw, json.dumps(raw)))
            continue
        raw = raw or ""
        try:
            args = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            calls.append(ToolCall(call_id, name, {}, raw, error=f"arguments of {name or 'the call'} are not valid JSON ({exc.msg} at char {exc.pos})"))
            continue
        if not isinstance(args, dict):
            calls.append(ToolCall(call_id, name, {}, raw, error=f"arguments of {name} must be a JSON object"))
        elif not name:
            calls.append(ToolCall(call_id, name, args, raw, error="tool call has no function name"))
        else:
            calls.append(ToolCall(call_id, name, args, raw))
    if not calls and "<tool_call>" in content:
        content, calls = parse_tool_calls(content)
    return ChatReply(content=content, tool_calls=calls, finish_reason=choice.get("finish_reason") or "stop",
                     usage=dict(data.get("usage") or {}))
