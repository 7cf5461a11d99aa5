"""The settings of a process that decide which kernels its calls run and how they are fed:
torch's backend switches, the environment variables CUDA and its libraries read, the
current stream, the CPU threads. A baseline is timed in the trusted process (a task timed by
graph replay: in a candidate's process, :mod:`.baselines.as_candidate`) and a candidate in a
process of its own; both record these (:func:`process_flags`), and a profile lists the ones
that differed (:func:`flags_differ`), so that two timings taken under different settings are
seen as such.

What the candidate's process reports is its own word: it is read as a record of what the
process said (:func:`sanitized`), never as a check.
"""

from __future__ import annotations

import os
from typing import Any

# environment variables that change what CUDA, cuBLAS, cuDNN or torch's allocator do
ENV = (
    "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_MODULE_LOADING", "CUDA_LAUNCH_BLOCKING", "CUDA_VISIBLE_DEVICES",
    "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
    "TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT", "CUDNN_LOGLEVEL_DBG", "OMP_NUM_THREADS",
)
# what differs between the two processes by design: recorded, left out of the comparison
BY_DESIGN = ("uid", "nice", "device_free_bytes")
MAX_KEYS = 64


def process_flags(device: Any = None) -> dict[str, Any]:
    """This process's settings now (see the module notes); ``device``: the CUDA device whose
    current stream and free memory are recorded."""
    import torch

    from .precision import precision_flags

    flags: dict[str, Any] = dict(precision_flags())
    det = getattr(torch.utils, "deterministic", None)
    flags.update({
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "fill_uninitialized_memory": getattr(det, "fill_uninitialized_memory", None),
        "grad_enabled": bool(torch.is_grad_enabled()),
        "torch_threads": int(torch.get_num_threads()),
        "uid": os.getuid(),
        "nice": os.nice(0),
    })
    try:
        flags["cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        flags["cpus"] = os.cpu_count()
    for name in ENV:
        flags["env:" + name] = os.environ.get(name)
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and torch.cuda.is_available():
        stream = torch.cuda.current_stream(dev)
        flags["current_stream_is_default"] = int(stream.cuda_stream) == 0
        try:
            flags["allocator_backend"] = torch.cuda.get_allocator_backend()
        except Exception:  # noqa: BLE001 - older torch
            flags["allocator_backend"] = None
        flags["device_free_bytes"] = int(torch.cuda.mem_get_info(dev)[0])
    return flags


def sanitized(value: Any) -> dict[str, Any] | None:
    """Flags as another process sent them: at most :data:`MAX_KEYS` short keys with scalar
    values (strings cut to 200 characters); None when it is no mapping."""
    if not isinstance(value, dict):
        return None
    out: dict[str, Any] = {}
    for k, v in list(value.items())[:MAX_KEYS]:
        if not isinstance(k, str) or len(k) > 80:
            continue
        if isinstance(v, str):
            v = v[:200]
        elif v is not None and not isinstance(v, (bool, int, float)):
            continue
        out[k] = v
    return out


def flags_differ(baseline: dict | None, candidate: dict | None) -> dict[str, list]:
    """The settings whose values differ between the two records, as ``{name: [baseline's,
    candidate's]}`` (the ones that differ by design left out); empty when either is missing."""
    if not isinstance(baseline, dict) or not isinstance(candidate, dict):
        return {}
    keys = [k for k in dict.fromkeys(list(baseline) + list(candidate)) if k not in BY_DESIGN]
    return {k: [baseline.get(k), candidate.get(k)] for k in keys if baseline.get(k) != candidate.get(k)}
