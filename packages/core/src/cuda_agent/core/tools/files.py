"""File tools: ``read``, ``write`` (only after reading an existing file), ``edit``, ``multi_edit``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..interfaces import AgentTool
from .base import ToolContext, ToolError, function_schema, ok

READ_KEY = "files.read"  # abs path -> mtime_ns when the agent last read or wrote it


def _mark_read(ctx: ToolContext, path: Path) -> None:
    ctx.state.setdefault(READ_KEY, {})[str(path)] = path.stat().st_mtime_ns


def _require_read(ctx: ToolContext, path: Path, verb: str) -> None:
    seen = ctx.state.get(READ_KEY, {}).get(str(path))
    rel = ctx.relative(path)
    if seen is None:
        raise ToolError(f"read {rel} before you {verb} it")
    if path.stat().st_mtime_ns != seen:
        raise ToolError(f"{rel} changed since you last read it; read it again before you {verb} it")


def _read_text(path: Path, rel: str) -> str:
    if not path.exists():
        raise ToolError(f"{rel}: no such file")
    if path.is_dir():
        raise ToolError(f"{rel} is a directory; use glob or bash ls to list it")
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        raise ToolError(f"{rel} is a binary file")
    return data.decode("utf-8", errors="replace")


@dataclass
class ReadOptions:
    max_lines: int = 2000  # lines returned when no limit is given
    max_line_chars: int = 2000


class ReadTool(AgentTool):
    name = "read"
    description = "Read a text file with line numbers."
    Options = ReadOptions

    def schema(self) -> dict:
        return function_schema(
            self.name,
            "Read a file of the workspace. Lines are numbered from 1 (number, tab, text). "
            "Use offset and limit for long files.",
            {
                "path": {"type": "string", "description": "File path, relative to the workspace."},
                "offset": {"type": "integer", "description": "First line to show (1-based)."},
                "limit": {"type": "integer", "description": "How many lines to show."},
            },
            ["path"],
        )

    def call(self, arguments: dict, context: ToolContext):
        path = context.resolve(arguments.get("path", ""))
        rel = context.relative(path)
        text = _read_text(path, rel)
        _mark_read(context, path)
        lines = text.splitlines()
        try:
            offset = max(1, int(arguments.get("offset") or 1))
            limit = int(arguments.get("limit") or self.options.max_lines)
        except (TypeError, ValueError):
            raise ToolError("offset and limit must be integers")
        if not lines:
            return ok(self.name, f"({rel} is empty)")
        chunk = lines[offset - 1 : offset - 1 + max(limit, 0)]
        width = len(str(offset + len(chunk)))
        out = []
        for i, line in enumerate(chunk, start=offset):
            if len(line) > self.options.max_line_chars:
                line = line[: self.options.max_line_chars] + " [line cut]"
            out.append(f"{i:>{width}}\t{line}")
        rest = len(lines) - (offset - 1 + len(chunk))
        if rest > 0:
            out.append(f"({rest} more lines; read with offset={offset + len(chunk)})")
        return ok(self.name, "\n".join(out))


class WriteTool(AgentTool):
    name = "write"
    description = "Create or overwrite a file (an existing file must be read first)."

    def schema(self) -> dict:
        return function_schema(
            self.name,
            "Write a file of the workspace, replacing its content. An existing file must be read "
            "with the read tool first. Parent folders are created.",
            {
                "path": {"type": "string", "description": "File path, relative to the workspace."},
                "content": {"type": "string", "description": "The complete new content."},
            },
            ["path", "content"],
        )

    def call(self, arguments: dict, context: ToolContext):
        path = context.resolve(arguments.get("path", ""), for_write=True)
        content = arguments.get("content")
        if not isinstance(content, str):
            raise ToolError("write: 'content' must be a string")
        rel = context.relative(path)
        if path.is_dir():
            raise ToolError(f"{rel} is a directory")
        existed = path.exists()
        if existed:
            _require_read(context, path, "overwrite")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        _mark_read(context, path)
        n = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
        return ok(self.name, f"{'overwrote' if existed else 'created'} {rel} ({n} lines)")


def _apply_edit(text: str, old: str, new: str, replace_all: bool, rel: str, which: str = "") -> str:
    if not isinstance(old, str) or not isinstance(new, str):
        raise ToolError(f"{which}old_string and new_string must be strings")
    if old == new:
        raise ToolError(f"{which}old_string and new_string are the same")
    if old == "":
        raise ToolError(f"{which}old_string is empty; use write to create a file")
    count = text.count(old)
    if count == 0:
        raise ToolError(f"{which}old_string not found in {rel}")
    if count > 1 and not replace_all:
        raise ToolError(
            f"{which}old_string occurs {count} times in {rel}; give more context to make it unique or set replace_all"
        )
    return text.replace(old, new) if replace_all else text.replace(old, new, 1)


_EDIT_PROPS = {
    "old_string": {"type": "string", "description": "Exact text to replace."},
    "new_string": {"type": "string", "description": "The replacement."},
    "replace_all": {"type": "boolean", "description": "Replace every occurrence (default: it must be unique)."},
}


class EditTool(AgentTool):
    name = "edit"
    description = "Replace exact text in a file that was read."

    def schema(self) -> dict:
        return function_schema(
            self.name,
            "Replace old_string by new_string in a file you have read. old_string must match exactly "
            "(whitespace included) and be unique unless replace_all is set.",
            {"path": {"type": "string", "description": "File path, relative to the workspace."}, **_EDIT_PROPS},
            ["path", "old_string", "new_string"],
        )

    def call(self, arguments: dict, context: ToolContext):
        path = context.resolve(arguments.get("path", ""), for_write=True)
        rel = context.relative(path)
        text = _read_text(path, rel)
        _require_read(context, path, "edit")
        new = _apply_edit(
            text, arguments.get("old_string"), arguments.get("new_string"), bool(arguments.get("replace_all")), rel
        )
        path.write_text(new)
        _mark_read(context, path)
        return ok(self.name, f"edited {rel}")


class MultiEditTool(AgentTool):
    name = "multi_edit"
    description = "Apply several replacements to one file, all or none."

    def schema(self) -> dict:
        return function_schema(
            self.name,
            "Apply a list of edits to one file you have read, in order; each edit sees the result of the "
            "previous ones. If any edit fails, none is applied.",
            {
                "path": {"type": "string", "description": "File path, relative to the workspace."},
                "edits": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": _EDIT_PROPS,
                        "required": ["old_string", "new_string"],
                    },
                },
            },
            ["path", "edits"],
        )

    def call(self, arguments: dict, context: ToolContext):
        path = context.resolve(arguments.get("path", ""), for_write=True)
        rel = context.relative(path)
        edits = arguments.get("edits")
        if not isinstance(edits, list) or not edits:
            raise ToolError("multi_edit: 'edits' must be a non-empty list")
        text = _read_text(path, rel)
        _require_read(context, path, "edit")
        for i, e in enumerate(edits, start=1):
            if not isinstance(e, dict):
                raise ToolError(f"edit {i}: must be an object with old_string and new_string")
            text = _apply_edit(
                text, e.get("old_string"), e.get("new_string"), bool(e.get("replace_all")), rel, f"edit {i}: "
            )
        path.write_text(text)
        _mark_read(context, path)
        return ok(self.name, f"applied {len(edits)} edits to {rel}")
