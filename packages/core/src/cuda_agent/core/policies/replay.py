"""``replay`` policy: replays the assistant turns of a recorded trajectory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..agent.loop import ChatReply
from ..errors import ConfigError
from ..interfaces import Policy
from ..types import ToolCall


@dataclass
class ReplayOptions:
    path: str = ""  # a trajectory record (.json), a JSONL of them, or a script {"turns": [...]}
    index: int = 0  # which record of a JSONL file
    final_message: str = "Recorded trajectory finished.\nDONE"  # said when the turns run out


def load_turns(path: str | Path, index: int = 0) -> list[dict]:
    """Assistant turns of a recording: ``[{"content" | "assistant": str, "tool_calls": [{name, arguments}]}]``."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"replay: recording not found: {p}")
    text = p.read_text()
    try:
        if p.suffix == ".jsonl":
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
            if not records:
                raise ConfigError(f"replay: {p} holds no record")
            if not 0 <= index < len(records):
                raise ConfigError(f"replay: {p} has {len(records)} records; index {index} is out of range")
            data = records[index]
        elif p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except (json.JSONDecodeError, ValueError) as exc:
        raise ConfigError(f"replay: {p} is not valid JSON: {exc}")
    turns = data.get("turns") if isinstance(data, dict) else None
    if not isinstance(turns, list):
        raise ConfigError(f"replay: {p} has no 'turns' list")
    return turns


class ReplayPolicy(Policy):
    """Chat-level policy that answers with the recorded turns, in order.

    The turn to replay is the number of assistant messages already in the conversation, so
    one policy object can replay many episodes. When the recording runs out it answers
    ``final_message`` without tool calls.
    """

    name = "replay"
    description = "Replay the assistant turns of a recorded trajectory (demos, tests)."
    Options = ReplayOptions

    def __init__(self, options: ReplayOptions | None = None, turns: list[dict] | None = None):
        super().__init__(options)
        if turns is None:
            if not self.options.path:
                raise ConfigError("policy replay needs options.path (a recorded trajectory)")
            turns = load_turns(self.options.path, self.options.index)
        self.turns = turns

    def chat(self, messages: list[dict], tools: list[dict], sampling: dict) -> ChatReply:
        k = sum(1 for m in messages if m.get("role") == "assistant")
        if k >= len(self.turns):
            return ChatReply(content=self.options.final_message, finish_reason="stop")
        t = self.turns[k]
        calls = []
        for i, c in enumerate(t.get("tool_calls") or []):
            args = c.get("arguments", {})
            calls.append(ToolCall(id=c.get("id") or f"call_{k}_{i}", name=c.get("name", ""),
                                  arguments=dict(args) if isinstance(args, dict) else {},
                                  raw_arguments=c.get("raw_arguments") or json.dumps(args), error=c.get("error")))
        content = t.get("content", t.get("assistant", "")) or ""
        return ChatReply(content=content, tool_calls=calls, finish_reason="tool_calls" if calls else "stop")
