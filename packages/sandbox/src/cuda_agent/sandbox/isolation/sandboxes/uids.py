"""Agent user ids: each open workspace gets a user id of its own from a range, held by a
file lock while any session of this process uses it, so no two workspaces share one."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
import threading
from pathlib import Path

from .results import SandboxError


def lock_dir() -> Path:
    """Where the file locks of the jobs' and builds' user ids live (``CUDA_AGENT_LOCK_DIR``,
    else ``cuda-agent-locks`` in the temporary folder): one folder for every process of the host."""
    return Path(os.environ.get("CUDA_AGENT_LOCK_DIR") or os.path.join(tempfile.gettempdir(), "cuda-agent-locks"))


_leases: dict[str, list] = {}  # workspace -> [lease, sessions using it] (one uid per workspace)
_leases_lock = threading.Lock()


def acquire_uid(workspace: Path, base: int, count: int, lock_dir: Path) -> "UidLease":
    """The workspace's agent user id: shared by this process's sessions on the same
    workspace, never used by another workspace while any of them is open."""
    key = str(workspace)
    with _leases_lock:
        if key in _leases:
            _leases[key][1] += 1
            return _leases[key][0]
        lease = UidLease(workspace, base, count, lock_dir)
        _leases[key] = [lease, 1]
        return lease


def uid_users(lease: "UidLease") -> int:
    """How many open sessions of this process use ``lease``."""
    with _leases_lock:
        entry = _leases.get(lease.key)
        return entry[1] if entry is not None and entry[0] is lease else 1


def release_uid(lease: "UidLease") -> None:
    with _leases_lock:
        entry = _leases.get(lease.key)
        if entry is None or entry[0] is not lease:
            lease.release()
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _leases[lease.key]
            lease.release()


class UidLease:
    """A user id no other open sandbox session uses (a file lock held while open)."""

    def __init__(self, workspace: Path, base: int, count: int, lock_dir: Path):
        self.key = str(workspace)
        lock_dir.mkdir(parents=True, exist_ok=True)
        start = int(hashlib.sha256(str(workspace).encode()).hexdigest(), 16) % count
        self._f = None
        for i in range(count):
            uid = base + (start + i) % count
            f = open(lock_dir / f"uid-{uid}.lock", "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            self._f = f
            self.uid = self.gid = uid
            return
        raise SandboxError(f"all {count} sandbox user ids from {base} are in use")

    def release(self) -> None:
        if self._f is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._f, fcntl.LOCK_UN)
                self._f.close()
            self._f = None
