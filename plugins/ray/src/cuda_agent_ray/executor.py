"""The ``ray`` executor: the GPU pool of a Ray cluster behind ``submit(Job) -> Future``.

The client side. Jobs wait in one priority queue here (verification before profiling
before baselines, as in ``local``); a dispatcher thread hands the first job to a free slot
actor (:mod:`.slots`), preferring the slot this client has used least, so a batch
spreads over every node. A slot that another client keeps busy answers ``busy`` and the
job goes back to its place in the queue; the slot is asked again after a short pause.

Each job's workspace travels as bytes (:mod:`.transfer`) through Ray's object store,
read when the job is submitted. Results and :class:`JobError` come back as the slot's
local pool made them.

Node loss: a slot whose actor dies while it holds a job (its node left the cluster, or
the actor process was killed) is dropped, and the job runs once more on another node
(``node_loss: retry``, ``retries`` times) or fails with reason ``node_lost``
(``node_loss: fail``). Finished jobs are never run again. New nodes are picked up every
``refresh_seconds``.

Builds (``builds: ray``): :meth:`RayExecutor.build_executor` gives the workspace service
an executor that runs its compile jobs as CPU tasks of the cluster (:mod:`.builds`).
"""

from __future__ import annotations

import heapq
import os
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from cuda_agent.core.errors import ConfigError
from cuda_agent.core.interfaces import Executor
from cuda_agent.core.types import FailureCategory
from cuda_agent.sandbox.executors.job import Job, JobError, format_seconds
from cuda_agent.sandbox.executors.pool import JobRecord

from . import cluster
from .slots import spec_hash
from .transfer import TransferError, pack

NODE_LOSS = ("retry", "fail")
BUILDS = ("local", "ray")
DEFAULT_CPU_RESOURCE = "cuda_agent_slot"
CLIENT_MARGIN_S = 60.0  # past a job's own timeout, how long a silent slot is waited for

class NodeLostError(JobError):
    """A job whose node (or slot actor) was lost: reason ``node_lost``. It says nothing about
    the candidate, so it counts as an infrastructure failure (redone when a run resumes)."""

    def __init__(self, message: str, *, job_id: str = "", device: str = "", seconds: float = 0.0, details: str = ""):
        super().__init__("node_lost", message, job_id=job_id, device=device, seconds=seconds, details=details)

    @property
    def failure(self) -> FailureCategory:
        return getattr(FailureCategory, "INFRA_ERROR", FailureCategory.CRASH)

    def __reduce__(self):
        return (_rebuild_node_lost, (self.message, self.job_id, self.device, self.seconds, self.details))


def _rebuild_node_lost(message, job_id, device, seconds, details) -> NodeLostError:
    return NodeLostError(message, job_id=job_id, device=device, seconds=seconds, details=details)


@dataclass
class RayExecutorOptions:
    # "auto" (the cluster of RAY_ADDRESS or one started on this machine with `ray start`),
    # "host:port" (its head), "ray://host:10001" (Ray Client), "" = start a cluster in this process
    address: str = ""
    namespace: str = "cuda-agent"  # slot actors and the baseline store are named in it: one pool per namespace
    backend: str = "cuda"  # cuda: a slot per GPU; cpu: a slot per unit of slot_resource, jobs on the CPU
    slot_resource: str = ""  # "" = GPU (cuda) or cuda_agent_slot (cpu); a custom resource caps the slots per node
    detached: bool = True  # slot actors outlive this client and serve every client (false: they end with it)
    timeout: float = 180.0  # default per-job timeout in seconds (jobs may set their own)
    pool: dict = field(default_factory=dict)  # options of each node's one-slot local/cpu executor
    node_loss: str = "retry"  # retry | fail: a job whose node left the cluster
    retries: int = 1  # with node_loss retry: how many more runs on other nodes
    builds: str = "local"  # local (the service's own compile worker) | ray (CPU tasks of the cluster)
    build_resource: str = ""  # a custom resource build tasks need (e.g. cuda_agent_build); "" = any node's CPUs
    build_cpus: float = 1.0  # CPUs a build task takes
    baseline_cache_dir: str = ""  # the cluster's baseline cache on the head node ("" = its default folder)
    work_root: str = ""  # on each node: where job copies and the baseline mirror live ("" = its temp folder)
    start_timeout: float = 120.0  # waiting for the slot actors when the pool starts
    max_transfer_mb: int = 256  # largest workspace a job may carry
    node_ip_address: str = ""  # this process's address when it runs on a node of the cluster
    local_slots: int = 0  # address "": CPU slots of the cluster started here (cpu backend; 0 = 1)
    refresh_seconds: float = 5.0  # how often new and lost nodes are looked for


@dataclass
class RayJobRecord(JobRecord):
    """A :class:`JobRecord` with where the job ran on the cluster."""

    node_ip: str = ""
    node_id: str = ""
    attempts: int = 0  # slots the job was started on (more than one after a node loss)
    lost_on: list = field(default_factory=list)  # slots lost while they held the job
    slot_record: dict = field(default_factory=dict)  # what the slot measured (wall clock, baselines)


@dataclass
class _Slot:
    name: str
    handle: Any
    node_id: str
    node_ip: str
    index: int
    info_ref: Any = None
    info: dict | None = None
    failed: str = ""
    dead: bool = False
    busy_with: Any = None  # the _Entry this client has on it
    backoff: float = 0.0
    backoff_until: float = 0.0
    jobs: int = 0

    @property
    def label(self) -> str:
        return (self.info or {}).get("label") or f"{self.node_ip}/{self.index}"


@dataclass
class _Entry:
    key: tuple
    job: Job
    future: Future
    record: RayJobRecord
    blob: bytes | None  # the workspace, packed at submit time
    workspace: str
    payload: Any = None  # the blob in Ray's object store, put there when the job first goes to a slot
    running: bool = False
    avoid: set = field(default_factory=set)  # node ids lost while they held this job
    slot: _Slot | None = None
    deadline: float | None = None
    killed_for_timeout: bool = False

    def __lt__(self, other: "_Entry") -> bool:
        return self.key < other.key


class RayExecutor(Executor):
    name = "ray"
    description = ("GPU pool of a Ray cluster: a slot actor per GPU running jobs through a one-slot local pool, "
                   "one job per GPU across every client; builds as CPU tasks.")
    Options = RayExecutorOptions

    def __init__(self, options=None):
        super().__init__(options)
        o = self.options
        if o.backend not in ("cuda", "cpu"):
            raise ConfigError(f"executor ray: backend must be cuda or cpu, got {o.backend!r}")
        if o.node_loss not in NODE_LOSS:
            raise ConfigError(f"executor ray: node_loss must be one of {', '.join(NODE_LOSS)}, got {o.node_loss!r}")
        if o.builds not in BUILDS:
            raise ConfigError(f"executor ray: builds must be one of {', '.join(BUILDS)}, got {o.builds!r}")
        if o.retries < 0 or o.timeout < 0:
            raise ConfigError("executor ray: retries and timeout must be >= 0")
        self.resource = o.slot_resource or ("GPU" if o.backend == "cuda" else DEFAULT_CPU_RESOURCE)
        if o.backend == "cpu" and self.resource == "GPU":
            raise ConfigError("executor ray: the cpu backend counts slots in a custom resource "
                              "(slot_resource, e.g. cuda_agent_slot), not GPU")
        self.backend = o.backend
        self.pool_options = self._check_pool_options(dict(o.pool or {}))
        self.client_id = f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._cond = threading.Condition(threading.RLock())
        self._heap: list[_Entry] = []
        self._inflight: dict[Any, _Entry] = {}
        self._slots: dict[str, _Slot] = {}
        self._ray: Any = None
        self._store: Any = None
        self._builds: Any = None
        self._thread: threading.Thread | None = None
        self._started = False
        self._closed = False
        self._last_refresh = 0.0
        self.records: list[RayJobRecord] = []
        self.counts: dict[str, int] = {}
        self.busy_answers = 0  # times a slot answered busy (another client's job, or its turn)
        self.warnings: list[str] = []

    # -- configuration --------------------------------------------------------------------

    def _check_pool_options(self, pool: dict) -> dict:
        """The node pool's options, checked here against the local/cpu executor's schema."""
        from cuda_agent.sandbox.executors.local import CpuExecutor, LocalExecutor
        from cuda_agent.sandbox.judge.tasks import build_options

        cls = LocalExecutor if self.options.backend == "cuda" else CpuExecutor
        for key in ("devices", "device_count", "workers"):
            if key in pool:
                raise ConfigError(f"executor ray: pool.{key} is set by the cluster (a slot per GPU); remove it")
        pool.setdefault("timeout", self.options.timeout)
        try:
            build_options(cls.Options, pool)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"executor ray: pool: {exc}") from None
        return pool

    def slot_spec(self, index: int) -> dict:
        return {"namespace": self.options.namespace, "backend": self.backend, "index": index,
                "gpu": self.backend == "cuda", "pool": self.pool_options, "work_root": self.options.work_root}

    # -- starting -------------------------------------------------------------------------

    def start(self) -> "RayExecutor":
        """Connect, find or start the slot actors and the baseline store, start dispatching."""
        with self._cond:
            if self._started:
                return self
            if self._closed:
                raise JobError("closed", f"{self.name}: the executor is closed")
            o = self.options
            local_res = None
            if not o.address and self.resource != "GPU":
                local_res = {self.resource: max(1, o.local_slots)}
            self._ray = cluster.connect(o.address, o.namespace, o.node_ip_address, local_res)
            self._started = True
        try:
            self._store = cluster.store_actor(self._ray, o.namespace, o.baseline_cache_dir)
            self._refresh(force=True)
            self._wait_slots(o.start_timeout)
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._loop, name="ray-executor-dispatch", daemon=True)
        self._thread.start()
        return self

    def _wait_slots(self, timeout: float) -> None:
        """Until every slot found answers (or one does and the others keep silent 5 s more)."""
        ray = self._ray
        t0 = time.monotonic()
        first_ready = None
        while True:
            with self._cond:
                slots = list(self._slots.values())
            pending = [s.info_ref for s in slots if s.info is None and not s.failed and s.info_ref is not None]
            if pending:
                done, _ = ray.wait(pending, num_returns=len(pending), timeout=0.2)
                for ref in done:
                    self._slot_answered(ref)
            with self._cond:
                ready = [s for s in self._slots.values() if s.info is not None]
                waiting = [s for s in self._slots.values() if s.info is None and not s.failed]
                failed = [s for s in self._slots.values() if s.failed]
            now = time.monotonic()
            if ready and first_ready is None:
                first_ready = now
            if ready and (not waiting or now - first_ready > 5.0):
                return
            if not waiting:
                if failed:
                    raise ConfigError(f"executor ray: no slot could start: {failed[0].label}: {failed[0].failed}")
                raise ConfigError(self._no_slots_message())
            if now - t0 > timeout:
                raise ConfigError(
                    f"executor ray: no slot actor started within {format_seconds(timeout)} "
                    f"({len(waiting)} waiting for a free {self.resource}: other work holds them?)")

    def _no_slots_message(self) -> str:
        seen = sorted({k for n in cluster.alive_nodes(self._ray) for k in (n.get("Resources") or {})
                       if not k.startswith("node:")})
        how = ("start nodes with GPUs" if self.resource == "GPU" else
               f"start nodes with --resources '{{\"{self.resource}\": N}}'")
        return (f"executor ray: no node of the cluster offers {self.resource} for slots ({how}); "
                f"resources seen: {', '.join(seen) or 'none'}")

    def _refresh(self, force: bool = False) -> None:
        """Add slots of new nodes, drop slots of nodes gone."""
        now = time.monotonic()
        if not force and now - self._last_refresh < self.options.refresh_seconds:
            return
        self._last_refresh = now
        ray = self._ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from .slots import SlotActor

        nodes = cluster.alive_nodes(ray)
        alive = {n["NodeID"] for n in nodes}
        cls = ray.remote(SlotActor)
        with self._cond:
            for s in list(self._slots.values()):
                if s.node_id not in alive or (s.dead and not s.failed):  # a slot that failed to start stays failed
                    if s.busy_with is None:
                        del self._slots[s.name]
            for n in nodes:
                for i in range(cluster.node_slots(n, self.backend, self.resource)):
                    name = cluster.slot_name(n["NodeID"], i)
                    if name in self._slots:
                        continue
                    opts: dict[str, Any] = dict(
                        name=name, namespace=self.options.namespace, get_if_exists=True, num_cpus=0,
                        max_restarts=0, max_concurrency=16,
                        scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                    if self.options.detached:
                        opts["lifetime"] = "detached"
                    if self.backend == "cuda":
                        opts["num_gpus"] = 1
                    if self.resource != "GPU":
                        opts["resources"] = {self.resource: 1}
                    handle = cls.options(**opts).remote(self.slot_spec(i))
                    s = _Slot(name=name, handle=handle, node_id=n["NodeID"], node_ip=n.get("NodeManagerAddress", "?"),
                              index=i, info_ref=handle.info.remote())
                    self._slots[name] = s

    def _slot_answered(self, ref: Any) -> None:
        ray = self._ray
        with self._cond:
            slot = next((s for s in self._slots.values() if s.info_ref is ref), None)
        if slot is None:
            return
        try:
            info = ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - the actor could not start here
            slot.failed = _first_line(exc)
            slot.dead = True
            return
        slot.info = info
        slot.info_ref = None
        if info.get("spec_hash") != spec_hash(self.slot_spec(slot.index)):
            self.warnings.append(f"slot {slot.label} was started by another client with other pool options; "
                                 "its options hold until `cuda-agent ray down`")

    # -- the Executor interface -------------------------------------------------------------

    @property
    def devices(self) -> list[str]:
        """Labels of the slots that answered (``ip/gpuN`` or ``ip/cpuN``); starts the pool."""
        self.start()
        with self._cond:
            return [s.label for s in self._slots.values() if s.info is not None and not s.dead]

    def submit(self, job: Job) -> Future:
        if not isinstance(job, Job):
            raise JobError("invalid", f"submit() takes a Job, got {type(job).__name__}")
        self.start()
        fut: Future = Future()
        record = RayJobRecord(job_id=job.id, kind=job.kind, label=job.label, submitted=time.monotonic())
        fut.job = job  # type: ignore[attr-defined]
        fut.record = record  # type: ignore[attr-defined]
        workspace = job.kwargs.get("workspace")
        blob = None
        if isinstance(workspace, (str, os.PathLike)) and os.path.isdir(workspace):
            try:  # read now: the job judges the files as they are when it is submitted
                blob = pack(workspace, int(self.options.max_transfer_mb) << 20)
            except (TransferError, OSError) as exc:
                record.status, record.reason = "error", "invalid"
                fut.set_exception(JobError("invalid", f"the job's workspace cannot travel: {exc}", job_id=job.id))
                return fut
        entry = _Entry(key=job.sort_key(), job=job, future=fut, record=record, blob=blob,
                       workspace=str(workspace) if blob is not None else "")
        with self._cond:
            if self._closed:
                raise JobError("closed", f"{self.name}: the executor is closed", job_id=job.id)
            heapq.heappush(self._heap, entry)
            self.records.append(record)
            if len(self.records) > 10000:
                del self.records[:-10000]
            self._cond.notify_all()
        return fut

    def run(self, job: Job) -> Any:
        """Submit and wait: the job's result, or a raised :class:`JobError`."""
        return self.submit(job).result()

    def build_executor(self) -> Any:
        """With ``builds: ray``, an executor whose compile jobs run as CPU tasks of the cluster."""
        if self.options.builds != "ray":
            return None
        self.start()
        with self._cond:
            if self._builds is None:
                from .builds import RayBuildExecutor

                o = self.options
                self._builds = RayBuildExecutor(self._ray, cpus=o.build_cpus, resource=o.build_resource,
                                                retries=o.retries if o.node_loss == "retry" else 0,
                                                max_bytes=int(o.max_transfer_mb) << 20)
            return self._builds

    def stats(self) -> dict:
        with self._cond:
            slots = list(self._slots.values())
            return {
                "devices": [s.label for s in slots if s.info is not None and not s.dead],
                "queued": len(self._heap),
                "running": [s.label for s in slots if s.busy_with is not None],
                "jobs_per_slot": {s.label: s.jobs for s in slots},
                "nodes": sorted({s.node_ip for s in slots if not s.dead}),
                "results": dict(self.counts),
                "busy_answers": self.busy_answers,
                "started": self._started,
            }

    def slot_table(self) -> list[tuple]:
        """One row per slot, fresh from each actor: label, device, torch, jobs, busy, pid."""
        ray = self.start()._ray
        with self._cond:
            slots = [s for s in self._slots.values() if s.info is not None and not s.dead]
        rows = []
        for s in slots:
            try:
                i = ray.get(s.handle.info.remote(), timeout=30)
            except Exception as exc:  # noqa: BLE001
                rows.append((s.label, "?", "?", "?", _first_line(exc)[:40], "?"))
                continue
            rows.append((i["label"], i["device_model"], i["torch"], i["jobs"], "yes" if i["busy"] else "no", i["pid"]))
        return sorted(rows)

    def store_info(self) -> dict | None:
        """The baseline store's record count and folder (on the head node)."""
        if self._store is None:
            return None
        try:
            return self._ray.get(self._store.info.remote(), timeout=30)
        except Exception:  # noqa: BLE001
            return None

    def queued(self) -> int:
        with self._cond:
            return len(self._heap)

    # -- dispatching --------------------------------------------------------------------------

    def _loop(self) -> None:
        ray = self._ray
        while True:
            with self._cond:
                if self._closed:
                    return
                self._launch()
                refs = list(self._inflight)
                refs += [s.info_ref for s in self._slots.values() if s.info_ref is not None and not s.failed]
                if not refs:
                    self._cond.wait(timeout=self._idle_wait())
            if refs:
                try:
                    done, _ = ray.wait(refs, num_returns=1, timeout=0.02)
                    if done:
                        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                except Exception:  # noqa: BLE001 - the connection is closing (this client, or the process)
                    if self._closed or not ray.is_initialized():
                        return
                    raise
                for ref in done:
                    if ref in self._inflight:
                        self._complete(ref)
                    else:
                        self._slot_answered(ref)
            self._check_deadlines()
            try:
                self._refresh()
            except Exception:  # noqa: BLE001 - the cluster is briefly unreachable: next round
                pass

    def _idle_wait(self) -> float:
        if not self._heap:
            return 0.5
        now = time.monotonic()
        waits = [s.backoff_until - now for s in self._slots.values() if s.busy_with is None and s.info and not s.dead]
        return max(0.005, min(waits, default=0.05))

    def _launch(self) -> None:
        """(lock held) Hand queued jobs to free slots."""
        now = time.monotonic()
        while self._heap:
            free = [s for s in self._slots.values()
                    if s.info is not None and not s.dead and s.busy_with is None and s.backoff_until <= now]
            if not free:
                return
            entry = self._heap[0]
            if not entry.running and entry.future.cancelled():
                heapq.heappop(self._heap)
                entry.record.status = "cancelled"
                continue
            fresh = [s for s in free if s.node_id not in entry.avoid]
            others_alive = any(s.node_id not in entry.avoid and not s.dead and s.info is not None
                               for s in self._slots.values())
            if not fresh and others_alive:
                return  # wait for a slot on a node that has not lost this job
            slot = min(fresh or free, key=lambda s: (s.jobs, s.backoff, s.name))
            heapq.heappop(self._heap)
            if not entry.running:
                if not entry.future.set_running_or_notify_cancel():
                    entry.record.status = "cancelled"
                    continue
                entry.running = True
            job = entry.job
            if entry.blob is not None and entry.payload is None:  # queued jobs keep the object store free
                entry.payload = self._ray.put(entry.blob)
            desc = {"fn": job.fn, "kwargs": job.kwargs, "kind": job.kind, "timeout": job.timeout,
                    "pass_device": job.pass_device, "label": job.label, "id": job.id, "workspace": entry.workspace}
            ref = slot.handle.try_run.remote(self.client_id, desc, [entry.payload])
            entry.record.status, entry.record.device, entry.record.node_ip = "running", slot.label, slot.node_ip
            slot.busy_with = entry
            entry.slot = slot
            timeout = job.timeout if job.timeout is not None else self.options.timeout
            entry.deadline = (now + timeout + self.pool_options.get("start_timeout", 180.0) + CLIENT_MARGIN_S
                              if timeout else None)
            self._inflight[ref] = entry

    def _complete(self, ref: Any) -> None:
        ray = self._ray
        with self._cond:
            entry = self._inflight.pop(ref)
            slot = entry.slot
            if slot is not None:
                slot.busy_with = None
        try:
            out = ray.get(ref)
        except Exception as exc:  # noqa: BLE001
            if _actor_gone(exc):
                self._slot_lost(slot, entry, exc)
            else:
                self._finish(entry, error=JobError("crash", f"the slot {slot.label if slot else '?'} failed: "
                                                   f"{_first_line(exc)}", job_id=entry.job.id,
                                                   device=slot.label if slot else ""))
            return
        if out[0] == "busy":
            with self._cond:
                self.busy_answers += 1
                if slot is not None:
                    slot.backoff = min(max(2 * slot.backoff, 0.02), 0.5)
                    slot.backoff_until = time.monotonic() + slot.backoff
                self._requeue(entry)
            return
        status, value, srec = out
        with self._cond:
            if slot is not None:
                slot.backoff = 0.0
                slot.jobs += 1
        r = entry.record
        r.attempts += 1
        r.device = slot.label if slot else ""
        r.node_ip, r.node_id = srec.get("node_ip", ""), srec.get("node_id", "")
        r.worker_pid, r.run_seconds = srec.get("worker_pid"), srec.get("run_seconds")
        r.slot_record = srec
        if status == "ok":
            self._finish(entry, result=value)
        else:
            self._finish(entry, error=value)

    def _requeue(self, entry: _Entry) -> None:
        """(lock held) Back to its place in the queue (it keeps its priority and age)."""
        entry.slot = None
        entry.deadline = None
        entry.record.status = "queued"
        heapq.heappush(self._heap, entry)
        self._cond.notify_all()

    def _slot_lost(self, slot: _Slot | None, entry: _Entry, exc: BaseException) -> None:
        ray = self._ray
        o = self.options
        text = str(exc)
        node_gone = "node has died" in text or "node is dead" in text
        if slot is not None and not node_gone:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                if not cluster.node_alive(ray, slot.node_id):
                    node_gone = True
                    break
                time.sleep(0.2)
        label = slot.label if slot else "?"
        with self._cond:
            if slot is not None:
                slot.dead = True
                for s in self._slots.values():
                    if node_gone and s.node_id == slot.node_id:
                        s.dead = True
                self._last_refresh = 0.0  # look for replacements now
                entry.avoid.add(slot.node_id)
            entry.record.lost_on.append(label)
            if entry.killed_for_timeout:
                timeout = entry.job.timeout if entry.job.timeout is not None else o.timeout
                self._finish(entry, error=JobError(
                    "timeout", f"timed out after {format_seconds(timeout or 0)}: the slot {label} stopped answering "
                    "and was replaced", job_id=entry.job.id, device=label))
                return
            what = (f"the node {slot.node_ip if slot else '?'} left the cluster while it ran the job (slot {label})"
                    if node_gone else f"the slot actor {label} died while it ran the job ({_first_line(exc)})")
            lost = len(entry.record.lost_on)
            if o.node_loss == "retry" and lost <= o.retries:
                entry.record.attempts += 1
                self._requeue(entry)
                return
        how = ("not retried (executor.options.node_loss=fail)" if o.node_loss == "fail"
               else f"it had been retried {lost - 1} time(s) already (executor.options.retries={o.retries})")
        self._finish(entry, error=NodeLostError(f"{what}; {how}", job_id=entry.job.id, device=label))

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        with self._cond:
            late = [e for e in self._inflight.values() if e.deadline is not None and now > e.deadline
                    and not e.killed_for_timeout]
        for entry in late:
            entry.killed_for_timeout = True
            if entry.slot is not None:
                try:
                    self._ray.kill(entry.slot.handle, no_restart=True)
                except Exception:  # noqa: BLE001
                    pass

    def _finish(self, entry: _Entry, result: Any = None, error: JobError | None = None) -> None:
        entry.blob = entry.payload = None
        r = entry.record
        sr = r.slot_record or {}
        # started/finished on this client's clock: when the slot accepted and ended the job
        r.finished = time.monotonic()
        if sr.get("started_wall") and sr.get("finished_wall"):
            r.started = r.finished - (sr["finished_wall"] - sr["started_wall"])
        with self._cond:
            if error is not None:
                r.status, r.reason = "error", error.reason
                self.counts[error.reason] = self.counts.get(error.reason, 0) + 1
            else:
                r.status = "ok"
                self.counts["ok"] = self.counts.get("ok", 0) + 1
        if entry.future.done():
            return
        if error is not None:
            entry.future.set_exception(error)
        else:
            entry.future.set_result(result)

    # -- ending ---------------------------------------------------------------------------------

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            pending = list(self._heap)
            self._heap.clear()
            inflight = list(self._inflight.values())
            self._inflight.clear()
            started = self._started
            self._cond.notify_all()
        for entry in pending:
            entry.record.status = "cancelled"
            if entry.running or entry.future.set_running_or_notify_cancel():
                if not entry.future.done():
                    entry.future.set_exception(JobError("closed", f"{self.name}: the executor was closed",
                                                        job_id=entry.job.id))
        for entry in inflight:
            if not entry.future.done():
                entry.future.set_exception(JobError("closed", "the executor was closed while the job ran",
                                                    job_id=entry.job.id))
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if started:
            if not self.options.detached:
                for s in list(self._slots.values()):
                    try:
                        self._ray.kill(s.handle, no_restart=True)
                    except Exception:  # noqa: BLE001
                        pass
            cluster.release()

    def shutdown_pool(self) -> int:
        """End every slot actor and the baseline store of this namespace (all clients'); how many."""
        with self._cond:
            if not self._started:
                self._ray = cluster.connect(self.options.address, self.options.namespace, self.options.node_ip_address)
                self._started = True
            for s in self._slots.values():
                s.dead = True
        return cluster.shutdown_pool(self._ray, self.options.namespace, self.backend, self.resource)

    def __enter__(self) -> "RayExecutor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line:
            return f"{type(exc).__name__}: {line}"[:300]
    return type(exc).__name__


def _actor_gone(exc: BaseException) -> bool:
    try:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, (RayActorError, ActorDiedError, ActorUnavailableError))
