"""Profiler plugins: ``cuda_events`` (default on CUDA), ``torch_profiler`` (the paper's
method, for comparison), ``nsight_compute`` (per-kernel metrics) and ``wallclock`` (CPU)."""

from __future__ import annotations

from .base import ProfilerError, summarize
from .cuda_events import CudaEventsProfiler
from .nsight_compute import NsightComputeProfiler, parse_ncu_csv
from .torch_profiler import TorchProfilerProfiler
from .wallclock import WallclockProfiler

BUILTIN_PROFILERS = (CudaEventsProfiler, TorchProfilerProfiler, NsightComputeProfiler, WallclockProfiler)


def get_profiler(name: str, options: dict | None = None):
    """Build a profiler by name through the plugin manager (built-ins when it is unavailable)."""
    options = dict(options or {})
    try:
        from cuda_agent.core.plugins import get_plugin_manager

        return get_plugin_manager().create("profiler", {"name": name, "options": options})
    except Exception as exc:
        by_name = {c.name: c for c in BUILTIN_PROFILERS}
        if name not in by_name:
            if isinstance(exc, ProfilerError) or exc.__class__.__name__ in ("ConfigError", "PluginError"):
                raise
            raise ProfilerError(f"unknown profiler {name!r}; valid: {', '.join(sorted(by_name))}") from exc
        cls = by_name[name]
        return cls(cls.Options(**options))


__all__ = [
    "BUILTIN_PROFILERS",
    "CudaEventsProfiler",
    "NsightComputeProfiler",
    "ProfilerError",
    "TorchProfilerProfiler",
    "WallclockProfiler",
    "get_profiler",
    "parse_ncu_csv",
    "summarize",
]
