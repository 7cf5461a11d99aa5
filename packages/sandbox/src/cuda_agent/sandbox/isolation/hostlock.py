"""The host's quiet lock: timed sections never overlap CPU-heavy sections of other jobs.

Timing a launch-bound model (hundreds of small kernels per call) measures the host as
much as the GPU: while another job on the same machine runs ``torch.compile`` (inductor
spreads its code generation over every core), eager times of KernelBench level-3 models
came out 1.3x to 2x slower, with spreads of 20% and more. Jobs on different GPUs share the
host, so the executor's per-GPU lock does not help; this lock does:

* ``timing()`` holds the lock shared: timed sections on different GPUs still run together
  (each keeps one core busy);
* ``cpu_heavy()`` holds it exclusively: compiling a baseline waits until no timed section
  runs, and none starts until it is done. A timed section inside it takes no host lock
  again, but still its device's quiet lock (below).

A writer-preferring reader/writer lock made of two ``flock`` files: a writer first takes
the gate exclusively, so that readers arriving after it wait behind it instead of
starving it. The files are opened once per worker process, before a job gives up root
rights (a job's private ``/tmp`` hides the host's), from the path the executor passes in
``$CUDA_AGENT_QUIET_LOCK``; without it both sections are no-ops.

Per GPU there is one more: a timed section also holds its device's quiet lock shared, and
a spare worker or its candidate process holds it exclusively while it creates its CUDA
context, and only then (``device_quiet``; their imports and starts take no lock), so that no
context is made on a GPU while a timing runs there, while verification jobs and the gaps
between jobs leave spares free to start (``$CUDA_AGENT_DEVICE_QUIET_LOCK``). A spare holding
the lock across its whole start kept profile jobs of an H200 waiting 20-30 s behind spares'
imports.

The descriptors stay open in the job, so candidate code could take a lock itself and hold
up other jobs' timings; its job's timeout bounds how long.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from typing import ContextManager, Iterator

ENV = "CUDA_AGENT_QUIET_LOCK"
DEVICE_ENV = "CUDA_AGENT_DEVICE_QUIET_LOCK"

_fds: tuple[int, int] | None = None  # (gate, main)
_opened_for: str | None = None
_device_fd: int | None = None
_local = threading.local()


def _forget_after_fork() -> None:
    """In a forked child (a worker forked from its fork server, a candidate process forked
    from its worker): the parent's descriptors are not this process's (the child closes them,
    and their numbers are reused), so the locks are opened again, as a started process would."""
    global _fds, _opened_for, _device_fd
    _fds, _opened_for, _device_fd = None, None, None


os.register_at_fork(after_in_child=_forget_after_fork)


def _open(path: str) -> int:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)


def open_from_env(device: str = "") -> bool:
    """Open the lock files named by ``$CUDA_AGENT_QUIET_LOCK`` and
    ``$CUDA_AGENT_DEVICE_QUIET_LOCK`` (a worker's init step)."""
    global _fds, _opened_for, _device_fd
    if _device_fd is None and os.environ.get(DEVICE_ENV):
        _device_fd = _open(os.environ[DEVICE_ENV])
    path = os.environ.get(ENV, "")
    if not path:
        return False
    if _fds is not None and _opened_for == path:
        return True
    _fds, _opened_for = (_open(path + ".gate"), _open(path)), path
    return True


def active() -> bool:
    return _fds is not None or open_from_env()


@contextmanager
def device_quiet(path: str | None = None, wait_s: float = 120.0) -> Iterator[None]:
    """Hold this worker's device quiet lock exclusively (a spare creating its CUDA context):
    no timed section runs on the device meanwhile. After ``wait_s`` without it the block
    runs anyway. ``path``: the lock file (default: ``$CUDA_AGENT_DEVICE_QUIET_LOCK``)."""
    path = path or os.environ.get(DEVICE_ENV, "")
    if not path:
        yield
        return
    fd = _open(path)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _held() -> str | None:
    return getattr(_local, "held", None)


def _take_host(kind: str, gate: int, main: int) -> None:
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


def _release_host(kind: str, gate: int, main: int) -> None:
    fcntl.flock(main, fcntl.LOCK_UN)
    if kind == "cpu_heavy":
        fcntl.flock(gate, fcntl.LOCK_UN)


@contextmanager
def _section(kind: str) -> Iterator[float]:
    if _held() is not None:  # nested: the outer section's host lock covers it
        # a timed section inside a CPU-heavy one (a compiled baseline timed as a candidate,
        # compiling and timed in one job) still keeps spares from making a context meanwhile
        device = _device_fd if kind == "timing" and _held() == "cpu_heavy" and not getattr(_local, "device", False) \
            else None
        if device is not None:
            fcntl.flock(device, fcntl.LOCK_SH)
            _local.device = True
        try:
            yield 0.0
        finally:
            if device is not None:
                _local.device = False
                fcntl.flock(device, fcntl.LOCK_UN)
        return
    host = _fds if active() else None
    # a timed section also keeps spares from making a CUDA context on its device
    device = _device_fd if kind == "timing" else None
    t0 = time.perf_counter()
    if host is not None:
        _take_host(kind, *host)
    try:
        if device is not None:
            fcntl.flock(device, fcntl.LOCK_SH)
        _local.held = kind
        try:
            yield time.perf_counter() - t0
        finally:
            _local.held = None
            if device is not None:
                fcntl.flock(device, fcntl.LOCK_UN)
    finally:
        if host is not None:
            _release_host(kind, *host)


def timing() -> ContextManager[float]:
    """A timed section: shared with other timed sections, never with a CPU-heavy one."""
    return _section("timing")


def cpu_heavy() -> ContextManager[float]:
    """A CPU-heavy section (compilation): alone against every timed section on the host."""
    return _section("cpu_heavy")
