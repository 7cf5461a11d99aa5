"""The ``torch.compile`` baseline: compile the reference, warm it up, time it.

The compiled model is called on every input set it will be timed on until a pass compiles
nothing new, so that compilation and guard-driven recompiles stay out of the timed calls.
Dynamo's compiles during warm-up and during timing are counted and recorded
(``compile_frames_warmup``, ``compile_recompiles_during_timing``); a timing that saw a
recompile is taken again once (``compile_retimed``). Compilation holds the host's quiet
lock exclusively (:mod:`cuda_agent.sandbox.isolation.hostlock`).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from cuda_agent.core.types import Timing


def dynamo_frames() -> int:
    """Frames dynamo has compiled in this process so far (first compiles and recompiles)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["frames"]["total"])
    except Exception:  # pragma: no cover - a torch without these counters
        return 0


def compile_model(model: Any, mode: str = "default") -> Any:
    import torch

    if mode in ("", "default", None):
        return torch.compile(model)
    return torch.compile(model, mode=mode)


def warm_compiled(cm: Any, input_sets: list, device: Any, max_rounds: int = 3) -> tuple[int, int]:
    """Call the compiled model on every input set until a pass compiles nothing new.

    Returns (dynamo frames compiled, passes made)."""
    import torch

    start = dynamo_frames()
    rounds = 0
    with torch.no_grad():
        for rounds in range(1, max_rounds + 1):
            before = dynamo_frames()
            for args in input_sets:
                cm(*args)
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize(device)
            if dynamo_frames() == before and rounds > 1:
                break
    return dynamo_frames() - start, rounds


def time_model(model: Any, input_sets: list, device: Any, profiler: Any, prepare: Any = None,
               max_spread: float = 0.0, attempts: int = 1) -> Timing:
    import torch

    from ..profilers.base import time_stably

    def fn(*args):
        return model(*args)

    with torch.no_grad():
        return time_stably(profiler, fn, input_sets, device, prepare, max_spread, attempts)


def compiled_timing(model: Any, input_sets: list, device: Any, profiler: Any, configured: Any,
                    compile_mode: str = "default", prepare: Callable | None = None, max_spread: float = 0.0,
                    attempts: int = 1) -> tuple[Timing | None, dict]:
    """(timing of ``torch.compile(model)``, what the record says of it). ``profiler`` is the
    mode the task's eager baseline was timed in, ``configured`` the profiler asked for: a
    compiled model that cannot be timed in the steadier mode is timed in the configured one
    (``compile_timing_mode``). A model that fails under ``torch.compile`` has no timing and
    ``compile_error`` says why."""
    from ...isolation import hostlock

    info: dict[str, Any] = {}
    comp = None
    try:
        with hostlock.cpu_heavy() as waited:
            t0 = time.perf_counter()
            cm = compile_model(model, compile_mode)
            frames, rounds = warm_compiled(cm, input_sets, device)
            info["compile_seconds"] = round(time.perf_counter() - t0, 2)
        if waited > 0.05:
            info["compile_waited_seconds"] = round(waited, 2)
        info["compile_frames_warmup"] = frames
        before = dynamo_frames()
        try:
            comp = time_model(cm, input_sets, device, profiler, prepare, max_spread, attempts)
        except Exception as exc:
            if profiler is configured:
                raise
            # the compiled model cannot be captured: its own timing in the configured mode
            info["compile_timing_mode"] = f"{configured.method_name()} ({type(exc).__name__} in the steadier mode)"
            profiler = configured
            comp = time_model(cm, input_sets, device, profiler, prepare, max_spread, attempts)
        recompiles = dynamo_frames() - before
        info["compile_recompiles_during_timing"] = recompiles
        if recompiles:  # a guard failed inside the timed loop: time again, now compiled
            before = dynamo_frames()
            comp = time_model(cm, input_sets, device, profiler, prepare, max_spread, attempts)
            info["compile_retimed"] = True
            info["compile_recompiles_during_timing"] = dynamo_frames() - before
    except Exception as exc:  # the task fails under torch.compile: no compile baseline
        info["compile_error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
    return comp, info
