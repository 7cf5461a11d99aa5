"""What the local and docker sandboxes share, in one place: results and the sandbox's error
(:mod:`.results`), agent user ids (:mod:`.uids`), process sweeps (:mod:`.sweeps`), the
permission layout of a workspace (:mod:`.layout`), a command's output (:mod:`.output`), the
disk watchdog (:mod:`.disk_watchdog`) and the sessions' bookkeeping (:mod:`.tracking`)."""

from __future__ import annotations

from .disk_watchdog import DiskWatchdog, tree_size
from .layout import STATE_DIR, adopt_files, apply_layout, is_root
from .output import OutputCollector, collect
from .results import CommandResult, SandboxError, limit_messages
from .sweeps import kill_namespace, namespace_members, pid_namespace, processes_of_uid, sweep_uid
from .tracking import TrackedProcesses, diskfs_full
from .uids import UidLease, acquire_uid, release_uid, uid_users

__all__ = [
    "STATE_DIR", "CommandResult", "DiskWatchdog", "OutputCollector", "SandboxError", "TrackedProcesses", "UidLease",
    "acquire_uid", "adopt_files", "apply_layout", "collect", "diskfs_full", "is_root", "kill_namespace",
    "limit_messages", "namespace_members", "pid_namespace", "processes_of_uid", "release_uid", "sweep_uid",
    "tree_size", "uid_users",
]
