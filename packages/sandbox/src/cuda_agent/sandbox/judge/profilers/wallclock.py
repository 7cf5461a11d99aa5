"""Wall-clock profiler for the CPU backend: the host clock around each call, read in the
judge's compiled timing loop (:mod:`cuda_agent.sandbox.judge.native`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


from .. import native
from .base import After, Prepare, ProfilerError, TimingRun, TwoPhaseProfiler, no_gc, past_give_up


class WallclockProfiler(TwoPhaseProfiler):
    name = "wallclock"
    backend = "cpu"
    description = "CPU wall-clock time per call (compiled loop, CLOCK_MONOTONIC): warm-up, rotated inputs, optional cache flush, median and spread"

    @dataclass
    class Options:
        warmup_iters: int = 2
        warmup_ms: float = 20.0
        target_ms: float = 200.0  # total timed time to reach
        min_iters: int = 5
        max_iters: int = 1000
        flush_bytes: int = 0  # >0: write this many bytes between calls to evict CPU caches
        keep_samples: int = 200
        give_up_ms: float = 0.0  # >0: the warm-up stops once two calls in a row each take longer

    def begin(self, fn: Any, input_sets: list, device: Any = None) -> TimingRun:
        """Warm-up (and a first estimate of one call), timed by the compiled loop's clock."""
        o = self.options
        if not input_sets:
            raise ProfilerError("wallclock: no input sets")
        mod = native.timing()
        calls = [lambda a=args: fn(*a) for args in input_sets]
        k = len(calls)
        i = 0
        t_start = mod.host_ms()
        times: list[float] = []
        while i < o.warmup_iters or mod.host_ms() - t_start < o.warmup_ms:
            off = i % k
            times.append(mod.run_loop(calls[off:] + calls[:off], 1)[1][0])
            i += 1
            if past_give_up(times, o.give_up_ms):  # hopeless: timed no further
                break
            if i >= 10 * max(o.warmup_iters, 1) and mod.host_ms() - t_start >= o.warmup_ms / 4:
                break
        # the median of the latest calls: one call descheduled on a busy host is not the estimate
        recent = sorted(times[-5:])
        return TimingRun(calls=calls, input_sets=input_sets, estimate_ms=recent[len(recent) // 2],
                         warmup_ms=mod.host_ms() - t_start, method=self.name)

    def loop(self, run: TimingRun, n: int, prepare: Prepare | None = None,
             after: After | None = None) -> tuple[list[float], dict]:
        """The ``n`` timed calls in the compiled loop (host clock per call)."""
        o = self.options
        sets, k = run.input_sets, len(run.calls)
        flush = None
        if o.flush_bytes > 0:
            import torch

            flush = torch.empty(o.flush_bytes, dtype=torch.uint8)

        def prep(j: int) -> None:
            if prepare is not None:
                prepare(j, sets[j % k])
            if flush is not None:
                flush.fill_(j & 0xFF)

        with no_gc():
            _, host_ms = native.timing().run_loop(run.calls, n, prepare=prep if prepare or flush is not None else None,
                                                  after=after)
        return list(host_ms), {}
