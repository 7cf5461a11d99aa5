"""The node side of the ``ray`` executor: one slot actor per GPU (or CPU slot).

A :class:`SlotActor` owns a one-slot ``local`` (or ``cpu``) pool on its node, so the
worker processes, per-job timeouts, the handling of crashes, hangs, CUDA errors and
out-of-memory, worker replacement, spares, dropping root rights and the machine-wide
per-GPU lock are the very code the ``local`` executor runs. What the actor adds:

* exclusivity across clients: the actor is named after its node and slot, so every
  client of the cluster reaches the same actor, and :meth:`SlotActor.try_run` takes one
  job at a time; a call while a job runs answers ``busy`` at once and the client tries
  another slot (the client keeps the queue order);
* the job's workspace arrives as bytes (:mod:`.transfer`) and is unpacked into a folder
  of its own, removed after the job; paths in the result are rewritten to the client's;
* baselines shared by the cluster (:mod:`.baseline_store`).

Ray is imported by the actor's process only (this module is loaded on cluster nodes).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from .baseline_store import STORE_NAME, changed_since, group_key, stamp, write_record
from .transfer import TransferError, file_text, rebase, remove_tree, unpack

BASELINE_KINDS = ("profile", "evaluate", "baseline")
LEASE_KINDS = ("profile", "evaluate")
LEASE_MARGIN_S = 30.0
STALE_MIRROR_S = 7 * 86400
WAITER_FRESH_S = 1.5  # a client told busy that has not asked again for this long has stopped waiting


def spec_hash(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"


def _gpu_model(gpu_id: str) -> str:
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader", "-i", gpu_id],
                                 capture_output=True, text=True, timeout=20).stdout.strip()
            if out:
                return out.splitlines()[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return "cuda"


def _profile_options(kind: str, kwargs: dict) -> dict:
    opts = kwargs.get("profile_options") if kind == "evaluate" else kwargs.get("options")
    opts = dict(opts or {}) if isinstance(opts, dict) else {}
    opts.pop("baseline_cache_dir", None)
    return opts


def _point_cache(obj: Any, mirror: str) -> Any:
    """Job arguments with every ``baseline_cache_dir`` set to the node's mirror."""
    if isinstance(obj, dict):
        return {k: (mirror if k == "baseline_cache_dir" else _point_cache(v, mirror)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_point_cache(v, mirror) for v in obj]
    return obj


class SlotActor:
    """One slot: see the module docstring. ``spec`` (a mapping, the same for every client):
    ``namespace``, ``backend`` (cuda|cpu), ``index`` (slot number on the node), ``gpu``
    (the actor holds a Ray GPU), ``pool`` (options of the node's local/cpu executor),
    ``work_root`` (folder for job copies and the baseline mirror; "" = the temp folder)."""

    def __init__(self, spec: dict):
        import ray

        from cuda_agent.sandbox.judge.tasks import build_options

        self.spec = dict(spec)
        self.hash = spec_hash(self.spec)
        self.namespace = spec["namespace"]
        self.backend = spec["backend"]
        ctx = ray.get_runtime_context()
        self.node_id = ctx.get_node_id()
        self.node_ip = ray.util.get_node_ip_address()
        root = Path(spec.get("work_root") or tempfile.gettempdir()) / "cuda-agent-ray" / self.namespace
        self._store: Any = None
        self._store_version = 0
        self._store_lock = threading.Lock()
        store = self._store_handle()
        try:
            store_id = ray.get(store.info.remote(), timeout=60)["id"] if store is not None else "none"
        except Exception:  # noqa: BLE001 - no store: the node's own folder still caches
            store_id = "none"
        # the mirror of this store: records of an earlier store (another cache folder) never leak in
        self.mirror = root / f"baselines-{store_id[:16]}"
        for old in root.glob("baselines-*"):  # mirrors of stores long gone
            try:
                if old != self.mirror and time.time() - old.stat().st_mtime > STALE_MIRROR_S:
                    shutil.rmtree(old, ignore_errors=True)
            except OSError:
                pass
        self.jobs_dir = root / "jobs"
        for d in (self.mirror, self.jobs_dir):
            d.mkdir(parents=True, exist_ok=True)
        os.chmod(self.jobs_dir, 0o755)
        # the pool's workers inherit this: baselines go to the node's mirror of the cluster's cache
        os.environ["CUDA_AGENT_BASELINE_CACHE"] = str(self.mirror)
        pool = dict(spec.get("pool") or {})
        index = int(spec.get("index", 0))
        if self.backend == "cuda":
            from cuda_agent.sandbox.executors.local import LocalExecutor

            ids = [str(g) for g in ray.get_gpu_ids()] if spec.get("gpu", True) else []
            gpu_id = ids[0] if ids else str(index)
            self.label = f"{self.node_ip}/gpu{gpu_id}"
            self.device_model = _gpu_model(gpu_id)
            opts = build_options(LocalExecutor.Options, {**pool, "devices": gpu_id, "device_count": 0})
            self.executor: Any = LocalExecutor(opts)
        else:
            from cuda_agent.sandbox.executors.local import CpuExecutor

            self.label = f"{self.node_ip}/cpu{index}"
            self.device_model = f"cpu:{platform.machine()}:{os.cpu_count()}"
            opts = build_options(CpuExecutor.Options, {**pool, "devices": f"ray-{self.node_ip}-cpu{index}"})
            self.executor = CpuExecutor(opts)
        self.torch = _torch_version()
        self.executor.start()
        self._run_lock = threading.Lock()
        self._wait_lock = threading.Lock()
        self._waiting: dict[str, tuple[float, float]] = {}  # client -> (first busy answer, last one)
        self.jobs = 0
        self.started_at = time.time()

    # -- baselines shared by the cluster -------------------------------------------------

    def _store_handle(self) -> Any:
        import ray

        if self._store is None:
            try:
                self._store = ray.get_actor(STORE_NAME, namespace=self.namespace)
            except ValueError:
                return None
        return self._store

    def _pull(self) -> int:
        import ray

        store = self._store_handle()
        if store is None:
            return 0
        with self._store_lock:
            try:
                version, items = ray.get(store.since.remote(self._store_version), timeout=60)
            except Exception:  # noqa: BLE001 - the store is gone: the node's mirror still works
                self._store = None
                return 0
            n = sum(write_record(self.mirror, key, text) for key, text in items)
            self._store_version = version
            return n

    def _push(self, before: dict) -> int:
        import ray

        store = self._store_handle()
        items = changed_since(self.mirror, before)
        if store is None or not items:
            return 0
        try:
            return int(ray.get(store.put.remote(items), timeout=60))
        except Exception:  # noqa: BLE001
            self._store = None
            return 0

    def _lease(self, group: str, holder: str, ttl: float) -> tuple[str, float]:
        """Wait while another slot measures this group's baselines; (answer, seconds waited)."""
        import ray

        store = self._store_handle()
        t0 = time.monotonic()
        if store is None:
            return "none", 0.0
        while True:
            try:
                answer = ray.get(store.lease.remote(group, holder, ttl), timeout=60)
            except Exception:  # noqa: BLE001
                return "none", time.monotonic() - t0
            if answer != "wait" or time.monotonic() - t0 > ttl:
                return answer, time.monotonic() - t0
            time.sleep(0.2)

    def _release(self, group: str, holder: str, done: bool) -> None:
        import ray

        store = self._store_handle()
        if store is not None:
            try:
                ray.get(store.release.remote(group, holder, done), timeout=60)
            except Exception:  # noqa: BLE001
                pass

    # -- jobs ---------------------------------------------------------------------------

    def info(self) -> dict:
        return {
            "label": self.label,
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "backend": self.backend,
            "device_model": self.device_model,
            "torch": self.torch,
            "pid": os.getpid(),
            "spec_hash": self.hash,
            "busy": self._run_lock.locked(),
            "jobs": self.jobs,
            "pool": self.executor.stats(),
        }

    def _acquire(self, client: str) -> bool:
        """Take the slot for ``client`` if it is free and ``client``'s turn: clients that were
        told ``busy`` and keep asking are served in the order they first asked, so a client
        with a stream of jobs cannot keep a slot from the others."""
        now = time.monotonic()
        with self._wait_lock:
            self._waiting = {c: v for c, v in self._waiting.items() if now - v[1] < WAITER_FRESH_S}
            first = min(self._waiting, key=lambda c: self._waiting[c][0], default=client)
            if first == client and self._run_lock.acquire(blocking=False):
                self._waiting.pop(client, None)
                return True
            self._waiting[client] = (self._waiting.get(client, (now, now))[0], now)
            return False

    def try_run(self, holder: str, job: dict, payload: list) -> tuple:
        """Run ``job`` now, or answer ``("busy",)`` at once when a job of any client runs here
        (or another client has waited longer). Returns ``("ok", result, record)`` or
        ``("error", JobError, record)``."""
        if not self._acquire(holder):
            return ("busy",)
        try:
            return self._run(holder, job, payload)
        finally:
            self._run_lock.release()

    def _run(self, holder: str, job: dict, payload: list) -> tuple:
        import ray

        from cuda_agent.sandbox.executors.job import Job, JobError

        accepted = time.time()
        self.jobs += 1
        kind = job.get("kind", "other")
        kwargs = dict(job.get("kwargs") or {})
        client_root = job.get("workspace") or ""
        blob = ray.get(payload[0]) if payload and payload[0] is not None else None
        tmp: Path | None = None
        node_root = ""
        error: JobError | None = None
        result = None
        record: dict[str, Any] = {"slot": self.label, "node_id": self.node_id, "node_ip": self.node_ip,
                                  "accepted_wall": accepted}
        try:
            if blob is not None:
                tmp = Path(tempfile.mkdtemp(prefix="job-", dir=self.jobs_dir))
                os.chmod(tmp, 0o755)
                try:
                    node_root = str(unpack(blob, tmp / "ws"))
                except TransferError as exc:
                    return ("error", JobError("invalid", f"the job's workspace could not be unpacked on {self.label}: "
                                              f"{exc}", job_id=job.get("id", ""), device=self.label), record)
                kwargs["workspace"] = node_root
            group = None
            if kind in BASELINE_KINDS:
                kwargs = _point_cache(kwargs, str(self.mirror))
                record["baselines_pulled"] = self._pull()
                if kind in LEASE_KINDS and blob is not None:
                    code = file_text(blob, "model.py") or ""
                    group = group_key(code, _profile_options(kind, kwargs), self.device_model, self.torch)
            timeout = job.get("timeout")
            ttl = (timeout or self.executor.options.timeout or 600.0) + LEASE_MARGIN_S
            lease_holder = f"{self.label}:{job.get('id', '')}"
            if group is not None:
                answer, waited = self._lease(group, lease_holder, ttl)
                record["baseline_lease"] = answer
                record["baseline_wait_s"] = round(waited, 3)
                if waited > 0.05 or answer == "granted":  # another slot may have just measured them
                    record["baselines_pulled"] += self._pull()
            before = stamp(self.mirror) if kind in BASELINE_KINDS else {}
            ids = {"id": job["id"]} if job.get("id") else {}
            j = Job(fn=job["fn"], kwargs=kwargs, kind=kind, timeout=timeout, pass_device=job.get("pass_device", True),
                    label=job.get("label", ""), **ids)
            record["started_wall"] = time.time()
            fut = self.executor.submit(j)
            try:
                result = fut.result()
            except JobError as exc:
                error = exc
            record["finished_wall"] = time.time()
            rec = getattr(fut, "record", None)
            if rec is not None:
                record.update(started=rec.started, finished=rec.finished, worker_pid=rec.worker_pid,
                              run_seconds=rec.run_seconds)
            if kind in BASELINE_KINDS:
                record["baselines_pushed"] = self._push(before)
            if group is not None and record.get("baseline_lease") == "granted":
                self._release(group, lease_holder, done=error is None or bool(record["baselines_pushed"]))
        finally:
            if tmp is not None:
                remove_tree(tmp)
        if error is not None:
            err = JobError(error.reason, rebase(error.message, node_root, client_root), job_id=error.job_id,
                           device=self.label, seconds=error.seconds,
                           details=rebase(error.details, node_root, client_root))
            return ("error", err, record)
        return ("ok", rebase(result, node_root, client_root), record)

    def shutdown(self) -> None:
        """End the pool's workers (then the actor may be killed)."""
        self.executor.close()
