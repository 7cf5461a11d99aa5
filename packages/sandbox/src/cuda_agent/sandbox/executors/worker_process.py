"""One worker process as its pool sees it, and the device it serves.

A :class:`WorkerProcess` starts ``python -m cuda_agent.sandbox.executors.worker`` (or,
with the pool's fork server, forks it from a process that has imported the preload modules
once: :mod:`.fork_server`) in a session of its own with a socket to the pool, waits until it is ready (modules preloaded,
CUDA context made), sends it one job at a time and waits for the answer, the process's end
or the job's deadline. A job that times out or crashes the process ends in a
:class:`~.job.JobError` that says so in one line, with the tail of the worker's output;
the process is then killed with its whole process group.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

from .fork_server import ForkServerError
from .job import Job, JobError, classify_exception, describe_exception, describe_exit, format_seconds
from .job_queue import JobRecord

if TYPE_CHECKING:
    from .pool import WorkerPool


@dataclass
class DeviceSpec:
    """A device slot: ``label`` names it in logs and errors, ``device`` is what jobs get
    ("cuda:0", "cpu"), ``env`` is added to the worker's environment."""

    label: str
    device: str
    env: dict[str, str] = field(default_factory=dict)


class WorkerProcess:
    """The pool side of one worker process: start it, send it a job, wait for the result
    or the deadline, read its output, kill it with its process group."""

    def __init__(self, pool: WorkerPool, spec: DeviceSpec, index: int):
        self.pool = pool
        self.spec = spec
        self.log_path = os.path.join(pool.log_dir, f"worker-{spec.label}-{index}.log")
        parent_sock, child_sock = socket.socketpair()
        self.conn = Connection(parent_sock.detach())
        child_fd = child_sock.detach()
        cfg = {
            "fd": child_fd,
            "parent": os.getpid(),
            "device": spec.device,
            "label": spec.label,
            "preload": list(pool.preload),
            "health_check": pool.health_check,
            "init": list(pool.init),
            "memory_limit_mb": pool.memory_limit_mb,
            # the init steps (CUDA context) hold the device's quiet lock: a spare never makes
            # its context while a job times on the same GPU (cuda_agent.sandbox.isolation.hostlock)
            "device_quiet_lock": pool.device_lock_path(spec.label, "quiet"),
            "sys_path": [p for p in sys.path if p and os.path.isdir(p)],
        }
        env = pool.worker_env(spec)
        self.log = open(self.log_path, "ab")
        self.proc: Any = None
        try:
            server = pool.fork_server()
            if server is not None:
                try:
                    self.proc = server.fork({**cfg, "env": env}, self.log.fileno(), child_fd,
                                            pool.start_timeout)
                except ForkServerError as exc:
                    pool.fork_server_failed(str(exc))
            if self.proc is None:
                self.proc = subprocess.Popen(
                    [pool.python, "-m", "cuda_agent.sandbox.executors.worker", json.dumps(cfg)],
                    stdin=subprocess.DEVNULL,
                    stdout=self.log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(child_fd,),
                    start_new_session=True,
                    env=env,
                    close_fds=True,
                )
        finally:
            os.close(child_fd)
        self.pid = self.proc.pid
        try:
            self.pidfd: int | None = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = None
        self.ready = False
        self.jobs_run = 0
        self.started_at = time.monotonic()

    # -- waiting ---------------------------------------------------------------------

    def _wait(self, timeout: float | None) -> str:
        """Wait for a message or the process's end: 'message', 'exit' or 'timeout'."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = remaining if self.pidfd is not None else min(0.2, remaining if remaining is not None else 0.2)
            objs: list[Any] = [self.conn]
            if self.pidfd is not None:
                objs.append(self.pidfd)
            ready = wait(objs, timeout=step)
            if self.conn in ready:
                return "message"
            if ready or self.proc.poll() is not None:
                # the process ended; a message it sent just before may still be buffered
                if self.conn.poll(0):
                    return "message"
                return "exit"
            if deadline is not None and time.monotonic() >= deadline:
                return "timeout"

    def output_tail(self, start: int = 0, lines: int = 15) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                data = f.read()[-8000:]
        except OSError:
            return ""
        text = data.decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def wait_ready(self, timeout: float) -> None:
        if self.ready:
            return
        what = self._wait(timeout)
        if what == "message":
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                msg = None
            if msg and msg[0] == "ready":
                self.ready = True
                return
        if what == "timeout":
            self.kill()
            raise JobError(
                "worker_start",
                f"worker for device {self.spec.label} did not start within {format_seconds(timeout)}",
                device=self.spec.label,
            )
        self.kill()
        tail = self.output_tail()
        last = tail.strip().splitlines()[-1] if tail.strip() else describe_exit(self.proc.returncode)
        raise JobError(
            "worker_start",
            f"worker for device {self.spec.label} failed to start: {last}",
            device=self.spec.label,
            details=tail,
        )

    # -- running -----------------------------------------------------------------------

    def run(self, job: Job, timeout: float | None, record: JobRecord) -> tuple[Any, str | None]:
        """Run ``job``; returns (result, health). Raises JobError. After a JobError whose
        reason is timeout or crash the process is gone."""
        log_start = self.log_size()
        kwargs = dict(job.kwargs)
        if job.pass_device:
            kwargs["device"] = self.spec.device
        t0 = time.monotonic()
        try:
            self.conn.send(("run", job.id, job.fn, kwargs))
        except (OSError, ValueError) as exc:
            self.kill()
            raise JobError("crash", f"crashed: the worker could not receive the job ({exc})", job_id=job.id,
                           device=self.spec.label) from None
        except Exception as exc:  # arguments not picklable
            raise JobError("invalid", f"job arguments could not be sent: {type(exc).__name__}: {exc}",
                           job_id=job.id, device=self.spec.label) from None
        self.jobs_run += 1
        what = self._wait(timeout)
        elapsed = time.monotonic() - t0
        if what == "timeout":
            self.kill(keep_log=True)
            details = self.output_tail(log_start)
            self.remove_log()
            raise JobError(
                "timeout",
                f"timed out after {format_seconds(timeout or 0)}",
                job_id=job.id,
                device=self.spec.label,
                seconds=elapsed,
                details=details,
            )
        msg = None
        if what == "message":
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                msg = None
        if msg is None:
            self.kill(keep_log=True)
            details = self.output_tail(log_start)
            self.remove_log()
            raise JobError(
                "crash",
                describe_exit(self.proc.returncode),
                job_id=job.id,
                device=self.spec.label,
                seconds=elapsed,
                details=details,
            )
        if msg[0] == "ok":
            _, _jid, result, seconds, health = msg
            record.run_seconds = seconds
            return result, health
        _, _jid, type_name, message, tb, seconds, health = msg
        record.run_seconds = seconds
        reason = classify_exception(type_name, message)
        err = JobError(
            reason,
            describe_exception(type_name, message),
            job_id=job.id,
            device=self.spec.label,
            seconds=seconds,
            details=tb,
        )
        err.health = health  # type: ignore[attr-defined]
        raise err

    # -- ending ------------------------------------------------------------------------

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, keep_log: bool = False) -> None:
        from ..isolation.sandboxes.sweeps import reap

        reap(self.proc, group=True)  # the worker leads its own process group
        self._close_handles(keep_log)

    def remove_log(self) -> None:
        try:
            os.unlink(self.log_path)
        except OSError:
            pass

    def _close_handles(self, keep_log: bool = False) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        if self.pidfd is not None:
            try:
                os.close(self.pidfd)
            except OSError:
                pass
            self.pidfd = None
        try:
            self.log.close()
        except OSError:
            pass
        if not keep_log:
            self.remove_log()
