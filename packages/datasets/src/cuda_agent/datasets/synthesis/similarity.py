"""AST structural similarity, for decontamination against KernelBench.

A program becomes a sequence of tokens from a pre-order walk of its AST: node types,
with API names kept (``torch.relu``, ``nn.Conv2d``: what the program computes) and
everything local abstracted (variable, parameter and attribute names of ``self``
become ``ID``, literals ``NUM``/``STR``; docstrings dropped). Two programs' similarity
is difflib's ratio ``2*M/T`` over these sequences (M matched tokens, T total). A
candidate whose similarity to any reference exceeds the threshold (0.9 in the paper)
is rejected. The multiset bound (``quick_ratio``) skips most exact comparisons.
"""

from __future__ import annotations

import ast
import difflib
from collections import Counter
from dataclasses import dataclass

API_ROOTS = {"torch", "nn", "F", "math", "functional", "transformers"}


def _is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant) and isinstance(
        node.value.value, str
    )


def _api_path(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in API_ROOTS:
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def structure_tokens(code: str) -> list[str]:
    """The normalised token sequence of ``code`` (empty when it does not parse)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import) or isinstance(node, ast.ImportFrom):
            return
        api = _api_path(node) if isinstance(node, ast.Attribute) else None
        if api is not None:
            out.append("API:" + api.split(".", 1)[-1] if "." in api else "API:" + api)
            return
        if isinstance(node, ast.Name):
            out.append("API:" + node.id if node.id in API_ROOTS else "ID")
            return
        if isinstance(node, ast.Attribute):
            out.append("Attr")
            visit(node.value)
            return
        if isinstance(node, ast.Constant):
            out.append("STR" if isinstance(node.value, str) else "NUM")
            return
        if isinstance(node, (ast.Load, ast.Store, ast.Del)):
            return
        out.append(type(node).__name__)
        body = getattr(node, "body", None)
        for child in ast.iter_child_nodes(node):
            if isinstance(body, list) and body and child is body[0] and _is_docstring(child):
                continue
            visit(child)

    visit(tree)
    return out


def similarity(a: list[str], b: list[str]) -> float:
    if not a and not b:
        return 1.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


@dataclass
class Match:
    score: float
    ref_id: str | None


class Decontaminator:
    """Similarity of candidates to a fixed set of reference programs."""

    def __init__(self, refs: list[tuple[str, list[str]]], threshold: float = 0.9):
        self.threshold = threshold
        self.refs = [(rid, toks, Counter(toks)) for rid, toks in refs if toks]

    @classmethod
    def from_codes(cls, items: list[tuple[str, str]], threshold: float = 0.9) -> "Decontaminator":
        return cls([(rid, structure_tokens(code)) for rid, code in items], threshold)

    def payload(self) -> list[tuple[str, list[str]]]:
        return [(rid, toks) for rid, toks, _ in self.refs]

    def closest(self, code_or_tokens: str | list[str], exact_top: int = 3) -> Match:
        """The highest similarity to any reference (exact for every reference that could exceed
        the threshold, and for the ``exact_top`` best bounds)."""
        toks = structure_tokens(code_or_tokens) if isinstance(code_or_tokens, str) else code_or_tokens
        if not toks or not self.refs:
            return Match(0.0, None)
        c = Counter(toks)
        n = len(toks)
        bounds = []
        for i, (_rid, rtoks, rc) in enumerate(self.refs):
            inter = sum((c & rc).values())
            bounds.append((2.0 * inter / (n + len(rtoks)), i))
        bounds.sort(reverse=True)
        best = Match(0.0, None)
        for rank, (bound, i) in enumerate(bounds):
            if bound <= best.score:
                break
            if bound <= self.threshold and rank >= exact_top:
                break
            rid, rtoks, _ = self.refs[i]
            s = similarity(toks, rtoks)
            if s > best.score:
                best = Match(s, rid)
        return best

    def is_contaminated(self, code: str) -> tuple[bool, Match]:
        m = self.closest(code)
        return m.score > self.threshold, m
