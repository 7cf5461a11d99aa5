"""Tool calls written as text by token-level policies.

Format (Hermes / Qwen2.5): each call is a JSON object on its own inside tags::

    <tool_call>
    {"name": "bash", "arguments": {"command": "ls"}}
    </tool_call>

``arguments`` may also be a JSON string holding the object. Text outside the tags is the
assistant's content. A call whose JSON cannot be parsed, or an unclosed tag, becomes a
:class:`ToolCall` with ``error`` set: the loop returns the error to the model as that
call's result instead of stopping.
"""

from __future__ import annotations

import json
import re

from ..types import ToolCall

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)
_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')


def format_tool_call(name: str, arguments: dict) -> str:
    """The text a model writes for one call (inverse of :func:`parse_tool_calls`)."""
    return f"{OPEN}\n" + json.dumps({"name": name, "arguments": arguments}) + f"\n{CLOSE}"


def _one(raw: str, idx: int, prefix: str) -> ToolCall:
    call_id = f"{prefix}{idx}"
    body = raw.strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        m = _NAME.search(body)
        return ToolCall(
            id=call_id, name=m.group(1) if m else "", raw_arguments=body,
            error=f"tool call is not valid JSON ({exc.msg} at char {exc.pos})",
        )
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(id=call_id, name="", raw_arguments=body, error='tool call needs {"name": ..., "arguments": {...}}')
    args = obj.get("arguments", {})
    raw_args = json.dumps(args) if not isinstance(args, str) else args
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolCall(id=call_id, name=obj["name"], raw_arguments=raw_args,
                            error=f"arguments of {obj['name']} are not valid JSON ({exc.msg})")
    if not isinstance(args, dict):
        return ToolCall(id=call_id, name=obj["name"], raw_arguments=raw_args,
                        error=f"arguments of {obj['name']} must be a JSON object")
    return ToolCall(id=call_id, name=obj["name"], arguments=args, raw_arguments=raw_args)


def parse_tool_calls(text: str, id_prefix: str = "call_") -> tuple[str, list[ToolCall]]:
    """Split generated text into (content, tool calls)."""
    calls = [_one(m.group(1), i, id_prefix) for i, m in enumerate(_BLOCK.finditer(text))]
    content = _BLOCK.sub("", text)
    tail = content.rfind(OPEN)
    if tail >= 0:  # an opened call that never closed (cut by the length limit)
        calls.append(ToolCall(id=f"{id_prefix}{len(calls)}", name="", raw_arguments=content[tail + len(OPEN):].strip(),
                              error="tool call was not closed with </tool_call> (output too long?)"))
        content = content[:tail]
    return content.strip(), calls
