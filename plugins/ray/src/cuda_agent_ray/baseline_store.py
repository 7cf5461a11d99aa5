"""One baseline cache for the whole cluster: a store actor on the head node and a mirror per node.

Profiling jobs read and write baselines in a folder (:mod:`cuda_agent.sandbox.judge.baselines`:
one JSON record per key, the key covering task, GPU model, torch version, precision
policy and profiler). On a cluster each node has such a folder, the *mirror*, and the
:class:`BaselineStore` actor (named, detached, on the head node) holds the records of
all of them, kept on the head's disk in the same layout, so a restarted store, a
``local`` pool on the head and ``cuda-agent baselines`` there all read the same records.

Around every job that may measure baselines a slot (:mod:`.slots`):

1. copies the records it has not seen yet from the store into its node's mirror;
2. takes the lease of the job's *group* (the task's code, the profiling options, the
   slot's device model and torch version): while one slot measures a group's baselines,
   the other slots with a job of that group wait instead of measuring them too; a group
   whose first job ended well needs no lease any more;
3. runs the job, then sends the records the job wrote to the store and hands the lease back.

A lease whose holder died runs out after its time (the job's timeout and a margin).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import time
from pathlib import Path

STORE_NAME = "cuda-agent-baselines"
RECORD = re.compile(r"^[0-9a-f]{32}\.json$")


def record_files(directory: str | os.PathLike) -> dict[str, Path]:
    """``{key: path}`` of the baseline records in a cache folder (``<key[:2]>/<key>.json``)."""
    out: dict[str, Path] = {}
    d = Path(directory)
    if not d.is_dir():
        return out
    for sub in d.iterdir():
        if len(sub.name) == 2 and sub.is_dir():
            for p in sub.iterdir():
                if RECORD.match(p.name) and p.name.startswith(sub.name):
                    out[p.name[:-5]] = p
    return out


def write_record(directory: str | os.PathLike, key: str, text: str) -> bool:
    """Write one record atomically; False when the folder already holds exactly this text."""
    p = Path(directory) / key[:2] / f"{key}.json"
    try:
        if p.read_text() == text:
            return False
    except OSError:
        pass
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, p)
    return True


def stamp(directory: str | os.PathLike) -> dict[str, tuple[int, int]]:
    """``{key: (mtime_ns, size)}``: what :func:`changed_since` compares against."""
    out = {}
    for key, p in record_files(directory).items():
        try:
            st = p.stat()
        except OSError:
            continue
        out[key] = (st.st_mtime_ns, st.st_size)
    return out


def changed_since(directory: str | os.PathLike, before: dict[str, tuple[int, int]]) -> list[tuple[str, str]]:
    """Records written since ``before`` was taken: ``[(key, text)]``."""
    out = []
    for key, p in record_files(directory).items():
        try:
            st = p.stat()
            if before.get(key) == (st.st_mtime_ns, st.st_size):
                continue
            text = p.read_text()
            json.loads(text)  # a record half written by a killed job is not sent
        except (OSError, ValueError):
            continue
        out.append((key, text))
    return out


def group_key(model_code: str, options: dict, device_model: str, torch_version: str) -> str:
    """The lease group of a profiling job (coarser than, never finer than, a cache key)."""
    blob = json.dumps([hashlib.sha256(model_code.encode()).hexdigest(), options, device_model, torch_version],
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


class BaselineStore:
    """The records of the cluster (an actor; see the module docstring). ``directory`` is a
    folder on the node the actor runs on ("" = that node's default baseline cache folder)."""

    def __init__(self, directory: str = ""):
        if not directory:
            from cuda_agent.sandbox.judge.baselines import default_cache_dir

            directory = str(default_cache_dir())
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._version = 0
        self._records: dict[str, tuple[int, str]] = {}
        for key, p in record_files(self.dir).items():
            try:
                text = p.read_text()
                json.loads(text)
            except (OSError, ValueError):
                continue
            self._version += 1
            self._records[key] = (self._version, text)
        self._leases: dict[str, tuple[str, float]] = {}
        self._done: set[str] = set()
        self.puts = 0
        try:  # names the nodes' mirrors of this store (a new store: fresh mirrors)
            import ray

            self.id = ray.get_runtime_context().get_actor_id() or ""
        except Exception:  # noqa: BLE001 - outside an actor
            self.id = ""
        self.id = self.id or hashlib.sha256(str(self.dir).encode()).hexdigest()

    def info(self) -> dict:
        with self._lock:
            return {"id": self.id, "dir": str(self.dir), "records": len(self._records), "version": self._version,
                    "leases": len(self._leases), "groups_done": len(self._done), "puts": self.puts,
                    "pid": os.getpid()}

    def since(self, version: int) -> tuple[int, list[tuple[str, str]]]:
        """Records newer than ``version``, and the version to ask from next time."""
        with self._lock:
            items = [(k, t) for k, (v, t) in self._records.items() if v > version]
            return self._version, items

    def put(self, items: list[tuple[str, str]]) -> int:
        """Keep records sent by a slot (also on the head's disk); how many were new or changed."""
        n = 0
        with self._lock:
            for key, text in items:
                if not RECORD.match(f"{key}.json"):
                    continue
                old = self._records.get(key)
                if old is not None and old[1] == text:
                    continue
                write_record(self.dir, key, text)
                self._version += 1
                self._records[key] = (self._version, text)
                n += 1
            self.puts += n
        return n

    def lease(self, group: str, holder: str, ttl: float) -> str:
        """``done`` (the group needs no lease), ``granted`` or ``wait``."""
        now = time.monotonic()
        with self._lock:
            if group in self._done:
                return "done"
            cur = self._leases.get(group)
            if cur is None or cur[0] == holder or cur[1] < now:
                self._leases[group] = (holder, now + max(1.0, ttl))
                return "granted"
            return "wait"

    def release(self, group: str, holder: str, done: bool) -> None:
        with self._lock:
            cur = self._leases.get(group)
            if cur is not None and cur[0] == holder:
                del self._leases[group]
            if done:
                self._done.add(group)
