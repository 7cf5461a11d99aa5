"""What the profilers share: statistics, iteration budgets, the timing-loop hooks."""

from __future__ import annotations

import gc
import math
import statistics
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from cuda_agent.core.errors import CudaAgentError
from cuda_agent.core.interfaces import Profiler
from cuda_agent.core.types import Timing

# prepare(iteration, inputs) runs before each timed call, outside the timed region
Prepare = Callable[[int, list], None]
# after(iteration, output) runs after each timed call, outside the timed region
After = Callable[[int, Any], None]


@dataclass
class TimingRun:
    """A timing between its two halves (``Profiler.begin`` and ``Profiler.loop``): what is
    called (one zero-argument call per input set), the warm-up's estimate of one call and
    its length, the method name, and the profiler's own state."""

    calls: list
    input_sets: list
    estimate_ms: float
    warmup_ms: float
    method: str
    state: dict = field(default_factory=dict)


class ProfilerError(CudaAgentError):
    """A profiler cannot run here (no GPU, no ncu, bad options)."""


class TwoPhaseProfiler(Profiler):
    """A profiler whose timing comes in two halves, so that a judge can drive them one by one
    (see :mod:`cuda_agent.sandbox.judge.timing`): :meth:`begin` (warm-up; returns a
    :class:`TimingRun`), :meth:`loop` (``n`` timed calls, ``prepare``/``after`` around each,
    outside the timed region) and :meth:`finish` (the samples summarised). Its options have
    ``target_ms``, ``min_iters`` and ``max_iters``."""

    def time(self, fn: Any, input_sets: list, device: Any = None, prepare: Prepare | None = None,
             after: After | None = None) -> Timing:
        run = self.begin(fn, input_sets, device)
        samples, info = self.loop(run, self.iterations(run.estimate_ms), prepare, after)
        return self.finish(samples, run.method, run.warmup_ms, info)

    def iterations(self, estimate_ms: float) -> int:
        o = self.options
        return iterations_for(estimate_ms, o.target_ms, o.min_iters, o.max_iters)

    def finish(self, samples: list[float], method: str, warmup_ms: float, info: dict | None = None) -> Timing:
        timing = summarize(samples, method, self.options.keep_samples)
        timing.warmup_ms = round(warmup_ms, 1)
        return timing

    def begin(self, fn: Any, input_sets: list, device: Any = None) -> "TimingRun":
        raise NotImplementedError

    def loop(self, run: "TimingRun", n: int, prepare: Prepare | None = None,
             after: After | None = None) -> tuple[list[float], dict]:
        raise NotImplementedError


def relative_spread(xs: list[float]) -> float:
    """Interquartile range over median (the range, for fewer than four values)."""
    s = sorted(xs)
    med = statistics.median(s)
    if med <= 0:
        return 0.0
    if len(s) >= 4:
        q = statistics.quantiles(s, n=4, method="inclusive")
        return (q[2] - q[0]) / med
    return (s[-1] - s[0]) / med


def summarize(samples_ms: list[float], method: str, keep: int = 200, extra: dict | None = None) -> Timing:
    """Median and relative spread (interquartile range / median) of the samples."""
    if not samples_ms:
        raise ProfilerError(f"{method}: no samples")
    med = statistics.median(samples_ms)
    spread = relative_spread(samples_ms)
    kept = samples_ms if len(samples_ms) <= keep else samples_ms[:: math.ceil(len(samples_ms) / keep)]
    return Timing(median_ms=med, spread=spread, iterations=len(samples_ms), method=method, samples_ms=[round(x, 6) for x in kept])


def window_calls(times_ms: list[float], window_ms: float) -> int:
    """How many of the latest calls (at least two) make up ``window_ms``."""
    recent = statistics.median(times_ms[-3:]) if times_ms else 0.0
    return max(2, math.ceil(window_ms / recent)) if recent > 0 else 2


def settled(times_ms: list[float], window_ms: float, tol: float) -> bool:
    """Whether per-call times have levelled off: the medians of the last two windows of
    calls (:func:`window_calls`) differ by at most ``tol`` (relative), or by no more than
    twice what the calls' own scatter lets a window's median resolve (each window's relative
    interquartile range over the square root of its size, averaged): a jittery host-bound
    call is not held in warm-up for noise. Under sustained load a GPU's clock can fall for a
    while (power capping), so the first calls are faster than the ones that follow."""
    w = window_calls(times_ms, window_ms)
    if len(times_ms) < 2 * w:
        return False
    older, newer = times_ms[-2 * w:-w], times_ms[-w:]
    a, b = statistics.median(older), statistics.median(newer)
    scatter = (relative_spread(older) + relative_spread(newer)) / 2 / math.sqrt(w)
    return abs(b - a) <= max(tol, 2 * scatter) * max(a, 1e-12)


def past_give_up(times_ms: list[float], give_up_ms: float) -> bool:
    """Whether a warm-up may stop at once: its two latest calls each took longer than
    ``give_up_ms`` (0: never). Such a candidate is timed no further (the judge gives up on a
    call that many times slower than eager); two calls, so that one slow first call (lazy
    initialisation, a compile) never decides it."""
    return give_up_ms > 0 and len(times_ms) >= 2 and min(times_ms[-2:]) > give_up_ms


def iterations_for(estimate_ms: float, target_ms: float, min_iters: int, max_iters: int) -> int:
    if estimate_ms <= 0:
        return max_iters
    return int(max(min_iters, min(max_iters, math.ceil(target_ms / estimate_ms))))


@contextmanager
def no_gc() -> Iterator[None]:
    """The garbage collector off for the block (the youngest generation collected first; a
    full collection of a process that holds torch takes tens of milliseconds)."""
    was = gc.isenabled()
    gc.collect(0)
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def continuous_steps(input_sets: list, prepare: Prepare | None) -> Prepare | None:
    """``prepare`` with steps that run on across several timings, per input set, as in one
    long timing: the v-th visit of set i is step v * k + i, so that inputs changed in place
    keep cycling through their states."""
    if prepare is None:
        return None
    k = max(1, len(input_sets))
    index = {id(a): i for i, a in enumerate(input_sets)}
    visits = [0] * k

    def prepare_next(step: int, args: list) -> None:
        i = index.get(id(args), step % k)
        prepare(visits[i] * k + i, args)
        visits[i] += 1

    return prepare_next


def time_stably(profiler: Any, fn: Any, input_sets: list, device: Any = None, prepare: Prepare | None = None,
                max_spread: float = 0.0, attempts: int = 1, steps: Prepare | None = None) -> Timing:
    """``profiler.time`` inside the host's quiet lock (:mod:`cuda_agent.sandbox.isolation.hostlock`),
    measured again while the spread stays above ``max_spread`` (at most ``attempts``
    measurements in all). The steadiest measurement is kept: the one with the lowest spread,
    so that baselines and candidates, measured under the same rule, are compared by their
    undisturbed medians. ``steps``: a :func:`continuous_steps` wrapper of ``prepare`` to
    continue from (made here when not given)."""
    from ...isolation import hostlock

    if steps is None:
        steps = continuous_steps(input_sets, prepare)
    best: Timing | None = None
    made = 0
    for _ in range(max(1, int(attempts))):
        with hostlock.timing():
            t = profiler.time(fn, input_sets, device, steps) if steps else profiler.time(fn, input_sets, device)
        made += 1
        if best is None or t.spread < best.spread:
            best = t
        if max_spread <= 0 or best.spread <= max_spread:
            break
    assert best is not None
    best.attempts = made
    return best


def time_for_task(profiler: Any, fn: Any, input_sets: list, device: Any = None, prepare: Prepare | None = None,
                  max_spread: float = 0.0, attempts: int = 1) -> tuple[Timing, Any]:
    """Time a task's eager reference and choose the mode for all of the task's timings.

    If the profiler has a steadier mode (``cuda_events``: CUDA-graph replay), the task is
    timed in it when the profiler names a reason up front (:meth:`steadier_reason`: work on
    parallel streams) or when the normal mode stays unsteady (spread above ``max_spread``
    after every attempt of :func:`time_stably`). Returns the timing and the profiler that
    made it: the task's other timings (its compiled baseline, every candidate) use the same
    one, so that a speedup never compares two modes. ``Timing.mode_reason`` says why."""
    steps = continuous_steps(input_sets, prepare)
    alt = steadier_mode(profiler)
    reason = reason_up_front(profiler, fn, input_sets, device)
    t: Timing | None = None
    if not reason:
        t = time_stably(profiler, fn, input_sets, device, prepare, max_spread, attempts, steps)
        if alt is None or max_spread <= 0 or t.spread <= max_spread:
            return t, profiler
        reason = f"unsteady: spread {t.spread:.1%} after {t.attempts} attempt(s)"
    try:
        steady = time_stably(alt, fn, input_sets, device, prepare, max_spread, attempts, steps)
    except Exception:  # the call cannot be captured: keep (or make) a normal timing
        if t is None:
            t = time_stably(profiler, fn, input_sets, device, prepare, max_spread, attempts, steps)
        return t, profiler
    steady.attempts += t.attempts if t is not None else 0
    steady.mode_reason = reason
    return steady, alt


def steadier_mode(profiler: Any) -> Any:
    """The profiler's steadier mode (``Profiler.steadier``), or None."""
    return profiler.steadier() if hasattr(profiler, "steadier") else None


def reason_up_front(profiler: Any, fn: Any, input_sets: list, device: Any = None, strict: bool = False) -> str:
    """Why ``fn`` should be timed in the profiler's steadier mode whatever its spread
    (``Profiler.steadier_reason``); "" when the profiler has no steadier mode, names no
    reason, or its check cannot run (a check that fails decides nothing; ``strict``: its
    error is raised instead)."""
    if steadier_mode(profiler) is None or not hasattr(profiler, "steadier_reason"):
        return ""
    try:
        return profiler.steadier_reason(fn, input_sets, device) or ""
    except Exception:
        if strict:
            raise
        return ""


def profiler_for(profiler: Any, eager: Timing | None) -> Any:
    """The profiler for a task's other timings: the steadier mode when its eager baseline was
    timed in it (see :func:`time_for_task`), else ``profiler`` itself."""
    alt = steadier_mode(profiler)
    if alt is None or eager is None:
        return profiler
    return alt if eager.method.startswith(alt.method_name()) else profiler


def call(fn: Any, args: list) -> Any:
    return fn(*args)
