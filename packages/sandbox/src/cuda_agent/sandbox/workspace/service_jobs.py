"""The workspace service's steps as jobs: builds through the Compiler plugin in a separate,
killable, resource-limited worker (or inline), verification and profiling as jobs on the
shared Executor pool. A job that fails (timeout, crash, out of memory) comes back as a
failed result with a short reason, never as an exception.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cuda_agent.core.errors import CudaAgentError
from cuda_agent.core.types import CompileResult, FailureCategory, ProfileResult, VerifyResult

from ..executors.job import Job, JobError
from .service_options import ServiceOptions


def compile_job(compiler: Any, workspace: str, build_dir: str | None = None) -> CompileResult:
    """Build ``workspace`` with ``compiler`` (a Compiler instance, or a {name, options} spec)
    into ``build_dir`` (default: the workspace's own)."""
    if isinstance(compiler, (dict, str)):
        from cuda_agent.core.plugins import get_plugin_manager

        compiler = get_plugin_manager().create("compiler", compiler)
    if build_dir is None:
        return compiler.build(Path(workspace))
    return compiler.build(Path(workspace), Path(build_dir))


COMPILE_JOB = f"{__name__}:compile_job"  # the job function of a build sent to a compile executor


def make_compiler(compiler: Any, backend: str) -> Any:
    """A Compiler from an instance, a plugin name or a {name, options} spec (``None``: the
    backend's default)."""
    if compiler is None:
        compiler = "gxx" if backend == "cpu" else "cpp_extension"
    if isinstance(compiler, (str, dict)) or hasattr(compiler, "keys"):
        from cuda_agent.core.plugins import get_plugin_manager

        spec = {"name": compiler} if isinstance(compiler, str) else compiler
        return get_plugin_manager().create("compiler", spec, where="compiler")
    return compiler


def _default_executor(backend: str) -> Any:
    from ..executors.local import CpuExecutor, LocalExecutor

    if backend == "cpu":
        return CpuExecutor()
    return LocalExecutor()


class ServiceJobs:
    """Builds, verification and profiling of one workspace's files, each as a job.

    ``executor`` runs verification and profiling (``None``: a local pool of the backend,
    closed with this object); builds go to ``compile_executor``, else to the executor's
    ``build_executor()`` when it has one (builds elsewhere, on the CPU nodes of a cluster),
    else to a compile worker of our own.
    """

    def __init__(self, root: Path, options: ServiceOptions, compiler: Any, backend: str,
                 executor: Any = None, compile_executor: Any = None):
        self.root = root
        self.options = options
        self.compiler = make_compiler(compiler, backend)
        self._own_executor = executor is None
        self.executor = executor if executor is not None else _default_executor(backend)
        self._compile_pool = compile_executor
        self._own_compile_pool = False

    def start(self) -> None:
        """Start the executor's workers (and the compile worker when builds run in one)."""
        start = getattr(self.executor, "start", None)
        if callable(start):
            start()
        if self.options.compile_in == "worker":
            self.compile_executor()

    def close(self) -> None:
        """Close the pools this object made (not those it was given)."""
        if self._own_compile_pool and self._compile_pool is not None:
            self._compile_pool.close()
            self._compile_pool = None
        if self._own_executor and self.executor is not None:
            self.executor.close()

    def compile_executor(self) -> Any:
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
                preload=[type(self.compiler).__module__],  # the toolchain is loaded before the first build
                memory_limit_mb=self.options.compile_memory_mb,
                start_timeout=120.0,
            )
            self._own_compile_pool = True
        return self._compile_pool

    def build(self, src: Path, build_dir: Path) -> CompileResult:
        """Build the sources in ``src`` into ``build_dir``, in the compile worker unless
        ``compile_in`` is ``inline``."""
        t0 = time.monotonic()
        if self.options.compile_in == "inline":
            return self._build_here(src, build_dir, t0)
        job = Job(COMPILE_JOB, {"compiler": self.compiler, "workspace": str(src), "build_dir": str(build_dir)},
                  kind="compile", timeout=self.options.compile_timeout, pass_device=False)
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

    def _build_here(self, src: Path, build_dir: Path, t0: float) -> CompileResult:
        try:
            return self.compiler.build(src, build_dir)
        except CudaAgentError as exc:
            return CompileResult(ok=False, errors=[exc.one_line()], seconds=time.monotonic() - t0)

    def _run_job(self, kind: str, fn: str, options: dict, timeout: float, result: type) -> Any:
        """The job's result, or a failed ``result`` (VerifyResult, ProfileResult) saying why it did not return."""
        t0 = time.monotonic()
        job = Job(fn, {"workspace": str(self.root), "options": dict(options)}, kind=kind, timeout=timeout,
                  label=self.root.name)
        try:
            return self.executor.submit(job).result()
        except JobError as exc:
            return result(ok=False, failure=exc.failure, message=exc.message, seconds=time.monotonic() - t0,
                          metadata={"reason": exc.reason, "device": exc.device, "details": exc.details[-3000:]})

    def verify(self, c: CompileResult) -> VerifyResult:
        """Verify the build ``c`` (a failed build is a failed verification, not a job)."""
        if not c.ok:
            first = c.errors[0] if c.errors else "see the compile log"
            return VerifyResult(ok=False, failure=FailureCategory.COMPILE_ERROR, message=f"compile failed: {first}")
        o = self.options
        return self._run_job("verify", o.verify_job, o.verify_options, o.verify_timeout, VerifyResult)

    def profile(self) -> ProfileResult:
        o = self.options
        return self._run_job("profile", o.profile_job, o.profile_options, o.profile_timeout, ProfileResult)

    def evaluate(self) -> tuple[VerifyResult, ProfileResult | None] | None:
        """Verify + profile as one job; None when it did not return (then two jobs tell
        which step failed)."""
        o = self.options
        job = Job(o.evaluate_job, {"workspace": str(self.root), "verify_options": dict(o.verify_options),
                                   "profile_options": dict(o.profile_options)},
                  kind="evaluate", timeout=o.verify_timeout + o.profile_timeout, label=self.root.name)
        try:
            v, p = self.executor.submit(job).result()
        except JobError:
            return None
        return v, p

