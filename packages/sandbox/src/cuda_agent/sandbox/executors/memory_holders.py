"""Who held a GPU's memory when a job ran out of it.

torch's out-of-memory message lists the processes on the device by pid ("Process 1326 has
45.72 GiB memory in use"). A pid alone does not say whether it was the job's own worker, a
spare waiting for the next job, a candidate process or something outside the pool; the pool
knows its workers, and ``/proc`` knows every process's parent. :func:`describe` puts the two
together, so that a job refused for memory says which process kept it.
"""

from __future__ import annotations

import re
from pathlib import Path

_HOLDER = re.compile(r"Process (\d+) has ([\d.]+ [KMGT]i?B) memory in use")


def _parent(pid: int, proc: Path) -> int | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after the last ')'
    fields = stat[stat.rfind(")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _command(pid: int, proc: Path) -> str:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:120]


def role(pid: int, workers: dict[str, list[int]], proc: Path = Path("/proc")) -> str:
    """What ``pid`` is to a pool whose workers per device are ``workers`` (each device's
    active worker first, then its spares, as :meth:`WorkerPool.worker_pids` lists them)."""

    def as_worker(p: int) -> str:
        for label, pids in workers.items():
            if p in pids:
                return f"the {'active worker' if pids.index(p) == 0 else 'spare worker'} of {label}"
        return ""

    own = as_worker(pid)
    if own:
        return own
    if not (proc / str(pid)).exists():
        return "ended before the failure was read"
    parent = _parent(pid, proc)
    grand = _parent(parent, proc) if parent else None
    for ancestor, what in ((parent, "a child"), (grand, "a grandchild")):
        w = as_worker(ancestor) if ancestor else ""
        if w:
            return f"{what} of {w} (a candidate process, a standby one or a measurement)"
    cmd = _command(pid, proc)
    return f"not of this pool ({cmd})" if cmd else "not of this pool"


def describe(message: str, workers: dict[str, list[int]], proc: Path = Path("/proc")) -> dict[str, str]:
    """Per pid named in an out-of-memory ``message``: how much it held and what it is
    ({} when the message names none)."""
    return {pid: f"{amount}: {role(int(pid), workers, proc)}" for pid, amount in _HOLDER.findall(message)}
