"""What the names of a candidate module refer to, read from its syntax tree.

The static rules judge what code means, not how it is spelled: ``t = torch; t._C`` reaches
``torch._C`` as surely as ``torch._C`` does, and a variable of the candidate's that happens
to be called ``custom_op`` is not ``torch.library.custom_op``. :class:`Resolver` maps every
name bound in the module (imports, assignments, definitions) to the qualified names it may
hold, and resolves names, attribute chains and ``getattr(x, "literal")`` to them. Binding is
flow- and scope-insensitive on purpose: a name that is bound to several things anywhere in
the module may refer to any of them, and the rules look at all of them.

``OWN`` stands for something the candidate made itself (a function, a class, an argument, a
value computed at run time).
"""

from __future__ import annotations

import ast
import builtins
from collections import defaultdict

OWN = ""
_BUILTINS = frozenset(dir(builtins))


def dotted(node: ast.AST) -> str:
    """``a.b.c`` for a chain of attributes on a name, else ""."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def literal_text(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


class Resolver:
    def __init__(self, tree: ast.AST):
        self.tree = tree
        self.bindings: dict[str, set[str]] = defaultdict(set)
        self.star_imports: list[str] = []
        self._assigns: list[tuple[str, ast.AST]] = []
        self._collect()
        self._settle()

    # -- binding -------------------------------------------------------------------------

    def _own(self, name: str) -> None:
        self.bindings[name].add(OWN)

    def _target(self, target: ast.AST, value: ast.AST | None) -> None:
        if isinstance(target, ast.Name):
            if value is None:
                self._own(target.id)
            else:
                self._assigns.append((target.id, value))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._target(elt, None)
        elif isinstance(target, ast.Starred):
            self._target(target.value, None)

    def _collect(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.bindings[a.asname].add(a.name)
                    else:
                        root = a.name.split(".")[0]
                        self.bindings[root].add(root)
            elif isinstance(node, ast.ImportFrom):
                mod = ("." * node.level) + (node.module or "")
                for a in node.names:
                    if a.name == "*":
                        self.star_imports.append(mod)
                        continue
                    self.bindings[a.asname or a.name].add(f"{mod}.{a.name}" if mod else a.name)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._own(node.name)
            elif isinstance(node, ast.arg):
                self._own(node.arg)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    self._target(t, node.value if isinstance(t, ast.Name) else None)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                self._target(node.target, node.value if isinstance(node, ast.AnnAssign) else None)
            elif isinstance(node, ast.NamedExpr):
                self._target(node.target, node.value)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                self._target(node.target, None)
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                self._target(node.optional_vars, None)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                self._own(node.name)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                pass

    def _settle(self) -> None:
        """Assignments, until no binding changes (``a = torch; b = a.cuda``)."""
        for _ in range(20):
            changed = False
            for name, value in self._assigns:
                got = self.resolve(value) or {OWN}
                before = len(self.bindings[name])
                self.bindings[name] |= got
                changed |= len(self.bindings[name]) != before
            if not changed:
                return

    # -- resolving -----------------------------------------------------------------------

    def resolve(self, node: ast.AST) -> set[str]:
        """The qualified names ``node`` may evaluate to (``OWN`` among them for values of the
        candidate's own); empty when it is none of a name, an attribute chain or a literal
        ``getattr``."""
        if isinstance(node, ast.Name):
            if node.id in self.bindings:
                return set(self.bindings[node.id])
            if node.id in _BUILTINS:
                return {f"builtins.{node.id}"}
            return {OWN}
        if isinstance(node, ast.Attribute):
            return {f"{q}.{node.attr}" if q else OWN for q in self.resolve(node.value)}
        if isinstance(node, ast.Call) and self.is_builtin(node.func, "getattr") and len(node.args) >= 2:
            attr = literal_text(node.args[1])
            if attr is not None:
                return {f"{q}.{attr}" if q else OWN for q in self.resolve(node.args[0])}
        return set()

    def qualified(self, node: ast.AST) -> set[str]:
        """:meth:`resolve` without ``OWN``."""
        return {q for q in self.resolve(node) if q}

    def is_builtin(self, node: ast.AST, name: str) -> bool:
        return f"builtins.{name}" in self.resolve(node)

    def is_own(self, node: ast.AST) -> bool:
        """Only ever the candidate's own value (``self``, a local object, a class it defined)."""
        got = self.resolve(node)
        return bool(got) and got == {OWN}
