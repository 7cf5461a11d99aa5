"""Static checks on the candidate module (``model_new.py`` or a single-file solution)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from .base import PythonRule
from .names import OWN, Resolver, dotted, literal_text
from .receivers import Receivers

REFERENCE_MODULES = frozenset({"model"})  # the task's model.py
DYNAMIC_CODE = frozenset({"exec", "eval", "compile", "__import__", "execfile"})
DYNAMIC_MODULES = frozenset({"importlib", "runpy", "imp", "pkgutil", "zipimport"})


class ReferenceModelCheck(PythonRule):
    name = "no_reference_model"
    rule = "static.reference-model"
    why = "ModelNew must compute the result itself, not through the reference Model"
    description = "Refuses imports of model.py, uses of Model, and dynamic imports/exec in the candidate."

    def findings(self, label: str, tree: ast.AST, names: Resolver) -> list[str]:
        out = []
        for node in ast.walk(tree):
            where = f"{label}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                for a in node.names:
                    root = a.name.split(".")[0]
                    if root in REFERENCE_MODULES:
                        out.append(self.violation(where, f"imports the reference module {a.name!r}"))
                    elif root in DYNAMIC_MODULES:
                        out.append(self.violation(where, f"imports {a.name!r} (dynamic import)"))
            elif isinstance(node, ast.ImportFrom):
                mod = (node.module or "").split(".")[0]
                if node.level == 0 and mod in REFERENCE_MODULES or (node.level and mod in REFERENCE_MODULES | {""}):
                    out.append(self.violation(where, f"imports from the reference module {node.module or '.'!r}"))
                elif mod in DYNAMIC_MODULES:
                    out.append(self.violation(where, f"imports from {node.module!r} (dynamic import)"))
                for a in node.names:
                    if a.name == "Model":
                        out.append(self.violation(where, "imports the reference class Model"))
            elif isinstance(node, ast.Name) and node.id == "Model" and names.resolve(node) != {OWN} \
                    or isinstance(node, ast.Name) and node.id == "Model" and "Model" not in names.bindings:
                out.append(self.violation(where, "refers to the reference class Model"))
            elif isinstance(node, (ast.Name, ast.Attribute)):
                for q in names.qualified(node):
                    if q.split(".")[0] in REFERENCE_MODULES:
                        out.append(self.violation(where, f"refers to {q} of the reference module"))
                    elif q.startswith("builtins.") and q.split(".")[1] in DYNAMIC_CODE:
                        out.append(self.violation(where, f"uses {q.split('.')[1]}() (dynamic code)"))
            if isinstance(node, ast.Call):
                fn = dotted(node.func)
                quals = names.qualified(node.func)
                if (any(q in ("builtins.open", "io.open") for q in quals) or fn.endswith("read_text")) and node.args:
                    path = literal_text(node.args[0])
                    if path is not None and path.endswith("model.py"):
                        out.append(self.violation(where, "reads model.py"))
                if fn.endswith("spec_from_file_location") or fn.endswith("load_source"):
                    out.append(self.violation(where, f"calls {fn}() (dynamic import)"))
        return _dedupe(out)


# calls an except branch may make: building or loading the candidate's own kernels
BUILD_CALLS = ("torch.utils.cpp_extension.", "cuda_agent_runtime.", "ctypes.CDLL", "ctypes.cdll")


def _always_raises(body: list) -> bool:
    """The block ends in ``raise`` on every path (a statement at its top level, or an if
    whose branches all do)."""
    for stmt in body:
        if isinstance(stmt, ast.Raise):
            return True
        if isinstance(stmt, ast.If) and stmt.orelse and _always_raises(stmt.body) and _always_raises(stmt.orelse):
            return True
    return False


def _assigned(nodes: list) -> set[str]:
    out = set()
    for stmt in nodes:
        for n in ast.walk(stmt):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                for x in ast.walk(t):
                    if isinstance(x, ast.Name):
                        out.add(x.id)
    return out


class FallbackCheck(PythonRule):
    name = "no_fallback"
    rule = "static.fallback"
    why = "a failing custom path must fail verification, not fall back to another implementation"
    description = ("Refuses a try/except whose handler produces the result another way (returns a value, computes "
                   "with torch or the reference, or sets again what the try block set); handlers that re-raise, "
                   "log, or build/load the kernels pass. contextlib.suppress is refused.")

    def findings(self, label: str, tree: ast.AST, names: Resolver) -> list[str]:
        out = []
        try_types = tuple(t for t in (ast.Try, getattr(ast, "TryStar", None)) if t is not None)
        for node in ast.walk(tree):
            where = f"{label}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, try_types) and node.handlers:
                for h in node.handlers:
                    why = self._fallback(h, node, names)
                    if why:
                        out.append(self.violation(f"{label}:{h.lineno}", f"the except branch {why}"))
                        break
            elif isinstance(node, ast.Call) and dotted(node.func).endswith("suppress"):
                out.append(self.violation(where, "contextlib.suppress swallows failures"))
        return out

    @staticmethod
    def _fallback(handler: ast.ExceptHandler, node: ast.AST, names: Resolver) -> str:
        """Why the handler is a second implementation, or ""."""
        if _always_raises(handler.body):
            return ""
        again = _assigned(node.body) & _assigned(handler.body)
        for n in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
            if isinstance(n, ast.Return) and n.value is not None:
                return "returns a value (a second way to produce the result)"
            if isinstance(n, ast.Call):
                quals = names.qualified(n.func)
                if any(q.startswith(BUILD_CALLS) for q in quals):
                    continue
                if any(q.split(".")[0] in ("torch", "numpy", "model") or q.startswith("builtins.exec") for q in quals):
                    return f"computes with {sorted(quals)[0]} (a second implementation)"
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and again:
                value = n.value
                if isinstance(value, ast.Call) and any(q.startswith(BUILD_CALLS) for q in names.qualified(value.func)):
                    continue
                hit = again & _assigned([n])
                if hit:
                    return f"sets {sorted(hit)[0]} again (a second value for what the try block computes)"
        return ""


# qualified names whose use lets a candidate switch the run-time guard off or read the
# harness's state (anything under them counts)
TAMPER_ATTRS = frozenset(
    {
        "torch._C", "torch.overrides", "torch.utils._python_dispatch",
        "torch._ops", "torch._dynamo", "torch._library",
        "sys.modules", "sys._getframe", "sys.settrace", "sys.setprofile", "sys.meta_path",
        "sys.path_hooks", "sys.addaudithook", "os.environ", "torch.use_deterministic_algorithms",
        "torch.backends.cuda.matmul", "torch.backends.cudnn", "torch.set_float32_matmul_precision",
        "torch.utils.deterministic", "ctypes.memmove", "ctypes.memset", "ctypes.cast", "ctypes.string_at",
        "ctypes.wstring_at", "ctypes.addressof", "ctypes.pythonapi", "ctypes.PyDLL", "ctypes.pydll",
        "ctypes.py_object", "operator.attrgetter", "operator.methodcaller", "builtins.globals",
        "builtins.vars", "builtins.locals", "builtins.breakpoint", "builtins.__import__",
        "builtins.delattr", "types.FunctionType", "types.CodeType",
        # what unpickles or imports by a name given at run time: code the names never show
        "torch.load", "torch.serialization", "torch.hub", "torch.package", "torch.ops.import_module",
        "numpy.load", "numpy.lib.npyio",
    }
)
# modules a candidate has no use for that reach the interpreter, other threads, signals or
# the harness itself (``cuda_agent``; the workspace's ``cuda_agent_runtime`` is its own)
TAMPER_MODULES = frozenset({"inspect", "gc", "builtins", "traceback", "threading", "multiprocessing", "signal",
                            "atexit", "cuda_agent", "_thread", "faulthandler", "tracemalloc", "dis", "code",
                            "codeop", "marshal", "pickle", "_pickle", "copyreg", "weakref", "shelve", "dill",
                            "cloudpickle", "joblib", "_ctypes"})
# attributes of the interpreter's internals: functions' code and globals, frames, classes' graphs
INTERNAL_ATTRS = frozenset(
    {
        "__code__", "__defaults__", "__kwdefaults__", "__globals__", "__closure__", "__dict__",
        "__builtins__", "__subclasses__", "__bases__", "__base__", "__mro__", "__getattribute__",
        "f_back", "f_locals", "f_globals", "f_code", "f_builtins", "tb_frame", "gi_frame", "cr_frame",
        "ag_frame", "from_address", "__torch_function__", "__torch_dispatch__", "__self__", "__func__",
        "__traceback__", "__reduce__", "__reduce_ex__", "__self_class__", "__thisclass__", "__objclass__",
        "__loader__", "__spec__", "__annotations__", "__wrapped__",
    }
)
# operator namespaces of torch itself: registering kernels into them would change torch's own
# operators (the candidate's own namespaces are free)
LIBRARY_PROTECTED = frozenset({"aten", "prim", "prims", "_c10d_functional", "c10d", "quantized", "cuda_agent"})
# a function of the interpreter (PyRun_SimpleString, PyGILState_Ensure, ...), reached through ctypes,
# runs Python past every check of names; a name is one when this interpreter exports it
C_API_PREFIX = re.compile(r"^_?Py\w+$")


def interpreter_function(name: str) -> bool:
    """Whether ``name`` is a function or variable the running interpreter exports (looked up
    in this, the trusted, process: the candidate's interpreter is the same build)."""
    if not C_API_PREFIX.match(name):
        return False
    import ctypes

    try:
        getattr(ctypes.pythonapi, name)
    except (AttributeError, ValueError):
        return False
    return True

# what opens a shared library through ctypes (a handle whose functions are looked up by name)
CTYPES_LOADERS = ("ctypes.CDLL", "ctypes.cdll.LoadLibrary", "ctypes.LibraryLoader", "ctypes.WinDLL",
                  "ctypes.OleDLL", "ctypes.windll", "ctypes.oledll")
CTYPES_PROTOTYPES = ("ctypes.CFUNCTYPE", "ctypes.WINFUNCTYPE", "ctypes.PYFUNCTYPE")
# methods that replace the run-time guard when a class defines them
TAMPER_METHODS = frozenset({"__torch_function__", "__torch_dispatch__"})
# builtins that reach any attribute or name when they are handed on as values
REACHING_BUILTINS = frozenset({"getattr", "setattr", "delattr", "vars", "globals", "locals", "__import__", "eval",
                               "exec", "compile", "breakpoint"})


class GuardTamperingCheck(PythonRule):
    name = "no_guard_tampering"
    rule = "static.guard-tampering"
    why = "the candidate may not reach into torch internals, the harness or the precision flags"
    description = ("Refuses, by what names refer to: torch internals (torch._C, modes, torch.library), frame, gc "
                   "and code-object introspection, computed attribute access, ctypes memory access, replacing "
                   "attributes of modules and classes it did not define, and flag changes.")

    @dataclass
    class Options:
        allow: list[str] = field(default_factory=list)

    def findings(self, label: str, tree: ast.AST, names: Resolver) -> list[str]:
        allow = set(self.options.allow)
        out = []
        try:  # names are walked through torch's real modules (the trusted process imports it anyway)
            import torch  # noqa: F401
        except ImportError:  # pragma: no cover - torch is always there where candidates are judged
            pass
        receivers = Receivers(tree, names)

        def hit(q: str) -> bool:  # builtins are judged one by one (TAMPER_ATTRS), not as a module
            root = q.split(".")[0]
            return _hits(q, allow) or (root != "builtins" and root in (TAMPER_MODULES | DYNAMIC_MODULES) - allow)

        for node in ast.walk(tree):
            where = f"{label}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in TAMPER_MODULES - allow or _hits(a.name, allow):
                        out.append(self.violation(where, f"imports {a.name!r}"))
            elif isinstance(node, ast.ImportFrom) and node.module:
                full = [f"{node.module}.{a.name}" for a in node.names]
                if node.module.split(".")[0] in TAMPER_MODULES - allow or any(_hits(f, allow) for f in [node.module, *full]):
                    out.append(self.violation(where, f"imports from {node.module!r}"))
            elif isinstance(node, ast.Attribute) and node.attr in INTERNAL_ATTRS - allow:
                out.append(self.violation(where, f"uses .{node.attr} (interpreter internals)"))
            elif isinstance(node, (ast.Name, ast.Attribute)):
                bad = sorted(q for q in names.qualified(node) if hit(q))
                if bad:
                    out.append(self.violation(where, f"uses {bad[0]}"))
                elif isinstance(node, ast.Name) and node.id == "__builtins__":
                    out.append(self.violation(where, "uses __builtins__"))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in TAMPER_METHODS - allow:
                out.append(self.violation(where, f"defines {node.name}"))
            if isinstance(node, (ast.Import, ast.ImportFrom)) and isinstance(receivers.parents.get(node), ast.ClassDef):
                out.append(self.violation(where, "imports inside a class body (the module becomes an attribute of the "
                                                 "class, where the check cannot follow it); import at the top"))
            if isinstance(node, (ast.Name, ast.Attribute, ast.Call)) and getattr(node, "ctx", ast.Load()).__class__ is ast.Load:
                handed = self._handed_on(node, names, receivers, allow)
                if handed:
                    out.append(self.violation(where, handed))
            if isinstance(node, ast.Call):
                out.extend(self._call(node, names, receivers, where, allow))
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Attribute):
                        foreign = sorted(names.qualified(t.value))
                        if foreign:
                            out.append(self.violation(where, f"replaces {foreign[0]}.{t.attr} (an attribute of "
                                                             f"something the candidate did not define)"))
        for node, what in receivers.class_leaks():
            out.append(self.violation(f"{label}:{getattr(node, 'lineno', 0)}", what))
        out.extend(self._ctypes(label, tree, names))
        return _dedupe(out)

    def _ctypes(self, label: str, tree: ast.AST, names: Resolver) -> list[str]:
        """What reaches the interpreter's own functions through ctypes: a name of the Python C
        API (an attribute, an item or a string), a library handle on the process itself
        (``CDLL(None)``: every symbol the interpreter has), and a function of a library handle
        looked up by a name computed at run time (an item or a prototype's ``(name, library)``)."""
        out = []

        def loader(call: ast.AST) -> bool:
            return isinstance(call, ast.Call) and any(
                q == l or q.startswith(l + ".") for q in names.qualified(call.func) for l in CTYPES_LOADERS)

        handles = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and loader(n.value)
                   for t in n.targets if isinstance(t, ast.Name)}

        def handle(node: ast.AST) -> bool:
            return loader(node) or isinstance(node, ast.Name) and node.id in handles

        for node in ast.walk(tree):
            where = f"{label}:{getattr(node, 'lineno', 0)}"
            text = node.attr if isinstance(node, ast.Attribute) else (
                node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None)
            if text is not None and interpreter_function(text):
                out.append(self.violation(where, f"names the interpreter's C API ({text}), which runs Python past "
                                                 f"every check; kernels are C/CUDA functions of the candidate's own"))
            elif loader(node) and (not node.args or isinstance(node.args[0], ast.Constant) and node.args[0].value is None):
                out.append(self.violation(where, "opens the process's own symbols through ctypes (the interpreter's "
                                                 "among them); load the candidate's own kernel library by its path"))
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and (
                    handle(node.value) or any(q.startswith("ctypes.") for q in names.qualified(node))):
                out.append(self.violation(where, f"uses ctypes' private {node.attr} (it looks functions up by names "
                                                 f"the check cannot read); write the function's name on the library"))
            elif isinstance(node, ast.Subscript) and handle(node.value) and literal_text(node.slice) is None:
                out.append(self.violation(where, "looks up a function of a ctypes library by a name computed at run "
                                                 "time; write the name"))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Call) and any(
                    q.startswith(CTYPES_PROTOTYPES) for q in names.qualified(node.func.func)) and node.args \
                    and isinstance(node.args[0], ast.Tuple) and node.args[0].elts \
                    and literal_text(node.args[0].elts[0]) is None:
                out.append(self.violation(where, "makes a ctypes function from a library by a name computed at run "
                                                 "time; write the name"))
        return out

    def _reaching(self, q: str, names: Resolver, allow: set) -> bool:
        """``q`` leads to what this rule guards: a module, a builtin that reaches any
        attribute or name, or a prefix of a guarded name."""
        if q.startswith("builtins."):
            return q.split(".", 1)[1] in REACHING_BUILTINS - allow
        for t in (TAMPER_ATTRS | TAMPER_MODULES | DYNAMIC_MODULES) - allow:
            if t.startswith(q + "."):
                return True
        return names.names_module(q)

    def _handed_on(self, node: ast.AST, names: Resolver, receivers: Receivers, allow: set) -> str:
        """Why ``node`` (a module or a reaching builtin) goes where the names cannot follow
        it, or "": only attribute access, a call, a plain-name assignment (the resolver follows
        it) and tests are followed."""
        if isinstance(node, ast.Call) and literal_text(node.args[1] if len(node.args) > 1 else None) is None:
            return ""  # only a getattr with a written name resolves to a qualified name
        quals = sorted(q for q in names.qualified(node) if self._reaching(q, names, allow))
        if not quals:
            return ""
        parents = receivers.parents
        cur = node
        parent = parents.get(cur)
        while isinstance(parent, (ast.IfExp, ast.BoolOp, ast.NamedExpr)) and getattr(parent, "test", None) is not cur:
            cur, parent = parent, parents.get(parent)
        if isinstance(parent, ast.Attribute) and parent.value is cur:
            return ""
        if isinstance(parent, ast.Call) and (parent.func is cur or (
                parent.args and parent.args[0] is cur and len(parent.args) >= 2 and literal_text(parent.args[1]) is not None
                and any(names.is_builtin(parent.func, f) for f in ("getattr", "hasattr")))):
            return ""
        if isinstance(parent, (ast.Compare, ast.Expr, ast.Subscript, ast.UnaryOp, ast.If, ast.While, ast.Assert,
                               ast.FormattedValue, ast.IfExp)):
            return ""
        assign = parent
        if isinstance(parent, (ast.Tuple, ast.List)):
            assign = parents.get(parent)
            if not (isinstance(assign, ast.Assign) and assign.value is parent and all(
                    isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == len(parent.elts)
                    and all(isinstance(e, ast.Name) for e in t.elts) for t in assign.targets)):
                assign = None
        elif isinstance(parent, ast.Assign) and not all(isinstance(t, ast.Name) for t in parent.targets):
            assign = None
        if isinstance(assign, ast.Assign) and not isinstance(parents.get(assign), ast.ClassDef):
            return ""
        where = ("in a class attribute" if isinstance(assign, ast.Assign) else
                 "as an argument" if isinstance(parent, (ast.Call, ast.keyword, ast.Starred)) else
                 "as a return value" if isinstance(parent, (ast.Return, ast.Lambda, ast.Yield, ast.YieldFrom)) else
                 "in a container" if isinstance(parent, (ast.Tuple, ast.List, ast.Set, ast.Dict, ast.comprehension,
                                                         ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)) else
                 "in an attribute or item" if isinstance(parent, (ast.Assign, ast.AugAssign, ast.AnnAssign)) else
                 "as a default value" if isinstance(parent, ast.arguments) else "as a value")
        return (f"hands on {quals[0]} {where}, where the check cannot follow what it reaches; use its attributes "
                f"directly where they are needed")

    def _call(self, node: ast.Call, names: Resolver, receivers: Receivers, where: str, allow: set) -> list[str]:
        out = []
        for fn, arity in (("getattr", 2), ("setattr", 3), ("hasattr", 2)):
            if names.is_builtin(node.func, fn) and len(node.args) >= 2:
                target = node.args[0]
                own_target = id(target) in receivers.bound and receivers.bound[id(target)].kind == "instance"
                attr = literal_text(node.args[1])
                if attr is None:
                    why = receivers.computed_access(node)
                    if why:
                        out.append(self.violation(where, f"{fn}() {why}"))
                elif attr in INTERNAL_ATTRS - allow:
                    out.append(self.violation(where, f"{fn}(..., {attr!r}) (interpreter internals)"))
                if fn == "setattr" and not own_target and attr is not None:
                    foreign = sorted(names.qualified(target))
                    if foreign:
                        out.append(self.violation(where, f"setattr() on {foreign[0]}"))
        quals = names.qualified(node.func)
        if any(q.startswith("torch.library.") for q in quals) and node.args:
            first = literal_text(node.args[0]) or ""
            if first.split("::")[0].split(".")[0] in LIBRARY_PROTECTED:
                out.append(self.violation(where, f"registers into torch's own operators ({first!r}); register the "
                                                 f"candidate's kernels under a namespace of its own"))
        if any(q.startswith("torch.ops.load_library") for q in quals):
            out.append(self.violation(where, "torch.ops.load_library (load kernels through cuda_agent_runtime or "
                                             "torch.utils.cpp_extension)"))
        if any(q in ("builtins.open", "io.open", "os.open") for q in quals) and node.args:
            path = literal_text(node.args[0])
            if path is not None and path.startswith("/proc"):
                out.append(self.violation(where, f"opens {path} (other processes and this one's memory)"))
        return out


def _hits(dotted_name: str, allow: set) -> bool:
    for t in TAMPER_ATTRS - allow:
        if dotted_name == t or dotted_name.startswith(t + "."):
            return True
    return False


def _dedupe(lines: list[str]) -> list[str]:
    """One violation per source line."""
    seen, out = set(), []
    for line in lines:
        key = line.split(": ", 1)[0]
        if key not in seen:
            seen.add(key)
            out.append(line)
    return out
