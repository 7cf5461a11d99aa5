"""Candidate code may not change the harness it is judged by (defence in depth).

Verdicts do not depend on this module: inputs, the reference and every comparison live in
the trusted process (:mod:`cuda_agent.sandbox.judge`), and timing runs in compiled code. It adds refusals in
the candidate process, where ``model_new.py`` could replace a timer, a torch function or a
harness function at import time or inside ``forward``. :func:`snapshot` records, before
candidate code is imported, every callable of the modules and classes the harness relies
on -- every loaded ``cuda_agent`` module among them, this one included -- and for Python
functions their code object, defaults and keyword defaults, so that an in-place swap of
``__code__`` shows as well as a replaced name. :func:`tampered` lists what was replaced,
removed or rewritten since. Attributes added later (lazily imported torch submodules,
loaded extensions) do not count, and neither do changed non-callable values (torch's own
state flags change as CUDA initialises).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

RULE = "rule no-tampering: candidate code may not replace functions of torch, Python's timers or the harness"

# modules whose callables the harness calls after candidate code ran
MODULES = (
    "time", "statistics", "math", "gc", "builtins", "contextlib",
    "torch", "torch.cuda", "torch.nn.functional", "torch.profiler", "torch.autograd.profiler",
    "cuda_agent.sandbox.judge.verify", "cuda_agent.sandbox.judge.loading", "cuda_agent.sandbox.judge.comparison",
    "cuda_agent.sandbox.judge.draws", "cuda_agent.sandbox.judge.poisoning", "cuda_agent.sandbox.judge.watchdog",
    "cuda_agent.sandbox.judge.options", "cuda_agent.sandbox.judge.jobs", "cuda_agent.sandbox.judge.inputs",
    "cuda_agent.sandbox.judge.baselines", "cuda_agent.sandbox.judge.baselines.cache",
    "cuda_agent.sandbox.judge.baselines.staleness", "cuda_agent.sandbox.judge.baselines.reference",
    "cuda_agent.sandbox.judge.baselines.cpu_threads", "cuda_agent.sandbox.judge.baselines.compiled",
    "cuda_agent.sandbox.judge.baselines.measure",
    "cuda_agent.sandbox.judge.precision", "cuda_agent.sandbox.judge.op_guard",
    "cuda_agent.sandbox.isolation.privdrop", "cuda_agent.core.types",
    "cuda_agent.sandbox.judge.profilers", "cuda_agent.sandbox.judge.profilers.base",
    "cuda_agent.sandbox.judge.profilers.cuda_events", "cuda_agent.sandbox.judge.profilers.torch_profiler",
    "cuda_agent.sandbox.judge.profilers.wallclock",
    "cuda_agent.sandbox.judge.candidate_state", "cuda_agent.sandbox.judge.candidate_load",
    "cuda_agent.sandbox.judge.candidate_run", "cuda_agent.sandbox.judge.candidate_timing",
)
# classes (by module and name) whose methods the harness calls; the classes defined in the
# cuda_agent modules above (profilers above all) are guarded too
CLASSES = (
    ("torch", "Tensor"), ("torch.cuda", "Event"), ("torch.cuda", "Stream"), ("torch.nn", "Module"),
)


def _modules() -> list[str]:
    """The guarded modules: :data:`MODULES` and every loaded module of the harness."""
    loaded = sorted(n for n, m in list(sys.modules.items())
                    if m is not None and (n == "cuda_agent" or n.startswith("cuda_agent.")))
    return list(dict.fromkeys([*MODULES, *loaded]))


def harness_modules() -> set[str]:
    """The names of the harness's modules loaded in this process."""
    return {n for n, m in list(sys.modules.items()) if m is not None and (n == "cuda_agent" or n.startswith("cuda_agent."))}


def _targets() -> list[tuple[str, dict]]:
    out = []
    for name in _modules():
        mod = sys.modules.get(name)
        if mod is None:
            try:
                mod = importlib.import_module(name)
            except Exception:  # not installed here (torch on a CPU-only core install): nothing to guard
                continue
        out.append((name, vars(mod)))
        if name.startswith("cuda_agent."):  # the harness's own classes: profilers, options, results
            for cls in list(vars(mod).values()):
                if isinstance(cls, type) and cls.__module__ == name:
                    out.append((f"{name}.{cls.__name__}", _resolved(cls)))
    for mod_name, cls_name in CLASSES:
        mod = sys.modules.get(mod_name)
        cls = getattr(mod, cls_name, None) if mod is not None else None
        if isinstance(cls, type):
            out.append((f"{mod_name}.{cls_name}", _resolved(cls)))
    return out


def _inner(value: Any) -> Any:
    """The Python function behind a value (methods, static/class methods, properties' getters)."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    return value if isinstance(value, types.FunctionType) else None


def _body(value: Any) -> tuple | None:
    """What a Python function runs: its code object, defaults and keyword defaults."""
    fn = _inner(value)
    if fn is None:
        return None
    kw = fn.__kwdefaults__
    return (fn.__code__, fn.__defaults__, tuple(sorted(kw.items())) if kw else None)


def _resolved(cls: type) -> dict:
    """What each attribute name of ``cls`` resolves to through its MRO (without calling
    descriptors): assigning ``Tensor.allclose`` shadows the inherited method, which a look
    at ``vars(Tensor)`` alone would take for an addition."""
    ns: dict = {}
    for klass in reversed(cls.__mro__):
        ns.update(vars(klass))
    return ns


# imported before a snapshot: importing them rebinds torch functions (torch._dynamo wraps
# torch.manual_seed), which must not be mistaken for the candidate's doing
SETTLE_FIRST = ("torch._dynamo",)


def _compile_patches() -> None:
    """What the first ``torch.compile`` call of a process patches, done now: dynamo wraps
    ``nn.Module.__init__`` and ``__setstate__`` to tag every module made afterwards. A forward
    compiled after the snapshot (a compile baseline timed as a candidate) is then not taken
    for the candidate's tampering; torch does it once per process, whoever compiles first."""
    try:
        from torch._dynamo.mutation_guard import install_generation_tagging_init
    except Exception:  # pragma: no cover - a torch without it
        return
    install_generation_tagging_init()


def snapshot() -> dict[tuple[str, str], Any]:
    """``(owner, attribute) -> (object, what it runs)`` for every callable of the guarded
    modules and classes (the objects themselves are kept, so an identity can never be reused
    by a replacement)."""
    if "torch" in sys.modules:
        for name in SETTLE_FIRST:
            try:
                importlib.import_module(name)
            except Exception:  # pragma: no cover - a torch without it
                pass
        _compile_patches()
    snap: dict[tuple[str, str], Any] = {}
    for owner, ns in _targets():
        for attr, value in list(ns.items()):
            if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
                snap[(owner, attr)] = (value, _body(value))
    return snap


def tampered(snap: dict[tuple[str, str], Any]) -> list[str]:
    """Names (``owner.attribute``) replaced or removed since ``snap`` was taken."""
    spaces = dict(_targets())
    changed = []
    for (owner, attr), (original, body) in snap.items():
        ns = spaces.get(owner)
        if ns is None:
            continue
        now = ns.get(attr, _MISSING)
        if now is not original:
            changed.append(f"{owner}.{attr}")
        elif body is not None and _body(now) != body:
            changed.append(f"{owner}.{attr} (code or defaults rewritten in place)")
    return changed


def message(changed: list[str], where: str = "model_new.py") -> str:
    shown = ", ".join(changed[:4]) + (f" (+{len(changed) - 4} more)" if len(changed) > 4 else "")
    return f"{where} replaced {shown} ({RULE})"


_MISSING = object()
