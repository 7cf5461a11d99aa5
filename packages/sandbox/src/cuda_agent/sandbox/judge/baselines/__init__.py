"""Eager and ``torch.compile`` baselines of a task's reference, measured once and cached.

A baseline is measured once per task, GPU model, torch version, precision policy and
profiler, stored as a small JSON record, and read back by every later profile of any
candidate for the task. The modules: :mod:`.cache` (records and their keys),
:mod:`.staleness` (when a record stands; timing-rule stamps; why one is measured again),
:mod:`.reference` (the model and input sets timed), :mod:`.cpu_threads` (one thread count for
every timing on the CPU), :mod:`.compiled` (the ``torch.compile`` warm-up and timing) and
:mod:`.measure` (the measurement, one task or many), :mod:`.as_candidate` (a task's baselines
timed in a candidate's process, as a candidate is). Their public names import from here.
"""

from __future__ import annotations

from .as_candidate import time_as_candidate
from .cache import CACHE_ENV, BaselineCache, cache_for, default_cache_dir, gpu_name, key_fields, timing_from
from .compiled import compile_model, compiled_timing, dynamo_frames, time_model, warm_compiled
from .cpu_threads import is_cpu, threads_for, timing_threads
from .measure import (
    BaselineError,
    BaselineOptions,
    cached_baselines,
    default_profiler,
    free_device_memory,
    measure_baselines,
    measure_baselines_record,
    measure_many,
    measure_model,
)
from .reference import auto_input_sets, build_reference, load_code, rotation_sets
from .staleness import TIMING_RULE, cached_record, noisy, stale_reason, under_current_rule

__all__ = [
    "CACHE_ENV", "TIMING_RULE", "BaselineCache", "BaselineError", "BaselineOptions", "auto_input_sets",
    "build_reference", "cache_for", "cached_baselines", "cached_record", "compile_model", "compiled_timing", "default_cache_dir",
    "default_profiler", "dynamo_frames", "free_device_memory", "gpu_name", "is_cpu", "key_fields", "load_code", "measure_baselines",
    "measure_baselines_record", "measure_many", "measure_model", "noisy", "rotation_sets", "stale_reason",
    "threads_for", "time_as_candidate", "time_model", "timing_from", "timing_threads", "under_current_rule", "warm_compiled",
]
