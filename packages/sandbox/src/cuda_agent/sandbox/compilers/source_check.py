"""Source checks before any tool runs: builds run host-side, so the agent's sources must
not make the compiler read files outside the workspace (an ``#include "/etc/..."`` would
print them in error messages; ``.incbin`` would embed them)."""

from __future__ import annotations

import re
from pathlib import Path

_INCLUDE = re.compile(r'^\s*#\s*(include|include_next|import|embed)\b\s*(.*)$')
_BAD = [
    (re.compile(r'\.incbin\b'), "embeds a file with .incbin"),
    (re.compile(r'__has_include\s*\(\s*"\s*/'), "probes an absolute path"),
    (re.compile(r'^\s*#\s*pragma\s+GCC\s+dependency', re.M), "uses #pragma GCC dependency"),
    (re.compile(r'^\s*#\s*line\s+\d+\s+"', re.M), "rewrites file names with #line"),
]


def check_sources(root: Path, files: list[str]) -> list[str]:
    """Violations as ``file:line: error: message`` (empty when the sources are fine)."""
    root = root.resolve()
    errors: list[str] = []
    for rel in files:
        p = root / rel
        if p.is_symlink():
            errors.append(f"{rel}:1: error: symbolic links are not allowed in kernels/; write a regular file")
            continue
        try:
            text = p.read_text(errors="replace")
        except OSError as exc:
            errors.append(f"{rel}:1: error: cannot read: {exc.strerror}")
            continue
        for pat, what in _BAD:
            m = pat.search(text)
            if m:
                line = text.count("\n", 0, m.start()) + 1
                errors.append(f"{rel}:{line}: error: not allowed: the source {what}")
        for i, line in enumerate(text.splitlines(), 1):
            m = _INCLUDE.match(line)
            if not m:
                continue
            arg = m.group(2).strip()
            if m.group(1) == "embed":
                errors.append(f"{rel}:{i}: error: #embed is not allowed")
                continue
            if not arg or arg[0] not in '<"':
                errors.append(f"{rel}:{i}: error: computed #include is not allowed; write <file> or \"file\"")
                continue
            end = arg.find(">" if arg[0] == "<" else '"', 1)
            name = arg[1:end] if end > 0 else arg[1:]
            if name.startswith("/"):
                errors.append(f"{rel}:{i}: error: #include of an absolute path is not allowed: {name}")
                continue
            if ".." in Path(name).parts:
                if arg[0] == "<":
                    errors.append(f"{rel}:{i}: error: #include <...> may not climb out with '..': {name}")
                    continue
                target = (p.parent / name).resolve()
                try:
                    target.relative_to(root)
                except ValueError:
                    errors.append(f"{rel}:{i}: error: #include of a file outside the workspace: {name}")
    return errors


def kernel_files(root: Path) -> list[str]:
    kdir = root / "kernels"
    if not kdir.is_dir():
        return []
    return [str(p.relative_to(root)) for p in sorted(kdir.rglob("*")) if p.is_file() or p.is_symlink()]
