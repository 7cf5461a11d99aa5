"""Job functions the workspace service submits: thin adapters over the verification and
profiling jobs of :mod:`cuda_agent.sandbox.jobs`.

They take plain ``options`` mappings (from the config) and build the jobs module's option
dataclasses inside the worker, so the service never imports torch and the pool stays generic.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def _options(module: Any, class_name: str, options: Any) -> Any:
    if options is None:
        options = {}
    if not isinstance(options, dict):
        return options  # already an options object
    cls = getattr(module, class_name, None)
    if cls is None:
        return options
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise ValueError(f"unknown {class_name} option {unknown[0]!r}; valid: {', '.join(sorted(names))}")
    return cls(**options)


def verify(workspace: str, device: str, options: dict | None = None) -> Any:
    """Verify the workspace's candidate on ``device``; returns a VerifyResult."""
    from cuda_agent.sandbox import jobs

    return jobs.verify_workspace(workspace, device, _options(jobs, "VerifyOptions", options))


def profile(workspace: str, device: str, options: dict | None = None) -> Any:
    """Time the workspace's candidate (baselines from the cache); returns a ProfileResult."""
    from cuda_agent.sandbox import jobs

    return jobs.profile_workspace(workspace, device, _options(jobs, "ProfileOptions", options))
