"""The one judge: a workspace in, a candidate outcome out.

:class:`Judge` builds, verifies and profiles the candidate in a workspace, as jobs on the
executor, and turns every job that did not return (timeout, crash, out of memory) into a
failed result with a short reason, never an exception. Both forms of a candidate go
through it:

* a workspace (``model_new.py`` with ``kernels/``): built by the Compiler plugin in a
  separate, killable, resource-limited worker (or on the executor's build nodes), then
  verified and profiled;
* a KernelBench single file (``model_new.py`` that builds its own kernels when imported):
  its extensions are built ahead in the CPU build pool (:mod:`.prebuild`), many candidates
  at a time, so that its GPU job only loads them.

The workspace service (the agent's tools and the RL reward) and evaluation (``cuda-agent
eval``) both use it, with :class:`JudgeOptions`. The job functions' import paths and each
backend's default compiler (:data:`..compilers.DEFAULT_COMPILER`) are reached through here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.core.errors import ConfigError, CudaAgentError
from cuda_agent.core.types import CandidateOutcome, CompileResult, FailureCategory, ProfileResult, VerifyResult

from ..compilers import DEFAULT_COMPILER
from ..executors.job import Job, JobError
from .client import KILLED_OUTSIDE

_TASKS = "cuda_agent.sandbox.judge.tasks:"
VERIFY_JOB = _TASKS + "verify"
PROFILE_JOB = _TASKS + "profile"
EVALUATE_JOB = _TASKS + "evaluate"  # verify, then profile, in one worker
PREBUILD_JOB = _TASKS + "prebuild"  # a single file's extensions, built without a GPU
BASELINES_JOB = _TASKS + "baselines"  # a task's baselines, measured ahead in GPU time no candidate asks for
COMPILE_JOB = f"{__name__}:compile_job"  # a workspace's build, sent to a compile executor



def default_compiler(backend: str) -> str:
    """The compiler plugin a backend uses when the config names none."""
    return DEFAULT_COMPILER["cpu" if backend == "cpu" else "cuda"]


def compile_job(compiler: Any, workspace: str, build_dir: str | None = None) -> CompileResult:
    """Build ``workspace`` with ``compiler`` (a Compiler instance, or a {name, options} spec)
    into ``build_dir`` (default: the workspace's own)."""
    if isinstance(compiler, (dict, str)):
        from cuda_agent.core.plugins import get_plugin_manager

        compiler = get_plugin_manager().create("compiler", compiler)
    if build_dir is None:
        return compiler.build(Path(workspace))
    return compiler.build(Path(workspace), Path(build_dir))


def make_compiler(compiler: Any, backend: str, pm: Any = None) -> Any:
    """A Compiler from an instance, a plugin name or a {name, options} spec (``None``: the
    backend's default), made by ``pm`` (the default plugin manager when None)."""
    if compiler is None or (isinstance(compiler, dict) and not compiler.get("name")):
        compiler = default_compiler(backend)
    if isinstance(compiler, (str, dict)) or hasattr(compiler, "keys"):
        if pm is None:
            from cuda_agent.core.plugins import get_plugin_manager

            pm = get_plugin_manager()
        spec = {"name": compiler} if isinstance(compiler, str) else compiler
        return pm.create("compiler", spec, where="compiler")
    return compiler


@dataclass
class JudgeOptions:
    """How the judge builds, verifies and profiles (the service's and eval's options map onto these)."""

    compile_timeout: float = 300.0  # seconds for one workspace build (killed with its process group after)
    compile_memory_mb: int = 0  # address-space limit of the compile worker (0: none)
    compile_in: str = "worker"  # worker (a separate, killable process) | inline
    verify_timeout: float | None = 120.0  # per verification job
    profile_timeout: float | None = 300.0  # per profiling job
    verify_job: str = VERIFY_JOB
    profile_job: str = PROFILE_JOB
    evaluate_job: str = ""  # verify+profile as one job (e.g. EVALUATE_JOB); "" = two jobs
    verify_options: dict = field(default_factory=dict)  # VerifyOptions fields
    profile_options: dict = field(default_factory=dict)  # ProfileOptions fields
    # single files: their extensions built in the CPU build pool before their GPU job
    prebuild: bool = True
    build_workers: int = 0  # parallel builds (0: auto_build_workers, from the host's cores, memory and GPUs)
    build_jobs: int = 2  # compiler processes per build (MAX_JOBS)
    build_timeout: float = 600.0
    build_arch: str = ""  # TORCH_CUDA_ARCH_LIST of the target GPU ("" = this host's first GPU, with PTX)
    prebuilt_cache: str = ""  # where builds are kept by key ("" = <tmp>/cuda-agent-prebuilt)
    # those builds find a precompiled torch/extension.h (made once per torch and compiler, in
    # the background from the first build on; see cuda_agent.sandbox.compilers.torch_header)
    torch_header: bool = True
    torch_header_cache: str = ""  # where it is kept ("" = /var/cache/cuda-agent/torch-header or ~/.cache)
    # once a task's eager time is known (from a profile of one of its candidates), its jobs'
    # timeouts are timeout_floor + calls x eager x hopeless_factor, at most the ones above
    scale_timeouts: bool = True
    timeout_floor: float = 90.0  # seconds: worker start, loading, the reference's share
    timeout_calls: int = 60  # candidate calls a job makes, about (draws, warm-up, timed loops)
    hopeless_factor: float = 20.0  # the slowdown against eager past which a candidate is timed no further
    # a task's eager time is also read from the baseline cache (profile_options'
    # baseline_cache_dir, else the default one) before its first job
    timeouts_from_cache: bool = True
    # the refusals that need neither a build nor a GPU (the judged files, the static checks) are
    # made here before anything is built; False: only inside the verification job
    refusals_first: bool = True
    # a task's baselines, not yet known, are measured by a job of their own (the queue's lowest
    # priority: it runs only while no candidate's job waits for the GPU) as soon as one of its
    # candidates passed those refusals, so that they are cached by the time its build is done;
    # a candidate whose job is due while that job still waits takes it over (measures them itself)
    baselines_ahead: bool = True

    def __post_init__(self) -> None:
        if self.compile_in not in ("worker", "inline"):
            raise ConfigError(f"compile_in must be 'worker' or 'inline', got {self.compile_in!r}")

    def check_job_options(self, where: str = "service") -> None:
        """Unknown verify/profile options are a config error now, not a failed job later."""
        from . import jobs
        from .tasks import build_options

        checks = [("verify_options", self.verify_job, jobs.VerifyOptions, self.verify_options),
                  ("profile_options", self.profile_job, jobs.ProfileOptions, self.profile_options)]
        for key, job, cls, opts in checks:
            if not job.startswith(_TASKS) or not opts:
                continue
            try:
                build_options(cls, dict(opts))
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{where}.{key}: {exc}") from None


def judge_options(source: Any, **overrides: Any) -> JudgeOptions:
    """JudgeOptions from the fields ``source`` (a dataclass or mapping) shares with them."""
    data = dataclasses.asdict(source) if dataclasses.is_dataclass(source) else dict(source or {})
    names = {f.name for f in dataclasses.fields(JudgeOptions)}
    kw = {k: v for k, v in data.items() if k in names}
    kw.update(overrides)
    return JudgeOptions(**kw)


def _default_executor(backend: str) -> Any:
    from ..executors.local import CpuExecutor, LocalExecutor

    return CpuExecutor() if backend == "cpu" else LocalExecutor()


# what one single file's build may hold at once: nvcc's front ends reached 2.9 GB on a CUDA
# unit that includes torch/extension.h
BUILD_MEMORY_BYTES = 3 << 30


def host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def auto_build_workers(o: JudgeOptions, devices: int, cores: int | None = None, memory: int | None = None) -> int:
    """Single files built at once when ``build_workers`` is 0: the host's cores left to the GPUs'
    jobs (two each) over ``build_jobs``, at most one build per ``BUILD_MEMORY_BYTES`` of host
    memory and at most 8 per GPU (8 on a host without one), at least 1."""
    if o.build_workers > 0:
        return o.build_workers
    cores = cores or os.cpu_count() or 2
    memory = host_memory_bytes() if memory is None else memory
    by_cores = (cores - 2 * max(0, devices)) // max(1, o.build_jobs)
    by_memory = memory // BUILD_MEMORY_BYTES if memory > 0 else by_cores
    return max(1, min(8 * max(1, devices), by_cores, by_memory))


class Judge:
    """Builds, verification and profiling of candidates, each as a job.

    ``executor`` runs verification and profiling (``None``: a local pool of the backend,
    closed with this object). Workspace builds go to ``compile_executor``, else to the
    executor's ``build_executor()`` when it has one (builds elsewhere, on the CPU nodes of
    a cluster), else to a compile worker of our own. Single files' builds go to a CPU pool
    of our own (``build_workers`` wide). ``pm`` makes the compiler from a spec.
    """

    def __init__(self, options: JudgeOptions | None = None, executor: Any = None, compiler: Any = None,
                 backend: str = "cuda", compile_executor: Any = None, pm: Any = None):
        self.options = options or JudgeOptions()
        self.backend = backend
        self.pm = pm
        self._compiler_spec = compiler
        self._compiler: Any = None
        self._own_executor = executor is None
        self.executor = executor if executor is not None else _default_executor(backend)
        self._compile_pool = compile_executor
        self._own_compile_pool = False
        self._build_pool: Any = None
        self._torch_header: Any = None
        self._lock = threading.Lock()
        self._arch: str | None = None
        self._eager_ms: dict[str, float] = {}  # task (hash of model.py) -> its eager time, from profiles
        self._task_locks: dict[str, threading.Lock] = {}  # a task's GPU jobs, one at a time until its baselines are known
        self._partial: dict[str, str] = {}  # workspace -> candidate hash, verified on one input set only (verify_stopped)
        self._ahead: dict[str, Any] = {}  # task -> the future of its baselines' job (measure_ahead)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the executor's workers (and the compile worker when builds run in one)."""
        start = getattr(self.executor, "start", None)
        if callable(start):
            start()
        if self.options.compile_in == "worker":
            self.compile_executor()

    def close(self) -> None:
        """Close the pools this object made (not those it was given)."""
        with self._lock:
            pools = [self._build_pool] + ([self._compile_pool] if self._own_compile_pool else [])
            self._build_pool = None
            if self._torch_header is not None:
                self._torch_header.stop()
            if self._own_compile_pool:
                self._compile_pool = None
        for pool in pools:
            if pool is not None:
                pool.close()
        if self._own_executor and self.executor is not None:
            self.executor.close()

    # -- workspace builds ------------------------------------------------------------------

    @property
    def compiler(self) -> Any:
        """The compiler (made on first use: single files never need one)."""
        with self._lock:
            if self._compiler is None:
                self._compiler = make_compiler(self._compiler_spec, self.backend, self.pm)
            return self._compiler

    def compile_executor(self) -> Any:
        compiler = self.compiler
        with self._lock:
            if self._compile_pool is None:
                remote = getattr(self.executor, "build_executor", None)
                remote = remote() if callable(remote) else None
                if remote is not None:  # the pool builds elsewhere (CPU nodes of a cluster); not ours to close
                    self._compile_pool = remote
                    return remote
                from ..executors.pool import DeviceSpec, WorkerPool

                self._compile_pool = WorkerPool(
                    [DeviceSpec(label="compile", device="cpu")],
                    name="compile",
                    default_timeout=self.options.compile_timeout,
                    recycle="never",
                    spares=0,
                    preload=[type(compiler).__module__],  # the toolchain is loaded before the first build
                    memory_limit_mb=self.options.compile_memory_mb,
                    start_timeout=120.0,
                )
                self._own_compile_pool = True
            return self._compile_pool

    def build(self, src: Path, build_dir: Path | None = None) -> CompileResult:
        """Build the sources in ``src`` into ``build_dir`` (the workspace's own when None), in
        the compile worker unless ``compile_in`` is ``inline``."""
        t0 = time.monotonic()
        if self.options.compile_in == "inline":
            return self._build_here(src, build_dir, t0)
        job = Job(COMPILE_JOB, {"compiler": self.compiler, "workspace": str(src),
                                "build_dir": str(build_dir) if build_dir is not None else None},
                  kind="compile", timeout=self.options.compile_timeout, pass_device=False, label=Path(src).name)
        try:
            return self.compile_executor().submit(job).result()
        except JobError as exc:
            if exc.reason == "invalid":  # the compiler object cannot travel to a worker: build here
                return self._build_here(src, build_dir, t0)
            if exc.reason == "timeout":
                msg = f"compile {exc.message} (a template or loop too large to build?)"
            elif exc.reason == "oom":
                msg = f"compile ran out of memory (limit {self.options.compile_memory_mb} MB)"
            else:
                msg = f"compiler failed: {exc.message}"
            return CompileResult(ok=False, errors=[msg], log=exc.details[-4000:], seconds=time.monotonic() - t0)

    def _build_here(self, src: Path, build_dir: Path | None, t0: float) -> CompileResult:
        try:
            if build_dir is None:
                return self.compiler.build(Path(src))
            return self.compiler.build(Path(src), Path(build_dir))
        except ConfigError:
            raise
        except CudaAgentError as exc:
            return CompileResult(ok=False, errors=[exc.one_line()], seconds=time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001 - a compiler plugin's bug is this candidate's failed build
            return CompileResult(ok=False, errors=[f"{type(exc).__name__}: {exc}"[:500]], seconds=time.monotonic() - t0)

    # -- single files' builds ------------------------------------------------------------------

    def arch(self) -> str:
        """``TORCH_CUDA_ARCH_LIST`` the single files are built for ("" on the CPU backend)."""
        if self._arch is None:
            from .prebuild import host_arch

            self._arch = "" if self.backend == "cpu" else (self.options.build_arch or host_arch())
        return self._arch

    def build_workers(self) -> int:
        """How many single files are built at once (0 when they are not built ahead)."""
        if not self.options.prebuild:
            return 0
        try:
            devices = len(self.executor.devices) if self.backend != "cpu" else 0
        except Exception:  # noqa: BLE001
            devices = 1
        return auto_build_workers(self.options, devices)

    def build_pool(self) -> Any:
        with self._lock:
            if self._build_pool is None:
                from ..executors.local import CpuExecutor, CpuExecutorOptions

                n = self.build_workers() or 1
                self._build_pool = CpuExecutor(CpuExecutorOptions(
                    devices=",".join(f"build{i}" for i in range(n)), timeout=self.options.build_timeout,
                    recycle="always", spares=1, quiet_timing=False, warm_plugins=False,
                    preload=["torch", "cuda_agent.sandbox.judge.jobs"]))
            return self._build_pool

    def prebuilt_store(self) -> Any:
        from .prebuild import PrebuiltStore

        root = self.options.prebuilt_cache or os.path.join(tempfile.gettempdir(), "cuda-agent-prebuilt")
        return PrebuiltStore(root)

    def torch_header(self) -> tuple[str, str]:
        """(the folder of the precompiled ``torch/extension.h`` for the builds' ``CPATH``, "")
        once it is made; else ("", why not), its making started in the background."""
        if not self.options.torch_header:
            return "", "off (torch_header: false)"
        from ..compilers.torch_header import TorchHeader

        with self._lock:
            if self._torch_header is None:
                self._torch_header = TorchHeader(self.options.torch_header_cache or None)
            header = self._torch_header
        folder, why = header.offer()
        if not folder:
            header.start(timeout=max(600.0, self.options.build_timeout))
            folder, why = header.offer()  # made by another process meanwhile, or switched off
        return folder, why

    def prebuild(self, root: Path, candidate: str = "model_new.py") -> dict:
        """Build the single file ``root/candidate``'s extensions in the build pool (once per
        source and GPU architecture) and place them in the workspace for its GPU job; what
        happened, for the result's metadata (``prebuild``)."""
        from .prebuild import PrebuildResult, source_key

        t0 = time.monotonic()
        arch = self.arch()
        if self.backend != "cpu" and not arch:
            return {"built": "in the GPU job (no GPU architecture known here: set build_arch)"}
        try:
            key = source_key((Path(root) / candidate).read_bytes(), arch)
        except OSError as exc:
            return {"built": f"in the GPU job ({candidate} unreadable: {exc})"}
        store = self.prebuilt_store()
        cached = store.has(key)
        header = ""
        if not cached:
            header, header_why = self.torch_header()
            job = Job(PREBUILD_JOB, {"workspace": str(root), "options": {
                "arch": arch, "jobs": self.options.build_jobs, "timeout": self.options.build_timeout,
                "candidate": candidate, "torch_header": header}}, kind="prebuild",
                timeout=self.options.build_timeout + 60, label=Path(root).name)
            try:
                res = self.build_pool().submit(job).result()
            except JobError as exc:
                return {"built": f"in the GPU job (the build job {exc.reason}: {exc.message})"[:500],
                        "seconds": round(time.monotonic() - t0, 3)}
            if not isinstance(res, PrebuildResult) or res.key != key:
                return {"built": "in the GPU job (the build job answered nothing usable)"}
            store.put(res)
        info = store.manifest(key)
        store.install(key, root)
        out = {"built": "ahead, without a GPU" if info.get("imported") else
               "partly ahead: the import without a GPU failed, so the GPU job builds what is missing",
               "seconds": round(time.monotonic() - t0, 3), "build_seconds": info.get("seconds"),
               "cached": cached, "files": info.get("files"), "arch": arch or "cpu"}
        if not cached:
            out["torch_header"] = f"offered ({header})" if header else f"not offered: {header_why}"
        if not info.get("imported") and info.get("message"):
            out["message"] = str(info["message"])[:500]
        return out

    # -- timeouts that scale with the task ------------------------------------------------------

    @staticmethod
    def _task_key(root: Path) -> str:
        import hashlib

        try:
            return hashlib.sha256((Path(root) / "model.py").read_bytes()).hexdigest()[:20]
        except OSError:
            return ""

    def _learn(self, root: Path, *results: Any) -> None:
        for r in results:
            eager = getattr(r, "eager", None)
            if getattr(r, "ok", False) and eager is not None and eager.median_ms > 0:
                key = self._task_key(root)
                if key:
                    self._eager_ms[key] = float(eager.median_ms)

    def eager_ms(self, root: Path) -> float | None:
        """The task's eager time (ms) when known: from a profile of one of its candidates, or
        from the baseline cache (``timeouts_from_cache``; read here, on the records' fields)."""
        key = self._task_key(root)
        if not key:
            return None
        with self._lock:
            fut = self._ahead.get(key)
        if key not in self._eager_ms and fut is not None and fut.done():  # its callback may not have run yet
            self._ahead_done(key, fut)
        if key not in self._eager_ms and self.options.timeouts_from_cache:
            from .baselines.cache import cache_for

            p = self.options.profile_options or {}
            prof = str(p.get("profiler") or ("wallclock" if self.backend == "cpu" else "cuda_events"))
            try:
                ms = cache_for(p.get("baseline_cache_dir") or None).eager_ms(
                    (Path(root) / "model.py").read_text(), str(p.get("precision") or "fp32-strict"),
                    "cuda_events" if prof == "nsight_compute" else prof)
            except Exception:  # noqa: BLE001 - an unreadable cache: the configured timeouts stand
                ms = None
            if ms:
                self._eager_ms[key] = ms
        return self._eager_ms.get(key)

    def timeout(self, root: Path, configured: float | None, prebuilt: bool = True) -> float | None:
        """``configured``, or less once the task's eager time is known (see :class:`JudgeOptions`);
        a single file whose extensions were not built ahead keeps the configured one (its build
        runs inside the job)."""
        o = self.options
        eager = self.eager_ms(root) if o.scale_timeouts and prebuilt else None
        if eager is None:
            return configured
        scaled = o.timeout_floor + o.timeout_calls * eager / 1e3 * max(1.0, o.hopeless_factor)
        return scaled if configured is None else min(configured, scaled)

    # -- verification and profiling ---------------------------------------------------------

    def _run_job(self, kind: str, fn: str, root: Path, options: dict, timeout: float | None, result: type) -> Any:
        """The job's result, or a failed ``result`` (VerifyResult, ProfileResult) saying why it did not return."""
        t0 = time.monotonic()
        job = Job(fn, {"workspace": str(root), "options": dict(options)}, kind=kind, timeout=timeout,
                  label=Path(root).name)
        try:
            r, first = self._submit(job, _killed_outside)
        except JobError as exc:
            meta = {"reason": exc.reason, "device": exc.device, "details": exc.details[-3000:]}
            holders = self._memory_holders(exc.message + " " + exc.details[-3000:])
            if holders:
                meta["gpu_memory_holders"] = holders
            return result(ok=False, failure=exc.failure, message=exc.message, seconds=time.monotonic() - t0,
                          metadata=meta)
        r = _after_rerun(r, first)
        if not getattr(r, "ok", True) and isinstance(getattr(r, "metadata", None), dict):
            holders = self._memory_holders(str(getattr(r, "message", "")))
            if holders:
                r.metadata["gpu_memory_holders"] = holders
        return r

    def _memory_holders(self, message: str) -> dict[str, str]:
        """For a job that ran out of GPU memory: what each process the message names held
        and what it is to this judge's pool (its job's worker, a spare, a candidate process,
        something else); {} otherwise."""
        if "out of memory" not in message:
            return {}
        pool = getattr(self.executor, "_pool", None)
        if pool is None or not hasattr(pool, "worker_pids"):
            return {}
        from ..executors.memory_holders import describe

        try:
            return describe(message, pool.worker_pids())
        except Exception:  # noqa: BLE001 - a diagnosis never fails the job's result
            return {}

    def _submit(self, job: Job, killed: Any) -> tuple[Any, Any]:
        """``job``'s result, and None; or, when ``killed(result)`` (its candidate process was
        killed from outside the judge), the result of the job run once more, and the first
        one. A JobError is raised."""
        r = self.executor.submit(job).result()
        if not killed(r):
            return r, None
        return self.executor.submit(dataclasses.replace(job, id=Job(job.fn).id)).result(), r

    def verify(self, root: Path, c: CompileResult | None = None, options: dict | None = None,
               prebuilt: bool = True) -> VerifyResult:
        """Verify the candidate in ``root`` (after the build ``c``: a failed build is a failed
        verification, not a job)."""
        if c is not None and not c.ok:
            first = c.errors[0] if c.errors else "see the compile log"
            return VerifyResult(ok=False, failure=FailureCategory.COMPILE_ERROR, message=f"compile failed: {first}")
        o = self.options
        opts = o.verify_options if options is None else options
        v = self._run_job("verify", o.verify_job, root, opts, self.timeout(root, o.verify_timeout, prebuilt),
                          VerifyResult)
        with self._lock:
            if v.ok and isinstance((v.metadata or {}).get("verify_stopped"), dict):
                self._partial[str(root)] = _candidate_hash(root, opts)
            else:
                self._partial.pop(str(root), None)
        return v

    def profile(self, root: Path, options: dict | None = None, prebuilt: bool = True,
                verify_options: dict | None = None) -> ProfileResult:
        """Time the candidate in ``root``. When its latest verification here stopped after one
        input set (a hopeless first call) and the timing does not find it hopeless too, it is
        verified again in full (``verify_options``: that verification's options), and a
        failure there is this result's."""
        o = self.options
        opts = o.profile_options if options is None else options
        ahead = self._ahead_settled(root)
        r = self._run_job("profile", o.profile_job, root, opts, self.timeout(root, o.profile_timeout, prebuilt),
                          ProfileResult)
        _note_ahead(ahead, r)
        self._learn(root, r)
        with self._lock:
            partial = self._partial.get(str(root))
        vopts = o.verify_options if verify_options is None else verify_options
        if partial is not None and not (r.ok and isinstance((r.metadata or {}).get("timing_stopped"), dict)) \
                and partial == _candidate_hash(root, vopts):
            v = self.verify(root, options=dict(vopts, hopeless_factor=0.0), prebuilt=prebuilt)
            if isinstance(r.metadata, dict):
                r.metadata["verified_in_full"] = "passed" if v.ok else v.message[:500]
            if not v.ok:
                return ProfileResult(ok=False, failure=v.failure, message=(
                    f"verified again in full (its first call was hopeless, its timing did not find it so): {v.message}"),
                    seconds=r.seconds + v.seconds, metadata={"verify": v.metadata, **(r.metadata or {})})
        return r

    def evaluate(self, root: Path, verify_options: dict | None = None, profile_options: dict | None = None,
                 job: str = "", split: bool = True, prebuilt: bool = True) -> tuple[VerifyResult, ProfileResult | None] | None:
        """Verify + profile as one job (``job``, default ``evaluate_job`` or the built-in one).
        When it does not return: None with ``split`` (two jobs then tell which step failed),
        else a failed verification saying why."""
        o = self.options
        ahead = self._ahead_settled(root)
        vt, pt = self.timeout(root, o.verify_timeout, prebuilt), self.timeout(root, o.profile_timeout, prebuilt)
        timeout = vt + pt if vt and pt else None
        j = Job(job or o.evaluate_job or EVALUATE_JOB, {
            "workspace": str(root),
            "verify_options": dict(o.verify_options if verify_options is None else verify_options),
            "profile_options": dict(o.profile_options if profile_options is None else profile_options)},
            kind="evaluate", timeout=timeout, label=Path(root).name)
        t0 = time.monotonic()
        try:
            (v, p), first = self._submit(j, lambda vp: _killed_outside(vp[0]) or _killed_outside(vp[1]))
            _note_ahead(ahead, p)
        except JobError as exc:
            if split:
                return None
            return VerifyResult(ok=False, failure=exc.failure, message=exc.message, seconds=time.monotonic() - t0,
                                metadata={"reason": exc.reason, "device": exc.device, "details": exc.details[-3000:]}), None
        if first is not None:  # the run whose process was killed, for the note
            first = first[1] if _killed_outside(first[1]) else first[0]
        v, p = _after_rerun(v, first), _after_rerun(p, first)
        self._learn(root, p)
        return v, p

    # -- the whole pipeline ---------------------------------------------------------------------

    def job_options(self, single_file: bool) -> tuple[dict, dict]:
        """The verification and profiling jobs' options for a candidate of this form: a
        single file gets KernelBench's weight protocol unless the options name one."""
        v, p = dict(self.options.verify_options), dict(self.options.profile_options)
        if single_file:
            v.setdefault("weights", "auto")
            p.setdefault("weights", "auto")
        return v, p

    def precheck(self, root: Path, options: dict | None = None) -> VerifyResult | None:
        """The refusals of verification that need neither a build nor a GPU (the judged files,
        the static checks), made here on a snapshot of ``root``: the failed VerifyResult, or
        None (passed, or a verification job of another kind, whose checks are its own)."""
        o = self.options
        if not o.refusals_first or not o.verify_job.startswith(_TASKS):
            return None
        from .options import VerifyOptions
        from .tasks import build_options
        from .verify import static_refusal

        try:
            return static_refusal(root, build_options(VerifyOptions, dict(o.verify_options if options is None else options)))
        except ConfigError:
            raise
        except Exception:  # noqa: BLE001 - the verification job checks again and says what is wrong
            return None

    def measure_ahead(self, root: Path, options: dict | None = None) -> Any:
        """Submit a job that measures and caches the baselines of ``root``'s task (its
        ``model.py``, copied alone into a folder of its own) unless they are known or already
        asked for; the job's future, or None. The job has the queue's lowest priority, so it
        takes only GPU time that no candidate's job asks for (see ``baselines_ahead``). Only
        for the built-in profiling jobs, whose baselines these are."""
        o = self.options
        if not (o.profile_job.startswith(_TASKS) and (not o.evaluate_job or o.evaluate_job.startswith(_TASKS))):
            return None  # jobs of another kind: their baselines are not necessarily these
        if (o.profile_options if options is None else options).get("baselines") is False:
            return None
        key = self._task_key(root)
        if not key or self.eager_ms(root) is not None:
            return None
        with self._lock:
            if key in self._ahead:
                return None
            self._ahead[key] = None  # claimed: one job per task
        folder = Path(tempfile.mkdtemp(prefix="cuda-agent-baselines-"))
        try:
            (folder / "model.py").write_bytes((Path(root) / "model.py").read_bytes())
            os.chmod(folder, 0o755)
            opts = dict(self.options.profile_options if options is None else options)
            job = Job(BASELINES_JOB, {"workspace": str(folder), "options": opts}, kind="baseline",
                      timeout=self.options.profile_timeout, label=f"baselines {Path(root).name}")
            fut = self.executor.submit(job)
        except Exception:  # noqa: BLE001 - no job ahead: the candidate's own job measures them
            shutil.rmtree(folder, ignore_errors=True)
            with self._lock:
                self._ahead.pop(key, None)
            return None

        def done(f: Any) -> None:
            shutil.rmtree(folder, ignore_errors=True)
            self._ahead_done(key, f)

        with self._lock:
            self._ahead[key] = fut
        fut.add_done_callback(done)
        return fut

    def _ahead_done(self, key: str, fut: Any) -> float | None:
        """A finished job ahead: its eager time learnt (ms), or, when it failed or was taken
        over, the task's claim given up so that a later candidate may ask again."""
        try:
            got = fut.result() if not fut.cancelled() else None
        except Exception:  # noqa: BLE001 - the candidate's own job measures them and says why
            got = None
        ms = getattr(got.get("eager") if isinstance(got, dict) else None, "median_ms", None)
        with self._lock:
            if ms:
                self._eager_ms[key] = float(ms)
            elif self._ahead.get(key) is fut:
                self._ahead.pop(key, None)
        return float(ms) if ms else None

    def _ahead_settled(self, root: Path) -> str:
        """Before a task's GPU job: its baselines' job ahead, if one is still queued, is
        withdrawn (this job measures them, not later than that one would start); one that
        runs is waited for. What happened ("" when there was none)."""
        key = self._task_key(root)
        with self._lock:
            fut = self._ahead.get(key) if key else None
            if fut is not None and fut.done():  # said once, to the first candidate after it
                self._ahead.pop(key, None)
        if fut is None or fut.done():
            ok = fut is not None and not fut.cancelled() and self._ahead_done(key, fut) is not None
            return "measured ahead" if ok else ""
        if fut.cancel():
            return "taken over from the job ahead, which had not started"
        try:
            fut.result()
        except Exception:  # noqa: BLE001 - the candidate's own job measures them and says why
            pass
        return "measured ahead (waited for)" if self._ahead_done(key, fut) is not None else ""

    @contextlib.contextmanager
    def _first_to_measure(self, root: Path, profile: bool) -> Any:
        """Around a task's GPU job: while its baselines are not known to be cached, one job of
        the task at a time, so that they are measured once, by the first of its candidates
        that needs them; the jobs that waited run side by side once they are known."""
        if not profile or self.eager_ms(root) is not None:
            yield
            return
        with self._lock:
            lock = self._task_locks.setdefault(self._task_key(root), threading.Lock())
        lock.acquire()
        held = self.eager_ms(root) is None
        if not held:
            lock.release()
        try:
            yield
        finally:
            if held:
                lock.release()

    def judge(self, root: Path, single_file: bool = False, profile: bool = True, one_job: bool = True) -> CandidateOutcome:
        """Refuse, build, verify and (when correct, and ``profile``) profile the candidate in
        ``root``: a workspace (built first) or a single file (``single_file``: its extensions
        built ahead when ``prebuild`` is on). The refusals that need no GPU come before the
        build (``refusals_first``). ``one_job``: verify and profile in one job."""
        root = Path(root)
        outcome = CandidateOutcome()
        info = None
        vopts, popts = self.job_options(single_file)
        early = self.precheck(root, vopts)
        if early is not None:
            outcome.verify = early
            return outcome
        if profile and self.options.baselines_ahead:
            self.measure_ahead(root, popts)
        if not single_file:
            outcome.compile = self.build(root)
            if not outcome.compile.ok:
                return outcome
        elif self.options.prebuild:
            info = self.prebuild(root)
        ahead = not single_file or (info is not None and str(info.get("built", "")).startswith("ahead"))
        measured_ahead = self._ahead_settled(root) if profile else ""
        with self._first_to_measure(root, profile):
            both = self.evaluate(root, vopts, popts, split=False, prebuilt=ahead) if one_job and profile else None
            if both is not None:
                outcome.verify, outcome.profile = both
            else:
                outcome.verify = self.verify(root, outcome.compile, vopts, prebuilt=ahead)
                if outcome.verify.ok and profile:
                    outcome.profile = self.profile(root, popts, prebuilt=ahead, verify_options=vopts)
                    if not outcome.profile.ok and isinstance((outcome.profile.metadata or {}).get("verify"), dict):
                        outcome.verify = VerifyResult(ok=False, failure=outcome.profile.failure,
                                                      message=outcome.profile.message,
                                                      metadata=outcome.profile.metadata["verify"])
                        outcome.profile = None
        _note_ahead(measured_ahead, outcome.profile)
        if info is not None:
            for r in (outcome.verify, outcome.profile):
                if r is not None and isinstance(r.metadata, dict):
                    r.metadata["prebuild"] = dict(info)
        return outcome


def _killed_outside(r: Any) -> bool:
    """Whether the job ``r`` came from lost its candidate process to a SIGKILL the judge did
    not send (:data:`.client.KILLED_OUTSIDE`): not a verdict on the candidate."""
    return r is not None and not getattr(r, "ok", True) and bool((getattr(r, "metadata", None) or {}).get(KILLED_OUTSIDE))


def _after_rerun(r: Any, first: Any) -> Any:
    """``r``, from a job run again because ``first`` lost its candidate process (None: not
    run again), says so in its metadata. A candidate killed from outside twice keeps the crash:
    a candidate that kills itself gains nothing."""
    if first is not None and r is not None and isinstance(getattr(r, "metadata", None), dict):
        r.metadata["run_again_because"] = f"the first run's candidate process was killed: {first.message}"[:600]
    return r


def _note_ahead(ahead: str, r: Any) -> None:
    """Say in a profile's metadata how its task's baselines' job ahead ended (when there was one)."""
    if ahead and r is not None and isinstance(getattr(r, "metadata", None), dict):
        r.metadata.setdefault("baselines_ahead", ahead)


def _candidate_hash(root: Path, verify_options: dict | None) -> str:
    """What a verification judged in ``root``: its candidate file and kernel sources."""
    h = hashlib.sha256()
    root = Path(root)
    files = [root / str((verify_options or {}).get("candidate") or "model_new.py")]
    if (root / "kernels").is_dir():
        files += sorted(p for p in (root / "kernels").rglob("*") if p.is_file())
    for f in files:
        try:
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        except OSError:
            h.update(b"?")
    return h.hexdigest()


__all__ = ["BASELINES_JOB", "COMPILE_JOB", "DEFAULT_COMPILER", "EVALUATE_JOB", "Judge", "JudgeOptions", "PREBUILD_JOB",
           "PROFILE_JOB", "VERIFY_JOB", "compile_job", "default_compiler", "judge_options", "make_compiler"]
