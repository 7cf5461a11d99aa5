"""Checking task files: a static check (parse, required names) and a run check.

A bad task is reported with a one-line reason and skipped; it never ends a run.
The run check executes task code, so it runs as an executor job (see :mod:`.untrusted`)
with a timeout, a memory cap and no root rights: a crash or a hang costs that task only.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass, field
from typing import Any

REQUIRED_FUNCTIONS = ("get_inputs", "get_init_inputs")


@dataclass
class TaskReport:
    """The outcome of checking one task."""

    id: str
    ok: bool
    stage: str = ""  # "static", "run", "timeout", "crash", "too_large" (run check skipped)
    reason: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        if self.ok:
            extra = f" ({self.reason})" if self.reason else ""
            return f"ok    {self.id}{extra}"
        return f"BAD   {self.id}: [{self.stage}] {self.reason}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def static_problems(code: str) -> list[str]:
    """One-line problems of a task's source; empty when it looks like a KernelBench model.py."""
    if not isinstance(code, str) or not code.strip():
        return ["empty source"]
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return [f"syntax error at line {exc.lineno}: {exc.msg}"]
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    funcs = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assigned = set()
    for n in tree.body:
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    assigned.add(t.id)
    problems = []
    if "Model" not in classes and "Model" not in assigned:
        problems.append("no class Model")
    elif "Model" in classes:
        body = classes["Model"].body
        if not any(isinstance(b, ast.FunctionDef) and b.name == "forward" for b in body):
            problems.append("Model has no forward()")
    for name in REQUIRED_FUNCTIONS:
        if name not in funcs and name not in assigned:
            problems.append(f"no {name}()")
    return problems


def load_module(code: str, name: str, directory: str) -> Any:
    """Import ``code`` as a real module file (tracebacks and torch.compile see its source)."""
    import importlib.util
    import os
    import sys

    path = os.path.join(directory, f"{name}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(code)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return mod


def flatten_outputs(out: Any) -> list:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        flat = []
        for o in out:
            flat.extend(flatten_outputs(o))
        return flat
    raise TypeError(f"forward returned {type(out).__name__}, not a tensor or a tuple of tensors")


def short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:300]


def run_task(code: str, state: dict) -> dict:
    """The run check (in a job process, see :mod:`.untrusted`): build the Model from ``code``
    and call it once on its inputs."""
    import tempfile
    import time

    import torch

    device = state.get("device", "cpu")
    t0 = time.perf_counter()
    tmp = state.setdefault("tmpdir", tempfile.mkdtemp(prefix="cuda_agent_check_"))
    state["n"] = state.get("n", 0) + 1
    name = f"_task_{state['n']}"
    try:
        mod = load_module(code, name, tmp)
    except MemoryError:
        return {"ok": False, "stage": "too_large", "reason": "module import exceeded the memory limit"}
    except BaseException as exc:  # noqa: BLE001 - any failure of the task is its own
        return {"ok": False, "stage": "run", "reason": "import failed: " + short_error(exc)}
    try:
        torch.manual_seed(0)
        init = mod.get_init_inputs()
        inputs = mod.get_inputs()
        if not isinstance(inputs, (list, tuple)):
            return {"ok": False, "stage": "run", "reason": f"get_inputs() returned {type(inputs).__name__}, not a list"}
        model = mod.Model(*init).to(device)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
        with torch.no_grad():
            out = model(*inputs)
        outs = flatten_outputs(out)
        shapes = [list(o.shape) for o in outs]
        finite = all(bool(torch.isfinite(o).all()) for o in outs if o.is_floating_point())
    except MemoryError:
        return {"ok": False, "stage": "too_large", "reason": "inputs exceed the run check's memory limit"}
    except RuntimeError as exc:
        msg = short_error(exc)
        if "allocate" in msg or "out of memory" in msg.lower():
            return {"ok": False, "stage": "too_large", "reason": "inputs exceed the run check's memory limit"}
        return {"ok": False, "stage": "run", "reason": msg}
    except BaseException as exc:  # noqa: BLE001
        return {"ok": False, "stage": "run", "reason": short_error(exc)}
    finally:
        import sys

        sys.modules.pop(name, None)
    return {
        "ok": True,
        "stage": "run",
        "reason": "" if finite else "output has NaN/inf",
        "details": {"output_shapes": shapes, "seconds": time.perf_counter() - t0, "finite": finite},
    }
