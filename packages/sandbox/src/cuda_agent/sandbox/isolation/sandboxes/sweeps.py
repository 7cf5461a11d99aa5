"""Process sweeps: find and kill every process of a user id or a PID namespace, and check
that none is left.

/proc/<pid> of a process that made itself undumpable belongs to root, so processes are
told apart by the ids in /proc/<pid>/status and by their PID namespace, never by the
owner of their /proc folder. Zombies (dead, waiting to be reaped) do not count.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Callable

from .layout import is_root


def reap(proc: subprocess.Popen, group: bool = False, timeout: float = 10.0) -> None:
    """Kill ``proc`` (with ``group``, its whole process group first) and wait for it."""
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)


def _status(pid: str) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def _living(pid: str, st: dict[str, str]) -> bool:
    return not st.get("State", "").startswith(("Z", "X"))


def processes_of_uid(uid: int) -> list[int]:
    """Living processes with ``uid`` as their real, effective, saved or file-system user id."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            st = _status(pid)
        except OSError:
            continue
        if str(uid) in st.get("Uid", "").split() and _living(pid, st):
            found.append(int(pid))
    return found


def pid_namespace(pid: int, children: bool = False) -> str | None:
    """The PID namespace of ``pid`` (or the one its new children get), e.g. ``pid:[4026532]``."""
    try:
        return os.readlink(f"/proc/{pid}/ns/{'pid_for_children' if children else 'pid'}")
    except OSError:
        return None


def namespace_members(ns: str) -> list[int]:
    """Living processes whose PID namespace is ``ns`` (its init included). Processes of
    namespaces nested in it die with its init."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") == ns and _living(pid, _status(pid)):
                found.append(int(pid))
        except OSError:
            continue
    return found


def _kill_until_gone(find: Callable[[], list[int]], timeout: float, extra: Callable[[], None] | None = None
                     ) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        pids = find()
        if not pids:
            return []
        if time.monotonic() > deadline:
            return pids
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if extra is not None:
            extra()
        time.sleep(0.02)


def pid_in_namespace(pid: int) -> int | None:
    """``pid``'s number in its own (innermost) PID namespace."""
    try:
        nspid = _status(str(pid)).get("NSpid", "").split()
    except OSError:
        return None
    return int(nspid[-1]) if nspid else None


def session_members(sid: int) -> list[int]:
    """Living processes of the session ``sid``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if rest[0] not in ("Z", "X") and int(rest[3]) == sid:
            found.append(int(pid))
    return found


def stop_and_kill(find: Callable[[], list[int]], timeout: float = 5.0) -> tuple[int, list[int]]:
    """End the processes ``find`` lists, also those they fork meanwhile: each round stops
    (SIGSTOP) every process found until a round finds no new one, so a fork bomb cannot
    outrun it; then all are killed. Returns (how many were found, those alive after ``timeout``)."""
    stopped: set[int] = set()
    for _ in range(1000):
        new = set(find()) - stopped
        if not new:
            break
        for pid in new:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    if not stopped:
        return 0, []
    left = _kill_until_gone(lambda: sorted(set(find()) | {p for p in stopped if _alive(p)}), timeout)
    return len(stopped), left


def _alive(pid: int) -> bool:
    try:
        return _living(str(pid), _status(str(pid)))
    except OSError:
        return False


def kill_namespace(ns: str, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process of the PID namespace ``ns`` (so the whole namespace ends, also
    processes that left the process group, cleared their parent-death signal or started
    sessions or nested namespaces of their own); returns those still alive after ``timeout``."""
    return _kill_until_gone(lambda: namespace_members(ns), timeout)


def sweep_uid(uid: int, gid: int | None = None, timeout: float = 5.0) -> list[int]:
    """Kill every process of ``uid`` on this host and check that none is left; returns
    the pids still alive after ``timeout`` (empty when the sweep succeeded). Needs root.

    Each round SIGKILLs what /proc shows, then sends SIGKILL to every process the user may
    signal (``kill(-1)`` run as that user), which also reaches those forked meanwhile."""
    if not is_root():
        return []

    def as_user() -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["kill", "-KILL", "-1"], user=uid, group=gid if gid is not None else uid,
                           extra_groups=[], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=5)

    return _kill_until_gone(lambda: processes_of_uid(uid), timeout, as_user)
