"""Job functions run inside an executor worker: verify and profile a candidate.

* :func:`verify_workspace` -- static checks, then ``ModelNew`` against ``Model`` on fresh
  inputs with the run-time guard on (see :mod:`.verify`).
* :func:`profile_workspace` -- eager and ``torch.compile`` baselines from the
  :class:`~.baselines.BaselineCache` (measured once per task, GPU, torch version, precision
  policy and profiler), then the candidate timed with the chosen profiler plugin; a closing
  spot check compares the outputs of timed calls with the reference, so a candidate that
  caches results fails.
* :func:`verify_file` / :func:`profile_file` -- the same for a KernelBench single-file
  solution (a module defining ``ModelNew`` that builds its own CUDA with ``load_inline``):
  the candidate module is a parameter.

The process that calls these is the trusted side of the job: it reads ``model.py``, measures
and caches the baselines, draws the inputs, runs the reference and compares. The candidate
runs only in a candidate process of its own, as the job's own user (:mod:`cuda_agent.sandbox.judge`;
``drop_privileges`` in the options), which a job that both verifies and profiles shares
(:func:`open_session`).

Devices: ``"cuda"``/``"cuda:N"``, or ``"cpu"`` (wall-clock profiler, ``torch.compile`` on the
CPU for the compile baseline; TF32 flags are irrelevant there). On the CPU the baselines and
the candidate are timed under the same thread count, ``cpu_threads`` (default 1; see
:mod:`.baselines` for why), recorded in the result's metadata.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.core.types import FailureCategory, ProfileResult, VerifyResult

from .baselines import (
    BaselineOptions,
    auto_input_sets,
    cache_for,
    default_profiler,
    free_device_memory,
    measure_baselines_record,
    timing_threads,
)
from .op_guard import GuardOptions
from .inputs import describe, draw_inputs, nbytes
from .precision import TF32, policy_from, precision_context
from .process_flags import flags_differ
from .comparison import compare_outputs
from .draws import fresh_seed
from .loading import LoadFailure, build_models, load_reference, short_exc, workspace_imports
from .options import VerifyOptions
from .phases import PhaseClock
from .verify import device_info, give_back_memory, verify_candidate

__all__ = [
    "GuardOptions",
    "ProfileOptions",
    "baselines_cached",
    "evaluate_workspace",
    "VerifyOptions",
    "measure_baselines",
    "open_session",
    "prepare_baselines",
    "profile_file",
    "profile_workspace",
    "verify_file",
    "verify_workspace",
]


TIMING_MODES = ("", "steadier", "configured")


@dataclass
class ProfileOptions:
    """Options of profiling (a run config's ``profile_options`` map onto these)."""

    profiler: str = ""  # "" = cuda_events on CUDA, wallclock on the CPU; also torch_profiler, nsight_compute
    profiler_options: dict = field(default_factory=dict)
    precision: str = "fp32-strict"  # applies to the baselines and the candidate alike
    baselines: bool = True
    compile_baseline: bool = True
    compile_mode: str = "default"
    report_tf32_baselines: bool = False  # also report speedups against TF32-enabled baselines
    baseline_cache_dir: str = ""  # "" = $CUDA_AGENT_BASELINE_CACHE or ~/.cache/cuda-agent/baselines
    baseline_seed: int = 0
    num_input_sets: int = 0  # 0 = as many as fit a memory budget (1..4)
    seed: int | None = None  # candidate's input sets; None = fresh each call
    perturb_inputs: bool = True  # change inputs in place between timed calls (untimed)
    # timings (candidate and baselines) whose spread (IQR / median) exceeds max_spread are
    # repeated, attempts in all, keeping the steadiest; a task whose eager reference runs on
    # parallel streams or stays unsteady is timed in the profiler's steadier mode throughout
    # (cuda_events: CUDA-graph replay); see profilers.base.time_stably and time_for_task
    max_spread: float = 0.01
    attempts: int = 3
    refresh_spread: float = 0.0  # cached baselines noisier than this are measured again (0: never)
    cpu_threads: int = 1  # on the CPU: threads for the baselines and the candidate alike (0 = torch's default)
    spot_check: bool = True
    atol: float = 1e-2
    rtol: float = 1e-2
    candidate: str = "model_new.py"
    reference: str = "model.py"
    ncu_options: dict = field(default_factory=dict)  # with profiler nsight_compute
    # as root on Linux: time the candidate as an unprivileged user, after the baselines
    # (see .privdrop); CUDA_AGENT_DROP_PRIVILEGES=0 switches it off too
    drop_privileges: bool = True
    weights: str = "state_dict"  # how ModelNew gets Model's weights: state_dict | auto | seeded (judge/rules.py)
    # a candidate whose first calls are more than this many times slower than eager is timed no
    # further: its warm-up estimate is its time, the metadata's timing_stopped says why (0: off)
    hopeless_factor: float = 20.0
    hopeless_min_ms: float = 10.0  # ... and more than this per call (a fast call costs little to time in full)
    # a result whose candidate, eager or compile timing still spreads (IQR / median) more than
    # this after its attempts is marked unsteady ("unsteady" in the metadata, the reward's raw
    # "trusted": false): its speedup may be the host's noise (0: never marked)
    trust_spread: float = 0.25
    # in a job that verifies first (evaluate_workspace): baselines not in the cache are measured
    # only once the candidate verified, after its process has ended (a new one is started for
    # the timing); False: measured before verification, whatever its verdict
    defer_baselines: bool = True
    # the mode the candidate is timed in: "" as the task's eager baseline was (its steadier mode
    # when that one was), "steadier" or "configured" whatever the baselines (a baseline timed as
    # a candidate: baselines.as_candidate)
    timing_mode: str = ""
    # where the baselines' reported timings are taken (baselines.as_candidate): "graph" (a task
    # timed by graph replay: in a candidate's process, as a candidate is), "always" or "never"
    baselines_as_candidate: str = "graph"

    def __post_init__(self) -> None:
        if self.timing_mode not in TIMING_MODES:
            raise ValueError(f"ProfileOptions.timing_mode {self.timing_mode!r} is not one of {TIMING_MODES}")
        from .baselines.as_candidate import CHOICES

        if self.baselines_as_candidate not in CHOICES:
            raise ValueError(f"ProfileOptions.baselines_as_candidate {self.baselines_as_candidate!r} is not one of {CHOICES}")


def verify_workspace(workspace: str, device: str, options: VerifyOptions | None = None,
                     session: Any = None) -> VerifyResult:
    """Verify ``<workspace>/model_new.py`` against ``<workspace>/model.py`` on ``device``."""
    return verify_candidate(workspace, device, _verify_opts(options), session=session)


def verify_file(candidate: str, reference: str, device: str, options: VerifyOptions | None = None,
                session: Any = None) -> VerifyResult:
    """Verify a single-file solution (``candidate`` defines ModelNew) against ``reference``."""
    cand = Path(candidate).resolve()
    return verify_candidate(cand.parent, device, _verify_opts(options), candidate=cand, reference=Path(reference).resolve(),
                            session=session)


def open_session(workspace: str, device: str, candidate: str = "model_new.py", reference: str = "model.py",
                 drop_privileges: bool = True) -> Any:
    """A :class:`~.judge.session.JudgeSession` for one job that both verifies and profiles
    (one candidate process, one load of the candidate); close it when done."""
    from .session import JudgeSession, job_files

    return JudgeSession(*job_files(workspace, candidate, reference), device, drop=drop_privileges)


def _as(cls: type, options: Any) -> Any:
    """``options`` as a ``cls`` (the defaults for None, built from a mapping)."""
    if options is None:
        return cls()
    return cls(**options) if isinstance(options, dict) else options


def _verify_opts(options: Any) -> VerifyOptions:
    return _as(VerifyOptions, options)


def _profile_opts(options: Any) -> ProfileOptions:
    return _as(ProfileOptions, options)


def measure_baselines(model_code: str, device: str = "cuda", options: Any = None) -> tuple:
    """(eager Timing, compile Timing) of a task's reference, cached (see :mod:`.baselines`).

    ``options`` may be :class:`ProfileOptions`, :class:`~.baselines.BaselineOptions` or a mapping
    of either's fields."""
    from .baselines import measure_baselines as _measure

    return _measure(model_code, device, _baseline_opts(options, device))


def _baseline_opts(options: Any, device: str, precision: str | None = None) -> BaselineOptions:
    if isinstance(options, BaselineOptions):
        return options
    if isinstance(options, dict):
        names = set(BaselineOptions.__dataclass_fields__)
        if set(options) <= names:
            return BaselineOptions(**options)
        options = ProfileOptions(**options)
    o = options or ProfileOptions()
    prof = o.profiler or default_profiler(device)
    if prof == "nsight_compute":
        prof = "cuda_events"
    return BaselineOptions(
        profiler=prof,
        profiler_options=dict(o.profiler_options) if prof == (o.profiler or default_profiler(device)) else {},
        precision=precision or o.precision,
        compile=o.compile_baseline,
        compile_mode=o.compile_mode,
        num_input_sets=o.num_input_sets,
        seed=o.baseline_seed,
        cache_dir=o.baseline_cache_dir,
        cpu_threads=o.cpu_threads,
        perturb_inputs=o.perturb_inputs,
        max_spread=o.max_spread,
        attempts=o.attempts,
        refresh_spread=o.refresh_spread,
        as_candidate=o.baselines_as_candidate,
    )


def profile_workspace(workspace: str, device: str, options: ProfileOptions | None = None,
                      baselines: dict | None = None, session: Any = None,
                      known_calls_ms: list[float] | None = None) -> ProfileResult:
    """Time ``<workspace>/model_new.py`` with baselines from the cache (or ``baselines``,
    from :func:`prepare_baselines`). ``known_calls_ms``: the trusted clock's times of the
    candidate's latest calls in this job's verification (see :func:`hopeless_calls`)."""
    return profile_candidate(workspace, device, _profile_opts(options), baselines=baselines, session=session,
                             known_calls_ms=known_calls_ms)


def profile_file(candidate: str, reference: str, device: str, options: ProfileOptions | None = None,
                 baselines: dict | None = None, session: Any = None) -> ProfileResult:
    """Time a single-file solution (``candidate`` defines ModelNew) against ``reference``."""
    cand = Path(candidate).resolve()
    return profile_candidate(cand.parent, device, _profile_opts(options), candidate=cand,
                             reference=Path(reference).resolve(), baselines=baselines, session=session)


def profile_candidate(workspace: str | Path, device: str, o: ProfileOptions, candidate: str | Path | None = None,
                      reference: str | Path | None = None, baselines: dict | None = None,
                      session: Any = None, known_calls_ms: list[float] | None = None) -> ProfileResult:
    """Time the candidate against its baselines. The baselines and every check run here;
    the candidate runs and is timed in its own process (:mod:`cuda_agent.sandbox.judge`), and what it reports is
    checked by :class:`~.judge.timing.CandidateTimer`. ``session``: a
    :class:`~.judge.session.JudgeSession` to use (and leave open)."""
    from .session import JudgeSession, job_files

    ws, cand_path, ref_path = job_files(workspace, candidate or o.candidate, reference or o.reference)
    own = session is None
    if own:
        session = JudgeSession(ws, cand_path, ref_path, device, drop=o.drop_privileges)
    res = None
    try:
        res = _profile(session, ws, cand_path, ref_path, device, o, baselines, known_calls_ms)
        return res
    finally:
        if own:
            session.close_into(res)


def hopeless_calls(calls_ms: list[float] | None, eager: Any, o: ProfileOptions) -> tuple[Any, dict] | None:
    """The timing of a candidate whose two latest calls in this job's verification (on the
    trusted clock, less the output's transfer) each took longer than the give-up bound
    (``hopeless_factor`` times eager, and over ``hopeless_min_ms``), and why it is timed no
    further; None when they did not (it is then timed, its warm-up stopping at that bound)."""
    from .profilers.base import past_give_up, summarize
    from .timing import give_up_bound

    if not calls_ms or len(calls_ms) < 2 or eager is None or eager.median_ms <= 0 or o.hopeless_factor <= 0:
        return None
    bound = give_up_bound((eager.median_ms, o.hopeless_factor, o.hopeless_min_ms))
    calls = [float(x) for x in calls_ms[-2:]]
    if not past_give_up(calls, bound):
        return None
    t = summarize(calls, "trusted clock, its calls in verification (timed no further)", 2)
    t.attempts = 0
    ratio = t.median_ms / eager.median_ms
    return t, {"ratio_vs_eager": round(ratio, 2), "limit": o.hopeless_factor, "from": "verification",
               "why": f"its calls in verification took {calls[0]:.4g} and {calls[1]:.4g} ms, {ratio:.1f}x eager's "
                      f"{eager.median_ms:.4g} ms (more than {o.hopeless_factor:g}x): timed no further"}


def _profile(session: Any, ws: Path, cand_path: Path, ref_path: Path, device: str, o: ProfileOptions,
             baselines: dict | None, known_calls_ms: list[float] | None = None) -> ProfileResult:
    import torch

    from .client import CandidateProcessError
    from .session import refusal_from_error
    from .timing import CandidateTimer
    from .profilers import get_profiler
    from .profilers.base import profiler_for

    t0 = time.perf_counter()
    host_paths = (ws, cand_path, ref_path)  # for tools started as other processes (ncu)
    policy = policy_from(o.precision)
    prof_name = o.profiler or default_profiler(device)
    timing_name = "cuda_events" if prof_name == "nsight_compute" else prof_name
    seed = o.seed if o.seed is not None else fresh_seed()
    meta: dict[str, Any] = {"precision_policy": policy.key, "profiler": prof_name, "seed": seed}
    meta.update(device_info(device))
    eager = comp = None
    phase = PhaseClock(meta.setdefault("phase_seconds", {}))  # where the job's time went

    def fail(category: FailureCategory, message: str, **kw) -> ProfileResult:
        meta.update({k: v for k, v in session.meta.items() if k not in meta})
        return ProfileResult(ok=False, failure=category, message=message, seconds=time.perf_counter() - t0,
                             metadata=meta, eager=eager, compile=comp, **kw)

    def refused(r: Any, **kw) -> ProfileResult:
        meta.update(r.extra)
        return fail(r.category, r.message, **kw)

    def succeeded(cand_timing: Any) -> ProfileResult:
        return _profiled(cand_timing, eager, comp, meta, session, o, prof_name, host_paths, device, seed, t0)

    bad_file = session.refused_files()
    if bad_file:
        return fail(FailureCategory.FORBIDDEN_OP, bad_file)
    try:
        profiler = get_profiler(timing_name, o.profiler_options if timing_name == prof_name else {})
    except Exception as exc:
        return fail(FailureCategory.CRASH, f"profiler {prof_name!r} unavailable: {exc}")
    model_code = session.reference.read_text() if session.reference.is_file() else ""
    with workspace_imports(session.snap.root), torch.no_grad():
        try:
            with phase("reference"):
                ref_mod = load_reference(session.reference)
                loaded = build_models(ref_mod, None, device, o.baseline_seed, True, cand_path.name)
        except LoadFailure as exc:
            return fail(exc.category, exc.message)
        meta["init_inputs"] = describe(loaded.init_inputs)
        # baselines (cached), before any candidate code is loaded
        if baselines is not None and baselines.get("error"):
            return fail(FailureCategory.CRASH, f"baseline measurement failed: {baselines['error']}")
        if baselines is not None:
            eager, comp = baselines.get("eager"), baselines.get("compile")
            meta.update(baselines.get("meta") or {})
        elif o.baselines:
            try:
                with phase("baselines"):
                    eager, comp, bmeta = _baselines(model_code, device, o, loaded.ref_model, loaded.init_inputs)
                meta.update(bmeta)
            except Exception as exc:
                return fail(FailureCategory.CRASH, f"baseline measurement failed: {short_exc(exc)}")
        known = hopeless_calls(known_calls_ms, eager, o)
        if known is not None:  # two calls past the bound already: no candidate call here
            meta["timing_stopped"] = known[1]
            return succeeded(known[0])
        timer = CandidateTimer(session, loaded.ref_model, ref_mod.get_inputs, device, o.atol, o.rtol)
        with precision_context(policy) as flags, timing_threads(device, o.cpu_threads) as threads:
            meta["precision_flags"] = flags
            if threads is not None:
                meta["cpu_threads"] = threads
            try:
                with phase("inputs"):
                    first = draw_inputs(ref_mod.get_inputs, seed + 7, device).values
            except Exception as exc:
                return fail(FailureCategory.CRASH, f"get_inputs() failed: {short_exc(exc)}")
            try:
                with phase("inputs"):
                    # a set costs its inputs twice (pristine and rotated) and an output: the
                    # candidate process keeps each set's last output for the spot check, and
                    # outputs several times the inputs (a convolution's) ran an H100 out of memory
                    out_bytes = nbytes(loaded.ref_model(*first))
                    k = auto_input_sets(2 * nbytes(first) + out_bytes, device, o.num_input_sets)
                    del first
                    give_back_memory(device)
            except Exception as exc:
                return fail(FailureCategory.CRASH, f"reference Model failed on the first input set: {short_exc(exc)}")
            timer.set_seeds = [seed + 7 * (i + 1) for i in range(k)]
            with phase("inputs"):
                meta["inputs"] = describe(timer.pristine(0))
            meta["input_sets"] = k
            # the mode the task's eager baseline was timed in (a steadier one when the
            # configured mode timed the reference unsteadily; see profilers.base.time_for_task)
            cand_prof = profiler_for(profiler, eager)
            if o.timing_mode == "steadier":
                cand_prof = (profiler.steadier() if hasattr(profiler, "steadier") else None) or profiler
            elif o.timing_mode == "configured":
                cand_prof = profiler
            graph = cand_prof is not profiler
            if graph:
                meta["timing_mode"] = cand_prof.method_name()
                if eager is not None and eager.mode_reason:
                    meta["timing_mode_reason"] = eager.mode_reason
            try:
                with phase("overhead"):
                    timer.measure_overhead(profiler)  # plain mode: no graph of a call that does nothing
                with phase("load"):
                    failed = session.load(o.baseline_seed, True, o.precision, o.weights)
                if failed is not None:
                    return refused(failed)
                options = dict(o.profiler_options) if timing_name == prof_name else {}
                give_up = (eager.median_ms, o.hopeless_factor, o.hopeless_min_ms) \
                    if eager is not None and o.hopeless_factor > 0 else None
                with phase("timing"):
                    cand_timing, failed = timer.time(profiler, timing_name, options, graph, o.max_spread, o.attempts,
                                                     threads, give_up)
                if failed is not None and failed.extra.get("profiler_error") and graph:
                    # cannot be captured: timed in the configured mode, unlike its baselines
                    meta["timing_mode"] = f"{profiler.method_name()} (baselines: {cand_prof.method_name()}; {failed.message})"[:300]
                    with phase("timing"):
                        cand_timing, failed = timer.time(profiler, timing_name, options, False, o.max_spread,
                                                         o.attempts, threads, give_up)
                meta.update(timer.meta)
                differ = flags_differ(meta.get("baseline_flags"), meta.get("candidate_flags"))
                if differ:  # timed under other settings than the baselines: listed, not judged
                    meta["timing_flags_differ"] = differ
                if failed is not None:
                    if failed.category is FailureCategory.CRASH and not failed.message.startswith("ModelNew"):
                        failed.message = f"ModelNew failed while being timed: {failed.message}"
                    return refused(failed)
                if o.spot_check:  # the outputs of timed calls, every input set
                    def compare(ref: Any, out: Any) -> Any:
                        return compare_outputs(ref, out, o.atol, o.rtol, "output")

                    with phase("spot_check"):
                        bad = timer.spot_check(compare) if getattr(timer, "_last_seed", None) is not None else None
                    meta.update(timer.meta)
                    if bad is not None:
                        return refused(bad, candidate=cand_timing)
                with phase("integrity"):
                    tampered = session.integrity()  # timed with replaced timers: defence in depth
                if tampered is not None:
                    return refused(tampered)
            except CandidateProcessError as exc:
                return refused(refusal_from_error(exc, "ModelNew failed while being timed"))
    return succeeded(cand_timing)


def _profiled(cand_timing: Any, eager: Any, comp: Any, meta: dict, session: Any, o: ProfileOptions, prof_name: str,
              host_paths: tuple, device: str, seed: int, t0: float) -> ProfileResult:
    """The result of a profile job whose candidate was timed (or found hopeless)."""
    unsteady = _unsteady(o.trust_spread, candidate=cand_timing, eager=eager, compile=comp)
    if unsteady:
        meta["unsteady"] = unsteady
    # how each timing's loop ran (e.g. ``cuda_events+graph+sync``: every call synchronised):
    # a speedup compares two timings that should have run alike
    meta["timing_methods"] = {k: t.method for k, t in (("candidate", cand_timing), ("eager", eager), ("compile", comp))
                              if t is not None and getattr(t, "method", "")}
    res = ProfileResult(ok=True, candidate=cand_timing, eager=eager, compile=comp, seconds=0.0, metadata=meta)
    meta.update({k: v for k, v in session.meta.items() if k not in meta})
    if "tf32_baselines" in meta and cand_timing.median_ms > 0:
        tb = meta["tf32_baselines"]
        tb["speedup_vs_eager"] = tb["eager_ms"] / cand_timing.median_ms
        tb["speedup_vs_compile"] = tb["compile_ms"] / cand_timing.median_ms if tb.get("compile_ms") else None
    if prof_name == "nsight_compute":
        try:
            from .profilers.nsight_compute import NsightComputeProfiler, analyze

            meta["ncu"] = analyze(host_paths[0], device, str(host_paths[1]), str(host_paths[2]), seed, NsightComputeProfiler.Options(**o.ncu_options))
        except Exception as exc:
            meta["ncu_error"] = str(exc)[:500]
    res.message = _summary(res)
    res.seconds = time.perf_counter() - t0
    return res


def _baselines(model_code: str, device: str, o: ProfileOptions, model: Any = None,
               init_inputs: Any = None) -> tuple[Any, Any, dict]:
    """(eager, compile, metadata) of the reference from the cache, measured on a miss."""
    import torch

    meta: dict[str, Any] = {}
    bopts = _baseline_opts(o, device)
    cache = cache_for(bopts.cache_dir or None)
    t0 = time.perf_counter()
    eager, comp, rec = measure_baselines_record(model_code, device, bopts, cache, model=model, init_inputs=init_inputs)
    meta["baseline_cache"] = "hit" if rec.get("cached") else "miss"
    if not rec.get("cached"):  # what the measurement cached is memory the candidate's process needs
        free_device_memory(device)
    # the time to read, re-check (an older timing rule) or measure the baselines
    meta["baseline_seconds"] = round(time.perf_counter() - t0, 3)
    meta["baseline_key"] = rec.get("key")
    if not rec.get("cached") and rec.get("measured_again_because"):
        meta["baseline_measured_again_because"] = rec["measured_again_because"]
    if rec.get("compile_error"):
        meta["compile_error"] = rec["compile_error"]
    for k in ("compile_seconds", "compile_frames_warmup", "compile_recompiles_during_timing", "compile_retimed"):
        if k in rec:
            meta[k] = rec[k]
    if "cpu_threads" in rec:
        meta["baseline_cpu_threads"] = rec["cpu_threads"]
    if isinstance(rec.get("process_flags"), dict):  # the settings the baselines were timed under
        meta["baseline_flags"] = rec["process_flags"]
    meta["baseline_timed_in"] = rec.get("timed_in") or "the trusted process"  # see baselines.as_candidate
    for k in ("as_candidate_error", "compile_as_candidate_error"):
        if rec.get(k):
            meta[f"baseline_{k}"] = rec[k]
    if not rec.get("cached"):  # what the measurement cost: its timings' attempts and calls
        meta["baseline_cost"] = {f"{name}_{k}": getattr(t, k) for name, t in (("eager", eager), ("compile", comp))
                                 if t is not None for k in ("attempts", "iterations", "warmup_ms")}
        if rec.get("timing_mode"):
            meta["baseline_cost"]["timing_mode"] = str(rec["timing_mode"])[:200]
    if o.report_tf32_baselines and torch.device(device).type == "cuda":
        te, tc, trec = measure_baselines_record(model_code, device, _baseline_opts(o, device, TF32.key), cache,
                                               model=model, init_inputs=init_inputs)
        meta["tf32_baselines"] = {"eager_ms": te.median_ms, "compile_ms": tc.median_ms if tc else None,
                                  "cache": "hit" if trec.get("cached") else "miss"}
    return eager, comp, meta


def prepare_baselines(workspace: str, device: str, options: ProfileOptions | dict | None = None) -> dict | None:
    """The trusted part of :func:`profile_workspace` ahead of time: the baselines (cached),
    for a job that runs candidate code (and so gives up its rights) before profiling.
    Returns ``{"eager", "compile", "meta"}`` for ``profile_workspace(baselines=...)``,
    ``{"error": ...}`` when they could not be measured (profiling then says so), or None
    when the baselines are off or the reference is missing."""
    import torch

    o = _profile_opts(options)
    if not o.baselines:
        return None
    from .session import job_files

    _ws, _cand, ref_path = job_files(workspace, o.candidate, o.reference)
    if not ref_path.is_file():
        return None
    try:
        with workspace_imports(workspace), torch.no_grad():
            eager, comp, meta = _baselines(ref_path.read_text(), device, o)
    except Exception as exc:
        return {"error": short_exc(exc)}
    return {"eager": eager, "compile": comp, "meta": meta}


def baselines_cached(workspace: str, device: str, options: ProfileOptions | dict | None = None) -> bool:
    """Whether :func:`prepare_baselines` would read the task's baselines from the cache rather
    than measure them (True also when the baselines are off or cannot be looked up: there is
    then nothing to put off)."""
    import torch

    from .baselines import cached_baselines
    from .session import job_files

    o = _profile_opts(options)
    if not o.baselines:
        return True
    _ws, _cand, ref_path = job_files(workspace, o.candidate, o.reference)
    try:
        with workspace_imports(workspace), torch.no_grad():
            return cached_baselines(ref_path.read_text(), device, _baseline_opts(o, device)) is not None
    except Exception:  # noqa: BLE001 - the measurement says what is wrong with the reference
        return True


def _stopped(r: Any, key: str) -> bool:
    return r is not None and isinstance(getattr(r, "metadata", None), dict) and isinstance(r.metadata.get(key), dict)


def evaluate_workspace(workspace: str, device: str, vopts: VerifyOptions, popts: ProfileOptions) -> tuple[Any, Any]:
    """Verify, then (when correct) profile, in one job: one candidate process for both.

    Baselines are measured with no candidate process alive. When the cache has them they are
    read first; otherwise (``defer_baselines``) only once the candidate verified: its process
    is ended, the baselines measured, and a new one loads it for the timing, so a candidate
    that fails verification costs no baseline. A verification stopped after one input set (a
    hopeless first call, ``verify_stopped``) is done again in full unless the timing found
    the candidate hopeless too, and that verdict stands. Returns (VerifyResult, ProfileResult or None)."""
    early = not popts.defer_baselines or baselines_cached(workspace, device, popts)
    baselines = prepare_baselines(workspace, device, popts) if early else None
    session = open_session(workspace, device, vopts.candidate, vopts.reference, vopts.drop_privileges)
    v = p = None
    try:
        v = verify_workspace(workspace, device, vopts, session=session)
        if not getattr(v, "ok", False):
            return v, None
        if not early:  # the same snapshot, a new candidate process for the timing
            ended = session.end_candidate()
            baselines = prepare_baselines(workspace, device, popts)
            if isinstance(v.metadata, dict):
                v.metadata.update({f"job_{k}": x for k, x in ended.items()})
                v.metadata["baselines_measured"] = "after verification, with no candidate process alive (not in the cache)"
        p = profile_workspace(workspace, device, popts, baselines=baselines, session=session,
                              known_calls_ms=_verification_calls(v))
        if _stopped(v, "verify_stopped") and not (getattr(p, "ok", False) and _stopped(p, "timing_stopped")):
            v, p = full_verification(workspace, device, vopts, v, p, session)
        return v, p
    finally:
        session.close_into(v, p)


def _verification_calls(v: Any) -> list[float] | None:
    """A hopeless candidate's calls in verification (its first, then those of the extra draws),
    on the trusted clock less the output's transfer; None when verification went on."""
    st = (getattr(v, "metadata", None) or {}).get("verify_stopped")
    if not isinstance(st, dict) or not st.get("later_calls_ms"):
        return None
    moved = float(st.get("output_transfer_ms") or 0.0)
    return [float(x) - moved for x in [st["candidate_ms"], *st["later_calls_ms"]]]


def full_verification(workspace: str, device: str, vopts: VerifyOptions, partial: Any, p: Any,
                      session: Any = None) -> tuple[Any, Any]:
    """The verification of a candidate whose first call was hopeless but whose timing did not
    find it so (``partial`` stopped after one input set; ``p`` timed it in full, or failed),
    done again on every input set: (the full VerifyResult, ``p``) when it passes, (the failed
    one, None) when not."""
    import dataclasses

    full = verify_workspace(workspace, device, dataclasses.replace(vopts, hopeless_factor=0.0), session=session)
    note = (f"verified again in full: its first call was hopeless "
            f"({partial.metadata['verify_stopped'].get('why', '')}) but its timing "
            f"{'found its calls not hopeless' if getattr(p, 'ok', False) else 'failed'}")
    if isinstance(full.metadata, dict):
        full.metadata["verified_in_full_because"] = note[:500]
    return (full, p) if full.ok else (full, None)


def _category(exc: BaseException) -> FailureCategory:
    from .op_guard import ForbiddenOpError

    if isinstance(exc, ForbiddenOpError):
        return FailureCategory.FORBIDDEN_OP
    return FailureCategory.CRASH


def _unsteady(limit: float, **timings: Any) -> str:
    """Why a result's timings are too unsteady to trust ("" when they are steady enough)."""
    if not limit or limit <= 0:
        return ""
    bad = [f"{name} spread {t.spread:.0%} after {max(1, t.attempts)} attempt(s)" for name, t in timings.items()
           if t is not None and t.spread > limit]
    if not bad:
        return ""
    return f"unsteady host: {', '.join(bad)}, above {limit:.0%}: result not trusted (the speedup may be noise)"


def _summary(r: ProfileResult) -> str:
    parts = [f"candidate {r.candidate.median_ms:.4g} ms (±{100 * r.candidate.spread:.1f}%)"]
    stopped = (r.metadata or {}).get("timing_stopped")
    if isinstance(stopped, dict):
        parts[0] = f"candidate about {r.candidate.median_ms:.4g} ms ({stopped['why']})"
    if r.eager:
        parts.append(f"eager {r.eager.median_ms:.4g} ms ({r.speedup_vs_eager():.2f}x)")
    if r.compile:
        parts.append(f"torch.compile {r.compile.median_ms:.4g} ms ({r.speedup_vs_compile():.2f}x)")
    charged = (r.metadata or {}).get("timing_charged")
    if isinstance(charged, dict):
        parts[0] += f" (timed by the trusted clock: {charged['why']})"
    if (r.metadata or {}).get("unsteady"):
        return ", ".join(parts) + f"; {r.metadata['unsteady']}"
    return ", ".join(parts)
