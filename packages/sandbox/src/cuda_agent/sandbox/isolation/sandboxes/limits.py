"""setrlimit helpers shared by the local sandbox and compiler runs."""

from __future__ import annotations

import os
import resource
from typing import Callable

MB = 1024 * 1024


def _set(which: int, value: int) -> None:
    soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY and value > hard:
        value = hard
    resource.setrlimit(which, (value, value))


def apply_rlimits(cpu_s: int = 0, memory_mb: int = 0, file_size_mb: int = 0, nproc: int = 0,
                  nofile: int = 0) -> None:
    """Apply limits to the current process (0 leaves a limit as it is)."""
    if cpu_s:
        _set(resource.RLIMIT_CPU, int(cpu_s))
    if memory_mb:
        _set(resource.RLIMIT_AS, int(memory_mb) * MB)
    if file_size_mb:
        _set(resource.RLIMIT_FSIZE, int(file_size_mb) * MB)
    if nproc:
        _set(resource.RLIMIT_NPROC, int(nproc))
    if nofile:
        _set(resource.RLIMIT_NOFILE, int(nofile))
    _set(resource.RLIMIT_CORE, 0)


def rlimit_preexec(cpu_s: int = 0, memory_mb: int = 0, file_size_mb: int = 0, nproc: int = 0,
                   new_session: bool = True) -> Callable[[], None]:
    """A ``preexec_fn`` for subprocess: own session/process group, then the limits."""

    def preexec() -> None:
        if new_session:
            os.setsid()
        apply_rlimits(cpu_s, memory_mb, file_size_mb, nproc)

    return preexec
