"""Eager and ``torch.compile`` baselines of a task's reference, measured once and cached.

:func:`measure_baselines` (and ``_record``) read a task's baseline from the cache, or
measure it -- the eager reference, then its compiled form, both under the same thread
setting with the same input rotation -- and store the record. :func:`measure_many`
measures a list of tasks in one process (``cuda-agent baselines``): inputs are drawn on the
device, the compiled graphs reuse inductor's parallel compile workers, and tasks already
cached are skipped, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

from cuda_agent.core.errors import CudaAgentError
from cuda_agent.core.types import Timing

from ..inputs import describe
from ..precision import precision_context
from ..process_flags import process_flags
from .as_candidate import mismatch, retime, wanted
from .cache import BaselineCache, cache_for, key_fields, timing_from
from .compiled import compiled_timing
from .cpu_threads import is_cpu, timing_threads
from .reference import build_reference, load_code, rotation_sets
from .staleness import TIMING_RULE, cached_record, under_current_rule


class BaselineError(CudaAgentError):
    """A baseline could not be measured (the reference fails to build or run)."""


@dataclass
class BaselineOptions:
    profiler: str = ""  # "" = cuda_events on CUDA, wallclock on the CPU
    profiler_options: dict = field(default_factory=dict)
    precision: str = "fp32-strict"
    compile: bool = True
    compile_mode: str = "default"
    num_input_sets: int = 0  # 0 = as many as fit a memory budget, at most 4
    seed: int = 0
    cache_dir: str = ""  # "" = $CUDA_AGENT_BASELINE_CACHE or ~/.cache/cuda-agent/baselines
    force: bool = False  # measure again and overwrite the cached record
    cpu_threads: int = 1  # on the CPU: torch/OpenMP threads for every timing (0 = torch's default)
    # change the inputs in place between timed calls, as the candidate's timing does, so that
    # neither side finds its inputs in a cache the other one does not
    perturb_inputs: bool = True
    # a timing whose spread (IQR / median) exceeds max_spread is repeated, attempts in all,
    # keeping the steadiest (the host was busy); not part of the cache key
    max_spread: float = 0.01
    attempts: int = 3
    # a cached record whose eager or compile spread exceeds this is measured again (0: never)
    refresh_spread: float = 0.0
    # where the reported timings are taken (see .as_candidate): "graph" (tasks timed by graph
    # replay in a candidate's process, the rest in this one), "always" or "never"
    as_candidate: str = "graph"


def default_profiler(device: Any) -> str:
    return "wallclock" if is_cpu(device) else "cuda_events"


def measure_model(model: Any, input_sets: list, device: Any, profiler: Any, do_compile: bool = True,
                  compile_mode: str = "default", cpu_threads: int | None = 1,
                  perturb_inputs: bool = False, max_spread: float = 0.0,
                  attempts: int = 1) -> tuple[Timing, Timing | None, dict]:
    """Eager and compiled timings of an already built reference model, both under the same
    thread setting (:mod:`.cpu_threads`), compilation kept out of the timed calls
    (:mod:`.compiled`). ``perturb_inputs``: inputs changed in place between timed calls, as
    for a candidate. Timed sections hold the host's quiet lock shared and the compilation
    holds it exclusively; a timing whose spread exceeds ``max_spread`` is repeated
    (``attempts`` in all, see :func:`..profilers.base.time_stably`). An eager timing that
    stays unsteady switches the task to the profiler's steadier mode (``info["timing_mode"]``;
    see :func:`..profilers.base.time_for_task`)."""
    import torch

    from ..inputs import perturb_
    from ..profilers.base import time_for_task

    info: dict[str, Any] = {}
    k = max(1, len(input_sets))
    prepare = (lambda step, args: perturb_(args, step // k)) if perturb_inputs else None
    with timing_threads(device, cpu_threads) as threads:
        if threads is not None:
            info["cpu_threads"] = threads
        configured = profiler
        with torch.no_grad():  # the eager reference, and the mode for every timing of the task
            info["process_flags"] = process_flags(device)  # recorded beside a candidate's
            eager, used = time_for_task(profiler, model, input_sets, device, prepare, max_spread, attempts)
        if used is not profiler:  # every timing of this task in the steadier mode
            info["timing_mode"] = f"{used.method_name()} ({eager.mode_reason or 'eager unsteady in the configured mode'})"
            profiler = used
        comp = None
        if do_compile:
            comp, compile_info = compiled_timing(model, input_sets, device, profiler, configured, compile_mode,
                                                 prepare, max_spread, attempts)
            info.update(compile_info)
    return eager, comp, info


def measure_baselines(model_code: str, device: str = "cuda", options: BaselineOptions | None = None,
                      cache: BaselineCache | None = None, model: Any = None, input_sets: list | None = None,
                      init_inputs: Any = None) -> tuple[Timing, Timing | None]:
    """(eager, compile) timings of a task's reference, from the cache when measured before.

    ``model``/``input_sets``/``init_inputs`` may be passed by a caller that has them already
    (``profile_workspace``); otherwise the code is imported and the model built here.
    """
    eager, comp, _ = measure_baselines_record(model_code, device, options, cache, model, input_sets, init_inputs)
    return eager, comp


def cached_baselines(model_code: str, device: str = "cuda", options: BaselineOptions | None = None,
                     cache: BaselineCache | None = None, init_inputs: Any = None) -> dict | None:
    """The cache record :func:`measure_baselines_record` would start from for this task (one
    measured under an older timing rule included: it is re-checked, not measured, there), or
    None when it would measure the baselines. Measures nothing."""
    o = options or BaselineOptions()
    cache = cache if cache is not None else cache_for(o.cache_dir or None)
    if init_inputs is None:
        init = load_code(model_code, cache.dir).get_init_inputs()
        init_inputs = list(init) if isinstance(init, (list, tuple)) else [init]
    fields = key_fields(model_code, describe(init_inputs), device, o.precision, o.profiler or default_profiler(device),
                        o.profiler_options, o.compile_mode, o.num_input_sets, o.seed, o.cpu_threads, o.perturb_inputs)
    rec, _ = cached_record(cache, BaselineCache.key(fields), o.force, o.refresh_spread, o.compile)
    return None if rec is None or mismatch(rec, o.as_candidate, device) else rec


def measure_baselines_record(model_code: str, device: str = "cuda", options: BaselineOptions | None = None,
                             cache: BaselineCache | None = None, model: Any = None, input_sets: list | None = None,
                             init_inputs: Any = None) -> tuple[Timing, Timing | None, dict]:
    """Like :func:`measure_baselines`, also returning the cache record (with ``cached``)."""
    import torch

    from ..profilers import get_profiler

    o = options or BaselineOptions()
    cache = cache if cache is not None else cache_for(o.cache_dir or None)
    prof_name = o.profiler or default_profiler(device)
    ref_mod = None
    if init_inputs is None:
        ref_mod = load_code(model_code, cache.dir)
        init = ref_mod.get_init_inputs()
        init_inputs = list(init) if isinstance(init, (list, tuple)) else [init]
    fields = key_fields(model_code, describe(init_inputs), device, o.precision, prof_name, o.profiler_options,
                        o.compile_mode, o.num_input_sets, o.seed, o.cpu_threads, o.perturb_inputs)
    key = BaselineCache.key(fields)
    rec, because = cached_record(cache, key, o.force, o.refresh_spread, o.compile)
    if rec is not None and mismatch(rec, o.as_candidate, device):
        rec, because = None, mismatch(rec, o.as_candidate, device)
    profiler = get_profiler(prof_name, o.profiler_options)
    own_sets, own_model = input_sets is None, model is None

    def reference() -> tuple[Any, list]:
        nonlocal ref_mod, model, input_sets
        if model is None:
            if ref_mod is None:
                ref_mod = load_code(model_code, cache.dir)
            try:
                model, _ = build_reference(ref_mod, device, o.seed)
            except Exception as exc:
                raise BaselineError(f"reference Model failed to build: {type(exc).__name__}: {exc}") from exc
        if input_sets is None:
            if ref_mod is None:
                ref_mod = load_code(model_code, cache.dir)
            input_sets = rotation_sets(ref_mod.get_inputs, device, o.seed, o.num_input_sets)
        return model, input_sets

    if rec is not None:  # one measured under an older timing rule is kept (and stamped) if it stands under this one
        rec, because = under_current_rule(cache, key, rec, profiler, reference, device, o.max_spread, o.precision)
    if rec is not None:
        rec = dict(rec, cached=True)
        return timing_from(rec["eager"]), timing_from(rec.get("compile")), rec
    t0 = time.perf_counter()
    with precision_context(o.precision) as flags, torch.no_grad():
        model, input_sets = reference()
        try:
            eager, comp, info = measure_model(model, input_sets, device, profiler, o.compile, o.compile_mode,
                                              o.cpu_threads, o.perturb_inputs, o.max_spread, o.attempts)
        except Exception as exc:
            raise BaselineError(f"reference Model failed to run: {type(exc).__name__}: {' '.join(str(exc).split())[:400]}") from exc
    cache.measured += 1
    rec = {
        "key": key,
        "fields": fields,
        "eager": asdict(eager),
        "compile": asdict(comp) if comp else None,
        "precision_flags": flags,
        "input_sets": len(input_sets),
        "inputs": describe(input_sets[0]),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(time.perf_counter() - t0, 2),
        "timing_rule": TIMING_RULE,
        **info,
    }
    if because:  # a record replaced: why (a first measurement has no such field)
        rec["measured_again_because"] = because
    steadier = bool(info.get("timing_mode"))
    if wanted(o.as_candidate, device, steadier):
        if own_sets:  # the candidate's process draws its own
            input_sets = None
        if own_model:
            model = None
        free_device_memory(device)
        t1 = time.perf_counter()
        try:
            rec = retime(rec, model_code, device, o, steadier)
        except BaselineError as exc:  # the trusted timings stand, and the record says why
            rec["as_candidate_error"] = str(exc)[:600]
        rec["as_candidate_seconds"] = round(time.perf_counter() - t1, 2)
        eager, comp = timing_from(rec["eager"]), timing_from(rec.get("compile"))
    cache.put(key, rec)
    return eager, comp, dict(rec, cached=False)


def measure_many(tasks: Iterable[Any], device: str = "cuda", options: BaselineOptions | None = None,
                 cache: BaselineCache | None = None, progress: bool = True,
                 on_result: Callable[[Any, dict], None] | None = None) -> list[dict]:
    """Baselines of many tasks (``Task`` objects or model-code strings) in this process.

    Tasks already in the cache cost nothing, so an interrupted run resumes where it stopped.
    Returns one summary per task: ``{"task", "eager_ms", "compile_ms", "cached", "error"}``.
    """
    o = options or BaselineOptions()
    cache = cache if cache is not None else cache_for(o.cache_dir or None)
    items = list(tasks)
    out = []
    try:
        from tqdm import tqdm

        bar = tqdm(items, desc=f"baselines on {device}", unit="task", disable=not progress)
    except ImportError:  # pragma: no cover
        bar = items
    for t in bar:
        code = t if isinstance(t, str) else t.code
        tid = getattr(t, "id", None) or hashlib.sha256(code.encode()).hexdigest()[:12]
        row: dict[str, Any] = {"task": tid}
        try:
            eager, comp, rec = measure_baselines_record(code, device, o, cache)
            row.update(eager_ms=eager.median_ms, compile_ms=comp.median_ms if comp else None,
                       cached=rec.get("cached", False), compile_error=rec.get("compile_error"),
                       spread=max(eager.spread, comp.spread if comp else 0.0), timing_mode=rec.get("timing_mode"),
                       timed_in=rec.get("timed_in") or "the trusted process")
            if rec.get("as_candidate_error"):
                row["as_candidate_error"] = rec["as_candidate_error"]
            if not rec.get("cached") and rec.get("measured_again_because"):
                row["measured_again_because"] = rec["measured_again_because"]
        except Exception as exc:  # one broken task must not stop the run
            row.update(error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        finally:
            free_device_memory(device)
        out.append(row)
        if on_result:
            on_result(t, row)
    return out


def free_device_memory(device: Any) -> None:
    """After a measurement: the models, input sets and compiled graphs it left are collected
    and torch's cached device memory handed back to the driver. A job that times the candidate
    next does so in another process, which cannot allocate what this one keeps cached: the
    input sets, outputs and temporaries of a task with inputs of several GB."""
    import gc

    gc.collect()
    try:
        import torch

        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
        import torch._dynamo

        torch._dynamo.reset()
    except Exception:
        pass
