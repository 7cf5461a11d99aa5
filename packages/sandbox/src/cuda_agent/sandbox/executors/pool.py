"""A pool of worker processes, one per device, each running one job at a time.

* One slot per device (a GPU, or a CPU worker). A slot owns the worker process that runs
  its jobs, and ``spares`` warm spare processes (modules preloaded, CUDA context made)
  that replace it without a start-up wait.
* One priority queue for all slots: verification before profiling before baselines,
  first come first served within a priority.
* Each job has a timeout. A job that times out, crashes its worker (signal, exit),
  surfaces a CUDA error or runs out of memory ends with a :class:`JobError` that says so
  in one line; its worker is killed (with its whole process group) and replaced, and the
  pool keeps serving. A worker whose health check fails after a job (a sticky CUDA error
  swallowed by the job) is replaced too.
* ``recycle``: ``always`` (a fresh process for every job, the default: no state of one
  candidate, loaded extension or monkey-patch survives into the next job), ``on_error``,
  or ``never``.
"""

from __future__ import annotations

import heapq
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from .job import Job, JobError, classify_exception, describe_exception, describe_exit, format_seconds

RECYCLE_MODES = ("always", "on_error", "never")


@dataclass
class DeviceSpec:
    """A device slot: ``label`` names it in logs and errors, ``device`` is what jobs get
    ("cuda:0", "cpu"), ``env`` is added to the worker's environment."""

    label: str
    device: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class JobRecord:
    """What happened to one job (kept in ``WorkerPool.records`` and on ``future.record``)."""

    job_id: str
    kind: str
    label: str
    submitted: float
    started: float | None = None
    finished: float | None = None
    device: str = ""
    status: str = "queued"  # queued, running, ok, error, cancelled
    reason: str = ""
    worker_pid: int | None = None
    run_seconds: float | None = None  # measured inside the worker

    @property
    def queued_seconds(self) -> float | None:
        return None if self.started is None else self.started - self.submitted

    @property
    def total_seconds(self) -> float | None:
        return None if self.finished is None else self.finished - self.submitted


class _Worker:
    """The pool side of one worker process."""

    def __init__(self, pool: "WorkerPool", spec: DeviceSpec, index: int):
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
        env = dict(os.environ)
        env.update(pool.env)
        env.update(spec.env)
        env["CUDA_AGENT_WORKER_DEVICE"] = spec.label
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.log = open(self.log_path, "ab")
        try:
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
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        try:
            self.proc.kill()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
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


class _Slot:
    """One device: a thread taking jobs from the shared queue and running them on its worker."""

    def __init__(self, pool: "WorkerPool", spec: DeviceSpec):
        self.pool = pool
        self.spec = spec
        self.active: _Worker | None = None
        self.spares: list[_Worker] = []
        self.n_started = 0
        self.restarts = 0
        self.lock = threading.Lock()
        self.current: Job | None = None
        self.thread = threading.Thread(target=self._loop, name=f"{pool.name}-slot-{spec.label}", daemon=True)

    def _new_worker(self) -> _Worker:
        self.n_started += 1
        return _Worker(self.pool, self.spec, self.n_started)

    def _top_up(self) -> None:
        """(lock held) start spares until there are ``pool.spares`` of them."""
        self.spares = [w for w in self.spares if w.alive() or w.kill()]
        while not self.pool.closed and len(self.spares) < self.pool.spares:
            self.spares.append(self._new_worker())

    def _promote(self) -> None:
        """(lock held) make the oldest live spare the active worker, or start one."""
        while self.spares:
            w = self.spares.pop(0)
            if w.alive():
                self.active = w
                break
            w.kill()
        else:
            self.active = self._new_worker()
        self._top_up()

    def warm_up(self) -> None:
        with self.lock:
            if self.active is None:
                self.active = self._new_worker()
            self._top_up()

    def _ready_worker(self) -> _Worker:
        with self.lock:
            if self.active is None or not self.active.alive():
                if self.active is not None:
                    self.active.kill()
                self._promote()
            worker = self.active
        worker.wait_ready(self.pool.start_timeout)
        return worker

    def _retire(self, worker: _Worker) -> None:
        """Kill ``worker`` and make sure a replacement is on its way."""
        worker.kill()
        with self.lock:
            if self.active is worker:
                self.active = None
                self.restarts += 1
                if self.pool.closed:
                    return
                self._promote()

    def _loop(self) -> None:
        pool = self.pool
        while True:
            item = pool._take()
            if item is None:
                return
            job, fut, record = item
            if not fut.set_running_or_notify_cancel():
                record.status = "cancelled"
                continue
            record.started = time.monotonic()
            record.status = "running"
            record.device = self.spec.label
            self.current = job
            try:
                worker = self._ready_worker()
            except JobError as exc:
                exc.job_id = job.id
                self.current = None
                self._finish(fut, record, error=exc)
                continue
            record.worker_pid = worker.pid
            timeout = job.timeout if job.timeout is not None else pool.default_timeout
            if timeout is not None and timeout <= 0:
                timeout = None
            lock = self._lock_device()
            if lock is None:  # closed while waiting for the device
                self._finish(fut, record, error=JobError("closed", f"{pool.name}: the executor was closed",
                                                         job_id=job.id, device=self.spec.label))
                continue
            try:
                result, health = worker.run(job, timeout, record)
            except JobError as exc:
                if pool.closed:
                    exc = JobError("closed", "the executor was closed while the job ran", job_id=job.id,
                                   device=self.spec.label)
                self._finish(fut, record, error=exc)
                if not self._keep_after_error(worker, exc):
                    self._retire(worker)
                continue
            finally:
                self.current = None
                self._unlock_device(lock)
            self._finish(fut, record, result=result)
            if health or pool.recycle == "always" or not worker.alive() or (
                pool.max_jobs_per_worker and worker.jobs_run >= pool.max_jobs_per_worker
            ):
                self._retire(worker)

    def _lock_device(self) -> Any:
        """Hold the machine-wide lock of this device while a job runs, so that pools of
        other processes never run a job on the same GPU at the same time. Returns a
        handle (True when locking is off), or None if the pool closed while waiting."""
        if not self.pool.lock_dir:
            return True
        import fcntl

        os.makedirs(self.pool.lock_dir, exist_ok=True)
        f = open(self.pool.device_lock_path(self.spec.label) or "", "a+")
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                return f
            except BlockingIOError:
                if self.pool.closed:
                    f.close()
                    return None
                time.sleep(0.02)

    @staticmethod
    def _unlock_device(lock: Any) -> None:
        if lock is True or lock is None:
            return
        import fcntl

        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
        finally:
            lock.close()

    def _keep_after_error(self, worker: _Worker, exc: JobError) -> bool:
        """May ``worker`` serve another job after ``exc``?"""
        if not worker.alive() or getattr(exc, "health", None):
            return False
        if exc.reason == "invalid":  # the job never reached the worker
            return True
        return exc.reason == "exception" and self.pool.recycle == "never"

    def _finish(self, fut: Future, record: JobRecord, result: Any = None, error: JobError | None = None) -> None:
        record.finished = time.monotonic()
        self.current = None
        if error is not None:
            record.status = "error"
            record.reason = error.reason
            self.pool._count(error.reason)
            fut.set_exception(error)
        else:
            record.status = "ok"
            self.pool._count("ok")
            fut.set_result(result)

    def close(self) -> None:
        with self.lock:
            workers = [w for w in (self.active, *self.spares) if w is not None]
            self.active, self.spares = None, []
        for w in workers:
            w.kill()


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
        self.closed = False
        self.records: list[JobRecord] = []
        self.keep_records = keep_records
        self.counts: dict[str, int] = {}
        self._heap: list[tuple[tuple[int, int], Job, Future, JobRecord]] = []
        self._cond = threading.Condition()
        self._slots = [_Slot(self, spec) for spec in self.devices]
        if warm:
            for slot in self._slots:
                slot.warm_up()
        for slot in self._slots:
            slot.thread.start()

    def device_lock_path(self, label: str, kind: str = "") -> str | None:
        """The machine-wide lock file of device ``label``: its job lock, or with ``kind``
        "quiet" its quiet lock (timed sections against new CUDA contexts); None: locking is off."""
        if not self.lock_dir:
            return None
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
        return os.path.join(self.lock_dir, f"device-{safe}{'.' + kind if kind else ''}.lock")

    # -- queue ------------------------------------------------------------------------

    def submit(self, job: Job) -> Future:
        if not isinstance(job, Job):
            raise JobError("invalid", f"submit() takes a Job, got {type(job).__name__}")
        fut: Future = Future()
        record = JobRecord(job_id=job.id, kind=job.kind, label=job.label, submitted=time.monotonic())
        fut.job = job  # type: ignore[attr-defined]
        fut.record = record  # type: ignore[attr-defined]
        with self._cond:
            if self.closed:
                raise JobError("closed", f"{self.name}: the executor is closed", job_id=job.id)
            heapq.heappush(self._heap, (job.sort_key(), job, fut, record))
            self.records.append(record)
            if len(self.records) > self.keep_records:
                del self.records[: len(self.records) - self.keep_records]
            self._cond.notify()
        return fut

    def _take(self):
        with self._cond:
            while not self._heap and not self.closed:
                self._cond.wait()
            if self.closed:
                return None
            _, job, fut, record = heapq.heappop(self._heap)
            return job, fut, record

    def _count(self, what: str) -> None:
        with self._cond:
            self.counts[what] = self.counts.get(what, 0) + 1

    def queued(self) -> int:
        with self._cond:
            return len(self._heap)

    def stats(self) -> dict:
        with self._cond:
            counts = dict(self.counts)
            queued = len(self._heap)
        return {
            "devices": [s.spec.label for s in self._slots],
            "queued": queued,
            "running": [s.spec.label for s in self._slots if s.current is not None],
            "restarts": {s.spec.label: s.restarts for s in self._slots},
            "workers_started": {s.spec.label: s.n_started for s in self._slots},
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
        with self._cond:
            if self.closed:
                return
            self.closed = True
            pending = list(self._heap)
            self._heap.clear()
            self._cond.notify_all()
        for _, job, fut, record in pending:
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
        shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # best effort: never leave worker processes behind
        try:
            if not self.closed:
                self.close(wait=False)
        except Exception:
            pass
