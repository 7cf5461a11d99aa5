"""Context budget: counting tokens and cutting long tool outputs."""

from __future__ import annotations

import json
from typing import Any

CHARS_PER_TOKEN = 4  # estimate for chat policies whose tokenizer we do not see
MESSAGE_OVERHEAD = 4  # tokens a chat template spends per message (role, separators)


def truncate_middle(text: str, max_chars: int) -> tuple[str, bool]:
    """Keep the head and the tail of ``text`` (``max_chars`` in all) with a marker between."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text, False
    head = max_chars * 2 // 3
    tail = max_chars - head
    omitted = len(text) - head - tail
    lines_omitted = text[head : len(text) - tail].count("\n")
    marker = f"\n[... {omitted} characters ({lines_omitted} lines) omitted ...]\n"
    return text[:head] + marker + text[len(text) - tail :], True


def estimate_tokens(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def estimate_message_tokens(message: dict[str, Any]) -> int:
    n = MESSAGE_OVERHEAD + estimate_tokens(str(message.get("content") or ""))
    for tc in message.get("tool_calls") or []:
        fn = tc.get("function", {})
        n += estimate_tokens(fn.get("name", "")) + estimate_tokens(str(fn.get("arguments", "")))
    return n


def estimate_tools_tokens(schemas: list[dict]) -> int:
    return estimate_tokens(json.dumps(schemas)) if schemas else 0


class ContextBudget:
    """Tracks how much of the context window an episode uses.

    Token-level episodes count exact ids (``set_exact``). Chat episodes estimate
    characters / 4 per message and take the server's reported usage when it is larger.
    """

    def __init__(self, limit: int, min_generation_tokens: int = 64):
        self.limit = int(limit)
        self.min_generation = int(min_generation_tokens)
        self.used = 0
        self.reported = 0

    def set_exact(self, n_tokens: int) -> None:
        self.used = int(n_tokens)

    def estimate_chat(self, messages: list[dict], schemas: list[dict]) -> int:
        est = estimate_tools_tokens(schemas) + sum(estimate_message_tokens(m) for m in messages)
        self.used = max(est, self.reported)
        return self.used

    def observe_usage(self, total_tokens: int | None) -> None:
        """A server's count of prompt + completion tokens of the last request."""
        if total_tokens:
            self.reported = max(self.reported, int(total_tokens))
            self.used = max(self.used, self.reported)

    @property
    def remaining(self) -> int:
        return self.limit - self.used

    def exhausted(self) -> bool:
        return self.remaining < self.min_generation

    def generation_cap(self, max_tokens: int) -> int:
        return max(0, min(int(max_tokens), self.remaining))
