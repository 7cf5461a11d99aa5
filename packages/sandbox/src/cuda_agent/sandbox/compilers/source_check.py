"""What a build read, checked against what it may read (defence in depth behind :mod:`.jail`).

The spelling of a source says little about the files it makes the compiler read: a line
splice, a comment inside the directive, a digraph (``%:include``), a macro, an assembler
``.include`` or an ``.incbin`` split across string literals all read a file no pattern
names. So every compile unit reports what it really read: the preprocessor's dependency
list (``-MD -MF``) and the assembler's (``--MD``, which lists ``.include`` and ``.incbin``
files). Each file in them must lie in the build's own copy of the sources, in the tool's
scratch folder, or below one of the toolchain's header folders (the compiler's own search
list, CUDA's, torch's, Python's, the precompiled header's). Any other file refuses the unit
(rule :data:`RULE_READS`): its object is not kept and its compiler output is not shown, only
the refusal naming the file.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

RULE_READS = "build.reads"
RULE_FILES = "build.files"
_READS_TEXT = ("a build reads only the workspace's own sources and headers and the toolchain's "
               "(system, CUDA, torch and Python headers)")


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a Make-style dependency file (``target: dep dep \\``)."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    out: list[str] = []
    for line in text.splitlines():
        m = re.match(r"^(.*?[^\\]):(?:\s|$)", line)
        if not m:
            continue
        rest = line[m.end():]
        for tok in re.findall(r"(?:\\.|[^\s\\])+", rest):
            dep = re.sub(r"\\(.)", r"\1", tok).replace("$$", "$")
            if dep and dep not in out:
                out.append(dep)
    return out


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def allowed_roots(paths: list[str]) -> list[str]:
    """``paths`` normalised, with their real paths beside them."""
    out: list[str] = []
    for p in paths:
        if not p:
            continue
        for q in (os.path.normpath(os.path.abspath(p)), os.path.realpath(p)):
            if q != "/" and q not in out:
                out.append(q)
    return out


def outside_reads(deps: list[str], cwd: str, roots: list[str]) -> list[str]:
    """The files of ``deps`` (relative ones taken from ``cwd``) below none of ``roots``."""
    bad = []
    for d in deps:
        p = os.path.normpath(d if os.path.isabs(d) else os.path.join(cwd, d))
        # a toolchain reached through a link (/usr/local/cuda -> /usr/local/cuda-13.0) is the
        # toolchain: the file is judged by where it really is as well as by the name read
        if not any(_under(q, r) for q in (p, os.path.realpath(p)) for r in roots):
            bad.append(p)
    return bad


def read_refusals(unit: str, bad: list[str]) -> list[str]:
    """One ``file:line: error:`` line per file read that the build may not read."""
    return [f"{unit}:1: error: the build read {p}, which is neither the workspace's nor the toolchain's "
            f"(rule {RULE_READS}: {_READS_TEXT}); include only those, and name no other file in "
            "#include, #embed, .include or .incbin" for p in bad[:3]]


def link_refusal(rel: str, why: str) -> str:
    """The refusal of a build input that is not a plain file with one name."""
    return (f"{rel}:1: error: {why} (rule {RULE_FILES}: a build uses only regular files of the workspace); "
            "write the file itself into kernels/")


@functools.lru_cache(maxsize=None)
def compiler_search_dirs(cxx: str, lang: str = "c++") -> tuple[str, ...]:
    """The folders ``cxx`` searches for ``#include <...>`` and ``"..."`` by default."""
    try:
        out = subprocess.run([cxx, f"-x{lang}", "-E", "-v", "-"], input="", capture_output=True, text=True,
                             timeout=60, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return ()
    dirs, inside = [], False
    for line in out.stderr.splitlines():
        if line.startswith("#include") and "search starts here" in line:
            inside = True
            continue
        if line.startswith("End of search list"):
            break
        if inside and line.startswith(" "):
            d = line.strip().split(" (")[0]
            if os.path.isdir(d):
                dirs.append(os.path.normpath(d))
    return tuple(dirs)


@functools.lru_cache(maxsize=None)
def nvcc_host_compiler(nvcc: str, ccbin: tuple[str, ...] = ()) -> str:
    """The host compiler ``nvcc`` runs for a ``.cu`` file's host side (``-ccbin``'s, else its
    default ``gcc`` from the search path, which need not be the ``g++`` of the C++ units), as
    its dry run shows it; "" when that cannot be told."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    with tempfile.TemporaryDirectory(prefix="cuda-agent-nvcc-probe-") as d:
        src = Path(d) / "probe.cu"
        src.write_text("int main() { return 0; }\n")
        try:
            out = subprocess.run([nvcc, *ccbin, "-dryrun", "-c", str(src), "-o", str(Path(d) / "probe.o")],
                                 capture_output=True, text=True, timeout=60, env=env)
        except (OSError, subprocess.SubprocessError):
            return ""
    for line in (out.stderr + out.stdout).splitlines():
        if not line.startswith("#$ "):
            continue
        try:
            words = shlex.split(line[3:])
        except ValueError:
            continue
        if words and "=" not in words[0] and "-E" in words and "c++" in words:
            return shutil.which(words[0], path=env["PATH"]) or ""
    return ""


def ccbin_flags(flags: list[str]) -> tuple[str, ...]:
    """The options of ``flags`` that choose nvcc's host compiler."""
    out: list[str] = []
    for i, f in enumerate(flags):
        if f in ("-ccbin", "--compiler-bindir") and i + 1 < len(flags):
            out += [f, flags[i + 1]]
        elif f.startswith(("-ccbin=", "--compiler-bindir=")):
            out.append(f)
    return tuple(out)


def read_depfiles(paths: list[Path]) -> tuple[list[str], list[str]]:
    """(prerequisites of the dependency files that exist, the names of those missing)."""
    deps: list[str] = []
    missing: list[str] = []
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            missing.append(p.name)
            continue
        with os.fdopen(fd, "rb") as fh:
            text = fh.read(16 << 20).decode("utf-8", "replace")
        deps += [d for d in parse_depfile(text) if d not in deps]
    return deps, missing
