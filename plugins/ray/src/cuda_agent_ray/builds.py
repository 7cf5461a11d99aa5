"""Builds as CPU tasks of the cluster: the paper's split of CPU sandboxes that compile and a
GPU pool that only loads and runs.

:class:`RayBuildExecutor` takes the workspace service's compile jobs
(``cuda_agent.sandbox.judge.pipeline:compile_job``, ``kind="compile"``) through the same
``submit(Job) -> Future`` as every executor. Each job becomes a Ray task needing
``build_cpus`` CPUs (and one unit of ``build_resource`` when set, so builds land on the
nodes meant for them): the workspace travels as bytes, the compiler plugin builds it in a
copy on that node, and the build folder (manifest and library) comes back and replaces
the client's ``.cuda_agent/build/`` atomically. The next verification or profiling job
carries that build to a GPU slot, which loads it and runs.

The compiler is sent as its ``{name, options}`` (the plugin is built again on the node),
so nodes need the same compiler plugins and toolchains (for ``cpp_extension``/``nvcc``:
the CUDA toolkit, torch of the GPU nodes' version, and ``arch`` set when the build node
has no GPU to detect it from). A build task whose node dies is retried by Ray
(``retries``); a build past its timeout is cancelled and reported as ``timeout``.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
import traceback
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from cuda_agent.sandbox.executors.job import Job, JobError, classify_exception, describe_exception, format_seconds

from .transfer import TransferError, pack, read_tree, rebase, remove_tree, unpack, write_tree

BUILD_DIR = ".cuda_agent/build"


def run_build(payload: list, fn: str, kwargs: dict, client_root: str) -> tuple:
    """The task body (on a cluster node): unpack, build, send the build folder back."""
    import ray

    from cuda_agent.sandbox.executors.worker import resolve

    node = ray.util.get_node_ip_address()
    blob = ray.get(payload[0])
    tmp = Path(tempfile.mkdtemp(prefix="cuda-agent-build-"))
    try:
        ws = unpack(blob, tmp / "ws")
        result = resolve(fn)(**dict(kwargs, workspace=str(ws)))
        return ("ok", rebase(result, str(ws), client_root), read_tree(ws, BUILD_DIR), node)
    except Exception as exc:  # noqa: BLE001 - reported to the client as a job error
        text = rebase(str(exc), str(tmp / "ws"), client_root)
        return ("error", type(exc).__name__, text, traceback.format_exc(limit=20), node)
    finally:
        remove_tree(tmp)


def compiler_spec(compiler: Any) -> Any:
    """A compiler component as ``{name, options}`` (what travels); specs pass through."""
    if isinstance(compiler, (str, dict)) or compiler is None:
        return compiler
    opts = getattr(compiler, "options", None)
    spec: dict[str, Any] = {"name": getattr(compiler, "name", "")}
    if dataclasses.is_dataclass(opts) and not isinstance(opts, type):
        spec["options"] = dataclasses.asdict(opts)
    return spec


class RayBuildExecutor:
    """Compile jobs as Ray CPU tasks (see the module docstring)."""

    name = "ray-builds"
    backend = "cpu"

    def __init__(self, ray: Any, cpus: float = 1.0, resource: str = "", retries: int = 1, max_bytes: int = 256 << 20):
        self._ray = ray
        self._task = ray.remote(run_build)
        self.cpus = cpus
        self.resource = resource
        self.retries = retries
        self.max_bytes = max_bytes
        self.built_on: list[str] = []  # the node of each finished build, in order

    def submit(self, job: Job) -> Future:
        fut: Future = Future()
        fut.set_running_or_notify_cancel()
        fut.job = job  # type: ignore[attr-defined]
        ws = job.kwargs.get("workspace")
        if not isinstance(ws, (str, os.PathLike)) or not os.path.isdir(ws):
            fut.set_exception(JobError("invalid", f"a build job needs a workspace folder, got {ws!r}", job_id=job.id))
            return fut
        try:
            blob = pack(ws, self.max_bytes)
        except (TransferError, OSError) as exc:
            fut.set_exception(JobError("invalid", f"the workspace cannot travel: {exc}", job_id=job.id))
            return fut
        kwargs = {k: v for k, v in job.kwargs.items() if k != "workspace"}
        if "compiler" in kwargs:
            kwargs["compiler"] = compiler_spec(kwargs["compiler"])
        opts: dict[str, Any] = {"num_cpus": self.cpus, "max_retries": self.retries, "retry_exceptions": False,
                                "scheduling_strategy": "SPREAD"}
        if self.resource:
            opts["resources"] = {self.resource: 1}
        ref = self._task.options(**opts).remote([self._ray.put(blob)], job.fn, kwargs, str(ws))
        state = {"timed_out": False}
        timer = None
        if job.timeout:
            def cancel() -> None:
                state["timed_out"] = True
                try:
                    self._ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001
                    pass

            timer = threading.Timer(job.timeout, cancel)
            timer.daemon = True
            timer.start()
        ref.future().add_done_callback(lambda f: self._done(f, fut, job, str(ws), state, timer))
        return fut

    def _done(self, f: Any, fut: Future, job: Job, ws: str, state: dict, timer: Any) -> None:
        if timer is not None:
            timer.cancel()
        try:
            out = f.result()
        except BaseException as exc:  # noqa: BLE001
            if state["timed_out"]:
                err = JobError("timeout", f"timed out after {format_seconds(job.timeout or 0)}", job_id=job.id)
            else:
                line = next((x.strip() for x in str(exc).splitlines() if x.strip()), type(exc).__name__)
                from .executor import NodeLostError

                err = NodeLostError(f"the build task was lost ({type(exc).__name__}: {line[:200]})", job_id=job.id)
            fut.set_exception(err)
            return
        if out[0] == "error":
            _, type_name, message, tb, node = out
            fut.set_exception(JobError(classify_exception(type_name, message), describe_exception(type_name, message),
                                       job_id=job.id, device=node, details=tb))
            return
        _, result, files, node = out
        try:
            write_tree(ws, files, BUILD_DIR)
        except (OSError, TransferError) as exc:
            fut.set_exception(JobError("exception", f"the build could not be written back: {exc}", job_id=job.id))
            return
        self.built_on.append(node)
        fut.set_result(result)

    def run(self, job: Job) -> Any:
        return self.submit(job).result()

    def close(self) -> None:
        pass
