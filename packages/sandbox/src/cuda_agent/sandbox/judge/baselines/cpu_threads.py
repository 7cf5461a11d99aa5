"""One explicit torch/OpenMP thread count for every timing on the CPU backend.

Eager PyTorch and inductor's C++ kernels both run on OpenMP threads but fork and join them
differently (an eager element-wise operator stays on one thread below a grain of 32K
elements, an inductor kernel forks its team at every call; an eager chain of N operators
forks N times where the fused kernel forks once). On a host whose cores are shared, each
join can wait a scheduler slice for a thread that is not running, so with several threads a
timing measures the scheduler, penalising whichever side joins more often. So the eager
baseline, ``torch.compile`` (its code generation included: inductor sizes its loops by the
thread count) and the candidate all run under ``cpu_threads`` (default 1; 0 keeps torch's
default), which is part of the cache key and of the record. See docs/architecture.md,
"Baselines on the CPU", for the measurements behind this.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator


def is_cpu(device: Any) -> bool:
    return str(device).startswith("cpu")


def threads_for(device: Any, cpu_threads: int | None) -> int | None:
    """The thread count timings on ``device`` run with (None: not set, a GPU device)."""
    if not is_cpu(device):
        return None
    n = int(cpu_threads or 0)
    if n > 0:
        return n
    import torch

    return torch.get_num_threads()


@contextmanager
def timing_threads(device: Any, cpu_threads: int | None) -> Iterator[int | None]:
    """Run the block with ``cpu_threads`` torch/OpenMP threads on the CPU (restored after).

    ``torch.set_num_threads`` sets OpenMP's thread count for this thread, which eager
    operators, inductor's generated kernels and a candidate's ``#pragma omp`` loops all read."""
    n = threads_for(device, cpu_threads)
    if n is None:
        yield None
        return
    import torch

    before = torch.get_num_threads()
    if n != before:
        torch.set_num_threads(n)
    try:
        yield n
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
