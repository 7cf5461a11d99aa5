"""Per-template formatters for token-level episodes.

After the model's tokens, the loop appends the tool results rendered as text by a fixed
formatter and tokenised on their own (never the history), followed by the next assistant
header. A formatter is chosen by name (``AgentOptions.tool_format``); add one to
``FORMATS`` for another chat template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass
class ToolFormat:
    name: str
    end_of_turn: str  # token text that ends an assistant message
    tool_open: str  # opens the message that carries tool results
    result_open: str
    result_close: str
    result_sep: str
    tool_close: str  # closes it and opens the next assistant message

    def render(self, results: list[str], closed: bool) -> str:
        """Text appended after a model turn: results, then the next assistant header.

        ``closed``: the model's tokens already end with ``end_of_turn``.
        """
        parts = [] if closed else [self.end_of_turn]
        parts.append(self.tool_open)
        parts.append(self.result_sep.join(f"{self.result_open}{r}{self.result_close}" for r in results))
        parts.append(self.tool_close)
        return "".join(parts)

    def strip_end(self, text: str) -> tuple[str, bool]:
        t = text.rstrip()
        if t.endswith(self.end_of_turn):
            return t[: -len(self.end_of_turn)], True
        return text, False


# ChatML with Hermes tool calls (Qwen2/2.5/3 templates): tool results go in a user message
CHATML = ToolFormat(
    name="chatml",
    end_of_turn="<|im_end|>",
    tool_open="\n<|im_start|>user",
    result_open="\n<tool_response>\n",
    result_close="\n</tool_response>",
    result_sep="",
    tool_close="<|im_end|>\n<|im_start|>assistant\n",
)

FORMATS: dict[str, ToolFormat] = {"chatml": CHATML}


def get_format(name: str) -> ToolFormat:
    from ..errors import ConfigError, did_you_mean

    if name not in FORMATS:
        raise ConfigError(f"unknown tool_format {name!r}; {did_you_mean(name, FORMATS)}")
    return FORMATS[name]


def tools_system_text(schemas: list[dict]) -> str:
    """The tool list and call format as Hermes-style templates (Qwen2.5) write them, for chat
    templates that have no place for tools."""
    lines = [json.dumps(s) for s in schemas]
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            + "\n".join(lines) + "\n</tools>\n\nFor each function call, return a json object with function name "
            "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def with_tools_in_system(messages: list[dict], schemas: list[dict]) -> list[dict]:
    """``messages`` with the tool text appended to the system message (one is added first when none)."""
    text = tools_system_text(schemas)
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{out[0].get('content') or ''}\n\n{text}"
    else:
        out.insert(0, {"role": "system", "content": text})
    return out
