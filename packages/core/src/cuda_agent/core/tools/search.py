"""Search tools: ``glob`` (files by pattern) and ``grep`` (regular expression in files)."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

from ..interfaces import AgentTool
from .base import ToolContext, ToolError, function_schema, ok

SKIP_DIRS = {".git", "__pycache__", ".cuda_agent"}


def _walk(root: Path):
    for p in sorted(root.rglob("*")):
        if any(part in SKIP_DIRS for part in p.relative_to(root).parts):
            continue
        if p.is_file():
            yield p


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
        base = context.resolve(arguments.get("path") or ".")
        if not base.is_dir():
            raise ToolError(f"{arguments.get('path')}: not a folder")
        found = [
            p
            for p in base.glob(pattern)
            if p.is_file() and not any(part in SKIP_DIRS for part in p.relative_to(base).parts)
        ]
        found.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        if not found:
            return ok(self.name, "no files match")
        lines = [context.relative(p) for p in found[: self.options.max_results]]
        if len(found) > len(lines):
            lines.append(f"({len(found) - len(lines)} more)")
        return ok(self.name, "\n".join(lines))


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
        base = context.resolve(arguments.get("path") or ".")
        files = [base] if base.is_file() else list(_walk(base))
        gl = arguments.get("glob")
        if gl:
            files = [
                f for f in files if fnmatch.fnmatch(f.name, gl) or fnmatch.fnmatch(context.relative(f), gl)
            ]
        out: list[str] = []
        n = 0
        for f in files:
            try:
                if f.stat().st_size > self.options.max_file_bytes:
                    continue
                data = f.read_bytes()
            except OSError:
                continue
            if b"\x00" in data[:8192]:
                continue
            lines = data.decode("utf-8", errors="replace").splitlines()
            hits = [i for i, line in enumerate(lines) if rx.search(line)]
            if not hits:
                continue
            rel = context.relative(f)
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
        return ok(self.name, "\n".join(out) if out else "no matches")
