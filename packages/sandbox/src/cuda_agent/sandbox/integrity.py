"""Candidate code may not change the harness it is judged by.

``model_new.py`` runs in the same process as verification and timing, so at import time or
inside ``forward`` it could replace a timer (``time.perf_counter``,
``torch.cuda.Event.elapsed_time``), a comparison (``compare_outputs``) or a torch function
the harness uses, and be judged by its own rules. :func:`snapshot` records every callable
of the modules and classes the harness relies on, before candidate code is imported;
:func:`tampered` lists what was replaced or removed since. Attributes added
later (lazily imported torch submodules, loaded extensions) do not count, and neither do
changed non-callable values (torch's own state flags change as CUDA initialises).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

RULE = "rule no-tampering: candidate code may not replace functions of torch, Python's timers or the harness"

# modules whose callables the harness calls after candidate code ran
MODULES = (
    "time", "statistics", "math", "gc", "builtins", "contextlib",
    "torch", "torch.cuda", "torch.nn.functional", "torch.profiler", "torch.autograd.profiler",
    "cuda_agent.sandbox.verify", "cuda_agent.sandbox.jobs", "cuda_agent.sandbox.inputs",
    "cuda_agent.sandbox.baselines", "cuda_agent.sandbox.precision", "cuda_agent.sandbox.guard",
    "cuda_agent.sandbox.privdrop", "cuda_agent.core.types",
    "cuda_agent.sandbox.profilers", "cuda_agent.sandbox.profilers.base",
    "cuda_agent.sandbox.profilers.cuda_events", "cuda_agent.sandbox.profilers.torch_profiler",
    "cuda_agent.sandbox.profilers.wallclock",
)
# classes (by module and name) whose methods the harness calls; the classes defined in the
# cuda_agent modules above (profilers above all) are guarded too
CLASSES = (
    ("torch", "Tensor"), ("torch.cuda", "Event"), ("torch.cuda", "Stream"), ("torch.nn", "Module"),
)


def _targets() -> list[tuple[str, dict]]:
    out = []
    for name in MODULES:
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


def snapshot() -> dict[tuple[str, str], Any]:
    """``(owner, attribute) -> object`` for every callable of the guarded modules and classes
    (the objects themselves are kept, so an identity can never be reused by a replacement)."""
    if "torch" in sys.modules:
        for name in SETTLE_FIRST:
            try:
                importlib.import_module(name)
            except Exception:  # pragma: no cover - a torch without it
                pass
    snap: dict[tuple[str, str], Any] = {}
    for owner, ns in _targets():
        for attr, value in list(ns.items()):
            if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
                snap[(owner, attr)] = value
    return snap


def tampered(snap: dict[tuple[str, str], Any]) -> list[str]:
    """Names (``owner.attribute``) replaced or removed since ``snap`` was taken."""
    spaces = dict(_targets())
    changed = []
    for (owner, attr), original in snap.items():
        ns = spaces.get(owner)
        if ns is None:
            continue
        if ns.get(attr, _MISSING) is not original:
            changed.append(f"{owner}.{attr}")
    return changed


def message(changed: list[str], where: str = "model_new.py") -> str:
    shown = ", ".join(changed[:4]) + (f" (+{len(changed) - 4} more)" if len(changed) > 4 else "")
    return f"{where} replaced {shown} ({RULE})"


_MISSING = object()
