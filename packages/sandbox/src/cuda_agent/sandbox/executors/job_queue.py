"""The queue a worker pool's slots take jobs from, and the record of each job.

One priority queue for all devices: verification before profiling before baselines, first
come first served within a priority (:meth:`~.job.Job.sort_key`). Every submitted job gets
a :class:`JobRecord` (when it was queued, started and finished, on which device, how it
ended); the queue keeps the latest ones and counts the results by reason.
"""

from __future__ import annotations

import heapq
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from .job import Job, JobError


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


QueuedJob = tuple[Job, Future, JobRecord]


class JobQueue:
    """Jobs waiting for a device, by priority; thread-safe. ``take`` blocks until a job
    is there or the queue is closed."""

    def __init__(self, name: str, keep_records: int = 10000):
        self.name = name
        self.closed = False
        self.records: list[JobRecord] = []
        self.keep_records = keep_records
        self.counts: dict[str, int] = {}
        self._heap: list[tuple[tuple[int, int], Job, Future, JobRecord]] = []
        self._cond = threading.Condition()

    def put(self, job: Job) -> Future:
        """Queue ``job``; its future carries ``future.job`` and ``future.record``."""
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

    def take(self) -> QueuedJob | None:
        """The next job by priority, waiting for one; None once the queue is closed."""
        with self._cond:
            while not self._heap and not self.closed:
                self._cond.wait()
            if self.closed:
                return None
            _, job, fut, record = heapq.heappop(self._heap)
            return job, fut, record

    def count(self, what: str) -> None:
        """Count one finished job under ``what`` ("ok" or the JobError's reason)."""
        with self._cond:
            self.counts[what] = self.counts.get(what, 0) + 1

    def _waiting(self) -> int:
        # a job whose future was cancelled stays in the heap until a slot takes and skips it
        return sum(1 for _, _, fut, _ in self._heap if not fut.cancelled())

    def __len__(self) -> int:
        with self._cond:
            return self._waiting()

    def snapshot(self) -> tuple[int, dict[str, int]]:
        """(jobs waiting, results counted so far), read together."""
        with self._cond:
            return self._waiting(), dict(self.counts)

    def close(self) -> list[QueuedJob] | None:
        """Close the queue and wake every ``take``; returns the jobs that were still
        waiting (None if it was closed already)."""
        with self._cond:
            if self.closed:
                return None
            self.closed = True
            pending = [(job, fut, record) for _, job, fut, record in self._heap]
            self._heap.clear()
            self._cond.notify_all()
        return pending
