"""Bookkeeping shared by the local and docker sandbox sessions: the processes a session
started (killed when it closes), whether it is closed, the notes for a command a limit
stopped, and files handed back to the agent's user."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from .diskfs import is_full as diskfs_full
from .layout import adopt_files
from .results import SandboxError, limit_messages, workspace_ran_out
from .uids import UidLease


class TrackedProcesses:
    """Bookkeeping shared by the sandbox sessions: the processes a session started (killed
    when it closes), the closed flag, and files handed back to the agent's user."""

    workspace: Path
    protected: list[str]
    lease: UidLease | None

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
        # the workspace's own file system, not any full one ("No space left on device" in the
        # output may be /tmp's: end_command found which scratch file systems are full)
        full = getattr(self, "disk_fs", "none") != "none" and workspace_ran_out(
            output, diskfs_full(self.workspace), getattr(proc, "scratch_full", None))
        return "\n".join(limit_messages(False, 0, killed, o.disk_mb, o.file_size_mb, False, None, disk_full=full))

    def _adopt(self) -> None:
        if self.lease is not None:
            adopt_files(self.workspace, self.protected, self.lease.uid, self.lease.gid)
