"""Static checks on a candidate's sources, each a CorrectnessCheck plugin.

Run before anything is imported: a violation fails verification with the category
``forbidden_op`` and a message naming the rule (``static.kernel-torch-op``,
``static.reference-model``, ``static.fallback``, ``static.guard-tampering``,
``native.python-api``). The built libraries themselves are judged by their dynamic symbols
before the candidate process loads them (:mod:`.native_symbols`, rule ``native.python-api``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import StaticCheck, strip_cxx
from .kernel_sources import KernelTorchOpsCheck
from .native_sources import NativePythonCheck
from .python_rules import FallbackCheck, GuardTamperingCheck, ReferenceModelCheck

BUILTIN_CHECKS = (KernelTorchOpsCheck, ReferenceModelCheck, FallbackCheck, GuardTamperingCheck, NativePythonCheck)

__all__ = [
    "BUILTIN_CHECKS",
    "FallbackCheck",
    "GuardTamperingCheck",
    "KernelTorchOpsCheck",
    "NativePythonCheck",
    "ReferenceModelCheck",
    "StaticCheck",
    "run_static_checks",
    "strip_cxx",
]


def _check_classes(names: list[str] | None) -> list[tuple[type, Any]]:
    """(class, options) for each named check; all registered static checks when None."""
    try:
        from cuda_agent.core.plugins import get_plugin_manager

        comps = get_plugin_manager().components("correctness_check")
        registry = {n: c.cls for n, c in comps.items()}
    except Exception:  # plugin machinery unavailable (bare worker): the built-ins
        registry = {}
    for cls in BUILTIN_CHECKS:
        registry.setdefault(cls.name, cls)
    if names is None:
        return [(cls, None) for n, cls in sorted(registry.items()) if getattr(cls, "stage", "static") == "static"]
    out = []
    for spec in names:
        if isinstance(spec, dict):
            name, opts = spec.get("name"), spec.get("options") or {}
        else:
            name, opts = str(spec), {}
        if name not in registry:
            from cuda_agent.core.errors import ConfigError, did_you_mean

            raise ConfigError(f"unknown correctness check {name!r}; {did_you_mean(name, registry)}")
        out.append((registry[name], opts))
    return out


def run_static_checks(workspace: str | Path, candidate: str | Path | None = None, names: list | None = None) -> list:
    """Run the static checks; returns one CheckResult per check (message = first violation)."""
    from cuda_agent.core.types import CheckResult

    results = []
    for cls, opts in _check_classes(names):
        options = cls.Options(**opts) if opts else cls.Options()
        inst = cls(options)
        try:
            found = inst.check(Path(workspace), candidate) if isinstance(inst, StaticCheck) else inst.check(Path(workspace))
        except Exception as exc:  # a broken third-party check must not pass silently
            found = [f"check {cls.name} failed: {type(exc).__name__}: {exc}"]
        results.append(
            CheckResult(
                name=f"static:{cls.name}",
                passed=not found,
                message="\n".join(found[:20]),
            )
        )
    return results
