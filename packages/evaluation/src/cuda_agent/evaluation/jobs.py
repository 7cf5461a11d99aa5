"""Job functions of the evaluation package, run inside an executor worker.

``baselines_chunk`` measures (or reads from the cache) the eager and ``torch.compile``
baselines of several tasks in one worker process, so torch is imported once and
inductor's compile workers are reused across the chunk. The baseline options are derived
from the profiling options exactly as the profiling job derives them, so the cache keys
match and later profiles of candidates read these records.
"""

from __future__ import annotations

import time
from typing import Any


def _baseline_options(options: dict | None, device: str) -> Any:
    from cuda_agent.sandbox.judge import jobs

    return jobs._baseline_opts(dict(options or {}), device)


def baselines_chunk(tasks: list[dict], device: str, options: dict | None = None) -> list[dict]:
    """Baselines of ``tasks`` (``{"id", "code"}`` each) on ``device``; one row per task."""
    from cuda_agent.sandbox.judge.baselines import cache_for, measure_many

    bopts = _baseline_options(options, device)
    cache = cache_for(bopts.cache_dir or None)
    rows: list[dict] = []
    timing: dict[str, float] = {}
    last = [time.perf_counter()]

    def on_result(task: Any, row: dict) -> None:
        now = time.perf_counter()
        timing[row["task"]] = now - last[0]
        last[0] = now

    from cuda_agent.core.types import Task

    items = [Task(id=t["id"], source="baselines", code=t["code"]) for t in tasks]
    for row in measure_many(items, device, bopts, cache, progress=False, on_result=on_result):
        rows.append(
            {
                "task_id": row.get("task"),
                "eager_ms": row.get("eager_ms"),
                "compile_ms": row.get("compile_ms"),
                "cached": bool(row.get("cached")),
                "error": row.get("error") or row.get("compile_error"),
                "spread": row.get("spread"),  # the larger of the eager and compile spreads
                "timing_mode": row.get("timing_mode"),
                "timed_in": row.get("timed_in"),  # the trusted process or a candidate's (baselines.as_candidate)
                "measured_again_because": row.get("measured_again_because"),  # a cached record replaced
                "seconds": round(timing.get(row.get("task"), 0.0), 2),
                "device": device,
                "cache_dir": str(cache.dir),
            }
        )
    return rows
