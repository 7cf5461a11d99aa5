"""Timing a candidate from the trusted side: what comes back is checked, not believed.

The candidate process times itself (it must call the candidate's forward) with a profiler
plugin whose loop is compiled code (:mod:`.native`). The trusted side drives the timing in
two halves and checks each timed loop:

* **Wall clock.** The trusted process times the whole loop command (``W``) on its own clock.
  Reported times cannot add up to more than ``W`` (refused), and ``W`` should not exceed them
  by more than the loop's own untimed work (making each call's inputs, L2 flush, checksums;
  measured here, before the candidate is loaded, by the same profiler on a call that does
  nothing) plus :data:`WALL_SLACK_RATIO` of the reported time and :data:`WALL_SLACK_MS`. When it
  does, twice in a row, the candidate is timed by the trusted clock: the time its reports
  leave out is charged to its calls, and the metadata (``timing_charged``) says why (rule
  ``timing.wall-clock``). On the CPU backend the job's CPU time plays the trusted clock.
* **Checksums.** Every timed call's output is summed outside the timed region
  (:class:`.rotation.Checksums`: sum of squares, a randomly weighted sum, and where the
  reference holds NaN or Inf a fingerprint of their positions); for :data:`CHECKED_CALLS`
  calls picked here after the loop, the reference is run on the same inputs
  (:class:`.rotation.Rotation`) and the reported numbers must agree within the tolerance
  (rule ``timing.checksum``): skipped, cached, stale or partly computed calls fail.
* **Spot check.** The outputs of the last timed call of every input set come back and are
  compared with the reference like any verification output.

Refusals are for what shows a wrong or skipped result (checksums, spot check) and for
reports no loop can have made; a clock that disagrees only changes the time.

Profilers without the two halves (third-party ones) are timed whole; their reported time
is bounded by ``W`` from above only, and the metadata says so.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import replace
from typing import Any

from cuda_agent.core.types import FailureCategory, Timing

from . import rotation
from .phases import PhaseClock
from .process_flags import sanitized
from .session import Refusal

# unaccounted wall time allowed on a GPU: a share of the reported time and of the loop's own
# work (whose estimate, measured on the trusted side, varies by a few percent), plus a constant
WALL_SLACK_RATIO = 0.1
WALL_SLACK_MS = 5.0
OWN_CALLS = 200  # calls of the null loop measured once the candidate's loop length is known
CPU_SLACK_RATIO = 1.25  # of the reported time per thread
CPU_SLACK_MS = 20.0
# on the CPU backend a loop is lengthened until the job's CPU time spent on its calls (the trusted
# clock there) is this many times the fixed slack, so that the slack cannot hide most of a loop
CPU_MIN_LOOP_MS = 10 * CPU_SLACK_MS
CPU_MAX_CALLS = 100_000
CPU_MAX_LOOP_MS = 2000.0  # a lengthened loop's CPU time, its own work (checksums) included
CHECKED_CALLS = 5
# on the CPU backend the loop's own work measured again after a failed check (a busy host) may
# rise by at most this share of the loop's mean reported call, per call (its fixed part not at
# all): a rise bounded by the own work itself let a report divided by 8 pass on a loaded 2-core
# host, where the own work is several times the kernel (the rise covered what the report left
# out); bounded by the report, a report divided by more than about 1 + 0.25 + OWN_RISE is caught
OWN_RISE = 0.5
FIXED_OWN = ("fixed", "cpu_fixed")  # the own work's per-loop parts; the others are per call
# the reported calls' mean may exceed their median by this share (outliers of an honest
# loop); beyond it the median is raised to mean / (1 + SKEW): the trusted clock bounds the
# calls' sum, so time moved from most calls into a few is still paid for, less at most this
SKEW = 0.03
NULL_CALLS = 30
# the null loop measured once the candidate is warm runs about this long (at least NULL_CALLS
# calls, at most OWN_CALLS and the timed loop's length): a loop whose own work is milliseconds a
# call (an output of GB checksummed) is measured as precisely in fewer calls
OWN_TARGET_MS = 250.0
MODES = ("plain", "sync_each")  # a timed loop's modes, each with its own cost per call
RULE_WALL = "timing.wall-clock"
RULE_CHECKSUM = "timing.checksum"


def give_up_bound(give_up: tuple[float, float, float] | None) -> float:
    """The time per call past which a candidate is timed no further (0: none): more than
    ``factor`` times eager's and more than ``min_ms``, from ``give_up = (eager_ms, factor,
    min_ms)`` (see :meth:`CandidateTimer.time`)."""
    if give_up is None or give_up[0] <= 0 or give_up[1] <= 0:
        return 0.0
    return max(give_up[0] * give_up[1], give_up[2])


def _now_ms() -> float:
    from . import native

    return native.timing().host_ms()


def quick(profiler: Any) -> Any:
    """A copy of ``profiler`` with a short warm-up (for the loop-overhead measurement)."""
    o = getattr(profiler, "options", None)
    fields = getattr(o, "__dataclass_fields__", {})
    change = {k: v for k, v in (("warmup_ms", 2.0), ("settle_ms", 0.0), ("warmup_iters", 2)) if k in fields}
    return type(profiler)(replace(o, **change)) if change else profiler


def loop_overhead_ms(profiler: Any, sets: list, ref_out: Any, device: Any, calls: int = NULL_CALLS,
                     get_inputs: Any = None, full: bool = False, modes: tuple[str, ...] = MODES,
                     wide: bool = False) -> dict:
    """The cost of a timed loop's untimed work, on this side: the profiler's loop over a call
    that returns a ready output (on the CPU a fresh one per call, whose release after the call
    costs what releasing a kernel's output does), with the same making of inputs over the
    timed loop's input ``sets`` (:class:`.rotation.Rotation`, made for each loop as the
    candidate process makes it) and the same checksums (``full``: with the non-finite
    fingerprint; ``wide``: sums of squares in float64), run for a few calls and for ``calls`` calls. Returns ``{"fixed": ms per
    loop, "plain": ms per call, "sync_each": ms per call, "cpu": CPU ms per call, "cpu_fixed":
    CPU ms per loop}`` (``sync_each`` for loops that synchronise every call). ``modes``: which
    of the loop's modes to measure (``plain`` gives the per-loop and CPU figures too)."""
    import torch

    work = [[v.clone() if isinstance(v, torch.Tensor) else v for v in p] for p in sets]
    k = len(sets)
    longest = max((t.numel() for t in rotation._tensors(ref_out)), default=1)

    if torch.device(device).type == "cpu":
        from torch.utils._pytree import tree_map

        def null(*_args: Any) -> Any:  # a fresh, written output, as a kernel returns: releasing
            # it after the call (outside the timed region) is the loop's work too; the
            # reference's values, so that checksums cost what they cost on real outputs (NaN
            # and Inf take the CPU several times longer than zeros)
            return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, ref_out)
    else:
        def null(*_args: Any) -> Any:
            return ref_out

    cpu: list[float] = []
    cpu_fixed: list[float] = []

    def unaccounted(prof: Any, run: Any, n: int) -> float:
        c0, t0 = time.thread_time(), _now_ms()
        seed = secrets.randbits(62)  # made per loop, as in the candidate process
        rot = rotation.Rotation(seed, sets, get_inputs, device)
        rot.prepare()
        checks = rotation.Checksums(rotation.derived(seed, 5), device, full, wide)
        checks.prepare(longest)
        slots = checks.slots(n)

        hooks = [0.0]  # CPU time of the untimed work itself (not the wall samples subtracted from
        # the thread's CPU time: on a busy host a call's wall time exceeds its CPU time)

        def prepare(j: int, _args: Any) -> None:  # over as many sets as the timed loop: the same memory
            c = time.thread_time()
            rot.fill(j, work[j % k])
            hooks[0] += time.thread_time() - c

        def after(j: int, out: Any) -> None:
            c = time.thread_time()
            checks.into(out, slots[j])
            hooks[0] += time.thread_time() - c

        c1, t1 = time.thread_time(), _now_ms()
        samples, _ = prof.loop(run, n, prepare, after)
        slots.reshape(-1).tolist()  # read back, as the candidate process sends them
        wall = _now_ms() - t1
        cpu.append(hooks[0] * 1e3 / n)
        cpu_fixed.append((c1 - c0) * 1e3)
        return max(0.0, wall - sum(samples)) + (t1 - t0)

    prof = quick(profiler)
    run = prof.begin(null, work, device)
    few = max(2, calls // 6)
    unaccounted(prof, run, few)  # first calls of the rotation and checksum paths
    out: dict[str, float] = {}
    for mode in (m for m in MODES if m in modes):
        if mode == "sync_each":
            if not hasattr(prof.options, "sync_each"):
                if "plain" in out:
                    out[mode] = out["plain"]
                    break
            else:
                prof = type(prof)(replace(prof.options, sync_each=True))
        short, long_ = min(unaccounted(prof, run, few) for _ in range(2)), unaccounted(prof, run, calls)
        out[mode] = max(0.0, (long_ - short) / (calls - few))
        if mode == "plain":
            out["fixed"] = max(0.0, short - few * out[mode])
            out["cpu"] = min(cpu)  # CPU time per call of the untimed work, this thread's
            out["cpu_fixed"] = min(cpu_fixed)
    return out


def wall_check(samples: list[float], wall_ms: float, per_call_ms: float, fixed_ms: float = 0.0,
               hidden: bool = True) -> tuple[str, dict]:
    """"" when reported ``samples`` fit the trusted wall clock ``wall_ms``, else why not:
    ``per_call_ms`` and ``fixed_ms`` are the loop's own untimed work per call and per loop;
    ``hidden``: also flag wall time the samples and that work do not account for (the
    candidate is then timed by the trusted clock: ``info["unaccounted_ms"]`` is charged)."""
    total = sum(samples)
    n = len(samples)
    own = n * per_call_ms + fixed_ms
    unaccounted = wall_ms - total - own
    info = {"wall_ms": round(wall_ms, 3), "reported_ms": round(total, 3), "overhead_ms": round(own, 3),
            "unaccounted_ms": round(unaccounted, 3)}
    if total > wall_ms + 1.0:
        info["impossible"] = True
        return (f"the candidate process reported {total:.3f} ms of timed calls in a loop that took {wall_ms:.3f} ms "
                f"(rule {RULE_WALL}: reported times must fit the trusted wall clock)"), info
    if hidden and unaccounted > WALL_SLACK_RATIO * (total + own) + WALL_SLACK_MS:
        return (f"the timed loop took {wall_ms:.3f} ms on the trusted clock, but its {n} calls reported "
                f"{total:.3f} ms and the loop's own work accounts for {own:.3f} ms: "
                f"{unaccounted:.3f} ms are unaccounted for, charged to the calls "
                f"(+{unaccounted / max(1, n):.4g} ms each) (rule {RULE_WALL}: time spent in a call must be "
                f"measured; do not leave work running outside the timed calls)"), info
    return "", info


def cpu_check(samples: list[float], cpu_ms: float, own_cpu_ms: float, threads: int, processes: int,
              wall_ms: float = 0.0, own_floor_ms: float | None = None) -> tuple[str, dict]:
    """"" when the CPU time the job's processes spent in a loop (``cpu_ms``, from the kernel's
    accounting) is covered by the reported calls, else why not. On the CPU backend a call's
    wall time is at least its CPU time per thread, however busy the host is, so the reported
    samples bound the work: a process that spent its CPU time on calls it reported as shorter
    is caught without trusting any clock of its own, and timed by that CPU time over its
    threads (``info["unaccounted_ms"]`` is charged). ``own_cpu_ms``: the loop's own work.

    On a busy host an honest call's wall time (what its samples hold) is its CPU time times
    how long it waited for a core; a caught process is charged the same wait: its calls'
    share of the loop's wall time (``wall_ms``), where that is more than their CPU time, so
    that it is never timed faster than an honest kernel timed beside it.

    ``own_floor_ms``: the smallest estimate of the loop's own work (default ``own_cpu_ms``),
    what a caught process is charged against. Whether a loop is caught is decided with the
    generous estimate (a busy host makes that work cost more CPU time, and an honest kernel
    must not be caught for it); the charge uses the smallest, because a loop whose own work
    is several times the kernel (a small element-wise kernel's checksums and inputs) would
    otherwise lose a third of its calls' time in the estimate's noise and be timed faster
    than the honest kernel."""
    total = sum(samples)
    calls_cpu = cpu_ms - own_cpu_ms
    threads = max(1, threads)
    budget = CPU_SLACK_RATIO * threads * total + CPU_SLACK_MS + 10.0 * processes
    info = {"cpu_ms": round(cpu_ms, 3), "reported_ms": round(total, 3), "overhead_cpu_ms": round(own_cpu_ms, 3),
            "threads": threads}
    if calls_cpu > budget:
        # a process whose reports were caught short is timed by its whole CPU time (how many
        # threads its calls really used is its own report too, so it gets no credit for them)
        # or by its calls' share of the wall time, the longer
        floor = own_cpu_ms if own_floor_ms is None else min(own_cpu_ms, own_floor_ms)
        calls_cpu = max(calls_cpu, cpu_ms - floor)
        calls_wall = wall_ms * calls_cpu / cpu_ms if wall_ms > 0 and cpu_ms > 0 else 0.0
        charge = max(0.0, max(calls_cpu, calls_wall) - total)
        info["unaccounted_ms"] = round(charge, 3)
        info["overhead_cpu_floor_ms"] = round(floor, 3)
        info["calls_wall_share_ms"] = round(calls_wall, 3)
        clock = "that CPU time" if calls_cpu >= calls_wall else f"their share of the loop's wall time, {calls_wall:.1f} ms"
        return (f"the job's processes spent {calls_cpu:.1f} ms of CPU time on {len(samples)} timed calls that "
                f"reported {total:.1f} ms with up to {threads} thread(s): timed by {clock} "
                f"(+{charge / max(1, len(samples)):.4g} ms a call) (rule {RULE_WALL}: a call's time must be "
                f"measured; on the CPU backend calls run with at most cpu_threads threads)"), info
    return "", info


def skew_bounded(samples: list[float], mean: float | None = None) -> tuple[list[float], dict]:
    """``samples`` whose median is at least their mean over ``1 +`` :data:`SKEW` (every sample
    raised by the same amount where it is not), and what was done ({} when nothing).
    ``mean``: the trusted mean per call where it is not the samples' (on the CPU backend the
    job's CPU time per call and thread, less its accounting's slack)."""
    import statistics

    if not samples:
        return samples, {}
    med = statistics.median(samples)
    mean = sum(samples) / len(samples) if mean is None else mean
    floor = mean / (1.0 + SKEW)
    if med >= floor:
        return samples, {}
    raise_by = floor - med
    why = (f"the calls' mean {mean:.4g} ms is {mean / max(med, 1e-12) - 1:.0%} above their median "
           f"{med:.4g} ms (more than {SKEW:.0%}): timed at the mean over {1 + SKEW:g}, {floor:.4g} ms (rule "
           f"{RULE_WALL}: the trusted clock bounds the calls' sum; time moved into a few calls is still paid for)")
    return [x + raise_by for x in samples], {"median_raised_ms": round(raise_by, 6), "why": why}


class CandidateTimer:
    """Drives one candidate's timing in its process (see the module docstring)."""

    def __init__(self, session: Any, ref_model: Any, get_inputs: Any, device: Any, atol: float, rtol: float,
                 timeout: float | None = None):
        self.s = session
        self.ref_model = ref_model
        self.get_inputs = get_inputs
        self.device = device
        self.atol, self.rtol = atol, rtol
        self.timeout = timeout
        self.meta: dict[str, Any] = {}
        self.overhead: dict[str, float] = {}
        self.own_floor: dict[str, float] = {}
        self.set_seeds: list[int] = []
        self._pristine: dict[int, list] = {}
        self._rotations: dict[int, Any] = {}
        self.threads: int | None = None
        self.full = False  # checksums with the non-finite fingerprint (the reference is not finite)
        self.wide = False  # sums of squares in float64 (the reference has elements past rotation.WIDE_ABOVE)
        # where a timing's time goes: warm-up, the loop's own work, timed loops, checksum checks
        self.clock = PhaseClock(self.meta.setdefault("timing_phase_seconds", {}))

    # -- the trusted side's own copies ---------------------------------------------------

    def pristine(self, s: int) -> list:
        from .inputs import draw_inputs

        if s not in self._pristine:
            self._pristine[s] = draw_inputs(self.get_inputs, self.set_seeds[s], self.device).values
        return self._pristine[s]

    def rotation(self, seed: int) -> Any:
        """The inputs of the loop of ``seed`` (the two latest kept: their factor buffers)."""
        if seed not in self._rotations:
            while len(self._rotations) >= 2:
                self._rotations.pop(next(iter(self._rotations)))
            sets = [self.pristine(s) for s in range(len(self.set_seeds))]
            self._rotations[seed] = rotation.Rotation(seed, sets, self.get_inputs, self.device)
        return self._rotations[seed]

    def reference_at(self, seed: int, j: int) -> Any:
        rot = self.rotation(seed)
        x = rot.inputs(j)
        rot.seed_call(j)  # random ops draw what call j drew in the candidate process
        out = self.ref_model(*x)
        from .watchdog import synchronize

        synchronize(self.device)
        return out

    _profiler: Any = None

    def own_calls(self, n: int) -> int:
        """Calls of the null loop measured once the candidate is warm, for a timed loop of
        ``n`` calls (see :data:`OWN_TARGET_MS`)."""
        most = min(n, OWN_CALLS)
        per = self.overhead.get("plain", 0.0)
        if per > 0:
            most = min(most, max(NULL_CALLS, math.ceil(OWN_TARGET_MS / per)))
        return most

    def measure_overhead(self, profiler: Any, keep: Any = None, calls: int = NULL_CALLS,
                         rise_per_call: float = 0.0, modes: tuple[str, ...] = MODES) -> None:
        """The loop's own cost, measured here (``keep``: ``min`` or ``max``, how a new
        measurement is combined with the one before). It is measured before the candidate is
        loaded and again once it is warm, keeping the smaller (another process starting on
        the host inflates either; a candidate can only inflate the second), and measured again
        after a loop that failed the clock check: on the CPU backend keeping the larger (the host
        was busy while the loop ran) but at most ``rise_per_call`` ms a call above the one before,
        on a GPU the smaller (the charge can only grow). ``modes``: the loop modes measured
        (see :func:`loop_overhead_ms`); the others keep their last estimate."""
        if not all(hasattr(profiler, a) for a in ("begin", "loop")):
            return
        from ..isolation import hostlock

        from .draws import all_finite

        self._profiler = profiler
        ref_out = self.reference_at(0, 0)
        if keep is None and not all_finite(ref_out):
            self.full = True  # NaN/Inf in the reference: checksums compare where they are
        if keep is None and rotation.largest_finite(ref_out) > rotation.WIDE_ABOVE:
            self.wide = True  # squares past float32's range: summed in float64
        with hostlock.timing():
            sets = [self.pristine(s) for s in range(len(self.set_seeds))]
            new = loop_overhead_ms(profiler, sets, ref_out, self.device, max(calls, NULL_CALLS), self.get_inputs,
                                   self.full, modes if self.overhead else MODES, self.wide)
        # every measurement's smallest: what a loop caught by the clock check is charged against
        self.own_floor = {**self.own_floor, **{k: min(v, self.own_floor.get(k, v)) for k, v in new.items()}}
        if keep is not None and self.overhead:
            new = {k: keep(v, self.overhead.get(k, v)) for k, v in new.items()}
            if keep is max:  # a busy host's estimate counts up to a bound: past it, the loop is charged
                new = {k: min(v, self.overhead.get(k, v) + (0.0 if k in FIXED_OWN else rise_per_call))
                       for k, v in new.items()}
        self.overhead = {**self.overhead, **new}
        self.meta["loop_overhead_ms"] = {k: round(v, 5) for k, v in self.overhead.items()}

    # -- one timing -------------------------------------------------------------------------

    def time(self, profiler: Any, name: str, options: dict, graph: bool, max_spread: float, attempts: int,
             cpu_threads: int | None, give_up: tuple[float, float, float] | None = None) -> tuple[Timing | None, Refusal | None]:
        """The candidate's timing (or why it was refused). ``give_up``: ``(eager_ms, factor,
        min_ms)``: a candidate whose first calls take more than ``factor`` times eager and more
        than ``min_ms`` each is timed no further (its warm-up estimate stands, ``timing_stopped``
        in the metadata says why); a fast call, however many times eager, is timed in full."""
        from ..isolation import hostlock

        self.threads = cpu_threads
        bound = give_up_bound(give_up)
        if bound > 0 and "give_up_ms" in getattr(getattr(profiler, "options", None), "__dataclass_fields__", {}):
            # the warm-up itself stops at the bound (two calls past it): a call of seconds is
            # not called again and again only to be given up on after the warm-up
            options = {**options, "give_up_ms": bound}
        warm_msg = {"op": "warm", "profiler": name, "options": options, "graph": graph,
                    "sets": self.set_seeds, "cpu_threads": cpu_threads}
        with self.clock("warm_up"), hostlock.timing():
            warm = self.s._request(warm_msg, self.timeout)
        flags = sanitized(warm.get("flags"))
        if flags is not None:  # the settings the candidate's process says it was timed under
            self.meta["candidate_flags"] = flags
        if not warm.get("ok"):
            if warm.get("profiler_error"):
                return None, Refusal(FailureCategory.CRASH, str(warm["profiler_error"]), {"profiler_error": True})
            return None, self._crash("ModelNew failed while being timed (warm-up)", warm)
        if not warm.get("two_phase"):
            return self._whole(profiler)
        prof = profiler.steadier() if graph and hasattr(profiler, "steadier") else profiler
        try:
            estimate = float(warm.get("estimate_ms", 0.0))
            warmup_ms = float(warm.get("warmup_ms", 0.0))
        except (TypeError, ValueError):
            return None, Refusal(FailureCategory.CRASH, "the candidate process sent a malformed warm-up")
        method = prof.method_name()
        if bound > 0 and estimate > bound:
            # hopeless: the estimate is the candidate's own report, and only ever counts against it
            from .profilers.base import summarize

            ratio = estimate / give_up[0]
            self.meta["timing_stopped"] = {
                "ratio_vs_eager": round(ratio, 2), "limit": give_up[1],
                "why": f"its first calls took {estimate:.4g} ms each, {ratio:.1f}x eager's {give_up[0]:.4g} ms "
                       f"(more than {give_up[1]:g}x): timed no further"}
            t = summarize([estimate], f"{method}, stopped after the warm-up", 1)
            t.warmup_ms = round(warmup_ms, 1)
            t.attempts = 0
            return t, None
        n = prof.iterations(max(estimate, 0.0))
        if self._profiler is not None:  # again, now that the loop's length is known; the mode that
            # synchronises every call only once a loop runs in it (the estimate before the load stands till then)
            with self.clock("own_work"):
                self.measure_overhead(self._profiler, keep=min, calls=self.own_calls(n), modes=("plain",))
        sync_measured = False
        best: Timing | None = None
        best_charge: dict | None = None
        made = 0
        loops: list[dict] = []
        suspect = 0
        charged_again = False
        while made < max(1, int(attempts)):
            seed = secrets.randbits(62)
            with self.clock("loops"), hostlock.timing():
                c0 = self._job_cpu()
                t0 = _now_ms()
                reply = self.s._request({"op": "loop", "n": n, "seed": seed, "full": self.full, "wide": self.wide},
                                        self.timeout)
                wall = _now_ms() - t0
                c1 = self._job_cpu()
            if not reply.get("ok"):
                return None, self._crash("ModelNew failed while being timed", reply)
            samples, sums, info = self._read_loop(reply, n)
            if samples is None:
                return None, Refusal(FailureCategory.CRASH, "the candidate process sent malformed timings")
            if info.get("sync_each") and not sync_measured and self._profiler is not None:
                sync_measured = True  # that mode's own work, now that a loop ran in it
                with self.clock("own_work"):
                    self.measure_overhead(self._profiler, keep=min, calls=self.own_calls(n), modes=("sync_each",))
            why, wall_info = self._clock_check(samples, info, wall, c0, c1, n)
            if why and self._profiler is not None and self._on_cpu:
                # the host may have been busy (on the CPU: memory shared with other work makes the
                # loop's own work cost more CPU time): that work measured again, now. Not on a
                # GPU: there the loop's own work is the smallest of the measurements before and after
                # the candidate loaded, and one more kept when larger is noise in the candidate's
                # favour (on an H200 it rose by half the loop's own work, enough to hide samples
                # divided by 8 on a 0.14 ms kernel); a failed check there is charged, not refused
                self.measure_overhead(self._profiler, keep=max, rise_per_call=OWN_RISE * sum(samples) / max(1, n))
                why, wall_info = self._clock_check(samples, info, wall, c0, c1, n)
            elif why and self._profiler is not None and not charged_again:
                # on a GPU, once: the loop's own work measured again and the smallest estimate kept,
                # which can only raise what the loop is charged (the charge is the trusted clock
                # less that estimate; an H200 charged samples divided by 8 7% short of the honest
                # kernel's time, with an estimate 3% above the other jobs')
                charged_again = True
                with self.clock("own_work"):
                    self.measure_overhead(self._profiler, keep=min, calls=self.own_calls(n))
                why, wall_info = self._clock_check(samples, info, wall, c0, c1, n)
            wall_info["calls"] = n
            loops.append(wall_info)
            self.meta["timing_loops"] = loops
            if why and wall_info.get("impossible"):
                return None, Refusal(FailureCategory.FORBIDDEN_OP, why)
            longer = self._cpu_loop_length(why, wall_info, n)
            if longer:  # too short for the trusted clock to bound: timed again with more calls
                n = longer
                continue
            if why:
                suspect += 1
                if suspect < 2:  # once: perhaps a passing disturbance of the host, timed again
                    continue
            else:
                suspect = 0
            was = (self.full, self.wide)
            with self.clock("checksums"):
                bad = self._check_sums(seed, sums, n)
            if bad is not None:
                return None, bad
            if (self.full, self.wide) != was:
                # a timed call's reference is not finite, or too large for float32 squares:
                # timed again, its NaN/Inf compared or its squares summed in float64, against
                # the loop's own work measured again with those checksums (they cost more; the
                # reference alone decides this, so a candidate cannot choose when it happens)
                if self._profiler is not None:
                    with self.clock("own_work"):
                        self.measure_overhead(self._profiler, calls=self.own_calls(n))
                continue
            made += 1
            charge = None
            if why:  # timed by the trusted clock: the time it does not see reported is the calls'
                extra = max(0.0, float(wall_info.get("unaccounted_ms", 0.0))) / n
                samples = [x + extra for x in samples]
                wall_info["charged_ms_per_call"] = round(extra, 6)
                charge = {"rule": RULE_WALL, "why": why, "charged_ms_per_call": round(extra, 6), "calls": n}
            # on a GPU (device event samples); on the CPU backend wall samples swell on a busy host
            # and the job's CPU time is too coarse to bound a median to a few percent
            samples, skew = (samples, {}) if self._on_cpu else skew_bounded(samples)
            if skew:
                wall_info["median_raised_ms"] = skew["median_raised_ms"]
                charge = {**(charge or {"rule": RULE_WALL, "calls": n}), "skew": skew["why"]}
                charge.setdefault("why", skew["why"])
            t = prof.finish(samples, method, warmup_ms, info)
            if best is None or t.spread < best.spread:
                best, best_charge = t, charge
            self._last_seed, self._last_n = seed, n
            if max_spread <= 0 or best.spread <= max_spread:
                break
        if best_charge is not None:
            self.meta["timing_charged"] = best_charge
        assert best is not None
        best.attempts = made
        return best, None

    def _cpu_loop_length(self, why: str, wall_info: dict, n: int) -> int:
        """A longer loop (0: none needed) when, on the CPU backend, the CPU time the job spent on
        a loop's calls is so short that the fixed slack of :func:`cpu_check` could hide most of
        it. The length follows that trusted CPU time, never the candidate's own reports."""
        if not self._on_cpu or why or n >= CPU_MAX_CALLS or "cpu_ms" not in wall_info:
            return 0
        cpu_ms = float(wall_info["cpu_ms"])
        calls_cpu = cpu_ms - float(wall_info.get("overhead_cpu_ms", 0.0))
        if calls_cpu >= CPU_MIN_LOOP_MS or cpu_ms >= CPU_MAX_LOOP_MS / 2:
            return 0
        want = max(2 * n, int(n * CPU_MIN_LOOP_MS / max(calls_cpu, 1.0)) + 1)
        bound = int(n * CPU_MAX_LOOP_MS / max(cpu_ms, 1.0))  # the loop's own work grows with it
        longer = min(CPU_MAX_CALLS, want, bound)
        return longer if longer > n else 0

    @property
    def _on_cpu(self) -> bool:
        return str(self.device).startswith("cpu")

    def _job_cpu(self) -> tuple[float, int]:
        from .identity import cpu_seconds

        proc = self.s.proc
        if proc is None:
            return 0.0, 0
        if proc.identity is not None:
            return cpu_seconds(uid=proc.identity.uid)
        return cpu_seconds(pid=proc.proc.pid)

    def _clock_check(self, samples: list[float], info: dict, wall: float, c0: tuple, c1: tuple,
                     n: int) -> tuple[str, dict]:
        """The trusted clocks against the reported times: on the CPU backend the job's CPU time
        (immune to a busy host); on a GPU the wall clock. "" when they agree, else why not, with
        the time the reports leave out in ``info["unaccounted_ms"]`` (charged to the calls);
        ``info["impossible"]``: reported times longer than the loop took (on both)."""
        why, out = wall_check(samples, wall, 0.0, 0.0, hidden=False) if self._on_cpu else \
            wall_check(samples, wall, self.overhead.get("sync_each" if info.get("sync_each") else "plain", 0.0),
                       self.overhead.get("fixed", 0.0))
        if self._on_cpu:
            out.pop("unaccounted_ms", None)
        if self._on_cpu and not why:
            threads = int(self.threads or 1)
            own = n * self.overhead.get("cpu", 0.0) + self.overhead.get("cpu_fixed", 0.0)
            low = self.own_floor or self.overhead
            floor = n * low.get("cpu", 0.0) + low.get("cpu_fixed", 0.0)
            why, cpu_info = cpu_check(samples, (c1[0] - c0[0]) * 1e3, own, threads, max(c0[1], c1[1]), wall,
                                      own_floor_ms=floor)
            out.update(cpu_info)
        return why, out

    def _read_loop(self, reply: dict, n: int) -> tuple[list | None, list | None, dict]:
        from .wire import WireError, floats

        try:
            samples = floats(reply, "samples", n)
            raw = reply.get("checksums")
            if not isinstance(raw, list) or len(raw) != n * rotation.WIDTH:
                return None, None, {}
            flat = [float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else float("nan") for x in raw]
        except WireError:
            return None, None, {}
        if any(x < 0 for x in samples):
            return None, None, {}
        sums = [flat[i * rotation.WIDTH:(i + 1) * rotation.WIDTH] for i in range(n)]
        info = reply.get("info") if isinstance(reply.get("info"), dict) else {}
        info = {"sync_each": bool(info.get("sync_each")),
                "escaped": int(info.get("escaped", 0)) if isinstance(info.get("escaped", 0), int) else 0}
        return samples, sums, info

    def _check_sums(self, seed: int, sums: list[list[float]], n: int) -> Refusal | None:
        """The statistics of :data:`CHECKED_CALLS` timed calls picked now against the
        reference's on the same inputs. A checked call whose reference is not finite while the
        loop summed without the non-finite fingerprint sets ``full``, and one whose reference
        holds elements past :data:`rotation.WIDE_ABOVE` while the loop summed squares in float32
        sets ``wide`` (nothing is listed as checked then: the loop is timed again)."""
        picks = sorted({secrets.randbelow(n) for _ in range(min(CHECKED_CALLS, n))})
        checks = rotation.Checksums(rotation.derived(seed, 5), self.device, full=self.full, wide=self.wide)
        checked = []
        for j in picks:
            ref = self.reference_at(seed, j)
            want = checks.expected(ref, self.atol, self.rtol)
            del ref
            if not want["finite"] and not self.full:
                self.full = True
                return None
            if want["largest"] > rotation.WIDE_ABOVE and not self.wide:
                self.wide = True
                return None
            why = checks.mismatch(sums[j], want)
            if why:
                return Refusal(FailureCategory.WRONG_RESULT,
                               f"timed call {j} of {n} (input set {j % len(self.set_seeds)}): {why} "
                               f"(rule {RULE_CHECKSUM}: every timed call must compute the output for its own "
                               f"inputs; results cached, stale, skipped or computed in part between calls fail)")
            checked.append(j)
        self.meta.setdefault("checksums_checked", []).extend(checked)
        self.meta["checksum_statistics"] = ["sum of squares" + (" (float64)" if self.wide else ""), "weighted sum"] + \
            (["non-finite positions and count"] if self.full else [])
        return None

    def spot_check(self, compare: Any) -> Refusal | None:
        """The last timed output of every input set against the reference on its inputs."""
        reply, outs = self.s.fetch({"op": "outputs"}, "outputs", self.timeout)
        if not reply.get("ok") or not isinstance(outs, list) or len(outs) != len(self.set_seeds):
            return self._crash("the outputs of the timed calls could not be read back", reply)
        last = reply.get("last_call")
        k = len(self.set_seeds)
        n = getattr(self, "_last_n", None)
        # the last call of each input set in a loop of n calls (sets past n had none: a slow
        # candidate timed in fewer calls than there are sets is checked on the sets it ran)
        want = [i + (n - 1 - i) // k * k if i < n else -1 for i in range(k)] if isinstance(n, int) else None
        if not (isinstance(last, list) and len(last) == k and all(isinstance(j, int) and j % k == i
                                                                  for i, j in enumerate(last))) or \
                (want is not None and last != want):
            return Refusal(FailureCategory.CRASH, "the candidate process sent malformed call indices")
        for i, (j, out) in enumerate(zip(last, outs)):
            if j < 0:
                continue
            ref = self.reference_at(self._last_seed, j)
            cmp = compare(ref, out)
            if not cmp.ok:
                self.meta["spot_check"] = "failed"
                return Refusal(FailureCategory.WRONG_RESULT,
                               f"wrong result on a timed call (input set {i}, call {j}; results cached or computed "
                               f"differently while timed?): {cmp.message}")
        self.meta["spot_check"] = "passed"
        return None

    def _whole(self, profiler: Any) -> tuple[Timing | None, Refusal | None]:
        from .baselines import timing_from
        from ..isolation import hostlock

        seed = secrets.randbits(62)
        with hostlock.timing():
            t0 = _now_ms()
            reply = self.s._request({"op": "whole", "seed": seed}, self.timeout)
            wall = _now_ms() - t0
        if not reply.get("ok"):
            return None, self._crash("ModelNew failed while being timed", reply)
        t = timing_from(reply.get("timing") if isinstance(reply.get("timing"), dict) else None)
        if t is None:
            return None, Refusal(FailureCategory.CRASH, "the candidate process sent a malformed timing")
        self.meta["timing_loops"] = [{"wall_ms": round(wall, 3), "whole_timing": True}]
        if t.median_ms * t.iterations > wall + 1.0:
            return None, Refusal(FailureCategory.FORBIDDEN_OP,
                                 f"the candidate process reported {t.iterations} calls of {t.median_ms:.4g} ms in "
                                 f"{wall:.3f} ms (rule {RULE_WALL}: reported times must fit the trusted wall clock)")
        self._last_seed = None
        return t, None

    def _crash(self, what: str, reply: dict) -> Refusal:
        err = reply.get("error") if isinstance(reply.get("error"), dict) else {}
        msg = str(err.get("message", "unknown error"))[:1500]
        extra = {"cuda_context_broken": True} if err.get("cuda") else {}
        return Refusal(FailureCategory.CRASH, f"{what}: {msg}", extra)

