"""A small pool of worker processes for running untrusted task code.

Each job runs in a long-lived worker (torch imported once) under a per-job timeout. A
job that hangs or crashes its worker costs that job only: the worker is killed and a
fresh one takes its place. Workers are fresh interpreters (safe with CUDA, and the caller's main module is never re-run).
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Iterable, Iterator

from cuda_agent.core.errors import CudaAgentError


def _resolve(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _worker_main(conn) -> None:
    job, init, init_payload, settings = conn.recv()
    for k, v in (settings.get("env") or {}).items():
        os.environ[k] = str(v)
    limit = settings.get("memory_limit_gb")
    if limit:
        try:
            import resource

            cap = int(float(limit) * (1 << 30))
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        except (ImportError, ValueError, OSError):
            pass
    threads = settings.get("threads")
    try:
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        fn = _resolve(job)
        state: dict = {}
        if init:
            state = _resolve(init)(init_payload) or {}
    except BaseException as exc:  # noqa: BLE001
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if msg is None:
            return
        job_id, payload = msg
        try:
            result = fn(payload, state)
        except BaseException as exc:  # noqa: BLE001 - report, keep serving
            result = {"ok": False, "stage": "crash", "reason": f"{type(exc).__name__}: {str(exc)[:300]}"}
        conn.send((job_id, result))


class _Worker:
    """A worker: ``python -m cuda_agent.datasets.pool FD`` talking over a socket pair.

    Started as a fresh interpreter (not through multiprocessing), so the caller's main
    module is never re-imported, and in its own session so that a kill also ends any
    helper processes it started (torch.compile workers).
    """

    def __init__(self, job, init, init_payload, settings, log_path=None):
        parent, child = socket.socketpair()
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cuda_agent.datasets.pool", str(child.fileno())],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        finally:
            child.close()
            if log_path:
                out.close()
        self.conn = Connection(parent.detach())
        self.conn.send((job, init, init_payload, settings))
        self.started = time.monotonic()
        self.ready = False
        self.job: tuple | None = None  # (job_id, key, payload, deadline, t0)

    @property
    def exitcode(self):
        return self.proc.poll()

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, OSError):
            pass
        try:
            self.proc.wait(5)
        except Exception:  # noqa: BLE001
            pass
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass


class WorkerPool:
    """``for key, payload, result in pool.map_unordered(items): ...``"""

    def __init__(
        self,
        job: str,
        workers: int = 2,
        timeout: float = 60.0,
        init: str | None = None,
        init_payload: Any = None,
        memory_limit_gb: float | None = None,
        threads: int | None = 1,
        env: dict | None = None,
        startup_timeout: float = 300.0,
        log_path: str | None = None,
    ):
        self.job, self.init, self.init_payload = job, init, init_payload
        self.n = max(1, int(workers))
        self.timeout = float(timeout)
        self.startup_timeout = startup_timeout
        self.settings = {"memory_limit_gb": memory_limit_gb, "threads": threads, "env": env or {}}
        self.log_path = log_path
        self.workers: list[_Worker] = []
        self.restarts = 0
        self._next_id = 0

    def _spawn(self) -> _Worker:
        return _Worker(self.job, self.init, self.init_payload, self.settings, self.log_path)

    def __enter__(self) -> "WorkerPool":
        self.workers = [self._spawn() for _ in range(self.n)]
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for w in self.workers:
            try:
                if w.exitcode is None and w.job is None and w.ready:
                    w.conn.send(None)
                    w.proc.wait(2)
            except Exception:  # noqa: BLE001
                pass
            w.kill()
        self.workers = []

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self.restarts += 1
        self.workers[self.workers.index(w)] = self._spawn()

    def map_unordered(self, items: Iterable[tuple[Any, Any]]) -> Iterator[tuple[Any, Any, dict]]:
        if not self.workers:
            self.__enter__()
        it = iter(items)
        exhausted = False
        while True:
            for w in self.workers:
                if w.ready and w.job is None and not exhausted:
                    try:
                        key, payload = next(it)
                    except StopIteration:
                        exhausted = True
                        break
                    self._next_id += 1
                    now = time.monotonic()
                    w.job = (self._next_id, key, payload, now + self.timeout, now)
                    w.conn.send((self._next_id, payload))
            busy = [w for w in self.workers if w.job is not None]
            if exhausted and not busy:
                return
            now = time.monotonic()
            deadlines = [w.job[3] for w in busy] + [
                w.started + self.startup_timeout for w in self.workers if not w.ready
            ]
            wait_s = max(0.0, min(deadlines) - now) if deadlines else 1.0
            ready = wait([w.conn for w in self.workers], timeout=min(wait_s, 5.0))
            for conn in ready:
                w = next((x for x in self.workers if x.conn is conn), None)
                if w is None:
                    continue
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    job = w.job
                    try:
                        code = w.proc.wait(2)
                    except subprocess.TimeoutExpired:
                        code = None
                    self._replace(w)
                    if job is not None:
                        yield job[1], job[2], {
                            "ok": False,
                            "stage": "crash",
                            "reason": f"worker died (exit code {code})",
                            "seconds": time.monotonic() - job[4],
                        }
                    elif not w.ready:
                        raise CudaAgentError(f"worker process failed to start (exit code {code})")
                    continue
                if msg[0] == "ready":
                    w.ready = True
                    continue
                if msg[0] == "failed":
                    raise CudaAgentError(f"worker process failed to start: {msg[1]}")
                job_id, result = msg
                if w.job is not None and w.job[0] == job_id:
                    job = w.job
                    w.job = None
                    result.setdefault("seconds", time.monotonic() - job[4])
                    yield job[1], job[2], result
            now = time.monotonic()
            for w in list(self.workers):
                if w.job is not None and now > w.job[3]:
                    job = w.job
                    self._replace(w)
                    yield job[1], job[2], {
                        "ok": False,
                        "stage": "timeout",
                        "reason": f"no result within {self.timeout:g} s",
                        "seconds": now - job[4],
                    }
                elif not w.ready and now > w.started + self.startup_timeout:
                    raise CudaAgentError(f"worker process did not start within {self.startup_timeout:g} s")


if __name__ == "__main__":
    _worker_main(Connection(int(sys.argv[1])))
