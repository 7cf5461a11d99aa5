"""The built-in executors: ``local`` (one worker per GPU) and ``cpu`` (N CPU workers).

Both are a :class:`~.pool.WorkerPool` behind the :class:`Executor` interface:
``submit(Job) -> Future``. The pool starts on first use (or ``start()``), so building
the component from a config costs nothing.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import threading
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from cuda_agent.core.errors import ConfigError
from cuda_agent.core.interfaces import Executor

from .job import Job, JobError
from .pool import RECYCLE_MODES, WorkerPool
from .worker_process import DeviceSpec

PRESTART = "cuda_agent.sandbox.judge.client:prestart"

_live: "weakref.WeakSet[_PoolExecutor]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for ex in list(_live):
        try:
            ex.close()
        except Exception:
            pass


def default_lock_dir() -> str:
    import tempfile

    return os.path.join(tempfile.gettempdir(), "cuda-agent-locks")


def _split(text: Any) -> list[str]:
    if text is None:
        return []
    if isinstance(text, (list, tuple)):
        return [str(x).strip() for x in text if str(x).strip()]
    return [x.strip() for x in str(text).split(",") if x.strip()]


class _PoolExecutor(Executor):
    """Shared machinery: a lazily started pool, submit/run/stats/close."""

    def __init__(self, options=None):
        super().__init__(options)
        o = self.options
        if o.recycle not in RECYCLE_MODES:
            raise ConfigError(
                f"executor {self.name}: recycle must be one of {', '.join(RECYCLE_MODES)}, got {o.recycle!r}"
            )
        if o.timeout is not None and o.timeout < 0:
            raise ConfigError(f"executor {self.name}: timeout must be >= 0, got {o.timeout}")
        self._pool: WorkerPool | None = None
        self._lock = threading.Lock()
        self._devices = self.device_specs()  # validates the device options now
        _live.add(self)

    def device_specs(self) -> list[DeviceSpec]:
        raise NotImplementedError

    def pool_kwargs(self) -> dict:
        o = self.options
        init = ["cuda_agent.sandbox.executors.health:warm_plugins"] if o.warm_plugins else []
        env = {}
        if o.quiet_timing:  # see cuda_agent.sandbox.isolation.hostlock
            env["CUDA_AGENT_QUIET_LOCK"] = os.path.join(o.lock_dir or default_lock_dir(), "host-quiet.lock")
        # each worker starts its candidate process (cuda_agent.sandbox.judge) ahead of its job,
        # before its own CUDA context (the candidate process is forked from the worker)
        if o.prestart:
            init.append(PRESTART)
        return dict(
            name=self.name,
            default_timeout=o.timeout or None,
            recycle=o.recycle,
            spares=o.spares,
            preload=list(o.preload or []),
            start_timeout=o.start_timeout,
            max_jobs_per_worker=o.max_jobs_per_worker,
            lock_dir=(o.lock_dir or default_lock_dir()) if o.exclusive else None,
            init=init,
            env=env,
            fork_server=o.fork_server,
            # the plugin registry (most of a second) loaded once in the fork server, not in every worker
            server_init=["cuda_agent.sandbox.executors.health:warm_plugins"] if o.warm_plugins else [],
        )

    @property
    def devices(self) -> list[str]:
        return [d.label for d in self._devices]

    @property
    def pool(self) -> WorkerPool:
        with self._lock:
            if self._pool is None or self._pool.closed:
                self._pool = WorkerPool(self._devices, **self.pool_kwargs())
            return self._pool

    def start(self) -> "_PoolExecutor":
        """Start the workers now (they preload their modules while nothing waits)."""
        _ = self.pool
        return self

    def submit(self, job: Job) -> Future:
        return self.pool.submit(job)

    def run(self, job: Job) -> Any:
        """Submit and wait: the job's result, or a raised :class:`JobError`."""
        return self.submit(job).result()

    def stats(self) -> dict:
        return self._pool.stats() if self._pool is not None else {"devices": self.devices, "started": False}

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


# modules a judge's worker imports before its first job (by its fork server, once per pool).
# Not torch._inductor: importing it asks torch.cuda.is_available(), which initialises CUDA
# in the fork server, and no worker forked after that can use the GPU (see warm_inductor)
JUDGE_PRELOAD = ("torch", "torch._dynamo", "cuda_agent.sandbox.judge.jobs")


# --- GPU pool -------------------------------------------------------------------------


@dataclass
class LocalExecutorOptions:
    devices: str = ""  # GPU ids for CUDA_VISIBLE_DEVICES, e.g. "0,1"; empty: all visible GPUs
    device_count: int = 0  # use only the first N of them (0: all)
    timeout: float = 180.0  # default per-job timeout in seconds (jobs may set their own)
    recycle: str = "always"  # always | on_error | never: when a worker process is replaced
    # warm workers waiting per GPU (torch imported, CUDA context made), so a replaced worker
    # costs no wait. Every job gets a fresh worker (recycle=always, and a job that drops root
    # cannot hand its process on); a reward is two jobs back to back and a worker takes
    # seconds to start (torch import, CUDA context), so with one spare the second job waited.
    spares: int = 3
    # torch._dynamo: imported by every candidate job (see cuda_agent.sandbox.judge.integrity); a spare pays it while it waits
    preload: list[str] = field(default_factory=lambda: list(JUDGE_PRELOAD))
    warm_plugins: bool = True  # workers load the plugin registry before their first job
    start_timeout: float = 180.0
    max_jobs_per_worker: int = 0  # with recycle=on_error/never: replace after N jobs (0: never)
    isolation: str = "visible_devices"  # visible_devices (CUDA_VISIBLE_DEVICES=<id>) | set_device (cuda:<id>)
    health_check: str = "cuda_agent.sandbox.executors.health:cuda_health"
    exclusive: bool = True  # one job per GPU across every pool on this machine (a lock file per GPU)
    lock_dir: str = ""  # where those locks live ("" = <tmp>/cuda-agent-locks)
    warm_cuda: bool = True  # workers create their CUDA context before their first job
    # timed sections of jobs never overlap CPU-heavy ones (torch.compile of a baseline) of any
    # job on this machine, in any pool: a host-wide reader/writer lock in lock_dir (see
    # cuda_agent.sandbox.isolation.hostlock)
    quiet_timing: bool = True
    # workers are forked from one process that imported the preload modules once, not started
    # from nothing (cuda_agent.sandbox.executors.fork_server): a fresh worker costs a fork
    fork_server: bool = True
    # each worker starts the judge's candidate process ahead of its job (imports, CUDA context);
    # a pool that runs no judge jobs (builds, self-tests) turns it off and saves that start
    prestart: bool = True
    # each worker imports inductor after its CUDA context, while it waits as a spare: a task's
    # first baseline compile paid that import in the GPU slot (4.6 s of a 6.7-7.5 s compile on an
    # H200 host, scripts/gpu/bench_baseline_cost.py)
    warm_inductor: bool = True


def visible_gpus() -> list[str]:
    """GPU ids visible to this process, without creating a CUDA context here."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [x for x in _split(env) if x != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
            n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
            if n:
                return [str(i) for i in range(n)]
        except (OSError, subprocess.SubprocessError):
            pass
    try:  # pragma: no cover - only where nvidia-smi is missing but torch sees GPUs
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


class LocalExecutor(_PoolExecutor):
    name = "local"
    description = "GPU pool on this machine: one worker process per GPU, one job per GPU at a time."
    Options = LocalExecutorOptions
    backend = "cuda"

    def device_specs(self) -> list[DeviceSpec]:
        o = self.options
        if o.isolation not in ("visible_devices", "set_device"):
            raise ConfigError(
                f"executor local: isolation must be 'visible_devices' or 'set_device', got {o.isolation!r}"
            )
        ids = _split(o.devices) or visible_gpus()
        if o.device_count and o.device_count > 0:
            if o.device_count > len(ids):
                raise ConfigError(
                    f"executor local: device_count={o.device_count} but only {len(ids)} GPU(s) found "
                    f"({','.join(ids) or 'none'})"
                )
            ids = ids[: o.device_count]
        if not ids:
            raise ConfigError(
                "executor local: no GPU found (set executor.options.devices, or use executor.name=cpu)"
            )
        if len(set(ids)) != len(ids):
            raise ConfigError(f"executor local: devices repeat: {','.join(ids)}")
        specs = []
        for i, gid in enumerate(ids):
            env = {"CUDA_DEVICE_ORDER": os.environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")}
            if o.isolation == "visible_devices":
                env["CUDA_VISIBLE_DEVICES"] = gid
                specs.append(DeviceSpec(label=gid, device="cuda:0", env=env))
            else:
                specs.append(DeviceSpec(label=gid, device=f"cuda:{i}", env=env))
        return specs

    def pool_kwargs(self) -> dict:
        kw = super().pool_kwargs()
        kw["health_check"] = self.options.health_check or None
        if self.options.warm_cuda:
            # after the candidate process: it is forked from this worker, which must not have
            # a CUDA context yet (cuda_agent.sandbox.judge.client)
            kw["init"] = kw["init"] + ["cuda_agent.sandbox.executors.health:cuda_init"]
        if self.options.warm_inductor:  # after the CUDA context (see JUDGE_PRELOAD)
            kw["init"] = kw["init"] + ["cuda_agent.sandbox.executors.health:warm_inductor"]
        return kw


# --- CPU pool --------------------------------------------------------------------------


@dataclass
class CpuExecutorOptions:
    workers: int = 1  # worker processes (1 keeps timings stable)
    devices: str = ""  # optional labels, one per worker (e.g. "a,b,c"); sets workers
    timeout: float = 180.0
    recycle: str = "always"
    spares: int = 1  # warm workers waiting per CPU slot
    # torch._dynamo: every candidate process imports it (see LocalExecutorOptions); forked, it has it already
    preload: list[str] = field(default_factory=lambda: list(JUDGE_PRELOAD))
    warm_plugins: bool = True
    start_timeout: float = 180.0
    max_jobs_per_worker: int = 0
    memory_limit_mb: int = 0  # address-space limit of each worker (0: none)
    threads: int = 0  # OMP/MKL threads per worker (0: library default)
    exclusive: bool = False  # lock each device label machine-wide (as the GPU pool does)
    lock_dir: str = ""
    quiet_timing: bool = True  # timed sections never overlap CPU-heavy ones (see LocalExecutorOptions)
    fork_server: bool = True  # workers forked from one process with the preload imported (see LocalExecutorOptions)
    prestart: bool = True  # each worker starts the judge's candidate process ahead of its job (see LocalExecutorOptions)


class CpuExecutor(_PoolExecutor):
    name = "cpu"
    description = "CPU pool: N worker processes (default 1), same queue, timeouts and recovery as the GPU pool."
    Options = CpuExecutorOptions
    backend = "cpu"

    def device_specs(self) -> list[DeviceSpec]:
        o = self.options
        labels = _split(o.devices)
        if not labels:
            if o.workers < 1:
                raise ConfigError(f"executor cpu: workers must be >= 1, got {o.workers}")
            labels = [f"cpu{i}" for i in range(o.workers)]
        if len(set(labels)) != len(labels):
            raise ConfigError(f"executor cpu: devices repeat: {','.join(labels)}")
        env: dict[str, str] = {"CUDA_VISIBLE_DEVICES": ""}
        if o.threads > 0:
            for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                env[var] = str(o.threads)
        return [DeviceSpec(label=lab, device="cpu", env=dict(env)) for lab in labels]

    def pool_kwargs(self) -> dict:
        kw = super().pool_kwargs()
        kw["memory_limit_mb"] = self.options.memory_limit_mb
        return kw


__all__ = ["CpuExecutor", "JobError", "LocalExecutor", "visible_gpus"]
