"""Job functions the workspace service submits: thin adapters over the verification and
profiling jobs of :mod:`cuda_agent.sandbox.judge.jobs`.

They take plain ``options`` mappings (from the config) and build the jobs module's option
dataclasses inside the worker, so the service never imports torch and the pool stays generic.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any


def build_options(cls: Any, data: dict) -> Any:
    """``cls(**data)`` for a dataclass, building nested dataclass fields from mappings."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} option {unknown[0]!r}; valid: {', '.join(sorted(names))}")
    try:
        hints = typing.get_type_hints(cls)
    except Exception:
        hints = {}
    kwargs = {}
    for key, value in data.items():
        t = hints.get(key)
        if isinstance(value, dict) and isinstance(t, type) and dataclasses.is_dataclass(t):
            value = build_options(t, value)
        kwargs[key] = value
    return cls(**kwargs)


def _options(module: Any, class_name: str, options: Any) -> Any:
    if options is None:
        options = {}
    if not isinstance(options, dict):
        return options  # already an options object
    cls = getattr(module, class_name, None)
    if cls is None or not dataclasses.is_dataclass(cls):
        return options
    return build_options(cls, options)


def verify(workspace: str, device: str, options: dict | None = None) -> Any:
    """Verify the workspace's candidate on ``device``; returns a VerifyResult."""
    from cuda_agent.sandbox.judge import jobs

    return jobs.verify_workspace(workspace, device, _options(jobs, "VerifyOptions", options))


def profile(workspace: str, device: str, options: dict | None = None) -> Any:
    """Time the workspace's candidate (baselines from the cache); returns a ProfileResult."""
    from cuda_agent.sandbox.judge import jobs

    return jobs.profile_workspace(workspace, device, _options(jobs, "ProfileOptions", options))


def evaluate(workspace: str, device: str, verify_options: dict | None = None,
             profile_options: dict | None = None) -> tuple[Any, Any]:
    """Verify, then (when correct) profile, in one worker: one candidate process and one
    load of the candidate instead of two. The baselines are measured while no candidate
    process runs (one could otherwise load the GPU while they are timed): first when cached,
    else only once the candidate verified (:func:`.jobs.evaluate_workspace`). Returns
    (VerifyResult, ProfileResult or None)."""
    from cuda_agent.sandbox.judge import jobs

    popts = _options(jobs, "ProfileOptions", profile_options)
    vopts = _options(jobs, "VerifyOptions", verify_options)
    return jobs.evaluate_workspace(workspace, device, vopts, popts)


def baselines(workspace: str, device: str, options: dict | None = None) -> Any:
    """Measure (or read) the baselines of the reference in ``workspace`` and cache them, for the
    candidates of its task to find (:meth:`..pipeline.Judge.measure_ahead`). ``workspace``
    holds the reference alone; ``options``: the profiling job's. Returns
    :func:`.jobs.prepare_baselines`' answer."""
    from cuda_agent.sandbox.judge import jobs

    return jobs.prepare_baselines(workspace, device, _options(jobs, "ProfileOptions", options))


def prebuild(workspace: str, device: str = "cpu", options: dict | None = None) -> Any:
    """Import a single-file solution once without a GPU so that its extensions are built
    before its GPU job (:mod:`.prebuild`); returns a PrebuildResult. ``options``: ``arch``
    (``TORCH_CUDA_ARCH_LIST`` of the target GPU), ``jobs`` (parallel compiler processes),
    ``timeout``, ``candidate``, ``reference``, ``torch_header`` (the folder of a precompiled
    ``torch/extension.h``, :mod:`cuda_agent.sandbox.compilers.torch_header`; "" for none)."""
    from cuda_agent.sandbox.judge import prebuild as pb

    o = dict(options or {})
    return pb.prebuild_workspace(workspace, device, candidate=o.get("candidate", "model_new.py"),
                                 reference=o.get("reference", "model.py"), arch=str(o.get("arch") or ""),
                                 jobs=int(o.get("jobs") or 2), timeout=float(o.get("timeout") or 600.0),
                                 torch_header=str(o.get("torch_header") or ""))
