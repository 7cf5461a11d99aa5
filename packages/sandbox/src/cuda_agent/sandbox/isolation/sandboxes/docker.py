"""The docker sandbox: one container per session, through the Docker SDK.

The container runs the locally built image (``cuda-agent sandbox build-image``; never
pulled) with: the workspace bind-mounted at ``/workspace``; protected paths and
``.cuda_agent`` mounted again on top, read-only (a read-only bind mount cannot be undone
without capabilities, and a mount point cannot be deleted or renamed); no network
(``network_mode: none``); memory, CPU and PID limits; a read-only root file system with a
size-limited tmpfs on /tmp; a file-size ulimit; the workspace a file system of ``disk_mb``
when the engine runs on this host and we are root (:mod:`.diskfs`); all capabilities dropped
but root's ``CAP_KILL`` (the agent never runs as root), ``no-new-privileges``. Commands run
as an unprivileged user id (the agent's own when the host side is root; the workspace's
layout is then the same as in the local sandbox; that user may then run ``pids``
processes, and the container a few more, so the sandbox can always start its reaper).

A command's processes end with it: what a command of the persistent shell left running
(``&``, ``nohup``, ``setsid``) is stopped when the command ends (:mod:`._reap`, run as root in
the container), and the agent is told so; its background jobs (processes started with
``spawn``) are kept, count against the process limit, and a command that hit the limit is
told how many processes they hold. Reading a command's output never gives up while the
command runs: a stream that stays silent past the Docker API's socket timeout
(``api_timeout_s``) is read on until the command ends or its own timeout kills it.

``DOCKER_HOST`` selects a remote engine; the workspace must then be visible to it at the
same path, or at the path given by ``path_map``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from cuda_agent.core.interfaces import Sandbox, SandboxSession

from . import diskfs
from .disk_watchdog import DiskWatchdog
from .image import DEFAULT_IMAGE, docker_client, image_exists
from .layout import apply_layout, is_root
from .output import collect
from .results import CommandResult, SandboxError, command_end_messages, limit_messages, workspace_ran_out
from .tracking import TrackedProcesses
from .uids import UidLease, acquire_uid, release_uid

MOUNT = "/workspace"
PIDS = "/tmp/.cuda-agent-pids"
SCRATCH = ["/tmp", "/var/tmp", "/dev/shm"]
PID_RESERVE = 16  # processes the container may run beyond the agent's own limit (the reaper)
REAPER = Path(__file__).with_name("_reap.py").read_text()


@dataclass
class DockerOptions:
    image: str = DEFAULT_IMAGE
    memory_mb: int = 4096
    cpus: float = 2.0
    pids: int = 256
    tmp_mb: int = 256
    file_size_mb: int = 256
    nofile: int = 1024
    disk_mb: int = 2048  # the workspace's size limit (its file system's size, and the watchdog's)
    disk_fs: str = "auto"  # as root with a local engine: auto | loop | tmpfs (see .diskfs); none
    max_output_kb: int = 1024
    uid_base: int = 61000
    uid_count: int = 4000
    api_timeout_s: float = 60.0  # the Docker SDK's socket timeout for API calls and output streams
    path_map: dict[str, str] = field(default_factory=dict)  # local prefix -> path on the engine's host
    extra_env: dict[str, str] = field(default_factory=dict)


class _Stdin:
    """Writes go to the exec's stdin; ``close()`` sends EOF."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self.closed = False

    def write(self, data: bytes) -> int:
        if self.closed:
            raise ValueError("stdin is closed")
        self._sock.sendall(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)


class DockerProcess:
    """A command executed in the container: ``stdin``/``stdout`` (stderr merged),
    ``poll``, ``wait``, ``kill`` (its whole process group)."""

    def __init__(self, session: "DockerSession", argv: list[str], env: dict):
        self.session = session
        api = session.client.api
        self.tag = uuid.uuid4().hex[:12]
        pidfile = f"{PIDS}/{self.tag}"
        wrapped = ["setsid", "-w", "sh", "-c", f'mkdir -p {PIDS}; echo $$ > {pidfile}; "$@"; exit $?', "sh", *argv]
        self.exec_id = api.exec_create(session.container.id, wrapped, stdin=True, stdout=True, stderr=True,
                                       tty=False, environment=env, workdir=MOUNT,
                                       user=session.user)["Id"]
        raw = api.exec_start(self.exec_id, socket=True)
        self._sock: socket.socket = getattr(raw, "_sock", raw)
        self.stdin = _Stdin(self._sock)
        rfd, wfd = os.pipe()
        self.stdout = os.fdopen(rfd, "rb", buffering=0)
        self._wfd = wfd
        self._returncode: int | None = None
        self._closing = False
        self.scratch_full: list | None = None  # the full scratch file systems after the last command
        self.pid = None
        self._fired_seen = session.watchdog.fired if hasattr(session, "watchdog") else 0
        self._t = threading.Thread(target=self._pump, daemon=True)
        self._t.start()

    def _recv_exact(self, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            try:
                chunk = self._sock.recv(n - len(buf))
            except socket.timeout:
                # a silent command, not the end of its output: read on while it runs
                if self._closing or not self._running():
                    return None
                continue
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk
        return buf

    def _pump(self) -> None:
        try:
            while True:
                header = self._recv_exact(8)
                if header is None:
                    break
                _stream, size = struct.unpack(">BxxxL", header)
                data = self._recv_exact(size) if size else b""
                if data is None:
                    break
                try:
                    os.write(self._wfd, data)
                except OSError:
                    break
        finally:
            with contextlib.suppress(OSError):
                os.close(self._wfd)

    def _running(self) -> bool:
        """Whether the engine says the command still runs (an engine that does not answer
        in time: it may)."""
        try:
            return bool(self.session.client.api.exec_inspect(self.exec_id).get("Running"))
        except Exception:
            return True

    def poll(self) -> int | None:
        if self._returncode is not None:
            return self._returncode
        try:
            info = self.session.client.api.exec_inspect(self.exec_id)
        except Exception:
            return -9
        if info.get("Running"):
            return None
        self._returncode = info.get("ExitCode")
        return self._returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() > deadline:
                import subprocess

                raise subprocess.TimeoutExpired("docker exec", timeout)
            time.sleep(0.05)

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def limit_notes(self, output: str) -> str:
        """What a limit did to the last command of this process (see TrackedProcesses.limit_notes)."""
        return self.session.limit_notes(output, self)

    def kill_group(self) -> dict | None:
        """Kill the command's session (background children included) and the strays of the
        container; what the reaper saw, or None when the container had to be restarted."""
        return self.session.reap(self, whole=True)

    def end_command(self, output: str) -> str:
        """Stop what the last command of this process (the agent's persistent shell) left
        running; the lines that tell the agent so (see DockerSession.reap_notes)."""
        info = self.session.reap(self, whole=False)
        self.scratch_full = None if info is None else list(info.get("full") or [])
        return self.session.reap_notes(info, output)

    def kill(self) -> None:
        self._closing = True
        self.kill_group()
        if self.poll() is None:
            try:
                self.wait(2)
            except Exception:
                self.session.restart()
        self.stdin.close()
        with contextlib.suppress(OSError):
            self._sock.close()
        self._t.join(2)
        if self._returncode is None:
            with contextlib.suppress(Exception):
                self.wait(2)
        self.session._forget(self)


class DockerSession(TrackedProcesses, SandboxSession):
    def __init__(self, sandbox: "DockerSandbox", workspace: Path, protected: list[str]):
        self.options: DockerOptions = sandbox.options
        o = self.options
        self.workspace = Path(workspace).resolve()
        if not self.workspace.is_dir():
            raise SandboxError(f"workspace {self.workspace} does not exist")
        self.protected = list(protected)
        self.client = docker_client(timeout=o.api_timeout_s)
        if not image_exists(self.client, o.image):
            raise SandboxError(f"docker image {o.image} not found: build it with `cuda-agent sandbox build-image`")
        self._init_tracking()
        self.lease: UidLease | None = None
        # the engine bind-mounts the workspace path: a file system mounted on it here is
        # what the container gets, when the engine runs on this host
        self.disk_fs = diskfs.acquire(self.workspace, o.disk_mb, o.disk_fs if self._local_engine() else "none")
        try:
            if is_root():
                self.lease = acquire_uid(self.workspace, o.uid_base, o.uid_count,
                                         Path(tempfile.gettempdir()) / "cuda-agent-sandbox-uids")
                uid, gid = self.lease.uid, self.lease.gid
                apply_layout(self.workspace, self.protected, uid, gid)
            else:
                uid, gid = os.getuid(), os.getgid()
                apply_layout(self.workspace, self.protected, None, None)
            self.user = f"{uid}:{gid}"
            self.container = self._start()
        except BaseException:
            if self.lease is not None:
                release_uid(self.lease)
            diskfs.release(self.workspace)
            raise
        self.restarts = 0
        self.watchdog = DiskWatchdog(self.workspace, o.disk_mb, self.kill_all, on_tick=self._adopt)

    def _local_engine(self) -> bool:
        host = os.environ.get("DOCKER_HOST", "")
        return (not host or host.startswith("unix://")) and not self.options.path_map

    def _host_path(self, p: Path) -> str:
        s = str(p)
        for local, remote in self.options.path_map.items():
            if s == local or s.startswith(local.rstrip("/") + "/"):
                return remote.rstrip("/") + s[len(local.rstrip("/")):]
        return s

    def _start(self):
        import docker

        o = self.options
        mounts = [docker.types.Mount(MOUNT, self._host_path(self.workspace), type="bind", read_only=False)]
        for rel in [*self.protected, ".cuda_agent"]:
            p = self.workspace / rel
            if p.exists() and not p.is_symlink():
                mounts.append(docker.types.Mount(f"{MOUNT}/{rel.rstrip('/')}", self._host_path(p), type="bind",
                                                 read_only=True))
        ulimits = [docker.types.Ulimit(name="fsize", soft=o.file_size_mb * 1024 * 1024, hard=o.file_size_mb * 1024 * 1024),
                   docker.types.Ulimit(name="nofile", soft=o.nofile, hard=o.nofile),
                   docker.types.Ulimit(name="core", soft=0, hard=0)]
        pids = o.pids
        if self.lease is not None:
            # the agent's user id is this workspace's alone: it may run `pids` processes (root,
            # the reaper, is exempt), and the container a few more
            ulimits.append(docker.types.Ulimit(name="nproc", soft=o.pids, hard=o.pids))
            pids = o.pids + PID_RESERVE
        tmpfs = {"/tmp": f"size={o.tmp_mb}m,mode=1777", "/var/tmp": f"size={o.tmp_mb}m,mode=1777",
                 "/run": "size=1m,mode=755"}
        try:
            return self.client.containers.run(
                o.image, ["sleep", "infinity"], detach=True, user="0:0", network_mode="none",
                mem_limit=f"{o.memory_mb}m", memswap_limit=f"{o.memory_mb}m", nano_cpus=int(o.cpus * 1e9),
                pids_limit=pids, read_only=True, tmpfs=tmpfs, mounts=mounts, working_dir=MOUNT,
                cap_drop=["ALL"], cap_add=["KILL"], security_opt=["no-new-privileges"], ulimits=ulimits, init=True,
                labels={"cuda-agent.sandbox": "1", "cuda-agent.workspace": str(self.workspace)},
                environment={"LANG": "C.UTF-8"}, shm_size=f"{o.tmp_mb}m",
            )
        except docker.errors.APIError as exc:
            raise SandboxError(f"cannot start the sandbox container: {exc.explanation or exc}") from exc

    def _env(self, env: dict | None) -> dict:
        out = {"HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb",
               "PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
               "CUDA_AGENT_WORKSPACE": MOUNT, "CUDA_AGENT_SERVICE": f"{MOUNT}/.cuda_agent/service.sock"}
        out.update(self.options.extra_env)
        out.update({str(k): str(v) for k, v in (env or {}).items()})
        return out

    def spawn(self, argv: list[str], env: dict | None = None) -> DockerProcess:
        self._check_open()
        return self._track(DockerProcess(self, list(argv), self._env(env)))

    def reap(self, proc: DockerProcess, whole: bool) -> dict | None:
        """Run the reaper (:mod:`._reap`) for ``proc``'s session: ``whole`` ends it, else what
        its last command left; None when no process could be started in the container (every
        PID in use), which then restarts the container."""
        uid = self.user.split(":")[0]
        cfg = {"uid": int(uid), "pidfile": f"{PIDS}/{proc.tag}", "whole": whole, "scratch": SCRATCH}
        api = self.client.api
        info = None
        with contextlib.suppress(Exception):
            eid = api.exec_create(self.container.id, ["python3", "-I", "-S", "-c", REAPER, json.dumps(cfg)],
                                  user="0:0")["Id"]
            out = api.exec_start(eid).decode("utf-8", "replace").strip().splitlines()
            info = json.loads(out[-1]) if out else None
        if whole and info is not None:
            with contextlib.suppress(Exception):
                eid = api.exec_create(self.container.id, ["rm", "-f", f"{PIDS}/{proc.tag}"], user="0:0")["Id"]
                api.exec_start(eid)
        if not isinstance(info, dict) or info.get("left"):
            self.restart()
            return None
        return info

    def reap_notes(self, info: dict | None, output: str) -> str:
        """What the agent is told after a command (see results.command_end_messages)."""
        if info is None:
            return ("[sandbox] the sandbox had to be restarted to stop runaway processes "
                    "(/tmp was cleared; background jobs were ended)")
        return "\n".join(command_end_messages(int(info.get("stopped") or 0), output, self.options.pids,
                                              sum(info.get("others") or []),
                                              [(str(p), int(mb)) for p, mb in info.get("full") or []]))

    def run(self, command: str, timeout: float = 60.0, env: dict | None = None) -> CommandResult:
        t0 = time.monotonic()
        restarts = self.restarts
        self.watchdog.check()
        fired = self.watchdog.fired
        proc = self.spawn(["/bin/bash", "--noprofile", "--norc", "-c", command], env=env)
        proc.stdin.close()
        output, timed_out = collect(proc, timeout, self.options.max_output_kb * 1024,
                                    stop=lambda: self.watchdog.fired != fired)
        code = None
        info = None
        killed_for_disk = self.watchdog.fired != fired
        if timed_out or killed_for_disk:
            proc.kill()
        else:
            with contextlib.suppress(Exception):
                code = proc.wait(10)
            info = proc.kill_group()  # what it left running in the background
            self._forget(proc)
        notes = []
        if self.restarts != restarts:
            notes.append(self.reap_notes(None, ""))
        elif info is not None:
            notes.append(self.reap_notes(dict(info, stopped=0), output))
        o = self.options
        notes += limit_messages(timed_out, timeout, killed_for_disk, o.disk_mb, o.file_size_mb,
                                file_too_large=code in (128 + 25, -25),
                                disk_full=self.disk_fs != "none" and workspace_ran_out(
                                    output, diskfs.is_full(self.workspace),
                                    None if info is None else list(info.get("full") or [])),
                                out_of_memory=f"the sandbox has {o.memory_mb} MB" if code == 137 and not timed_out else None)
        notes = [n for n in notes if n]
        if notes:
            output = (output.rstrip("\n") + "\n" if output else "") + "\n".join(notes)
        return CommandResult(exit_code=code, output=output, timed_out=timed_out, seconds=time.monotonic() - t0)

    def restart(self) -> None:
        """Kill every process in the container and start it again (the workspace is kept)."""
        with contextlib.suppress(Exception):
            self.container.kill()
        with contextlib.suppress(Exception):
            self.container.start()
        self.restarts += 1

    def kill_all(self) -> None:
        """Kill every process of the agent user in the container."""
        for p in self._tracked():
            with contextlib.suppress(Exception):
                p.kill()
        with contextlib.suppress(Exception):
            self.container.exec_run(["sh", "-c", "kill -KILL -1 2>/dev/null; true"], user=self.user)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.watchdog.stop()
        for p in self._tracked():
            with contextlib.suppress(Exception):
                p.stdin.close()
        with contextlib.suppress(Exception):
            self.container.remove(force=True)
        try:
            diskfs.release(self.workspace)
        finally:
            if self.lease is not None:
                release_uid(self.lease)


class DockerSandbox(Sandbox):
    name = "docker"
    description = "a container per session (local image, no network, read-only protected mounts, limits)"
    Options = DockerOptions

    def open(self, workspace: Path, protected: list[str] | None = None) -> DockerSession:
        if protected is None:
            from .local import _protected_of

            protected = _protected_of(workspace)
        return DockerSession(self, Path(workspace), protected)
