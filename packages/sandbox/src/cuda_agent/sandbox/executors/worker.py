"""The worker process of an executor pool: ``python -m cuda_agent.sandbox.executors.worker CONFIG``.

Started by :mod:`.pool` in its own process session (so a timeout kills it together with
anything it spawned), with the device already chosen through the environment
(``CUDA_VISIBLE_DEVICES``). It talks to the pool over an inherited socket
(``multiprocessing.connection``): it says ``ready`` once its modules are preloaded,
then runs one job at a time.

Messages from the pool: ``("run", job_id, fn, kwargs)`` and ``("exit",)``.
Replies: ``("ready", info)``; ``("ok", job_id, result, seconds, health)``;
``("error", job_id, type_name, message, traceback, seconds, health)``. ``health`` is
None when the process is still fit for another job, else a one-line reason
(for example a sticky CUDA error), and the pool then replaces the worker.

Standard library only at import time: the preloaded modules (torch) are imported
after ``ready`` is prepared, so the start-up cost is paid once per worker, before any job.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import sys
import time
import traceback
from typing import Any, Callable


def resolve(path: str) -> Callable[..., Any]:
    """``"pkg.mod:func"`` or ``"pkg.mod.func"`` -> the function."""
    if ":" in path:
        mod_name, _, attr = path.partition(":")
    else:
        mod_name, _, attr = path.rpartition(".")
    if not mod_name or not attr:
        raise ValueError(f"job function {path!r} is not of the form 'package.module:function'")
    obj: Any = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"job function {path!r} is not callable")
    return obj


def _apply_limits(cfg: dict) -> None:
    import resource

    mb = int(cfg.get("memory_limit_mb") or 0)
    if mb > 0:
        limit = mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    nofile = int(cfg.get("max_open_files") or 0)
    if nofile > 0:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    nice = int(cfg.get("nice") or 0)
    if nice > 0:
        os.nice(nice)


def _health(check: Callable[[], Any] | None) -> str | None:
    if check is None:
        return None
    try:
        out = check()
    except BaseException as exc:  # noqa: BLE001 - any failure means the process is unfit
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    return str(out) if out else None


def _after_job(health: str | None) -> str | None:
    """The health reason after a job, also saying so when the job used its candidate process
    (:mod:`cuda_agent.sandbox.judge.client`) or gave up root rights
    (:mod:`cuda_agent.sandbox.isolation.privdrop`): such a process never serves another job."""
    for name in ("cuda_agent.sandbox.judge.client", "cuda_agent.sandbox.isolation.privdrop"):
        mod = sys.modules.get(name)
        if mod is None:
            continue
        try:
            why = mod.after_job()
        except Exception as exc:  # noqa: BLE001 - the process is unfit either way
            why = f"cleaning up after a job failed: {exc}"
        health = health or why
    return health


def _watch_parent(parent: int) -> None:
    """End this worker (and its process group) when the pool's process is gone."""
    import signal
    import threading

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                try:
                    os.killpg(0, signal.SIGKILL)
                finally:
                    os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    from multiprocessing.connection import Connection

    argv = sys.argv[1:] if argv is None else argv
    cfg = json.loads(argv[0])
    # marks this process as a job process: jobs that run candidate code may give up root
    # rights for good here (cuda_agent.sandbox.isolation.privdrop), never in the caller's process
    os.environ["CUDA_AGENT_JOB_PROCESS"] = str(os.getpid())
    conn = Connection(int(cfg["fd"]))
    if cfg.get("parent"):
        _watch_parent(int(cfg["parent"]))
    faulthandler.enable(all_threads=False)
    _apply_limits(cfg)
    for extra in cfg.get("sys_path") or []:
        if extra not in sys.path:
            sys.path.append(extra)
    for mod in cfg.get("preload") or []:
        try:
            importlib.import_module(mod)
        except Exception as exc:  # a job that needs it will report the failure itself
            print(f"worker: preloading {mod} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    device = cfg.get("device", "cpu")
    if cfg.get("device_quiet_lock"):  # for the jobs' timed sections (cuda_agent.sandbox.isolation.hostlock)
        os.environ["CUDA_AGENT_DEVICE_QUIET_LOCK"] = cfg["device_quiet_lock"]
    from cuda_agent.sandbox.isolation.hostlock import open_from_env

    open_from_env()  # now, before a job gives up root rights and gets a private /tmp
    # the init steps that make a CUDA context hold the device's quiet lock for that moment only
    # (hostlock.device_quiet): imports and process starts never hold up a timing on this GPU
    for fn_path in cfg.get("init") or []:
        try:
            resolve(fn_path)(device=device)
        except Exception as exc:  # the job will meet the same problem and report it
            print(f"worker: init {fn_path} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    check = None
    if cfg.get("health_check"):
        check = resolve(cfg["health_check"])
    conn.send(("ready", {"pid": os.getpid(), "device": device, "label": cfg.get("label", "")}))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 0
        if not msg or msg[0] == "exit":
            return 0
        if msg[0] != "run":
            continue
        _, job_id, fn_path, kwargs = msg
        t0 = time.perf_counter()
        try:
            fn = resolve(fn_path)
            result = fn(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported to the pool, never raised
            if isinstance(exc, KeyboardInterrupt):
                raise
            seconds = time.perf_counter() - t0
            tb = traceback.format_exc(limit=20)
            health = _after_job(_health(check))
            sys.stdout.flush()
            sys.stderr.flush()
            conn.send(("error", job_id, type(exc).__name__, str(exc), tb, seconds, health))
            continue
        seconds = time.perf_counter() - t0
        health = _after_job(_health(check))
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            conn.send(("ok", job_id, result, seconds, health))
        except Exception as exc:  # unpicklable result
            conn.send(
                ("error", job_id, type(exc).__name__, f"job result could not be sent back: {exc}", "", seconds, health)
            )


if __name__ == "__main__":
    sys.exit(main())
