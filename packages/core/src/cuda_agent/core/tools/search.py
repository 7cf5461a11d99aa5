"""Search tools: ``glob`` (files by pattern) and ``grep`` (regular expression in files).

Both walk the workspace through its :class:`~cuda_agent.core.safefs.Tree`: folders are
entered and files read only when no symbolic link is on the way; links met are named in
the answer, not followed."""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from dataclasses import dataclass

from ..interfaces import AgentTool
from ..safefs import UnsafePath
from .base import ToolContext, ToolError, function_schema, ok

SKIP_DIRS = frozenset({".git", "__pycache__", ".cuda_agent"})
MAX_LINK_NOTES = 5


def _walk(context: ToolContext, base: str):
    """(relative path, status) of the regular files below ``base``, and the links met
    (never followed)."""
    files, links = [], []
    try:
        for rel, st in context.tree.walk(base, skip=SKIP_DIRS):
            if stat.S_ISREG(st.st_mode):
                files.append((rel, st))
            elif stat.S_ISLNK(st.st_mode):
                links.append(rel)
    except UnsafePath as exc:
        raise ToolError(str(exc)) from None
    return files, links


def _link_notes(context: ToolContext, links: list[str]) -> list[str]:
    notes = []
    for rel in links[:MAX_LINK_NOTES]:
        try:
            notes.append(str(context.tree.link_error(rel, context.tree.readlink(rel), rel)))
        except (OSError, UnsafePath):
            continue
    if len(links) > MAX_LINK_NOTES:
        notes.append(f"({len(links) - MAX_LINK_NOTES} more symbolic links not followed)")
    return notes


def _base(context: ToolContext, path: str | None, tool: str) -> tuple[str, os.stat_result]:
    rel = context.locate(path or ".")
    try:
        st = context.tree.lstat(rel)
    except UnsafePath as exc:
        raise ToolError(str(exc)) from None
    if st is None:
        raise ToolError(f"{tool}: {rel}: no such file or folder")
    if stat.S_ISLNK(st.st_mode):
        raise ToolError(str(context.tree.link_error(rel, context.tree.readlink(rel))))
    return rel, st


def glob_regex(pattern: str) -> re.Pattern:
    """A regular expression for a glob over relative paths: ``*`` and ``?`` stay within one
    path component, ``**`` spans any number of them, ``[...]`` is a character class."""
    segments = [seg for seg in pattern.split("/") if seg not in ("", ".")]
    if pattern.startswith("/") or ".." in segments:
        raise ToolError(f"glob: pattern {pattern!r} leaves the workspace ('..' or an absolute path); "
                        "patterns match inside the workspace only (use path= for a sub-folder)")
    out = []
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == "**":
            out.append(".*" if last else "(?:[^/]+/)*")
            continue
        j, part = 0, []
        while j < len(seg):
            c = seg[j]
            if c == "*":
                part.append("[^/]*")
            elif c == "?":
                part.append("[^/]")
            elif c == "[" and seg.find("]", j + 2) != -1:
                end = seg.index("]", j + 2)
                body = seg[j + 1:end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                part.append("[" + body.replace("\\", "\\\\").replace("/", "") + "]")
                j = end
            else:
                part.append(re.escape(c))
            j += 1
        out.append("".join(part) + ("" if last else "/"))
    return re.compile("".join(out) + r"\Z", re.DOTALL)


@dataclass
class GlobOptions:
    max_results: int = 200


class GlobTool(AgentTool):
    name = "glob"
    description = "List files matching a glob pattern."
    Options = GlobOptions

    def schema(self) -> dict:
        return function_schema(
            self.name,
            "List workspace files matching a glob pattern such as 'kernels/*.cu' or '**/*.py', "
            "most recently modified first.",
            {
                "pattern": {"type": "string", "description": "Glob pattern, relative to path."},
                "path": {"type": "string", "description": "Folder to search (default: the workspace)."},
            },
            ["pattern"],
        )

    def call(self, arguments: dict, context: ToolContext):
        pattern = arguments.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ToolError("glob: 'pattern' must be a non-empty string")
        rx = glob_regex(pattern)
        base, st = _base(context, arguments.get("path"), "glob")
        if not stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{arguments.get('path')}: not a folder")
        prefix = "" if base == "." else base + "/"
        files, links = _walk(context, base)
        found = [(rel, st) for rel, st in files if rx.match(rel[len(prefix):])]
        found.sort(key=lambda e: e[1].st_mtime, reverse=True)
        notes = _link_notes(context, [rel for rel in links if rx.match(rel[len(prefix):])])
        if not found:
            return ok(self.name, "\n".join(["no files match", *notes]))
        lines = [rel for rel, _ in found[: self.options.max_results]]
        if len(found) > len(lines):
            lines.append(f"({len(found) - len(lines)} more)")
        return ok(self.name, "\n".join(lines + notes))


@dataclass
class GrepOptions:
    max_matches: int = 200
    max_file_bytes: int = 2_000_000


class GrepTool(AgentTool):
    name = "grep"
    description = "Search file contents with a regular expression."
    Options = GrepOptions

    def schema(self) -> dict:
        return function_schema(
            self.name,
            "Search workspace files for a Python regular expression. output_mode 'content' (default) "
            "shows matching lines as path:line:text, 'files_with_matches' lists files, 'count' counts per file.",
            {
                "pattern": {"type": "string", "description": "Regular expression."},
                "path": {"type": "string", "description": "File or folder to search (default: the workspace)."},
                "glob": {"type": "string", "description": "Only files whose name or path matches this glob, e.g. '*.cu'."},
                "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
                "ignore_case": {"type": "boolean"},
                "context": {"type": "integer", "description": "Lines of context around each match (content mode)."},
            },
            ["pattern"],
        )

    def call(self, arguments: dict, context: ToolContext):
        pattern = arguments.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ToolError("grep: 'pattern' must be a non-empty string")
        try:
            rx = re.compile(pattern, re.IGNORECASE if arguments.get("ignore_case") else 0)
        except re.error as exc:
            raise ToolError(f"grep: bad regular expression: {exc}")
        mode = arguments.get("output_mode") or "content"
        if mode not in ("content", "files_with_matches", "count"):
            raise ToolError(f"grep: unknown output_mode {mode!r}")
        ctx_lines = max(0, int(arguments.get("context") or 0))
        base, st = _base(context, arguments.get("path"), "grep")
        files, links = ([(base, st)], []) if stat.S_ISREG(st.st_mode) else _walk(context, base)
        gl = arguments.get("glob")
        if gl:
            files = [(f, s) for f, s in files if fnmatch.fnmatch(f.rsplit("/", 1)[-1], gl) or fnmatch.fnmatch(f, gl)]
            links = [f for f in links if fnmatch.fnmatch(f.rsplit("/", 1)[-1], gl) or fnmatch.fnmatch(f, gl)]
        out: list[str] = []
        n = 0
        for f, fst in files:
            if fst.st_size > self.options.max_file_bytes:
                continue
            try:
                data = context.tree.read_bytes(f, self.options.max_file_bytes)
            except (OSError, UnsafePath):
                continue
            if b"\x00" in data[:8192]:
                continue
            lines = data.decode("utf-8", errors="replace").splitlines()
            hits = [i for i, line in enumerate(lines) if rx.search(line)]
            if not hits:
                continue
            rel = f
            if mode == "files_with_matches":
                out.append(rel)
            elif mode == "count":
                out.append(f"{rel}:{len(hits)}")
            else:
                shown: set[int] = set()
                for i in hits:
                    for j in range(max(0, i - ctx_lines), min(len(lines), i + ctx_lines + 1)):
                        if j not in shown:
                            shown.add(j)
                            sep = ":" if j == i else "-"
                            out.append(f"{rel}{sep}{j + 1}{sep}{lines[j]}")
            n += 1 if mode != "content" else len(hits)
            if n >= self.options.max_matches:
                out.append(f"(stopped after {self.options.max_matches} matches)")
                break
        out += _link_notes(context, links)
        return ok(self.name, "\n".join(out) if out else "no matches")
