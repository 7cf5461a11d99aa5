"""Executors: pools of worker processes that run verification, profiling and baseline jobs.

``local`` runs one worker per GPU, ``cpu`` N CPU workers; both queue jobs by priority
(verification first), enforce per-job timeouts and replace a worker that crashed, hung,
hit a CUDA error or ran out of memory. Jobs name an importable function and its keyword
arguments (:class:`Job`), so the same pool serves baselines and evaluation too.

Imports are lazy so that the worker process (``python -m ...executors.worker``) starts fast.

May import: ``cuda_agent.core``, :mod:`..compilers` and :mod:`..isolation`. The job functions
themselves (verification, profiling: :mod:`..judge.tasks`) are named by their import path
and imported in the worker, never by this package.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Job": ".job",
    "JobError": ".job",
    "PRIORITIES": ".job",
    "DeviceSpec": ".worker_process",
    "JobRecord": ".job_queue",
    "WorkerPool": ".pool",
    "CpuExecutor": ".local",
    "LocalExecutor": ".local",
    "visible_gpus": ".local",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(name)
