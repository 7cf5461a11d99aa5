"""What the local and docker sandboxes share: results, process handles, the permission
layout of a workspace, agent user ids and the disk watchdog."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import select
import signal
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cuda_agent.core.errors import CudaAgentError
from cuda_agent.core.safefs import Tree, UnsafePath

STATE_DIR = ".cuda_agent"


class SandboxError(CudaAgentError):
    """A sandbox cannot be opened or used as configured."""


@dataclass
class CommandResult:
    exit_code: int | None
    output: str
    timed_out: bool = False
    seconds: float = 0.0


def is_root() -> bool:
    return os.geteuid() == 0


# --- agent user ids ---------------------------------------------------------------------


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


# --- process sweeps -------------------------------------------------------------------------
# /proc/<pid> of a process that made itself undumpable belongs to root, so processes are
# told apart by the ids in /proc/<pid>/status and by their PID namespace, never by the
# owner of their /proc folder. Zombies (dead, waiting to be reaped) do not count.


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


# --- workspace permissions -----------------------------------------------------------------


def _is_protected(rel: str, protected: list[str]) -> bool:
    return any(rel == p.rstrip("/") or rel.startswith(p.rstrip("/") + "/") for p in protected)


def _agent_mode(st: os.stat_result) -> int:
    return 0o770 if stat.S_ISDIR(st.st_mode) else (0o660 | (st.st_mode & 0o110))


def apply_layout(root: Path, protected: list[str], uid: int | None, gid: int | None) -> None:
    """Make ``protected`` paths unwritable by the agent and the rest writable.

    As root with an agent ``uid``: the workspace folder is ``root:<gid>`` mode ``1770``
    (only the agent's group may enter; the sticky bit stops it deleting or renaming files
    it does not own), protected files are ``root:root`` ``0444`` (folders ``0555``),
    everything else belongs to the agent, ``.cuda_agent`` is ``root:<gid>`` ``0750``.
    Without root only the modes are set, which the agent could undo (advisory).
    Every change goes through a descriptor opened without following links
    (:meth:`~cuda_agent.core.safefs.Tree.set_owner`): links are left as they are.
    """
    root = Path(root)
    tree = Tree(root)
    owner = uid is not None and is_root()
    for rel, st in list(tree.walk(".", skip={STATE_DIR})):
        if stat.S_ISLNK(st.st_mode):
            continue
        with contextlib.suppress(OSError, UnsafePath):
            if _is_protected(rel, protected):
                tree.set_owner(rel, 0 if owner else None, 0, 0o555 if stat.S_ISDIR(st.st_mode) else 0o444)
            elif owner:
                tree.set_owner(rel, uid, gid, _agent_mode)
            else:
                tree.set_owner(rel, None, None, lambda s: stat.S_IMODE(s.st_mode) | stat.S_IWUSR)
    state = root / STATE_DIR
    if state.is_dir() and not state.is_symlink():
        tree.set_owner(STATE_DIR, 0 if owner else None, gid or 0, 0o750 if owner else 0o755)
        for name in os.listdir(state):
            rel = f"{STATE_DIR}/{name}"
            with contextlib.suppress(OSError, UnsafePath):
                if name == "service.sock":
                    sock = state / name
                    if stat.S_ISSOCK(os.lstat(sock).st_mode):
                        os.chmod(sock, 0o666)
                elif stat.S_ISDIR(os.lstat(state / name).st_mode):
                    tree.set_owner(rel, None, None, 0o755)
        if owner:  # jobs that run the agent's code as root drop to this user (see ..privdrop)
            from ..privdrop import record_user

            record_user(root, uid, gid)
    tree.set_owner(".", 0 if owner else None, gid or 0, 0o1770 if owner else 0o755)


# --- process handle ----------------------------------------------------------------------


class OutputCollector:
    """Reads a process's stdout to the end, keeping the head and tail when it is huge."""

    def __init__(self, fileobj, limit: int):
        self.f = fileobj
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        half = self.limit // 2
        if len(self.head) < half:
            take = half - len(self.head)
            self.head += data[:take]
            data = data[take:]
        if data:
            self.tail += data
            if len(self.tail) > half:
                cut = len(self.tail) - half
                self.dropped += cut
                del self.tail[:cut]

    def text(self) -> str:
        mid = f"\n[... {self.dropped} bytes of output omitted ...]\n".encode() if self.dropped else b""
        return bytes(self.head + mid + self.tail).decode("utf-8", "replace")


def collect(proc: Any, timeout: float, limit: int, stop: Callable[[], bool] | None = None) -> tuple[str, bool]:
    """Read ``proc.stdout`` until EOF or ``timeout``; returns (output, timed_out)."""
    col = OutputCollector(proc.stdout, limit)
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        if stop is not None and stop():
            break
        r, _, _ = select.select([fd], [], [], min(left, 0.25))
        if not r:
            continue
        data = os.read(fd, 65536)
        if not data:
            break
        col.feed(data)
    return col.text(), timed_out


# --- disk watchdog -------------------------------------------------------------------------


def tree_size(root: Path, stop_at: int) -> int:
    total = 0
    stack = [str(root)]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                        else:  # sparse files at their apparent size, preallocated ones at their blocks
                            st = e.stat(follow_symlinks=False)
                            total += max(st.st_blocks * 512, st.st_size if e.is_file(follow_symlinks=False) else 0)
                    except OSError:
                        continue
                    if total > stop_at:
                        return total
        except OSError:
            continue
    return total


def adopt_files(root: Path, protected: list[str], uid: int, gid: int) -> int:
    """Give the agent the files that host-side tools (the agent's write/edit tools run
    outside the sandbox) created in its part of the workspace; returns how many changed.
    Links are never followed (see :func:`apply_layout`)."""
    changed = 0
    tree = Tree(root)
    try:
        entries = list(tree.walk(".", skip={STATE_DIR}))
    except (OSError, UnsafePath):
        return 0
    for rel, st in entries:
        if st.st_uid == uid or stat.S_ISLNK(st.st_mode) or _is_protected(rel, protected):
            continue
        with contextlib.suppress(OSError, UnsafePath):
            if tree.set_owner(rel, uid, gid, _agent_mode) is not None:
                changed += 1
    return changed


class DiskWatchdog:
    """Kills the session's processes when the workspace grows past ``limit_mb``."""

    def __init__(self, root: Path, limit_mb: int, on_exceed: Callable[[], None], period: float = 0.5,
                 on_tick: Callable[[], None] | None = None):
        self.root = root
        self.on_tick = on_tick
        self.limit = limit_mb * 1024 * 1024
        self.on_exceed = on_exceed
        self.period = period
        self.exceeded = False
        self.fired = 0  # how many times the session was killed for its size
        self._fired_at = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, name="disk-watchdog", daemon=True)
        if limit_mb > 0 or on_tick is not None:
            self._t.start()

    def check(self) -> bool:
        """Kill the session when the workspace passes the limit, and again each time it grows
        further while over it (commands that only delete files may run)."""
        if self.on_tick is not None:
            with contextlib.suppress(Exception):
                self.on_tick()
        if self.limit <= 0:
            return False
        with self._lock:
            size = tree_size(self.root, self.limit + (64 << 20) + self._fired_at)
            if size > self.limit:
                if not self.exceeded or size > self._fired_at + (8 << 20):
                    self.exceeded = True
                    self._fired_at = size
                    self.fired += 1
                    self.on_exceed()
                return True
            self.exceeded = False
            self._fired_at = 0
            return False

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            with contextlib.suppress(Exception):
                self.check()

    def stop(self) -> None:
        self._stop.set()


def diskfs_full(root: Path) -> bool:
    from .diskfs import is_full

    return is_full(root)


class TrackedProcesses:
    """Bookkeeping shared by the sandbox sessions: the processes a session started (killed
    when it closes), the closed flag, and files handed back to the agent's user."""

    workspace: Path
    protected: list[str]
    lease: "UidLease | None"

    def _init_tracking(self) -> None:
        self._procs: list[Any] = []
        self._lock = threading.Lock()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox session is closed")

    def _track(self, proc: Any) -> Any:
        with self._lock:
            self._procs.append(proc)
        return proc

    def _forget(self, proc: Any) -> None:
        with self._lock:
            if proc in self._procs:
                self._procs.remove(proc)

    def _tracked(self) -> list[Any]:
        with self._lock:
            return list(self._procs)

    def limit_notes(self, output: str, proc: Any) -> str:
        """Lines for a command of a long-lived process (the agent's persistent shell) that a
        limit stopped: the workspace's file system is full, or the disk watchdog killed it."""
        o = self.options
        fired = self.watchdog.fired
        killed = fired != getattr(proc, "_fired_seen", fired)
        proc._fired_seen = fired
        full = getattr(self, "disk_fs", "none") != "none" and (
            "No space left on device" in output or diskfs_full(self.workspace))
        return "\n".join(limit_messages(False, 0, killed, o.disk_mb, o.file_size_mb, False, None, disk_full=full))

    def _adopt(self) -> None:
        if self.lease is not None:
            adopt_files(self.workspace, self.protected, self.lease.uid, self.lease.gid)


def limit_messages(timed_out: bool, timeout: float, killed_for_disk: bool, disk_mb: int, file_size_mb: int,
                   file_too_large: bool, out_of_memory: str | None, cpu_s: int | None = None,
                   disk_full: bool = False) -> list[str]:
    """The lines a sandbox appends to a command's output when a limit stopped it.
    ``out_of_memory``: the memory rule in words when the command was killed for memory;
    ``disk_full``: the workspace's size-limited file system has no room left."""
    msgs = []
    if timed_out:
        msgs.append(f"[sandbox] command timed out after {timeout:g} s; it and every process it started were killed")
    if killed_for_disk:
        msgs.append(f"[sandbox] the workspace grew past its disk limit of {disk_mb} MB (sparse files count at "
                    "their full size); the command was killed: delete large files")
    if disk_full and not killed_for_disk:
        msgs.append(f"[sandbox] the workspace is full: it holds at most {disk_mb} MB (preallocated space counts); "
                    "delete large files to go on")
    if file_too_large:
        msgs.append(f"[sandbox] file size limit exceeded: files may not exceed {file_size_mb} MB")
    if cpu_s is not None:
        msgs.append(f"[sandbox] CPU time limit of {cpu_s} s exceeded")
    if out_of_memory:
        msgs.append(f"[sandbox] killed: out of memory ({out_of_memory}) or another resource limit")
    return msgs
