"""Wall-clock profiler for the CPU backend: ``time.perf_counter`` around each call."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from cuda_agent.core.interfaces import Profiler
from cuda_agent.core.types import Timing

from .base import Prepare, iterations_for, no_gc, summarize


class WallclockProfiler(Profiler):
    name = "wallclock"
    backend = "cpu"
    description = "CPU wall-clock time per call (perf_counter): warm-up, rotated inputs, optional cache flush, median and spread"

    @dataclass
    class Options:
        warmup_iters: int = 2
        warmup_ms: float = 20.0
        target_ms: float = 200.0  # total timed time to reach
        min_iters: int = 5
        max_iters: int = 1000
        flush_bytes: int = 0  # >0: write this many bytes between calls to evict CPU caches
        keep_samples: int = 200

    def time(self, fn: Any, input_sets: list, device: Any = None, prepare: Prepare | None = None) -> Timing:
        o = self.options
        k = len(input_sets)
        flush = None
        if o.flush_bytes > 0:
            import torch

            flush = torch.empty(o.flush_bytes, dtype=torch.uint8)
        # warm-up (and a first estimate of one call)
        i = 0
        t_start = time.perf_counter()
        last = 0.0
        while i < o.warmup_iters or (time.perf_counter() - t_start) * 1e3 < o.warmup_ms:
            t0 = time.perf_counter()
            fn(*input_sets[i % k])
            last = (time.perf_counter() - t0) * 1e3
            i += 1
            if i >= 10 * max(o.warmup_iters, 1) and (time.perf_counter() - t_start) * 1e3 >= o.warmup_ms / 4:
                break
        n = iterations_for(last, o.target_ms, o.min_iters, o.max_iters)
        samples = []
        with no_gc():
            for j in range(n):
                args = input_sets[j % k]
                if prepare is not None:
                    prepare(j, args)
                if flush is not None:
                    flush.fill_(j & 0xFF)
                t0 = time.perf_counter()
                fn(*args)
                samples.append((time.perf_counter() - t0) * 1e3)
        return summarize(samples, self.name, o.keep_samples)
