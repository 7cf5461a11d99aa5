"""The paper's timing method, kept for comparison: the torch profiler's summed device time.

Calls ``fn`` ``iters`` times under ``torch.profiler.profile`` and sums the device time of
every kernel, memcpy and memset it recorded, divided by the number of calls. Launch
overhead, host work and idle gaps between kernels are invisible to it, and kernels on
several streams add up rather than overlap. One sample is one profiler session;
``repeats`` sessions give the median and spread. Inputs rotate but are not changed between
calls (``prepare`` is ignored: its own kernels would be counted), and no L2 flush is done,
as in the paper's scripts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from cuda_agent.core.interfaces import Profiler
from cuda_agent.core.types import Timing

from .base import Prepare, ProfilerError, iterations_for, summarize


def device_time_us(prof: Any) -> float:
    """Sum of the device-side events' own time (kernels, memcpy, memset), microseconds."""
    from torch.autograd import DeviceType

    total = 0.0
    for evt in prof.events():
        if getattr(evt, "device_type", None) == DeviceType.CUDA:
            total += float(getattr(evt, "device_time", None) or getattr(evt, "cuda_time", 0.0) or 0.0)
    if total == 0.0:
        # older layouts: device time attributed to the CPU ops that launched the kernels
        total = sum(float(getattr(e, "self_device_time_total", 0.0) or 0.0) for e in prof.key_averages())
    return total


class TorchProfilerProfiler(Profiler):
    name = "torch_profiler"
    backend = "cuda"
    description = "torch.profiler summed device time per call (the paper's method; hides launch overhead)"

    @dataclass
    class Options:
        warmup_iters: int = 5
        iters: int = 0  # calls per session; 0: enough for target_ms
        target_ms: float = 100.0  # device time per session when iters is 0
        repeats: int = 5
        max_iters: int = 200
        keep_samples: int = 50

    def time(self, fn: Any, input_sets: list, device: Any = None, prepare: Prepare | None = None) -> Timing:
        import torch
        from torch.profiler import ProfilerActivity, profile

        if not torch.cuda.is_available():
            raise ProfilerError("torch_profiler needs a CUDA GPU; use the wallclock profiler on the CPU backend")
        o = self.options
        dev = torch.device(device if device is not None else "cuda")
        k = len(input_sets)
        est = 0.0
        with torch.cuda.device(dev):
            for i in range(max(1, o.warmup_iters)):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                fn(*input_sets[i % k])
                e1.record()
                torch.cuda.synchronize(dev)
                est = e0.elapsed_time(e1)
            n = o.iters or iterations_for(est, o.target_ms, 3, o.max_iters)
            samples = []
            j = 0
            for _ in range(max(1, o.repeats)):
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(n):
                        fn(*input_sets[j % k])
                        j += 1
                    torch.cuda.synchronize(dev)
                total_us = device_time_us(prof)
                samples.append(total_us / 1e3 / n)
        return summarize(samples, self.name, o.keep_samples)
