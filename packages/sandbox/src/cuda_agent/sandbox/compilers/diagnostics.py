"""Compiler output trimmed to what an agent can act on.

g++, nvcc (its EDG front end and the host compiler behind it), ptxas, nvlink and ld
write pages of template back-traces, notes and include chains. This keeps the first
errors as ``file:line: message`` with paths relative to the workspace.
"""

from __future__ import annotations

import re
from pathlib import Path

# g++ / clang:  path:line:col: error: message
_GCC = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?P<sev>fatal error|error):\s*(?P<msg>.*)$")
# nvcc front end:  path(line): error: message   (also "error #20: ...")
_EDG = re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\):\s*(?P<sev>error|catastrophic error)(?:\s*#\S+)?:\s*(?P<msg>.*)$")
# ptxas / nvlink / ld / generic tool errors
_TOOL = re.compile(r"^(?P<tool>ptxas|nvlink|ld|/usr/bin/ld|collect2|nvcc|c\+\+|g\+\+|cc1plus)(?: fatal)?\s*(?:error|fatal)?\s*:?\s*(?P<msg>.*(?:error|undefined reference|cannot find|multiple definition|returned \d+ exit status).*)$", re.I)
_UNDEF = re.compile(r"^(?P<file>[^:\s]+):(?:\([^)]*\)|[^:]*):\s*(?P<msg>(?:undefined reference|multiple definition).*)$")


def _rel(path: str, root: Path | None) -> str:
    if root is None:
        return path
    p = Path(path)
    try:
        if p.is_absolute():
            return str(p.resolve().relative_to(root.resolve()))
    except (ValueError, OSError):
        pass
    return path


def trim_errors(output: str, root: Path | None = None, max_errors: int = 5) -> list[str]:
    """The first ``max_errors`` distinct errors of a compiler/linker log."""
    found: list[str] = []
    seen: set[str] = set()
    total = 0
    for raw in output.splitlines():
        line = raw.rstrip()
        entry = None
        m = _GCC.match(line) or _EDG.match(line)
        if m:
            msg = m.group("msg").strip()
            msg = re.sub(r"\s+", " ", msg)
            entry = f"{_rel(m.group('file'), root)}:{m.group('line')}: error: {msg}"
        else:
            m = _UNDEF.match(line)
            if m:
                entry = f"link: {m.group('msg').strip()}"
            else:
                m = _TOOL.match(line.strip())
                if m and "exit status" not in m.group("msg"):
                    entry = f"{m.group('tool')}: {m.group('msg').strip()}"
        if entry is None:
            continue
        if len(entry) > 400:
            entry = entry[:400] + " ..."
        if entry in seen:
            continue
        seen.add(entry)
        total += 1
        if len(found) < max_errors:
            found.append(entry)
    if total > len(found):
        found.append(f"... and {total - len(found)} more errors")
    if not found and output.strip():
        # no recognisable error line: keep the last meaningful lines
        tail = [ln.strip() for ln in output.splitlines() if ln.strip()][-3:]
        found = [" | ".join(tail)[:400]]
    return found


def log_tail(output: str, max_chars: int = 4000) -> str:
    """The end of a log, without the template back-trace noise."""
    keep = []
    for line in output.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith(("In file included from", "from ", "required from", "In instantiation of")):
            continue
        if ": note:" in s or "required from here" in s or s.startswith("detected during"):
            continue
        keep.append(line)
    text = "\n".join(keep)
    return text[-max_chars:]
