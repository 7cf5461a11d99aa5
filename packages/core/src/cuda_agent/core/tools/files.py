"""File tools: ``read``, ``write`` (only after reading an existing file), ``edit``, ``multi_edit``.

They run host-side, often with more rights than the agent, so every path goes through the
workspace's :class:`~cuda_agent.core.safefs.Tree`: no symbolic link is followed."""

from __future__ import annotations

import stat
from dataclasses import dataclass

from ..interfaces import AgentTool
from ..safefs import UnsafePath
from .base import ToolContext, ToolError, function_schema, ok

READ_KEY = "files.read"  # workspace-relative path -> mtime_ns when the agent last read or wrote it


def _stat(ctx: ToolContext, rel: str):
    try:
        return ctx.tree.lstat(rel)
    except UnsafePath as exc:
        raise ToolError(str(exc)) from None
    except OSError as exc:
        raise ToolError(f"{rel}: {exc.strerror}") from None


def _mark_read(ctx: ToolContext, rel: str) -> None:
    st = _stat(ctx, rel)
    if st is not None:
        ctx.state.setdefault(READ_KEY, {})[rel] = st.st_mtime_ns


def _require_read(ctx: ToolContext, rel: str, verb: str) -> None:
    seen = ctx.state.get(READ_KEY, {}).get(rel)
    if seen is None:
        raise ToolError(f"read {rel} before you {verb} it")
    st = _stat(ctx, rel)
    if st is None or st.st_mtime_ns != seen:
        raise ToolError(f"{rel} changed since you last read it; read it again before you {verb} it")


def _read_text(ctx: ToolContext, rel: str) -> str:
    """The text of a workspace file, never through a link (see :mod:`cuda_agent.core.safefs`)."""
    st = _stat(ctx, rel)
    if st is None:
        raise ToolError(f"{rel}: no such file")
    if stat.S_ISDIR(st.st_mode):
        raise ToolError(f"{rel} is a directory; use glob or bash ls to list it")
    try:
        data = ctx.tree.read_bytes(rel)
    except UnsafePath as exc:
        raise ToolError(str(exc)) from None
    except OSError as exc:
        raise ToolError(f"{rel}: cannot read: {exc.strerror}") from None
    if b"\x00" in data[:8192]:
        raise ToolError(f"{rel} is a binary file")
    return data.decode("utf-8", errors="replace")


def _write_text(ctx: ToolContext, rel: str, text: str) -> bool:
    try:
        return ctx.tree.write_text(rel, text, make_dirs=True)
    except UnsafePath as exc:
        raise ToolError(str(exc)) from None
    except OSError as exc:
        raise ToolError(f"{rel}: cannot write: {exc.strerror}") from None


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
        rel = context.locate(arguments.get("path", ""))
        text = _read_text(context, rel)
        _mark_read(context, rel)
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
        rel = context.locate(arguments.get("path", ""), for_write=True)
        content = arguments.get("content")
        if not isinstance(content, str):
            raise ToolError("write: 'content' must be a string")
        st = _stat(context, rel)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{rel} is a directory")
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise ToolError(str(context.tree.link_error(rel, context.tree.readlink(rel))))
        existed = st is not None
        if existed:
            _require_read(context, rel, "overwrite")
        _write_text(context, rel, content)
        _mark_read(context, rel)
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
        rel = context.locate(arguments.get("path", ""), for_write=True)
        text = _read_text(context, rel)
        _require_read(context, rel, "edit")
        new = _apply_edit(
            text, arguments.get("old_string"), arguments.get("new_string"), bool(arguments.get("replace_all")), rel
        )
        _write_text(context, rel, new)
        _mark_read(context, rel)
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
        rel = context.locate(arguments.get("path", ""), for_write=True)
        edits = arguments.get("edits")
        if not isinstance(edits, list) or not edits:
            raise ToolError("multi_edit: 'edits' must be a non-empty list")
        text = _read_text(context, rel)
        _require_read(context, rel, "edit")
        for i, e in enumerate(edits, start=1):
            if not isinstance(e, dict):
                raise ToolError(f"edit {i}: must be an object with old_string and new_string")
            text = _apply_edit(
                text, e.get("old_string"), e.get("new_string"), bool(e.get("replace_all")), rel, f"edit {i}: "
            )
        _write_text(context, rel, text)
        _mark_read(context, rel)
        return ok(self.name, f"applied {len(edits)} edits to {rel}")
