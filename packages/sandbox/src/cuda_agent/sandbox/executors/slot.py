"""One device's slot in a worker pool: its worker process, warm spares and device lock.

A slot's thread takes jobs from the pool's queue and runs them on its active worker,
one at a time. A worker that timed out, crashed, failed its health check after a job, or
(by the pool's ``recycle`` mode) has served its last job is killed and replaced by the
oldest warm spare, and a new spare starts. While a job runs the slot holds the
machine-wide lock file of its device, so pools of other processes never run a job on the
same GPU at the same time.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .job import Job, JobError
from .job_queue import JobRecord
from .worker_process import DeviceSpec, WorkerProcess

if TYPE_CHECKING:
    from .pool import WorkerPool


class DeviceSlot:
    """One device: a thread taking jobs from the shared queue and running them on its worker."""

    def __init__(self, pool: WorkerPool, spec: DeviceSpec):
        self.pool = pool
        self.spec = spec
        self.active: WorkerProcess | None = None
        self.spares: list[WorkerProcess] = []
        self.n_started = 0
        self.restarts = 0
        self.lock = threading.Lock()
        self.current: Job | None = None
        self.thread = threading.Thread(target=self._loop, name=f"{pool.name}-slot-{spec.label}", daemon=True)

    def _new_worker(self) -> WorkerProcess:
        self.n_started += 1
        return WorkerProcess(self.pool, self.spec, self.n_started)

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

    def _ready_worker(self) -> WorkerProcess:
        with self.lock:
            if self.active is None or not self.active.alive():
                if self.active is not None:
                    self.active.kill()
                self._promote()
            worker = self.active
        worker.wait_ready(self.pool.start_timeout)
        return worker

    def _retire(self, worker: WorkerProcess) -> None:
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
            item = pool.queue.take()
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

    def _keep_after_error(self, worker: WorkerProcess, exc: JobError) -> bool:
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
            self.pool.queue.count(error.reason)
            fut.set_exception(error)
        else:
            record.status = "ok"
            self.pool.queue.count("ok")
            fut.set_result(result)

    def close(self) -> None:
        with self.lock:
            workers = [w for w in (self.active, *self.spares) if w is not None]
            self.active, self.spares = None, []
        for w in workers:
            w.kill()
