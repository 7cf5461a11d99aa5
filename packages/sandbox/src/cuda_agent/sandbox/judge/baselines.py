"""Eager and ``torch.compile`` baselines, measured once and cached on disk.

The paper's scripts recompiled the reference under ``torch.compile`` on every profile call
(20-30 s per reward). Here a baseline is measured once per

    (hash of the model code and its init inputs, GPU model, torch version,
     precision policy, profiler and its options)

and stored as a small JSON file in the cache folder; every later profile of any candidate
for the same task reads it back. ``BaselineCache.measured`` counts real measurements (a
test asserts a second call does not measure).

:func:`measure_many` measures a list of tasks in one process (``cuda-agent baselines``):
inputs are drawn on the device, the compiled graphs reuse inductor's parallel compile
workers, and finished tasks are skipped when the run is resumed.

Fair timing on the CPU backend. Eager PyTorch and inductor's C++ kernels both run on
OpenMP threads, but they split work differently: an eager element-wise operator stays on one
thread below a grain of 32K elements, while an inductor kernel forks its ``#pragma omp
parallel`` team at every call whatever the size; and an eager chain of N operators forks N
times where the fused kernel forks once. Each fork/join waits for the slowest thread, and on
a host whose cores are shared (other jobs, a spare worker starting, other users) a thread
that is not running costs a whole scheduler slice (milliseconds) per join. Timings with
several threads then measure the scheduler, and which baseline it penalises depends on how
many joins each one makes (measured with two threads on two shared cores: a 4096-element add,
eager 0.003 ms and compiled 8.0 ms, 0.013 ms compiled on one thread; the demo's chain of six
element-wise operators on 2048x2048, eager 52 ms and compiled 8.0 ms, against 16 ms and 1.4 ms
on one thread). So on the CPU every timing -- eager,
``torch.compile`` (its code generation included: inductor sizes its loops by the thread
count) and the candidate -- runs under one explicit thread count, ``cpu_threads`` (default
1; 0 keeps torch's default), which is part of the cache key and of the record.

The compiled model is warmed up on every input set it will be timed on, until a pass
compiles nothing new, so that compilation and guard-driven recompiles stay out of the
timed calls; the dynamo compiles seen during warm-up and during timing are counted and
recorded (``compile_frames_warmup``, ``compile_recompiles_during_timing``; a timing that
saw a recompile is repeated once).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from cuda_agent.core.errors import CudaAgentError
from cuda_agent.core.types import Timing

from .inputs import describe, draw_inputs, nbytes
from .precision import policy_from, precision_context

CACHE_ENV = "CUDA_AGENT_BASELINE_CACHE"


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


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cuda-agent" / "baselines"


def default_profiler(device: Any) -> str:
    return "wallclock" if str(device).startswith("cpu") else "cuda_events"


def timing_from(d: dict | None) -> Timing | None:
    if not d:
        return None
    return Timing(**{k: d[k] for k in ("median_ms", "spread", "iterations", "method", "samples_ms", "attempts", "mode_reason",
                                "warmup_ms") if k in d})


class BaselineCache:
    """A folder of JSON records, one per baseline key; safe for concurrent writers."""

    def __init__(self, directory: str | Path | None = None):
        self.dir = Path(directory) if directory else default_cache_dir()
        self.hits = 0
        self.misses = 0
        self.measured = 0  # real measurements done through this cache object
        self._mem: dict[str, dict] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(fields: dict) -> str:
        blob = json.dumps(fields, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:32]

    def path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict | None:
        with self._lock:
            rec = self._mem.get(key)
            if rec is None:
                p = self.path(key)
                if p.is_file():
                    try:
                        rec = json.loads(p.read_text())
                    except (OSError, ValueError):
                        rec = None
                if rec is not None:
                    self._mem[key] = rec
            if rec is None:
                self.misses += 1
            else:
                self.hits += 1
            return rec

    def put(self, key: str, record: dict) -> None:
        p = self.path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, default=str)
        os.replace(tmp, p)
        with self._lock:
            self._mem[key] = record

    def __len__(self) -> int:
        return sum(1 for _ in self.dir.glob("*/*.json")) if self.dir.is_dir() else 0


_default_caches: dict[str, BaselineCache] = {}


def cache_for(directory: str | Path | None) -> BaselineCache:
    """One BaselineCache object per folder and process (shares the in-memory layer)."""
    d = str(Path(directory) if directory else default_cache_dir())
    if d not in _default_caches:
        _default_caches[d] = BaselineCache(d)
    return _default_caches[d]


# --- keys ---------------------------------------------------------------------------------


def gpu_name(device: Any) -> str:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    import platform

    return f"cpu:{platform.machine()}:{os.cpu_count()}"


def key_fields(model_code: str, init_spec: Any, device: Any, precision: str, profiler: str, profiler_options: dict,
               compile_mode: str = "default", num_input_sets: int = 0, seed: int = 0, cpu_threads: int | None = None,
               perturb_inputs: bool = True) -> dict:
    import torch

    extra = {}
    if is_cpu(device):
        extra["cpu_threads"] = threads_for(device, cpu_threads)
    return {**extra,
        "code": hashlib.sha256(model_code.encode()).hexdigest(),
        "init": init_spec,
        "gpu": gpu_name(device),
        "torch": torch.__version__,
        "precision": policy_from(precision).key,
        "profiler": profiler,
        "profiler_options": profiler_options,
        "compile_mode": compile_mode,
        "input_sets": num_input_sets,
        "seed": seed,
        "perturb_inputs": bool(perturb_inputs),
    }


# --- measuring ------------------------------------------------------------------------------


def auto_input_sets(one_set_bytes: int, device: Any, wanted: int = 0) -> int:
    """How many input sets to rotate through: ``wanted``, or as many as fit a budget (1..4)."""
    if wanted > 0:
        return wanted
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        budget = free // 4
    else:
        budget = 512 << 20
    if one_set_bytes <= 0:
        return 4
    return int(max(1, min(4, budget // one_set_bytes)))


def rotation_sets(get_inputs: Callable, device: Any, seed: int, wanted: int = 0) -> list[list]:
    """Input sets to rotate through while timing, each drawn with its own seed."""
    first = draw_inputs(get_inputs, seed + 7, device).values
    k = auto_input_sets(nbytes(first), device, wanted)
    return [first] + [draw_inputs(get_inputs, seed + 7 * (i + 2), device).values for i in range(k - 1)]


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


def dynamo_frames() -> int:
    """Frames dynamo has compiled in this process so far (first compiles and recompiles)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["frames"]["total"])
    except Exception:  # pragma: no cover - a torch without these counters
        return 0


def time_model(model: Any, input_sets: list, device: Any, profiler: Any, prepare: Any = None,
               max_spread: float = 0.0, attempts: int = 1) -> Timing:
    import torch

    from .profilers.base import time_stably

    def fn(*args):
        return model(*args)

    with torch.no_grad():
        return time_stably(profiler, fn, input_sets, device, prepare, max_spread, attempts)


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


def measure_model(model: Any, input_sets: list, device: Any, profiler: Any, do_compile: bool = True,
                  compile_mode: str = "default", cpu_threads: int | None = 1,
                  perturb_inputs: bool = False, max_spread: float = 0.0,
                  attempts: int = 1) -> tuple[Timing, Timing | None, dict]:
    """Eager and compiled timings of an already built reference model, both under the same
    thread setting (see the module docstring), compilation kept out of the timed calls.
    ``perturb_inputs``: inputs changed in place between timed calls, as for a candidate.
    Timed sections hold the host's quiet lock shared and the compilation holds it
    exclusively (:mod:`.hostlock`); a timing whose spread exceeds ``max_spread`` is
    repeated (``attempts`` in all, see :func:`.profilers.base.time_stably`). An eager
    timing that stays unsteady switches the task to the profiler's steadier mode
    (``info["timing_mode"]``; see :func:`.profilers.base.time_for_task`)."""
    import torch

    from ..isolation import hostlock
    from .inputs import perturb_
    from .profilers.base import time_for_task

    info: dict[str, Any] = {}
    k = max(1, len(input_sets))
    prepare = (lambda step, args: perturb_(args, step // k)) if perturb_inputs else None
    with timing_threads(device, cpu_threads) as threads:
        if threads is not None:
            info["cpu_threads"] = threads
        configured = profiler
        with torch.no_grad():  # the eager reference, and the mode for every timing of the task
            eager, used = time_for_task(profiler, model, input_sets, device, prepare, max_spread, attempts)
        if used is not profiler:  # every timing of this task in the steadier mode
            info["timing_mode"] = f"{used.method_name()} ({eager.mode_reason or 'eager unsteady in the configured mode'})"
            profiler = used
        comp = None
        if do_compile:
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
    return eager, comp, info


def _load_code(model_code: str, cache_dir: Path) -> Any:
    from .verify import load_module

    src_dir = cache_dir / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    path = src_dir / f"{hashlib.sha256(model_code.encode()).hexdigest()[:20]}.py"
    if not path.exists():
        path.write_text(model_code)
    return load_module(path, "_cuda_agent_baseline")


def build_reference(ref_mod: Any, device: Any, seed: int) -> tuple[Any, list]:
    import torch

    from .inputs import seed_everything

    seed_everything(seed)
    init = ref_mod.get_init_inputs()
    init = list(init) if isinstance(init, (list, tuple)) else [init]
    with torch.device(torch.device(device)):
        model = ref_mod.Model(*init)
    return model.to(torch.device(device)), init


def noisy(rec: dict, max_spread: float) -> bool:
    """Whether a cached record's eager or compile timing spread exceeds ``max_spread``."""
    return any((rec.get(k) or {}).get("spread", 0.0) > max_spread for k in ("eager", "compile"))


# The rule that picks a task's timing mode (profilers.base.time_for_task), recorded with each
# measurement. 1: steadier mode when the eager timing stays above max_spread (3% then);
# 2: also when the profiler names a reason up front (cuda_events: parallel streams);
# 3: warm-up continues until per-call times level off (cuda_events: settle_ms).
TIMING_RULE = 3


def stale_reason(rec: dict, profiler: Any, model: Any, input_sets: list, device: str, max_spread: float) -> str | None:
    """Why a record measured under an older :data:`TIMING_RULE` does not stand under the
    current one, "" when it does: its spreads are within ``max_spread``; the reference's
    per-call time, in the mode the record was timed in, is level once the profiler's fixed
    warm-up is over (``warmup_drift`` within ``max_spread / 2``: the older rules timed
    right after it); and, timed in the profiler's normal mode, the profiler names no reason
    for its steadier mode. Costs a warm-up and a graph capture, no timing. None when a check
    could not run: the record is kept as it is, unstamped, and checked again on its next
    use."""
    from ..isolation import hostlock
    from .profilers.base import profiler_for, reason_up_front

    if max_spread > 0 and noisy(rec, max_spread):
        worst = max(("eager", "compile"), key=lambda k: (rec.get(k) or {}).get("spread", 0.0))
        return f"spread: {worst} timing spread {rec[worst]['spread']:.2%} above {max_spread:.2%}"
    try:
        # the mode the record was timed in: its drift is measured on what that mode calls
        timed_by = profiler_for(profiler, Timing(median_ms=0.0, method=(rec.get("eager") or {}).get("method", "")))
        if max_spread > 0 and hasattr(timed_by, "warmup_drift"):
            with hostlock.timing():  # a timing of sorts: not beside another lane's compile
                drift = timed_by.warmup_drift(model, input_sets, device)
            if drift > max_spread / 2:
                return f"drift: per-call time moved {drift:.2%} after the fixed warm-up (limit {max_spread / 2:.2%})"
        if timed_by is not profiler:
            return ""  # timed in the steadier mode already
        reason = reason_up_front(profiler, model, input_sets, device, strict=True)
        return f"mode: {reason}" if reason else ""
    except Exception:
        return None


def measure_baselines(model_code: str, device: str = "cuda", options: BaselineOptions | None = None,
                      cache: BaselineCache | None = None, model: Any = None, input_sets: list | None = None,
                      init_inputs: Any = None) -> tuple[Timing, Timing | None]:
    """(eager, compile) timings of a task's reference, from the cache when measured before.

    ``model``/``input_sets``/``init_inputs`` may be passed by a caller that has them already
    (``profile_workspace``); otherwise the code is imported and the model built here.
    """
    eager, comp, _ = measure_baselines_record(model_code, device, options, cache, model, input_sets, init_inputs)
    return eager, comp


def measure_baselines_record(model_code: str, device: str = "cuda", options: BaselineOptions | None = None,
                             cache: BaselineCache | None = None, model: Any = None, input_sets: list | None = None,
                             init_inputs: Any = None) -> tuple[Timing, Timing | None, dict]:
    """Like :func:`measure_baselines`, also returning the cache record (with ``cached``)."""
    import torch

    from .profilers import get_profiler

    o = options or BaselineOptions()
    cache = cache if cache is not None else cache_for(o.cache_dir or None)
    prof_name = o.profiler or default_profiler(device)
    ref_mod = None
    if init_inputs is None:
        ref_mod = _load_code(model_code, cache.dir)
        init = ref_mod.get_init_inputs()
        init_inputs = list(init) if isinstance(init, (list, tuple)) else [init]
    fields = key_fields(model_code, describe(init_inputs), device, o.precision, prof_name, o.profiler_options,
                        o.compile_mode, o.num_input_sets, o.seed, o.cpu_threads, o.perturb_inputs)
    key = BaselineCache.key(fields)
    rec = None if o.force else cache.get(key)
    because = "forced: measured again on request" if o.force and cache.path(key).is_file() else ""
    if rec is not None and o.refresh_spread > 0 and noisy(rec, o.refresh_spread):
        rec, because = None, f"refresh: a spread above refresh_spread {o.refresh_spread:.2%}"  # measured on a busy host
    if rec is not None and o.compile and rec.get("compile") is None and not rec.get("compile_error"):
        rec, because = None, "compile: measured without its compiled baseline"
    profiler = get_profiler(prof_name, o.profiler_options)

    def reference() -> tuple[Any, list]:
        nonlocal ref_mod, model, input_sets
        if model is None:
            if ref_mod is None:
                ref_mod = _load_code(model_code, cache.dir)
            try:
                model, _ = build_reference(ref_mod, device, o.seed)
            except Exception as exc:
                raise BaselineError(f"reference Model failed to build: {type(exc).__name__}: {exc}") from exc
        if input_sets is None:
            if ref_mod is None:
                ref_mod = _load_code(model_code, cache.dir)
            input_sets = rotation_sets(ref_mod.get_inputs, device, o.seed, o.num_input_sets)
        return model, input_sets

    if rec is not None and int(rec.get("timing_rule") or 1) < TIMING_RULE:
        # measured under an older timing rule: kept (and stamped) if it stands under this one
        with precision_context(o.precision), torch.no_grad():
            stale = stale_reason(rec, profiler, *reference(), device, o.max_spread)
        if stale == "":
            rec = dict(rec, timing_rule=TIMING_RULE)
            cache.put(key, rec)
        elif stale:
            rec, because = None, f"rule {int(rec.get('timing_rule') or 1)} record, {stale}"
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
                       spread=max(eager.spread, comp.spread if comp else 0.0), timing_mode=rec.get("timing_mode"))
            if not rec.get("cached") and rec.get("measured_again_because"):
                row["measured_again_because"] = rec["measured_again_because"]
        except Exception as exc:  # one broken task must not stop the run
            row.update(error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        finally:
            _free(device)
        out.append(row)
        if on_result:
            on_result(t, row)
    return out


def _free(device: Any) -> None:
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
