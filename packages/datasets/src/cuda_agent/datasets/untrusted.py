"""Running task code (a synthesised or user ``model.py``) as jobs of an executor plugin.

The caller's side: :func:`open_executor` builds the executor a config names (``cpu`` by
default, ``local`` for ``device: cuda``) and :func:`run_tasks` streams tasks through it, one
result per task. The job's side: :func:`run_batch` runs a few tasks in a fresh worker process
that has given up root rights (:func:`cuda_agent.sandbox.isolation.privdrop.drop_privileges`) before any
task code runs. A task past its timeout ends its batch, and a batch whose process crashed or
hung runs again one task per job, so a hang or a crash costs that task only.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import deque
from itertools import islice
from typing import Any, Iterable, Iterator

from cuda_agent.core.errors import ConfigError, CudaAgentError

SANDBOX_HINT = "install cuda-agent-sandbox (pip install ./packages/sandbox), which provides the executors"
GRACE_S = 5.0  # past a task's timeout: the job process ends itself (task code ignored the alarm)
HARD_EXIT = 75  # exit status of a job process that ended itself that way
_FATAL = ("worker_start", "closed", "invalid")  # executor failures that are no task's doing


# --- the caller's side ------------------------------------------------------------------------


def open_executor(spec: Any = None, *, device: str = "cpu", workers: int = 2, memory_limit_gb: float | None = None,
                  preload: Iterable[str] = (), where: str = "executor") -> Any:
    """The executor ``spec`` (``{name, options}``) names. ``workers``, the memory cap and the
    preloaded modules set the options of those names it has, where ``spec`` leaves them at
    the plugin's defaults (a composed config holds every option). Nothing starts until a job comes."""
    from cuda_agent.core.plugins import get_plugin_manager

    spec = dict(spec or {})
    cuda = str(device).startswith("cuda")
    name = spec.get("name") or ("local" if cuda else "cpu")
    pm = get_plugin_manager()
    if not pm.components("executor"):
        raise ConfigError(f"running task code needs an executor plugin: {SANDBOX_HINT}")
    schema = pm.get("executor", name, where).Options
    try:
        plugin_defaults = dataclasses.asdict(schema())
    except TypeError:  # options without defaults: all of them are the spec's
        plugin_defaults = {}
    ours = {
        "workers": int(workers),
        "memory_limit_mb": int(float(memory_limit_gb) * 1024) if memory_limit_gb and not cuda else 0,
        "preload": ["torch", *preload, __name__],
        "warm_plugins": False,
    }
    given = {k: v for k, v in (spec.get("options") or {}).items() if k not in plugin_defaults or v != plugin_defaults[k]}
    fields = {f.name for f in dataclasses.fields(schema)}
    options = {k: v for k, v in ours.items() if k in fields} | given
    executor = pm.create("executor", {"name": name, "options": options}, where=where)
    if cuda and getattr(executor, "backend", "cuda") != "cuda":
        executor.close()
        raise ConfigError(f"device {device} needs an executor with GPUs ({where}.name=local), not {name!r}")
    return executor


def run_tasks(executor: Any, check: str, items: Iterable[tuple[Any, str]], *, timeout: float, batch_size: int = 1,
              init: str = "", shared: dict | None = None, threads: int = 0, label: str = "task") -> Iterator[tuple[Any, dict]]:
    """``(key, result)`` for every ``(key, code)`` of ``items``, in the order they finish.

    ``check`` (``"module:function"``, called as ``check(code, state)``) runs in a job process
    on up to ``batch_size`` tasks; ``init(shared, device)`` makes its ``state`` first. A
    result is the check's dict, or ``ok: False`` with ``stage`` ``timeout`` or ``crash`` and a
    one-line ``reason``; ``privileges`` says whom the task code ran as. Items are drawn only
    as slots free up."""
    try:
        from cuda_agent.sandbox.executors.job import Job, JobError
    except ImportError as exc:
        raise ConfigError(f"running task code needs the executor jobs: {SANDBOX_HINT} ({exc})") from None
    from concurrent.futures import FIRST_COMPLETED, wait

    slots = len(getattr(executor, "devices", None) or ()) or 1
    folder = tempfile.mkdtemp(prefix="cuda-agent-tasks-")  # what the jobs show their task code: nothing
    os.chmod(folder, 0o755)
    common = {"check": check, "init": init, "shared": shared or {}, "timeout": float(timeout), "threads": int(threads),
              "folder": folder}
    source = iter(items)
    again: deque[list] = deque()  # batches to run before new items: the rest of a batch, or its tasks one by one
    pending: dict[Any, list] = {}
    drawn_all = False

    def submit(batch: list, priority: int) -> None:
        single = len(batch) == 1
        job = Job(fn=f"{__name__}:run_batch", kwargs=common | {"codes": [code for _, code in batch], "single": single},
                  kind="task_check", priority=priority, label=f"{label} x{len(batch)}",
                  timeout=timeout + GRACE_S if single else len(batch) * (timeout + GRACE_S) + 30.0)
        pending[executor.submit(job)] = batch

    try:
        while True:
            while len(pending) < slots and (again or not drawn_all):
                if again:
                    submit(again.popleft(), priority=2)
                    continue
                batch = list(islice(source, max(1, int(batch_size))))
                drawn_all = len(batch) < max(1, int(batch_size))
                if batch:
                    submit(batch, priority=3)
            if not pending:
                return
            done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for fut in done:
                batch = pending.pop(fut)
                try:
                    out = fut.result()
                except JobError as err:
                    if err.reason in _FATAL:
                        raise CudaAgentError(f"the executor could not run {label} checks: {err.message}") from None
                    if len(batch) > 1:
                        again.extend([item] for item in batch)
                        continue
                    yield batch[0][0], _failure(err, timeout)
                    continue
                for (key, _code), result in zip(batch, out["results"]):
                    yield key, result | {"privileges": out["privileges"]}
                if len(out["results"]) < len(batch):
                    again.append(batch[len(out["results"]):])
    finally:
        for fut in pending:
            fut.cancel()
        shutil.rmtree(folder, ignore_errors=True)


def _failure(err: Any, timeout: float) -> dict:
    if err.reason == "timeout":
        return {"ok": False, "stage": "timeout", "reason": f"no result within {timeout:g} s", "seconds": err.seconds}
    return {"ok": False, "stage": "crash", "reason": err.message[:300], "seconds": err.seconds}


# --- the job's side ---------------------------------------------------------------------------


class _TaskTimeout(BaseException):
    """Raised in the job's main thread when a task's time is up."""


def run_batch(check: str, codes: list[str], timeout: float, folder: str, init: str = "", shared: dict | None = None,
              threads: int = 0, single: bool = False, device: str = "cpu") -> dict:
    """Job function: ``check(code, state)`` for each of ``codes`` with root rights given up
    first. Returns ``results`` (fewer than ``codes`` after a timeout: the rest runs in a new
    job) and ``privileges``."""
    from cuda_agent.sandbox.isolation import privdrop

    if threads:
        import torch

        torch.set_num_threads(int(threads))
    state = _resolve(init)(shared or {}, device) if init else {"device": device}
    fn = _resolve(check)  # our own modules are imported with our rights
    os.makedirs(folder, mode=0o755, exist_ok=True)  # the caller's, unless the worker runs on another host
    _view, meta = privdrop.drop_privileges(folder)
    results: list[dict] = []
    for code in codes:
        t0 = time.perf_counter()
        expired = threading.Event()
        try:
            with _deadline(timeout, expired, hard=not single):
                result = fn(code, state)
        except _TaskTimeout:
            result = {}
        except BaseException as exc:  # noqa: BLE001 - whatever the task code raises is its verdict
            result = {"ok": False, "stage": "crash", "reason": f"{type(exc).__name__}: {str(exc)[:300]}"}
        if expired.is_set():  # whatever the check made of the alarm
            result = {"ok": False, "stage": "timeout", "reason": f"no result within {timeout:g} s"}
        result.setdefault("seconds", time.perf_counter() - t0)
        results.append(result)
        if expired.is_set():
            break  # the process may be in any state now: the rest of the batch gets a fresh one
    return {"results": results, "privileges": meta.get("privileges", "")}


class _deadline:
    """An alarm after ``seconds`` (raises :class:`_TaskTimeout` in the main thread); with
    ``hard``, the process ends itself ``GRACE_S`` later should the task code outlast it."""

    def __init__(self, seconds: float, expired: threading.Event, hard: bool):
        self.seconds, self.expired = float(seconds), expired
        self.timer = threading.Timer(self.seconds + GRACE_S, os._exit, (HARD_EXIT,)) if hard else None
        self.main = threading.current_thread() is threading.main_thread()
        self.previous: Any = None

    def _alarm(self, signum, frame) -> None:
        self.expired.set()
        raise _TaskTimeout()

    def __enter__(self) -> "_deadline":
        if self.main and self.seconds > 0:
            self.previous = signal.signal(signal.SIGALRM, self._alarm)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        if self.timer is not None:
            self.timer.daemon = True
            self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.main and self.seconds > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)


def _resolve(path: str) -> Any:
    import importlib

    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)
