"""Job descriptions and job errors shared by every executor.

A job names an importable function (``"package.module:function"``) and its keyword
arguments, so one pool serves verification, profiling, baselines and evaluation alike.
The function runs inside a worker process; its return value (picklable) becomes the
result of the future returned by ``Executor.submit``. A job that does not return
normally (timeout, crash, CUDA error, out of memory, exception) makes the future raise
:class:`JobError`, whose ``reason`` and one-line message say what happened.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any

from cuda_agent.core.errors import CudaAgentError
from cuda_agent.core.types import FailureCategory

# queue order: lower first (verification before profiling before baselines)
PRIORITIES: dict[str, int] = {"verify": 0, "evaluate": 1, "profile": 1, "baseline": 2}
DEFAULT_PRIORITY = 3

_seq = itertools.count()


@dataclass
class Job:
    """One unit of work for an executor.

    ``fn`` is ``"module:function"`` (or ``"module.function"``). When ``pass_device`` is
    true the worker adds ``device=<its device string>`` ("cuda:0", "cpu") to ``kwargs``.
    ``timeout`` overrides the executor's default for this job (seconds).
    """

    fn: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    kind: str = "other"
    priority: int | None = None
    timeout: float | None = None
    pass_device: bool = True
    label: str = ""
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        if not isinstance(self.fn, str) or not self.fn.strip():
            raise JobError("invalid", "a job needs a function path like 'package.module:function'")
        if self.priority is None:
            self.priority = PRIORITIES.get(self.kind, DEFAULT_PRIORITY)

    def sort_key(self) -> tuple[int, int]:
        return (int(self.priority or 0), next(_seq))


# reason -> failure category of the candidate whose job it was
REASON_FAILURE: dict[str, FailureCategory] = {
    "timeout": FailureCategory.TIMEOUT,
    "crash": FailureCategory.CRASH,
    "cuda_error": FailureCategory.CRASH,
    "oom": FailureCategory.CRASH,
    "exception": FailureCategory.CRASH,
    "worker_start": FailureCategory.CRASH,
    "cancelled": FailureCategory.CRASH,
    "invalid": FailureCategory.CRASH,
    "closed": FailureCategory.CRASH,
}


class JobError(CudaAgentError):
    """A job that did not return a result.

    ``reason`` is one of: ``timeout``, ``crash`` (the worker died: signal or exit),
    ``cuda_error`` (a CUDA error surfaced as an exception), ``oom`` (out of memory),
    ``exception`` (the job raised), ``worker_start`` (no worker could be started),
    ``invalid`` (bad job), ``closed`` (the executor was closed).
    """

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        job_id: str = "",
        device: str = "",
        seconds: float = 0.0,
        details: str = "",
    ):
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.job_id = job_id
        self.device = device
        self.seconds = seconds
        self.details = details  # traceback or last lines the worker printed

    @property
    def failure(self) -> FailureCategory:
        return REASON_FAILURE.get(self.reason, FailureCategory.CRASH)

    def __reduce__(self):
        return (
            _rebuild_job_error,
            (self.reason, self.message, self.job_id, self.device, self.seconds, self.details),
        )


def _rebuild_job_error(reason, message, job_id, device, seconds, details) -> JobError:
    return JobError(reason, message, job_id=job_id, device=device, seconds=seconds, details=details)


# --- classification of errors raised inside a job ----------------------------------

_CUDA_MARKERS = (
    "cuda error",
    "cudaerror",
    "illegal memory access",
    "illegal instruction",
    "misaligned address",
    "device-side assert",
    "unspecified launch failure",
    "cuda kernel errors",
    "cublas_status",
    "cudnn_status",
    "an illegal",
    "launch timed out",
)


def classify_exception(type_name: str, message: str) -> str:
    """Reason for an exception raised by a job: ``oom``, ``cuda_error`` or ``exception``."""
    low = message.lower()
    if type_name in ("MemoryError", "OutOfMemoryError") or "out of memory" in low:
        return "oom"
    if type_name in ("AcceleratorError", "CudaError") or any(m in low for m in _CUDA_MARKERS):
        return "cuda_error"
    return "exception"


def describe_exception(type_name: str, message: str) -> str:
    """One line for an exception raised by a job."""
    first = ""
    for line in message.strip().splitlines():
        line = line.strip()
        if line:
            first = line
            break
    reason = classify_exception(type_name, message)
    if reason == "oom":
        return f"out of memory ({type_name}: {first})" if first else "out of memory"
    if reason == "cuda_error":
        if first.lower().startswith("cuda error"):
            return first
        return f"CUDA error: {first}" if first else "CUDA error"
    return f"{type_name}: {first}" if first else type_name


def describe_exit(returncode: int | None) -> str:
    """One line for a worker that died: 'crashed: segmentation fault (signal 11)'."""
    import signal

    if returncode is None:
        return "crashed: the worker disappeared"
    if returncode < 0:
        sig = -returncode
        try:
            name = signal.strsignal(sig) or f"signal {sig}"
        except (ValueError, OSError):
            name = f"signal {sig}"
        name = name.split(":")[0].strip().lower()
        return f"crashed: {name} (signal {sig})"
    return f"crashed: the worker exited with code {returncode}"


def format_seconds(s: float) -> str:
    return f"{s:g} s" if s == int(s) else f"{s:.1f} s"
