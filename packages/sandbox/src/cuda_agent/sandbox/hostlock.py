"""The host's quiet lock: timed sections never overlap CPU-heavy sections of other jobs.

Timing a launch-bound model (hundreds of small kernels per call) measures the host as
much as the GPU: while another job on the same machine runs ``torch.compile`` (inductor
spreads its code generation over every core), eager times of KernelBench level-3 models
came out 1.3x to 2x slower, with spreads of 20% and more. Jobs on different GPUs share the
host, so the executor's per-GPU lock does not help; this lock does:

* ``timing()`` holds the lock shared: timed sections on different GPUs still run together
  (each keeps one core busy);
* ``cpu_heavy()`` holds it exclusively: compiling a baseline waits until no timed section
  runs, and none starts until it is done.

A writer-preferring reader/writer lock made of two ``flock`` files: a writer first takes
the gate exclusively, so that readers arriving after it wait behind it instead of
starving it. The files are opened once per worker process, before a job gives up root
rights (a job's private ``/tmp`` hides the host's), from the path the executor passes in
``$CUDA_AGENT_QUIET_LOCK``; without it both sections are no-ops.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from typing import ContextManager, Iterator

ENV = "CUDA_AGENT_QUIET_LOCK"

_fds: tuple[int, int] | None = None  # (gate, main)
_opened_for: str | None = None
_local = threading.local()
waited_seconds = {"timing": 0.0, "cpu_heavy": 0.0}


def open_from_env(device: str = "") -> bool:
    """Open the lock files named by ``$CUDA_AGENT_QUIET_LOCK`` (a worker's init step)."""
    global _fds, _opened_for
    path = os.environ.get(ENV, "")
    if not path:
        return False
    if _fds is not None and _opened_for == path:
        return True
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    gate = os.open(path + ".gate", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    main = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    _fds, _opened_for = (gate, main), path
    return True


def active() -> bool:
    return _fds is not None or open_from_env()


def _held() -> str | None:
    return getattr(_local, "held", None)


@contextmanager
def _section(kind: str) -> Iterator[float]:
    if _held() is not None or not active():  # nested, or no lock configured
        yield 0.0
        return
    assert _fds is not None
    gate, main = _fds
    t0 = time.perf_counter()
    if kind == "cpu_heavy":
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(main, fcntl.LOCK_EX)
        except BaseException:
            fcntl.flock(gate, fcntl.LOCK_UN)
            raise
    else:  # pass the gate (waits behind a writer), then share the main lock
        fcntl.flock(gate, fcntl.LOCK_SH)
        try:
            fcntl.flock(main, fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
    waited = time.perf_counter() - t0
    waited_seconds[kind] += waited
    _local.held = kind
    try:
        yield waited
    finally:
        _local.held = None
        fcntl.flock(main, fcntl.LOCK_UN)
        if kind == "cpu_heavy":
            fcntl.flock(gate, fcntl.LOCK_UN)


def timing() -> ContextManager[float]:
    """A timed section: shared with other timed sections, never with a CPU-heavy one."""
    return _section("timing")


def cpu_heavy() -> ContextManager[float]:
    """A CPU-heavy section (compilation): alone against every timed section on the host."""
    return _section("cpu_heavy")
