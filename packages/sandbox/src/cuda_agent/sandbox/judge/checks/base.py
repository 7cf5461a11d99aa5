"""Common ground of the static checks: finding a workspace's sources and reporting a rule."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import ClassVar, Iterator

from cuda_agent.core.interfaces import CorrectnessCheck

KERNEL_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".h", ".hpp")
# a Python string holding C++ source (single-file solutions pass it to load_inline)
_CXX_MARKERS = ("#include", "__global__", "torch::", "at::", "PYBIND11_MODULE", "TORCH_LIBRARY", "extern \"C\"")


class StaticCheck(CorrectnessCheck):
    """A rule checked on the candidate's sources before anything runs.

    ``check(workspace, candidate=None)`` looks at ``<workspace>/kernels/*`` and at the
    candidate module (``model_new.py`` unless ``candidate`` names another file, e.g. a
    KernelBench single-file solution). Each violation is one line:
    ``<file>:<line>: <what> (rule <rule>: <why>)``.
    """

    stage = "static"
    rule: ClassVar[str] = ""
    why: ClassVar[str] = ""

    def violation(self, where: str, what: str) -> str:
        return f"{where}: {what} (rule {self.rule}: {self.why})"

    # -- sources -------------------------------------------------------------------------

    @staticmethod
    def candidate_path(workspace: Path, candidate: str | Path | None) -> Path:
        p = Path(candidate) if candidate else Path("model_new.py")
        return p if p.is_absolute() else Path(workspace) / p

    @staticmethod
    def rel(workspace: Path, path: Path) -> str:
        try:
            return str(Path(path).resolve().relative_to(Path(workspace).resolve()))
        except ValueError:
            return Path(path).name

    def python_tree(self, workspace: Path, candidate=None) -> tuple[str, ast.AST | None, str]:
        path = self.candidate_path(workspace, candidate)
        if not path.is_file():
            return self.rel(workspace, path), None, ""
        text = path.read_text(errors="replace")
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError:
            return self.rel(workspace, path), None, text  # the import reports it as a compile error
        return self.rel(workspace, path), tree, text

    def kernel_sources(self, workspace: Path, candidate=None) -> Iterator[tuple[str, int, str]]:
        """(label, first line, C++ text) for every kernel file and every C++ string in the candidate."""
        kdir = Path(workspace) / "kernels"
        if kdir.is_dir():
            for f in sorted(kdir.rglob("*")):
                if f.is_file() and f.suffix in KERNEL_SUFFIXES:
                    yield self.rel(workspace, f), 1, f.read_text(errors="replace")
        label, tree, _ = self.python_tree(workspace, candidate)
        if tree is not None:
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if any(m in node.value for m in _CXX_MARKERS):
                        yield f"{label} (C++ string)", node.lineno, node.value


class PythonRule(StaticCheck):
    """A rule on the candidate's Python source: :meth:`findings` of its syntax tree, with the
    names in it resolved (a file that does not parse is the import's compile error, not a finding)."""

    def check(self, workspace: Path, candidate=None) -> list[str]:
        label, tree, _ = self.python_tree(Path(workspace), candidate)
        if tree is None:
            return []
        from .names import Resolver

        return self.findings(label, tree, Resolver(tree))

    def findings(self, label: str, tree: ast.AST, names) -> list[str]:
        raise NotImplementedError


def strip_cxx(text: str) -> str:
    """Remove comments and string/char literals, keeping line breaks (line numbers stay right)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                if text[j] == "\\":
                    j += 1
                elif text[j] == "\n":
                    break
                j += 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


WORD = re.compile(r"\w+")
