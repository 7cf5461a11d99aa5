"""Which names of a candidate module really are the object a method was called on.

``getattr(obj, name)`` with a name computed at run time can reach anything reachable from
``obj``; it is harmless only on an instance of the candidate's own class, whose attributes the
candidate set itself (``getattr(self, f"conv{i}")``). A parameter called ``self`` proves
nothing: any function's first parameter can be handed any object (``f(torch, "_C")``), and so
can a method's when it is called through its class (``ModelNew.m(torch, "_C")``). So a name
counts as the instance (:meth:`Receivers.computed_access`) only when all of this holds:

* it is the first parameter of a plain method (no decorator; not ``__new__``,
  ``__init_subclass__`` or ``__class_getitem__``) of a class the module defines that is not a
  metaclass, used in that method's own scope, and never bound again there (no assignment,
  loop target, ``del``, ``global``/``nonlocal``, nor a nested function or lambda taking a
  parameter of that name where it is used);
* the computed name starts with a written part that does not start with ``_``
  (``f"conv{i}"``, ``"layer" + str(i)``, ``"w%d" % i``, ``"b{}".format(i)``): the class
  (``__class__``), the instance's dictionary and private state stay out of reach;
* the function of such a method is never taken from its class, so it always receives a real
  instance: the class (and every class of the module derived from it) appears only as the
  callee of a call (``ModelNew(...)``), as a base of a class, as the second argument of
  ``isinstance``/``issubclass``, or as the first argument of ``super(C, self)``; nothing in
  the module asks an object for its class (``type(x)``, ``.__class__``, ``.mro``), and the
  class body does not name the method again (``alias = m``) (:meth:`Receivers.class_leaks`).

``cls`` in a ``classmethod`` is a class, whose attributes are unbound functions: computed
names on it are refused.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from .names import Resolver, literal_text

IMPLICIT_CLASS_METHODS = frozenset({"__new__", "__init_subclass__", "__class_getitem__"})
COMPUTED_ACCESS = ("getattr", "setattr", "hasattr")
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def written_prefix(node: ast.AST) -> str | None:
    """The part a computed string starts with when it is written out, else None."""
    if isinstance(node, ast.JoinedStr) and node.values:
        return literal_text(node.values[0])
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left = node.left
        while isinstance(node.op, ast.Add) and isinstance(left, ast.BinOp) and isinstance(left.op, ast.Add):
            left = left.left
        text = literal_text(left)
        return text.split("%", 1)[0] if isinstance(node.op, ast.Mod) and text is not None else text
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        text = literal_text(node.func.value)
        return text.split("{", 1)[0] if text is not None else None
    return None


def public_prefix(node: ast.AST) -> bool:
    prefix = written_prefix(node)
    return bool(prefix) and not prefix.startswith("_")


@dataclass
class _Method:
    cls: str
    name: str
    node: ast.AST
    kind: str  # "instance" or "class"
    param: str


@dataclass
class Receivers:
    tree: ast.AST
    names: Resolver
    parents: dict = field(default_factory=dict)
    bound: dict = field(default_factory=dict)  # id(Name node) -> _Method whose receiver it is
    classes: dict = field(default_factory=dict)  # class name -> ClassDef (the module's own)
    reflective: dict = field(default_factory=dict)  # class name -> {method names using computed names}

    def __post_init__(self) -> None:
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
            if isinstance(node, ast.ClassDef):
                self.classes.setdefault(node.name, node)
        for cdef in self.classes.values():
            if self._is_metaclass(cdef):
                continue
            for fn in cdef.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    m = self._method(cdef, fn)
                    if m is not None:
                        for n in self._receiver_uses(fn, m.param):
                            self.bound[id(n)] = m
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and self._computed_call(node):
                m = self.bound.get(id(node.args[0]))
                if m is not None and m.kind == "instance" and public_prefix(node.args[1]):
                    self.reflective.setdefault(m.cls, set()).add(m.name)
        # classes derived from a reflective class inherit its methods
        changed = True
        while changed:
            changed = False
            for cdef in self.classes.values():
                if cdef.name in self.reflective:
                    continue
                inherited = set()
                for b in cdef.bases:
                    if isinstance(b, ast.Name) and b.id in self.reflective:
                        inherited |= self.reflective[b.id]
                if inherited:
                    self.reflective[cdef.name] = inherited
                    changed = True

    # -- what is bound -------------------------------------------------------------------

    def _is_metaclass(self, cdef: ast.ClassDef) -> bool:
        for b in cdef.bases:
            if self.names.is_builtin(b, "type") or isinstance(b, ast.Name) and b.id in self.classes \
                    and b.id != cdef.name and self._is_metaclass(self.classes[b.id]):
                return True
        return False

    def _method(self, cdef: ast.ClassDef, fn: ast.AST) -> _Method | None:
        params = [*fn.args.posonlyargs, *fn.args.args]
        if not params or fn.name in IMPLICIT_CLASS_METHODS:
            return None
        if not fn.decorator_list:
            kind = "instance"
        elif len(fn.decorator_list) == 1 and self.names.is_builtin(fn.decorator_list[0], "classmethod"):
            kind = "class"
        else:
            return None
        return _Method(cdef.name, fn.name, fn, kind, params[0].arg)

    def _receiver_uses(self, fn: ast.AST, param: str) -> list[ast.Name]:
        """The loads of ``param`` in ``fn`` that refer to its first parameter; none when the
        name is bound again anywhere inside ``fn``."""
        for n in ast.walk(fn):
            if isinstance(n, ast.Name) and n.id == param and not isinstance(n.ctx, ast.Load):
                return []
            if isinstance(n, (ast.Global, ast.Nonlocal)) and param in n.names:
                return []
            if isinstance(n, ast.ExceptHandler) and n.name == param:
                return []
            if isinstance(n, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == param
                                                                  for a in n.names):
                return []
            if isinstance(n, _SCOPES) and n is not fn and not isinstance(n, ast.Lambda) and n.name == param:
                return []
        uses: list[ast.Name] = []

        def visit(node: ast.AST) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    args = child.args
                    shadow = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                    shadow += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
                    for d in (*args.defaults, *[d for d in args.kw_defaults if d is not None],
                              *getattr(child, "decorator_list", [])):
                        visit_node(d)
                    if param in shadow:
                        continue
                    visit(child)
                else:
                    visit_node(child)

        def visit_node(node: ast.AST) -> None:
            if isinstance(node, ast.Name) and node.id == param:
                uses.append(node)
            visit(node)

        for stmt in fn.body:
            visit_node(stmt)
        return uses

    # -- the rules -----------------------------------------------------------------------

    def _computed_call(self, node: ast.Call) -> bool:
        return len(node.args) >= 2 and literal_text(node.args[1]) is None and any(
            self.names.is_builtin(node.func, fn) for fn in COMPUTED_ACCESS)

    def computed_access(self, node: ast.Call) -> str:
        """Why this ``getattr``/``setattr``/``hasattr`` with a computed name is refused, or ""."""
        m = self.bound.get(id(node.args[0]))
        if m is None:
            return ("with a computed attribute name on something other than the instance its method was called on "
                    "(write the attribute out, or keep the objects in an nn.ModuleList, nn.ModuleDict or a dict)")
        if m.kind == "class":
            return (f"with a computed attribute name on {m.param}, a class whose functions take any object as self "
                    f"(write the attribute out, or keep the objects in a dict)")
        if not public_prefix(node.args[1]):
            return ("with a computed attribute name that does not start with a written public part (write it as "
                    "f\"conv{i}\" or \"layer\" + str(i), or keep the objects in an nn.ModuleList or nn.ModuleDict)")
        return ""

    def class_leaks(self) -> list[tuple[ast.AST, str]]:
        """(node, what) for each use that could hand a reflective method another object as self."""
        if not self.reflective:
            return []
        out = []
        some = sorted(self.reflective)[0]
        why = (f"while {some}.{sorted(self.reflective[some])[0]} takes computed attribute names (its function could "
               f"then be called with any object as self)")
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in self.reflective \
                    and not self._class_use_ok(node):
                out.append((node, f"uses the class {node.id} as a value {why}; keep it to calls, bases and isinstance"))
            elif isinstance(node, ast.Attribute) and node.attr in ("__class__", "mro"):
                out.append((node, f"asks an object for its class (.{node.attr}) {why}"))
            elif isinstance(node, ast.Call) and self.names.is_builtin(node.func, "getattr") and len(node.args) >= 2 \
                    and literal_text(node.args[1]) in ("__class__", "mro"):
                out.append((node, f"asks an object for its class {why}"))
            elif isinstance(node, ast.Call) and self.names.is_builtin(node.func, "type") and len(node.args) == 1:
                out.append((node, f"asks an object for its class (type(x)) {why}"))
            elif isinstance(node, ast.Call) and self.names.is_builtin(node.func, "super") and node.args \
                    and (len(node.args) != 2 or id(node.args[1]) not in self.bound):
                out.append((node, f"calls super() with an object other than self {why}"))
        for cname, methods in self.reflective.items():
            cdef = self.classes[cname]
            for stmt in cdef.body:
                nodes = [stmt] if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) else \
                    [*stmt.decorator_list, *stmt.args.defaults, *[d for d in stmt.args.kw_defaults if d]]
                for top in nodes:
                    for n in ast.walk(top):
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in methods:
                            out.append((n, f"names the method {n.id} again in the class body {why}"))
        return out

    def _class_use_ok(self, node: ast.Name) -> bool:
        parent = self.parents.get(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            return True
        if isinstance(parent, ast.ClassDef) and node in parent.bases:
            return True
        if isinstance(parent, ast.Tuple):
            holder = self.parents.get(parent)
            if isinstance(holder, ast.Call) and len(holder.args) == 2 and holder.args[1] is parent \
                    and (self.names.is_builtin(holder.func, "isinstance") or self.names.is_builtin(holder.func, "issubclass")):
                return True
        if isinstance(parent, ast.Call) and len(parent.args) == 2:
            if parent.args[1] is node and (self.names.is_builtin(parent.func, "isinstance")
                                           or self.names.is_builtin(parent.func, "issubclass")):
                return True
            if parent.args[0] is node and self.names.is_builtin(parent.func, "super") and id(parent.args[1]) in self.bound:
                return True
        return False
