"""Health checks a worker runs after each job: is the process still fit for another?"""

from __future__ import annotations

import sys


def cuda_health() -> str | None:
    """Synchronize the device and run a tiny kernel: a sticky CUDA error (illegal memory
    access, device-side assert, ...) makes this raise, and the pool then replaces the worker."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    torch.cuda.synchronize()
    x = torch.ones(4, device="cuda")
    if float((x + 1).sum().item()) != 8.0:
        return "the device returned a wrong result for a trivial kernel"
    return None


def no_health() -> str | None:
    return None


def cuda_init(device: str = "cuda:0") -> None:
    """Create the CUDA context ahead of the first job (run by a spare worker while it waits)."""
    torch = sys.modules.get("torch")  # only where the worker preloaded torch
    if torch is not None and torch.cuda.is_available():
        from cuda_agent.sandbox.isolation.hostlock import device_quiet

        with device_quiet():  # never while a timing runs on this GPU
            torch.zeros(1, device=device)
            torch.cuda.synchronize(device)


def warm_inductor(device: str = "") -> None:
    """Import what a baseline's ``torch.compile`` imports first (seconds of CPU), ahead of the
    worker's first job. In a worker only, after its CUDA context: the import initialises CUDA
    (``torch.cuda.is_available()``), which a process that forks workers must never do."""
    if "torch" not in sys.modules:  # only where the worker preloaded torch
        return
    import importlib

    # what scripts/gpu/bench_baseline_cost.py's "preload" imports (triton's runtime on a GPU host)
    for name in ("torch._inductor.compile_fx", "torch._inductor.codegen.triton", "torch._inductor.runtime.triton_heuristics"):
        importlib.import_module(name)


def warm_plugins(device: str = "") -> None:
    """Load the plugin registry now (jobs look up profilers and checks through it)."""
    from cuda_agent.core.plugins import get_plugin_manager

    get_plugin_manager().all_components()
