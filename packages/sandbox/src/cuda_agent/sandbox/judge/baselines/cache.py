"""The baseline cache: one small JSON record per key, in a folder shared by processes.

A key hashes everything a baseline's times depend on (:func:`key_fields`: the model code
and its init inputs, GPU model, torch version, precision policy, profiler and its options,
compile mode, input sets, seed and, on the CPU, the thread count), so every profile of any
candidate for the same task reads back one measurement. ``BaselineCache.measured`` counts
the real measurements made through a cache object.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from cuda_agent.core.types import Timing

from ..precision import policy_from
from .cpu_threads import is_cpu, threads_for

CACHE_ENV = "CUDA_AGENT_BASELINE_CACHE"


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cuda-agent" / "baselines"


def timing_from(d: dict | None) -> Timing | None:
    if not d:
        return None
    return Timing(**{k: d[k] for k in ("median_ms", "spread", "iterations", "method", "samples_ms", "attempts", "mode_reason",
                                "warmup_ms") if k in d})


class BaselineCache:
    """A folder of JSON records, one per baseline key; safe for concurrent writers."""

    def __init__(self, directory: str | Path | None = None):
        self.dir = Path(directory) if directory else default_cache_dir()
        self.hits = 0
        self.misses = 0
        self.measured = 0  # real measurements done through this cache object
        self._mem: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._by_code: dict[str, list[tuple[str, str, float]]] | None = None  # code hash -> (precision, profiler, eager ms)
        self._scanned_at = 0.0

    @staticmethod
    def key(fields: dict) -> str:
        blob = json.dumps(fields, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:32]

    def path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        with self._lock:
            rec = self._mem.get(key)
            if rec is None:
                p = self.path(key)
                if p.is_file():
                    try:
                        rec = json.loads(p.read_text())
                    except (OSError, ValueError):
                        rec = None
                if rec is not None:
                    self._mem[key] = rec
            if rec is None:
                self.misses += 1
            else:
                self.hits += 1
            return rec

    def put(self, key: str, record: dict) -> None:
        p = self.path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, default=str)
        os.replace(tmp, p)
        with self._lock:
            self._mem[key] = record

    def __len__(self) -> int:
        return sum(1 for _ in self.dir.glob("*/*.json")) if self.dir.is_dir() else 0

    # -- read without torch: what a task's eager time is, for the judge's job timeouts ------

    def eager_ms(self, model_code: str, precision: str = "", profiler: str = "", rescan_s: float = 30.0) -> float | None:
        """The largest eager median (ms) recorded for ``model_code`` (under ``precision``'s
        policy key and ``profiler`` when given), on any GPU; None when none is recorded. Reads
        the records' fields only (no key, so no torch and no reference import); the folder is
        read again on a miss at most every ``rescan_s`` seconds."""
        import time

        code = hashlib.sha256(model_code.encode()).hexdigest()
        with self._lock:
            stale = time.monotonic() - self._scanned_at > rescan_s
            if self._by_code is None or (code not in self._by_code and stale):
                self._by_code = self._scan()
                self._scanned_at = time.monotonic()
            rows = list(self._by_code.get(code, ()))
        want = policy_from(precision).key if precision else ""
        times = [ms for prec, prof, ms in rows if (not want or prec == want) and (not profiler or prof == profiler)]
        return max(times) if times else None

    def _scan(self) -> dict[str, list[tuple[str, str, float]]]:
        out: dict[str, list[tuple[str, str, float]]] = {}
        if not self.dir.is_dir():
            return out
        for p in self.dir.glob("*/*.json"):
            try:
                rec = json.loads(p.read_text())
                f, ms = rec.get("fields") or {}, float((rec.get("eager") or {}).get("median_ms") or 0.0)
            except (OSError, ValueError, TypeError, AttributeError):
                continue
            if isinstance(f, dict) and f.get("code") and ms > 0:
                out.setdefault(str(f["code"]), []).append((str(f.get("precision", "")), str(f.get("profiler", "")), ms))
        return out


_default_caches: dict[str, BaselineCache] = {}


def cache_for(directory: str | Path | None) -> BaselineCache:
    """One BaselineCache object per folder and process (shares the in-memory layer)."""
    d = str(Path(directory) if directory else default_cache_dir())
    if d not in _default_caches:
        _default_caches[d] = BaselineCache(d)
    return _default_caches[d]


# --- keys ---------------------------------------------------------------------------------


def gpu_name(device: Any) -> str:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform

    return f"cpu:{platform.machine()}:{os.cpu_count()}"


def key_fields(model_code: str, init_spec: Any, device: Any, precision: str, profiler: str, profiler_options: dict,
               compile_mode: str = "default", num_input_sets: int = 0, seed: int = 0, cpu_threads: int | None = None,
               perturb_inputs: bool = True) -> dict:
    import torch

    extra = {}
    if is_cpu(device):
        extra["cpu_threads"] = threads_for(device, cpu_threads)
    return {**extra,
        "code": hashlib.sha256(model_code.encode()).hexdigest(),
        "init": init_spec,
        "gpu": gpu_name(device),
        "torch": torch.__version__,
        "precision": policy_from(precision).key,
        "profiler": profiler,
        "profiler_options": profiler_options,
        "compile_mode": compile_mode,
        "input_sets": num_input_sets,
        "seed": seed,
        "perturb_inputs": bool(perturb_inputs),
    }
