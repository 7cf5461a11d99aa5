"""Static checks on the candidate module (``model_new.py`` or a single-file solution)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from .base import StaticCheck

REFERENCE_MODULES = frozenset({"model"})  # the task's model.py
DYNAMIC_CODE = frozenset({"exec", "eval", "compile", "__import__", "execfile"})
DYNAMIC_MODULES = frozenset({"importlib", "runpy", "imp", "pkgutil", "zipimport"})


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


class ReferenceModelCheck(StaticCheck):
    name = "no_reference_model"
    rule = "static.reference-model"
    why = "ModelNew must compute the result itself, not through the reference Model"
    description = "Refuses imports of model.py, uses of Model, and dynamic imports/exec in the candidate."

    def check(self, workspace: Path, candidate=None) -> list[str]:
        label, tree, _ = self.python_tree(Path(workspace), candidate)
        if tree is None:
            return []
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
            elif isinstance(node, ast.Name) and node.id == "Model":
                out.append(self.violation(where, "refers to the reference class Model"))
            elif isinstance(node, ast.Attribute) and node.attr == "Model":
                out.append(self.violation(where, f"refers to {_dotted(node) or 'Model'}"))
            elif isinstance(node, ast.Call):
                fn = _dotted(node.func)
                if fn.split(".")[-1] in DYNAMIC_CODE and fn.split(".")[0] in ("", fn.split(".")[-1], "builtins"):
                    out.append(self.violation(where, f"calls {fn}() (dynamic code)"))
                if fn in ("open", "io.open", "pathlib.Path.read_text") and node.args:
                    a0 = node.args[0]
                    if isinstance(a0, ast.Constant) and isinstance(a0.value, str) and a0.value.endswith("model.py"):
                        out.append(self.violation(where, "reads model.py"))
                if fn.endswith("spec_from_file_location") or fn.endswith("load_source"):
                    out.append(self.violation(where, f"calls {fn}() (dynamic import)"))
        return out


class FallbackCheck(StaticCheck):
    name = "no_fallback"
    rule = "static.fallback"
    why = "a failing custom path must fail verification, not fall back to another implementation"
    description = "Refuses try/except (and contextlib.suppress) in the candidate module."

    def check(self, workspace: Path, candidate=None) -> list[str]:
        label, tree, _ = self.python_tree(Path(workspace), candidate)
        if tree is None:
            return []
        out = []
        try_types = tuple(t for t in (ast.Try, getattr(ast, "TryStar", None)) if t is not None)
        for node in ast.walk(tree):
            where = f"{label}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, try_types) and node.handlers:
                out.append(self.violation(where, "try/except around code of the candidate"))
            elif isinstance(node, ast.Call) and _dotted(node.func).endswith("suppress"):
                out.append(self.violation(where, "contextlib.suppress swallows failures"))
        return out


# names whose use lets a candidate switch the run-time guard off or read the harness's state
TAMPER_ATTRS = frozenset(
    {
        "torch._C", "torch.overrides", "torch.utils._python_dispatch", "torch.library",
        "torch._ops", "torch._dynamo", "torch.ops.load_library", "torch._library",
        "sys.modules", "sys._getframe", "sys.settrace", "sys.setprofile", "sys.meta_path",
        "sys.path_hooks", "os.environ", "torch.use_deterministic_algorithms",
        "torch.backends.cuda.matmul", "torch.backends.cudnn", "torch.set_float32_matmul_precision",
        "torch.utils.deterministic",
    }
)
TAMPER_MODULES = frozenset({"inspect", "gc", "builtins", "traceback", "threading", "multiprocessing", "signal", "atexit"})
TAMPER_NAMES = frozenset(
    {
        "__torch_function__", "__torch_dispatch__", "TorchFunctionMode", "TorchDispatchMode",
        "_disable_torch_function", "DisableTorchFunction", "DisableTorchFunctionSubclass",
        "_DisableTorchDispatch", "custom_op", "register_fake", "_getframe", "f_back", "f_locals",
        "f_globals", "__builtins__", "globals", "__globals__", "__code__",
    }
)


class GuardTamperingCheck(StaticCheck):
    name = "no_guard_tampering"
    rule = "static.guard-tampering"
    why = "the candidate may not reach into torch internals, the harness or the precision flags"
    description = "Refuses torch internals (torch._C, modes, torch.library), frame/gc introspection and flag changes."

    @dataclass
    class Options:
        allow: list[str] = field(default_factory=list)

    def check(self, workspace: Path, candidate=None) -> list[str]:
        label, tree, _ = self.python_tree(Path(workspace), candidate)
        if tree is None:
            return []
        allow = set(self.options.allow)
        out = []
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
                for a in node.names:
                    if a.name in TAMPER_NAMES - allow:
                        out.append(self.violation(where, f"imports {a.name!r}"))
            elif isinstance(node, ast.Attribute):
                d = _dotted(node)
                if d and _hits(d, allow):
                    out.append(self.violation(where, f"uses {d}"))
                elif node.attr in TAMPER_NAMES - allow:
                    out.append(self.violation(where, f"uses .{node.attr}"))
            elif isinstance(node, ast.Name) and node.id in TAMPER_NAMES - allow:
                out.append(self.violation(where, f"uses {node.id}"))
            elif isinstance(node, ast.FunctionDef) and node.name in TAMPER_NAMES - allow:
                out.append(self.violation(where, f"defines {node.name}"))
        return _dedupe(out)


def _hits(dotted: str, allow: set) -> bool:
    for t in TAMPER_ATTRS - allow:
        if dotted == t or dotted.startswith(t + "."):
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
