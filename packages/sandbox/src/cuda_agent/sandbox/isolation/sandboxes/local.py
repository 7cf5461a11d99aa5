"""The local sandbox (default): the agent's commands run as subprocesses of this host.

What holds where (Linux):

* always: own process group/session, killed as a whole on timeout or close; rlimits on
  CPU time, address space, file size and open files; a clean environment (no host
  variables leak in); a disk watchdog that kills the session when the workspace grows
  past ``disk_mb`` (sparse files at their full size).
* as root: the workspace is a file system of ``disk_mb`` while sessions are open
  (:mod:`.diskfs`), so preallocated space counts too.
* as root (``isolation: auto`` or ``user``): each session runs under its own unprivileged
  user id (RLIMIT_NPROC then bounds a fork bomb), in new mount, PID and network
  namespaces (``unshare``); killing a command kills every member of its PID namespace
  (whatever session, group or parent-death signal they chose), and the last session of a
  workspace kills and checks that no process of its user id is left
  (:func:`.sweeps.sweep_uid`). No network (only a down loopback), private size-limited
  tmpfs on /tmp, /var/tmp and /dev/shm; /home, /root, /mnt, /media, /srv, the workspace's
  parent folder and closed folders on the way to the workspace and the Python
  installation shown empty, except for those two paths (system folders such as /usr and
  /etc stay readable, as the shell and Python need them);
  ``no_new_privs``. Protected files are ``root``-owned and read-only; the workspace folder
  is sticky and closed to other users, so other workspaces cannot be read.
* not root: limits, process group and watchdog only; if unprivileged user namespaces
  are allowed the network is cut too. Protected files are only chmod-ed read-only, which
  the agent could undo: use the docker sandbox for real isolation.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from cuda_agent.core.interfaces import Sandbox, SandboxSession

from . import diskfs
from .disk_watchdog import DiskWatchdog
from .layout import apply_layout, is_root
from .output import collect
from .results import CommandResult, SandboxError, command_end_messages, limit_messages, workspace_ran_out
from .sweeps import (kill_namespace, namespace_members, pid_in_namespace, pid_namespace, processes_of_uid,
                     session_members, stop_and_kill, sweep_uid)
from .tracking import TrackedProcesses
from .uids import UidLease, acquire_uid, release_uid, uid_users

LAUNCHER = Path(__file__).with_name("_launch.py")
MB = 1024 * 1024
SCRATCH = ["/tmp", "/var/tmp", "/dev/shm"]


@dataclass
class LocalOptions:
    isolation: str = "auto"  # auto | user (root: own uid + namespaces) | none (limits only)
    network: bool = False
    cpu_s: int = 600  # CPU seconds per process
    memory_mb: int = 8192  # address space per process
    file_size_mb: int = 256  # largest file a process may write
    nproc: int = 256  # processes of the agent user (isolation: user)
    nofile: int = 1024
    tmp_mb: int = 256  # private /tmp, /var/tmp, /dev/shm
    disk_mb: int = 2048  # the workspace's size limit (its file system's size, and the watchdog's)
    disk_fs: str = "auto"  # as root: auto | loop | tmpfs: a file system of disk_mb on the workspace; none
    max_output_kb: int = 1024  # output kept per command (head and tail)
    uid_base: int = 61000
    uid_count: int = 4000
    expose: list[str] = field(default_factory=list)  # extra read-only paths to keep visible
    # folders shown empty (isolation: user); the workspace's parent is hidden too
    hide: list[str] = field(default_factory=lambda: ["/home", "/root", "/mnt", "/media", "/srv"])
    path: str = ""  # PATH inside; default: this Python's bin folder, then the system's


class SandboxProcess:
    """A process in the sandbox: ``stdin``/``stdout`` pipes (stderr merged), ``poll``,
    ``wait``, ``kill`` (kills everything it started)."""

    def __init__(self, popen: subprocess.Popen, session: "LocalSession"):
        self._p = popen
        self._session = session
        self.stdin = popen.stdin
        self.stdout = popen.stdout
        self.pid = popen.pid
        # the PID namespace unshare makes for it: killing every member ends everything the
        # command started, whatever process group, session or parent-death signal it chose
        self.pid_ns = _child_namespace(popen) if session.mode == "user" else None
        self._fired_seen = session.watchdog.fired
        self.scratch_full: list | None = None  # the full scratch file systems after the last command

    def poll(self) -> int | None:
        return self._p.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._p.wait(timeout)

    @property
    def returncode(self) -> int | None:
        return self._p.returncode

    def limit_notes(self, output: str) -> str:
        """What a limit did to the last command of this process (see TrackedProcesses.limit_notes)."""
        return self._session.limit_notes(output, self)

    def end_command(self, output: str) -> str:
        """Stop what the last command of this process (the agent's persistent shell) left
        running; the lines that tell the agent so (see LocalSession.end_command)."""
        return self._session.end_command(self, output)

    def kill(self) -> None:
        # the namespace's processes first (its init's end takes nested namespaces along);
        # the process group covers the no-namespace case
        if self.pid_ns is not None:
            left = kill_namespace(self.pid_ns)
            if left:
                self._session.notes.append(f"processes {left} of a command outlived SIGKILL")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._p.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self._p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._p.wait(5)
        self._session._forget(self)


_warned: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


@dataclass
class _Plan:
    prefix: list[str]
    config: dict
    uid: int | None


class LocalSession(TrackedProcesses, SandboxSession):
    def __init__(self, sandbox: "LocalSandbox", workspace: Path, protected: list[str]):
        self.sandbox = sandbox
        self.options: LocalOptions = sandbox.options
        self.workspace = Path(workspace).resolve()
        if not self.workspace.is_dir():
            raise SandboxError(f"workspace {self.workspace} does not exist")
        self.protected = list(protected)
        self.notes: list[str] = []
        self._init_tracking()
        self.lease: UidLease | None = None
        o = self.options
        if o.isolation not in ("auto", "user", "none"):
            raise SandboxError(f"local sandbox: isolation must be auto, user or none, not {o.isolation!r}")
        self.mode = "none"
        if o.isolation in ("auto", "user"):
            if is_root() and _namespaces_work():
                self.mode = "user"
            elif o.isolation == "user":
                raise SandboxError("local sandbox: isolation 'user' needs root and working mount/PID/network "
                                   "namespaces (unshare)")
            elif is_root():
                _warn_once("local sandbox: unshare cannot create namespaces here (a container without "
                           "CAP_SYS_ADMIN?): commands run without user/network isolation; use the docker sandbox")
            else:
                _warn_once("local sandbox: not root, so no separate user, namespaces or protected "
                           "files beyond chmod; use the docker sandbox for isolation")
        elif is_root():
            _warn_once("local sandbox: isolation 'none' as root: commands run as root and can change "
                       "protected files; only limits and timeouts apply")
        self.disk_fs = diskfs.acquire(self.workspace, o.disk_mb, o.disk_fs)
        try:
            if self.mode == "user":
                lock_dir = Path(tempfile.gettempdir()) / "cuda-agent-sandbox-uids"
                self.lease = acquire_uid(self.workspace, o.uid_base, o.uid_count, lock_dir)
                apply_layout(self.workspace, self.protected, self.lease.uid, self.lease.gid)
            else:
                apply_layout(self.workspace, self.protected, None, None)
        except BaseException:
            diskfs.release(self.workspace)
            raise
        self.watchdog = DiskWatchdog(self.workspace, o.disk_mb, self._disk_exceeded, on_tick=self._adopt)
        self._net_prefix = self._probe_network()

    # -- setup --------------------------------------------------------------------

    def _probe_network(self) -> list[str]:
        if self.options.network or self.mode == "user":
            return []
        if shutil.which("unshare"):
            probe = subprocess.run(["unshare", "--user", "--map-current-user", "--net", "true"],
                                   capture_output=True)
            if probe.returncode == 0:
                return ["unshare", "--user", "--map-current-user", "--net", "--"]
        _warn_once("local sandbox: cannot create a network namespace here; commands keep network access")
        return []

    def _path(self) -> str:
        if self.options.path:
            return self.options.path
        bin_dir = str(Path(sys.executable).parent)
        return f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

    def _env(self, env: dict | None) -> dict:
        out = {
            "PATH": self._path(),
            "HOME": "/tmp" if self.mode == "user" else str(self.workspace / ".cuda_agent" / "tmp"),
            "TMPDIR": "/tmp" if self.mode == "user" else str(self.workspace / ".cuda_agent" / "tmp"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "CUDA_AGENT_WORKSPACE": str(self.workspace),
            "CUDA_AGENT_SERVICE": str(self.workspace / ".cuda_agent" / "service.sock"),
        }
        for key in ("CUDA_VISIBLE_DEVICES", "CUDA_HOME"):
            if key in os.environ:
                out[key] = os.environ[key]
        out.update({str(k): str(v) for k, v in (env or {}).items()})
        return out

    def _expose(self) -> list[tuple[str, bool]]:
        paths = [(str(self.workspace), True)]
        seen = set()
        for p in [sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent.parent),
                  *self.options.expose]:
            rp = str(Path(p).resolve())
            if rp not in seen and rp != "/":
                seen.add(rp)
                paths.append((rp, False))
        return paths

    def _plan(self, env: dict | None) -> _Plan:
        o = self.options
        rl = {"RLIMIT_CPU": o.cpu_s, "RLIMIT_AS": o.memory_mb * MB, "RLIMIT_FSIZE": o.file_size_mb * MB,
              "RLIMIT_NOFILE": o.nofile, "RLIMIT_CORE": 0}
        cfg = {"cwd": str(self.workspace), "env": self._env(env), "rlimits": rl, "mount": False}
        if self.mode == "user":
            assert self.lease is not None
            rl["RLIMIT_NPROC"] = o.nproc
            hide = [*o.hide]
            if str(self.workspace.parent) != "/":
                hide.append(str(self.workspace.parent))
            cfg.update(uid=self.lease.uid, gid=self.lease.gid, mount=True, expose=self._expose(), hide=hide,
                       scratch=[["/tmp", o.tmp_mb], ["/var/tmp", o.tmp_mb], ["/dev/shm", o.tmp_mb]])
            flags = ["--mount", "--pid", "--fork", "--kill-child", "--mount-proc"]
            if not o.network:
                flags.append("--net")
            prefix = ["unshare", *flags, "--", sys.executable, "-I", "-S", str(LAUNCHER)]
            return _Plan(prefix, cfg, self.lease.uid)
        prefix = [*self._net_prefix, sys.executable, "-I", "-S", str(LAUNCHER)]
        return _Plan(prefix, cfg, None)

    # -- processes ----------------------------------------------------------------------

    def spawn(self, argv: list[str], env: dict | None = None) -> SandboxProcess:
        self._check_open()
        plan = self._plan(env)
        full = [*plan.prefix, json.dumps(plan.config), "--", *argv]
        p = subprocess.Popen(full, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             cwd=str(self.workspace), env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                             start_new_session=True)
        return self._track(SandboxProcess(p, self))

    def run(self, command: str, timeout: float = 60.0, env: dict | None = None) -> CommandResult:
        t0 = time.monotonic()
        self.watchdog.check()
        fired = self.watchdog.fired
        proc = self.spawn(["/bin/bash", "--noprofile", "--norc", "-c", command], env=env)
        proc.stdin.close()
        output, timed_out = collect(proc, timeout, self.options.max_output_kb * 1024,
                                    stop=lambda: self.watchdog.fired != fired)
        killed_for_disk = self.watchdog.fired != fired
        if timed_out or killed_for_disk:
            proc.kill()
            code = None
        else:
            try:
                code = proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = None
        self._forget(proc)
        bounded = self.disk_fs != "none"
        scratch_known = [] if self.mode != "user" else None  # without namespaces /tmp is the workspace's
        full = bounded and workspace_ran_out(output, diskfs.is_full(self.workspace), scratch_known)
        notes = self.explain(code, timed_out, timeout, killed_for_disk, disk_full=full)
        if "No space left on device" in output and not full and self.mode == "user":
            # the command's private scratch file systems ended with it: which one ran out is unknown
            o = self.options
            room = f"the workspace holds at most {o.disk_mb} MB (preallocated space counts), " if bounded else ""
            notes = "\n".join(filter(None, [notes, (
                f"[sandbox] no space left on device: {room}/tmp, /var/tmp and /dev/shm hold at most {o.tmp_mb} MB "
                "each; delete large files to go on")]))
        if notes:
            output = (output.rstrip("\n") + "\n" if output else "") + notes
        return CommandResult(exit_code=code, output=output, timed_out=timed_out, seconds=time.monotonic() - t0)

    def end_command(self, proc: SandboxProcess, output: str) -> str:
        """After a command of ``proc`` (a long-lived shell): every process the command left
        running is stopped (the members of the shell's PID namespace other than the shell,
        its init; without namespaces, the members of its session); the lines for the agent:
        what was stopped, the process limit and what background jobs hold of it, a full
        scratch file system."""
        if proc.pid_ns is not None:
            ns = proc.pid_ns

            def left() -> list[int]:
                return [p for p in namespace_members(ns) if pid_in_namespace(p) != 1]
        else:  # no namespace of its own: the shell leads the session (it is the launcher's exec)
            def left() -> list[int]:
                return [p for p in session_members(proc.pid) if p != proc.pid and
                        (self.mode != "user" or pid_in_namespace(p) != 1)]
        stopped, survivors = stop_and_kill(left)
        if survivors:
            self.notes.append(f"processes {survivors} a command left outlived SIGKILL")
        limit, held, full = None, 0, []
        proc.scratch_full = [] if self.mode != "user" else None  # without namespaces /tmp is the workspace's
        if self.mode == "user" and self.lease is not None:
            limit = self.options.nproc
            mine = set(namespace_members(proc.pid_ns)) if proc.pid_ns else set()
            held = len([p for p in processes_of_uid(self.lease.uid) if p not in mine])
            init = next((p for p in mine if pid_in_namespace(p) == 1), None)
            if init is not None:
                full = proc.scratch_full = _full_scratch(init, self.options.tmp_mb)
        return "\n".join(command_end_messages(stopped, output, limit, held, full))

    def explain(self, code: int | None, timed_out: bool, timeout: float, killed_for_disk: bool = False,
                disk_full: bool = False) -> str:
        o = self.options
        sig = 0 if code is None else (-code if code < 0 else (code - 128 if code > 128 else 0))
        return "\n".join(limit_messages(
            timed_out, timeout, killed_for_disk, o.disk_mb, o.file_size_mb, file_too_large=sig == signal.SIGXFSZ,
            disk_full=disk_full and self.disk_fs != "none",
            cpu_s=o.cpu_s if sig == signal.SIGXCPU else None,
            out_of_memory=f"each process may use {o.memory_mb} MB" if sig == signal.SIGKILL and not timed_out else None))

    def _disk_exceeded(self) -> None:
        self.kill_all()

    def kill_all(self) -> None:
        for p in self._tracked():
            p.kill()
        if self.lease is not None:
            sweep_uid(self.lease.uid, self.lease.gid)

    def close(self) -> None:
        """Kill every process the session started; the last session of a workspace also
        kills and checks that no process of its user id is left, then gives the workspace's
        file system back. SandboxError when a process survived (its user id then stays
        reserved, so no other workspace gets it)."""
        if self._closed:
            return
        self._closed = True
        self.watchdog.stop()
        for p in self._tracked():
            p.kill()
        survivors: list[int] = []
        last = self.lease is None or uid_users(self.lease) == 1
        if self.lease is not None and last:
            survivors = sweep_uid(self.lease.uid, self.lease.gid)  # nothing may outlive the workspace's sessions
        try:
            diskfs.release(self.workspace)
        finally:
            if self.lease is not None and not survivors:
                release_uid(self.lease)
        if survivors:
            raise SandboxError(f"local sandbox: processes {survivors} of user {self.lease.uid} survived SIGKILL "
                               "when the sandbox closed; the user id stays reserved")


_ns_ok: bool | None = None


def _namespaces_work() -> bool:
    """Can this process create the mount, PID and network namespaces (once per process)?"""
    global _ns_ok
    if _ns_ok is None:
        if not shutil.which("unshare"):
            _ns_ok = False
        else:
            try:
                probe = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
                                        "--net", "true"], capture_output=True, timeout=30)
                _ns_ok = probe.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                _ns_ok = False
    return _ns_ok


def _full_scratch(init: int, size_mb: int) -> list[tuple[str, int]]:
    """The scratch file systems (private tmpfs) of the namespace whose init is ``init`` that
    have no room left."""
    full = []
    for d in SCRATCH:
        with contextlib.suppress(OSError):
            st = os.statvfs(f"/proc/{init}/root{d}")
            if st.f_bavail * st.f_frsize <= MB:
                full.append((d, size_mb))
    return full


def _child_namespace(popen: subprocess.Popen, timeout: float = 5.0) -> str | None:
    """The PID namespace ``unshare --pid`` made for its command (once it has made it)."""
    own = pid_namespace(os.getpid())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # no link until the namespace has its init: between unshare's unshare() and fork()
        ns = pid_namespace(popen.pid, children=True)
        if popen.poll() is not None:
            return None
        if ns is not None and ns != own:
            return ns
        time.sleep(0.002)
    return None


class LocalSandbox(Sandbox):
    name = "local"
    description = "subprocesses with rlimits; as root: own uid, no network, private /tmp (namespaces)"
    Options = LocalOptions

    def open(self, workspace: Path, protected: list[str] | None = None) -> LocalSession:
        if protected is None:
            protected = _protected_of(workspace)
        return LocalSession(self, Path(workspace), protected)


def _protected_of(workspace: Path) -> list[str]:
    meta = Path(workspace) / ".cuda_agent" / "workspace.json"
    try:
        return list(json.loads(meta.read_text()).get("protected", []))
    except (OSError, ValueError):
        return []
