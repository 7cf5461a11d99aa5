"""A pool of worker processes, one per device, each running one job at a time.

* One slot per device (a GPU, or a CPU worker; :mod:`.slot`). A slot owns the worker
  process that runs its jobs (:mod:`.worker_process`), and ``spares`` warm spare processes
  (modules preloaded, CUDA context made) that replace it without a start-up wait.
* One priority queue for all slots (:mod:`.job_queue`): verification before profiling
  before baselines, first come first served within a priority.
* Each job has a timeout. A job that times out, crashes its worker (signal, exit),
  surfaces a CUDA error or runs out of memory ends with a :class:`JobError` that says so
  in one line; its worker is killed (with its whole process group) and replaced, and the
  pool keeps serving. A worker whose health check fails after a job (a sticky CUDA error
  swallowed by the job) is replaced too.
* ``recycle``: ``always`` (a fresh process for every job, the default: no state of one
  candidate, loaded extension or monkey-patch survives into the next job), ``on_error``,
  or ``never``.
* ``fork_server``: workers are forked from a process that imported the preload modules
  once (:mod:`.fork_server`), not started from nothing; a fresh process per job then costs
  a fork instead of the imports. Off, or when that process fails, workers start directly.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
from concurrent.futures import Future

from . import fork_server as fork_servers
from .fork_server import ForkServer
from .job import Job, JobError
from .job_queue import JobQueue, JobRecord
from .slot import DeviceSlot
from .worker_process import DeviceSpec

__all__ = ["RECYCLE_MODES", "DeviceSpec", "JobRecord", "WorkerPool"]

RECYCLE_MODES = ("always", "on_error", "never")
FORK_SERVER_ENV = "CUDA_AGENT_FORK_SERVER"  # "0": every pool starts its workers directly


class WorkerPool:
    """Priority queue + one slot (worker process) per device. See the module docstring."""

    def __init__(
        self,
        devices: list[DeviceSpec],
        *,
        name: str = "pool",
        default_timeout: float | None = 120.0,
        recycle: str = "always",
        spares: int = 1,
        preload: list[str] | tuple[str, ...] = (),
        health_check: str | None = None,
        init: list[str] | tuple[str, ...] = (),
        memory_limit_mb: int = 0,
        start_timeout: float = 120.0,
        max_jobs_per_worker: int = 0,
        env: dict[str, str] | None = None,
        python: str | None = None,
        warm: bool = True,
        keep_records: int = 10000,
        lock_dir: str | None = None,
        fork_server: bool = True,
        server_init: list[str] | tuple[str, ...] = (),
    ):
        if not devices:
            raise JobError("invalid", f"{name}: no devices to run jobs on")
        labels = [d.label for d in devices]
        if len(set(labels)) != len(labels):
            raise JobError("invalid", f"{name}: device labels repeat: {','.join(labels)}")
        if recycle not in RECYCLE_MODES:
            raise JobError("invalid", f"{name}: recycle must be one of {', '.join(RECYCLE_MODES)}, got {recycle!r}")
        self.name = name
        self.devices = list(devices)
        self.default_timeout = default_timeout
        self.recycle = recycle
        self.spares = max(0, int(spares))
        self.preload = list(preload)
        self.health_check = health_check or None
        self.init = list(init)
        self.memory_limit_mb = int(memory_limit_mb or 0)
        self.start_timeout = start_timeout
        self.max_jobs_per_worker = int(max_jobs_per_worker or 0)
        self.env = dict(env or {})
        self.python = python or sys.executable
        self.log_dir = tempfile.mkdtemp(prefix=f"cuda-agent-{name}-")
        self.lock_dir = lock_dir or None  # machine-wide per-device job locks (None: off)
        self.queue = JobQueue(name, keep_records)
        # the fork server (see .fork_server), by its environment; None: failed
        self.use_fork_server = bool(fork_server) and os.environ.get(FORK_SERVER_ENV, "").strip().lower() not in (
            "0", "false", "no", "off")
        self.server_init = list(server_init)  # run once in the fork server (no thread, no CUDA)
        self.fork_server_error = ""
        self._fork_servers: dict[str, ForkServer | None] = {}
        self._fork_lock = threading.Lock()
        if self.use_fork_server:
            self.fork_server()
        self._slots = [DeviceSlot(self, spec) for spec in self.devices]
        if warm:
            for slot in self._slots:
                slot.warm_up()
        for slot in self._slots:
            slot.thread.start()

    def worker_env(self, spec: DeviceSpec) -> dict[str, str]:
        """The environment a worker of device ``spec`` runs in."""
        env = self.server_env()
        env.update(self.device_env(spec))
        return env

    def server_env(self) -> dict[str, str]:
        """The environment every worker shares, whatever its device: the fork server's."""
        env = dict(os.environ)
        env.update(self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    @staticmethod
    def device_env(spec: DeviceSpec) -> dict[str, str]:
        """What a worker of device ``spec`` adds to :meth:`server_env` (its visible devices, its
        label): set by a forked worker itself, before anything of it reads them (no module
        the server imports reads them, and the server makes no CUDA context)."""
        return {**spec.env, "CUDA_AGENT_WORKER_DEVICE": spec.label}

    def fork_server(self) -> ForkServer | None:
        """The fork server (started on first use); None when the pool starts its workers
        directly. One serves every device: its workers set their own device's variables."""
        if not self.use_fork_server:
            return None
        env = self.server_env()
        key = json.dumps(env, sort_keys=True)
        with self._fork_lock:
            if key not in self._fork_servers and not self.closed:
                # shared with this process's other pools of the same settings (see .fork_server)
                self._fork_servers[key] = fork_servers.acquire(
                    python=self.python, env=env, preload=self.preload,
                    sys_path=[p for p in sys.path if p and os.path.isdir(p)], init=self.server_init)
            return self._fork_servers.get(key)

    def fork_server_failed(self, why: str) -> None:
        """Start workers directly from now on, and say why once."""
        key = json.dumps(self.server_env(), sort_keys=True)
        with self._fork_lock:
            server = self._fork_servers.get(key)
            self._fork_servers[key] = None
        if server is not None:
            tail = ""
            try:
                with open(server.log_path, errors="replace") as f:
                    tail = " ".join(f.read().strip().splitlines()[-3:])
            except OSError:
                pass
            self.fork_server_error = why + (f" ({tail[-400:]})" if tail else "")
            print(f"{self.name}: workers start without the fork server: {self.fork_server_error}",
                  file=sys.stderr, flush=True)
            fork_servers.release(server)
            fork_servers.discard(server)

    def device_lock_path(self, label: str, kind: str = "") -> str | None:
        """The machine-wide lock file of device ``label``: its job lock, or with ``kind``
        "quiet" its quiet lock (timed sections against new CUDA contexts); None: locking is off."""
        if not self.lock_dir:
            return None
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
        return os.path.join(self.lock_dir, f"device-{safe}{'.' + kind if kind else ''}.lock")

    @property
    def closed(self) -> bool:
        return self.queue.closed

    @property
    def records(self) -> list[JobRecord]:
        """The latest ``keep_records`` jobs' records, oldest first."""
        return self.queue.records

    @property
    def counts(self) -> dict[str, int]:
        """Finished jobs by result: "ok" or the JobError's reason."""
        return self.queue.counts

    # -- queue ------------------------------------------------------------------------

    def submit(self, job: Job) -> Future:
        if not isinstance(job, Job):
            raise JobError("invalid", f"submit() takes a Job, got {type(job).__name__}")
        return self.queue.put(job)

    def queued(self) -> int:
        return len(self.queue)

    def stats(self) -> dict:
        queued, counts = self.queue.snapshot()
        return {
            "devices": [s.spec.label for s in self._slots],
            "queued": queued,
            "running": [s.spec.label for s in self._slots if s.current is not None],
            "restarts": {s.spec.label: s.restarts for s in self._slots},
            "workers_started": {s.spec.label: s.n_started for s in self._slots},
            "fork_server": "off" if not self.use_fork_server else (self.fork_server_error or "on"),
            "results": counts,
        }

    def worker_pids(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for s in self._slots:
            with s.lock:
                out[s.spec.label] = [w.pid for w in (s.active, *s.spares) if w is not None and w.alive()]
        return out

    # -- closing ------------------------------------------------------------------------

    def close(self, wait: bool = True) -> None:
        pending = self.queue.close()
        if pending is None:
            return
        for job, fut, record in pending:
            record.status = "cancelled"
            if fut.set_running_or_notify_cancel():
                fut.set_exception(JobError("closed", f"{self.name}: the executor was closed", job_id=job.id))
        for slot in self._slots:
            slot.close()
        if wait:
            for slot in self._slots:
                slot.thread.join(timeout=15)
            # a worker started by a slot that was finishing a job as we closed
            for slot in self._slots:
                slot.close()
        with self._fork_lock:
            servers, self._fork_servers = list(self._fork_servers.values()), {}
        for server in servers:
            if server is not None:
                fork_servers.release(server)  # it waits for this process's next pool a while
        shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # best effort: never leave worker processes behind
        try:
            if not self.closed:
                self.close(wait=False)
        except Exception:
            pass
