"""What a report's numbers were measured with: precision policy, profiler, GPU, software.

Values the verification and profiling jobs reported (in each result's metadata) win over
what this process sees, since the jobs ran on the measuring machine.
"""

from __future__ import annotations

import json
import platform
from importlib import metadata as _md
from typing import Any, Iterable

from ..metrics import TaskResult

# metadata keys of verification/profiling results -> environment entries
ENV_FROM_JOBS = {
    "precision_policy": "precision",
    "profiler": "profiler",
    "gpu": "gpu",
    "device": "device",
    "cpu": "cpu",
    "torch": "torch",
    "cuda": "cuda",
    "driver": "driver",
    "triton": "triton",
}
PACKAGES = (
    "cuda-agent-core",
    "cuda-agent-sandbox",
    "cuda-agent-rewards",
    "cuda-agent-datasets",
    "cuda-agent-evaluation",
)


def _version(dist: str) -> str | None:
    try:
        return _md.version(dist)
    except _md.PackageNotFoundError:
        return None


def timing_modes(results: Iterable[TaskResult]) -> str:
    """How many profiled tasks were timed in each profiler mode, with the reasons for a
    steadier one (see ``profilers.base.time_for_task``), e.g.
    ``cuda_events 233, cuda_events+graph 17 (unsteady 14, parallel streams 3)``; "" when no
    task was profiled."""
    counts: dict[str, int] = {}
    reasons: dict[str, dict[str, int]] = {}
    for r in results:
        md = (r.metadata or {}).get("profile") or {}
        if not md.get("profiler"):
            continue
        mode = str(md.get("timing_mode") or md["profiler"]).split(" ")[0]
        counts[mode] = counts.get(mode, 0) + 1
        why = str(md.get("timing_mode_reason") or "")
        if mode != md["profiler"]:  # a steadier mode than the configured one
            label = "parallel streams" if "parallel" in why else "unsteady"
            reasons.setdefault(mode, {})
            reasons[mode][label] = reasons[mode].get(label, 0) + 1
    parts = []
    for mode, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        why = ", ".join(f"{k} {v}" for k, v in sorted(reasons.get(mode, {}).items(), key=lambda kv: -kv[1]))
        parts.append(f"{mode} {n}" + (f" ({why})" if why else ""))
    return ", ".join(parts)


def collect_environment(results: Iterable[TaskResult] = (), extra: dict | None = None) -> dict:
    """What the numbers were measured with.

    Values reported by the profiler/verifier jobs (in each result's metadata) win over
    what this process sees: the jobs ran on the measuring machine.
    """
    results = list(results)  # read twice below
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    pkgs = {}
    for dist in PACKAGES:
        v = _version(dist)
        if v:
            pkgs[dist.removeprefix("cuda-agent-")] = v
    env["packages"] = pkgs
    for dist in ("torch", "triton"):
        v = _version(dist)
        if v:
            env[dist] = v
    # what the measuring jobs reported, for the keys that describe the setup
    seen: dict[str, set] = {}
    for r in results:
        for part in ("profile", "verify"):
            md = (r.metadata or {}).get(part) or {}
            for key, value in md.items():
                name = ENV_FROM_JOBS.get(key)
                if name is None or value is None:
                    continue
                if isinstance(value, dict):
                    value = value.get("key") or value.get("name") or json.dumps(value, sort_keys=True, default=str)
                seen.setdefault(name, set()).add(str(value))
    for key, values in seen.items():
        env[key] = " | ".join(sorted(values))
    modes = timing_modes(results)
    if modes:
        env["timing_modes"] = modes
    for key, value in (extra or {}).items():
        if value is not None and value != "":
            env.setdefault(key, value)
    env.setdefault("precision", "unknown")
    env.setdefault("profiler", "unknown")
    env.setdefault("gpu", "none")
    return env
