"""One job, one identity, nothing left behind.

Every candidate process runs under a user id leased for its job alone (60000..60999, a
file lock held while the job runs, see :class:`JobIdentity`), so a candidate can signal,
trace or read no other job's processes, and none of the trusted side's (root's). When the
job ends, every process of that user id is killed and the end is checked
(:func:`sweep`): a child that started a new session, double-forked or was reparented
cannot outlive its job and reach the next job that leases the same id. Where it can, the
candidate process also starts as the first process of a PID namespace of its own
(:func:`spawn`), so that its end takes every process it started with it and ``/proc``
shows it nothing else.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..isolation.forked_child import ForkedChild
from ..isolation.sandboxes.uids import lock_dir

JOB_UID_BASE = 60000
JOB_UID_COUNT = 1000
PIDNS_ENV = "CUDA_AGENT_JOB_PIDNS"  # "0": no PID namespace for candidate processes
_CLONE_NEWPID = 0x20000000





class JobIdentity:
    """A user id leased for one job (released by :meth:`release`, after :func:`sweep`)."""

    def __init__(self, base: int = JOB_UID_BASE, count: int = JOB_UID_COUNT):
        from ..isolation.sandboxes.uids import UidLease

        self._lease = UidLease(Path(f"job-{uuid.uuid4().hex}"), base, count, lock_dir())
        self.uid = self.gid = self._lease.uid
        leftover = sweep(self.uid)  # a process of a crashed earlier job with this id
        self.leftover_before = leftover

    def release(self) -> None:
        self._lease.release()


def processes_of(uid: int) -> list[int]:
    """Pids of the living processes of ``uid`` (see :func:`..isolation.sandboxes.sweeps.processes_of_uid`)."""
    from ..isolation.sandboxes.sweeps import processes_of_uid

    return processes_of_uid(uid)


def sweep(uid: int) -> int:
    """Kill every process of ``uid`` (as root) and check that none is left; returns how many
    there were. Raises when one survives."""
    from ..isolation.sandboxes.layout import is_root
    from ..isolation.sandboxes.sweeps import sweep_uid

    if not is_root() or uid <= 0:
        return 0
    first = processes_of(uid)
    if not first:
        return 0
    left = sweep_uid(uid, uid)
    if left:
        raise RuntimeError(f"processes of job user {uid} survive SIGKILL: {left[:5]}")
    return len(first)


_TICK = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def cpu_seconds(uid: int | None = None, pid: int | None = None) -> tuple[float, int]:
    """CPU time (user + system, the reaped children's included) of every process of ``uid``
    (or of process ``pid`` alone), from the kernel's accounting: nothing the processes do can
    change it. Returns (seconds, processes counted); each count is one clock tick coarse."""
    total, seen = 0.0, 0
    names = [str(pid)] if uid is None and pid is not None else [n for n in os.listdir("/proc") if n.isdigit()]
    for name in names:
        try:
            if uid is not None:
                with open(f"/proc/{name}/status") as fh:
                    ids = next((line.split()[1:4] for line in fh if line.startswith("Uid:")), [])
                if str(uid) not in ids:
                    continue
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) * _TICK  # utime stime cutime cstime
            seen += 1
        except (OSError, ValueError, IndexError):
            continue
    return total, seen


def _pidns_marker(device: str) -> Path:
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    return lock_dir() / f"pidns-refused-{kind}-{os.uname().release}"


def pidns_wanted(device: str) -> bool:
    """Start candidate processes for ``device`` in a PID namespace of their own? Not where
    that was seen to stop CUDA from starting on this host (:func:`pidns_refused`)."""
    return not _pidns_marker(device).exists()


def pidns_refused(device: str, why: str) -> None:
    """Remember, for this host and kernel, that CUDA did not start in a PID namespace."""
    try:
        lock_dir().mkdir(parents=True, exist_ok=True)
        _pidns_marker(device).write_text(why[:500] + "\n")
    except OSError:
        pass


def spawn(argv: list[str], pidns: bool = True, **popen: Any) -> tuple[subprocess.Popen, str]:
    """Start ``argv`` (as the first process of a new PID namespace when ``pidns`` and root).
    Returns the process and how it was isolated ("own PID namespace" or why not)."""
    return _start(lambda: subprocess.Popen(argv, **popen), pidns)


def fork(run: Callable[[], int], pidns: bool = True, **child: Any) -> tuple[ForkedChild, str]:
    """Fork a child that runs ``run`` (:class:`ForkedChild`; ``child`` are its output and
    the descriptors it keeps), isolated as :func:`spawn` isolates a started process."""
    return _start(lambda: ForkedChild.start(run, **child), pidns)


def _start(make: Callable[[], Any], pidns: bool) -> tuple[Any, str]:
    how = "host PID namespace"
    if not pidns or os.environ.get(PIDNS_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return make(), f"{how} (switched off)"
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        return make(), f"{how} (not root)"
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.unshare(_CLONE_NEWPID) != 0:
            return make(), f"{how} (unshare: {os.strerror(ctypes.get_errno())})"
        try:
            proc = make()
        finally:
            # later children of this process stay in its own namespace
            if libc.setns(own, _CLONE_NEWPID) != 0:  # pragma: no cover - setns to one's own namespace
                raise OSError(ctypes.get_errno(), "setns back to the job's PID namespace failed")
        return proc, "own PID namespace"
    finally:
        os.close(own)
