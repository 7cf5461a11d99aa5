"""What the profilers share: statistics, iteration budgets, the timing-loop hooks."""

from __future__ import annotations

import gc
import math
import statistics
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from cuda_agent.core.errors import CudaAgentError
from cuda_agent.core.types import Timing

# prepare(iteration, inputs) runs before each timed call, outside the timed region
Prepare = Callable[[int, list], None]


class ProfilerError(CudaAgentError):
    """A profiler cannot run here (no GPU, no ncu, bad options)."""


def summarize(samples_ms: list[float], method: str, keep: int = 200, extra: dict | None = None) -> Timing:
    """Median and relative spread (interquartile range / median) of the samples."""
    if not samples_ms:
        raise ProfilerError(f"{method}: no samples")
    s = sorted(samples_ms)
    med = statistics.median(s)
    if len(s) >= 4:
        q = statistics.quantiles(s, n=4, method="inclusive")
        spread = (q[2] - q[0]) / med if med > 0 else 0.0
    else:
        spread = (s[-1] - s[0]) / med if med > 0 else 0.0
    kept = samples_ms if len(samples_ms) <= keep else samples_ms[:: math.ceil(len(samples_ms) / keep)]
    return Timing(median_ms=med, spread=spread, iterations=len(samples_ms), method=method, samples_ms=[round(x, 6) for x in kept])


def iterations_for(estimate_ms: float, target_ms: float, min_iters: int, max_iters: int) -> int:
    if estimate_ms <= 0:
        return max_iters
    return int(max(min_iters, min(max_iters, math.ceil(target_ms / estimate_ms))))


@contextmanager
def no_gc() -> Iterator[None]:
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def call(fn: Any, args: list) -> Any:
    return fn(*args)
