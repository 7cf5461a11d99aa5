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

Qualified names are judged by the objects they name, not by the path written: an attribute
chain through real modules is walked in this (trusted) process, so ``torch.nn.functional.torch._C``
is ``torch._C`` and ``os.path`` is ``posixpath`` (:func:`canonical`). Only modules already imported
here are walked (nothing the candidate names is imported for it); past a module that is not, a
component that names a module this process knows (``cuda_agent_runtime.ctypes.pythonapi``) is
taken as that module.
"""

from __future__ import annotations

import ast
import builtins
import sys
import types
from collections import defaultdict

OWN = ""
_BUILTINS = frozenset(dir(builtins))
_MISSING = object()


def _module_attr(mod: types.ModuleType, name: str):
    """``mod.name`` when it is a module, read from the module's own namespace or the imported
    submodules (never through a module ``__getattr__``, which could import more)."""
    try:
        got = vars(mod).get(name, _MISSING)
    except TypeError:
        return None
    if got is _MISSING:
        got = sys.modules.get(f"{getattr(mod, '__name__', '')}.{name}", _MISSING)
    return got if isinstance(got, types.ModuleType) else None


def _known_module_name(name: str) -> bool:
    return name in sys.modules or name in sys.builtin_module_names or name in getattr(sys, "stdlib_module_names", ())


def canonical(qualified: str) -> str:
    """The qualified name of what ``qualified`` refers to, through the modules it passes
    (see the module docstring); names past the last module stay as written."""
    parts = qualified.split(".")
    if not parts or not parts[0]:
        return qualified
    mod = sys.modules.get(parts[0])
    prefix, i = [parts[0]], 1
    if isinstance(mod, types.ModuleType):
        prefix = (getattr(mod, "__name__", None) or parts[0]).split(".")
        while i < len(parts):
            nxt = _module_attr(mod, parts[i])
            if nxt is None:
                break
            mod, prefix, i = nxt, (getattr(nxt, "__name__", None) or parts[i]).split("."), i + 1
        if i < len(parts) and parts[i] not in vars(mod):  # past what this process can see
            mod = None
    if mod is None or not isinstance(mod, types.ModuleType):
        # an unknown module's attribute named like a known module is taken to be that module
        rest = parts[i:]
        for j, part in enumerate(rest):
            if _known_module_name(part):
                return canonical(".".join(rest[j:]))
    return ".".join(prefix + parts[i:])


def is_module(qualified: str) -> bool | None:
    """Whether ``qualified`` names a module (True/False), or None when this process cannot tell."""
    parts = canonical(qualified).split(".")
    mod = sys.modules.get(parts[0])
    if not isinstance(mod, types.ModuleType):
        return None
    for part in parts[1:]:
        nxt = _module_attr(mod, part)
        if nxt is None:
            return False if part in vars(mod) else None
        mod = nxt
    return True


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
        self.modules: set[str] = set()  # what ``import`` statements bind: modules for sure
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
            pairwise = (isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
                        and not any(isinstance(e, ast.Starred) for e in (*value.elts, *target.elts)))
            for k, elt in enumerate(target.elts):
                self._target(elt, value.elts[k] if pairwise else None)
        elif isinstance(target, ast.Starred):
            self._target(target.value, None)

    def _collect(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.modules.add(a.name)
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
                    self._target(t, node.value if isinstance(t, (ast.Name, ast.Tuple, ast.List)) else None)
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
        if isinstance(node, ast.IfExp):
            return self.resolve(node.body) | self.resolve(node.orelse)
        if isinstance(node, ast.BoolOp):
            return set().union(*(self.resolve(v) for v in node.values))
        if isinstance(node, ast.NamedExpr):
            return self.resolve(node.value)
        return set()

    def qualified(self, node: ast.AST) -> set[str]:
        """:meth:`resolve` without ``OWN``, each name as :func:`canonical` has it."""
        return {canonical(q) for q in self.resolve(node) if q}

    def names_module(self, qualified: str) -> bool:
        """``qualified`` (a name :meth:`qualified` gave) is a module, or may be one: a module
        object here, or bound by an ``import`` this process cannot walk."""
        known = is_module(qualified)
        return bool(known) or (known is None and any(canonical(m) == qualified for m in self.modules))

    def is_builtin(self, node: ast.AST, name: str) -> bool:
        return f"builtins.{name}" in self.resolve(node)

    def is_own(self, node: ast.AST) -> bool:
        """Only ever the candidate's own value (``self``, a local object, a class it defined)."""
        got = self.resolve(node)
        return bool(got) and got == {OWN}
