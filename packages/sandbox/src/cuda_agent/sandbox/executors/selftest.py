"""Small jobs that misbehave on purpose: used by the executor tests and GPU checks to prove
that a pool survives whatever a candidate kernel does to its worker."""

from __future__ import annotations

import os
import time


def echo(value=None, device: str = "") -> dict:
    """Return where and how the job ran."""
    return {
        "value": value,
        "device": device,
        "pid": os.getpid(),
        "worker": os.environ.get("CUDA_AGENT_WORKER_DEVICE", ""),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def sleep(seconds: float = 0.1, value=None, device: str = "") -> dict:
    time.sleep(seconds)
    return echo(value, device)


def record(path: str, value, seconds: float = 0.0, device: str = "") -> dict:
    """Append ``value`` to ``path`` (order of execution), then sleep."""
    with open(path, "a") as f:
        f.write(f"{value}\n")
    time.sleep(seconds)
    return echo(value, device)


def hang(device: str = "") -> None:
    while True:
        time.sleep(1)


def hang_with_child(pid_file: str, device: str = "") -> None:
    """Start a grandchild process, then hang: a timeout must end both."""
    import subprocess

    child = subprocess.Popen(["sleep", "3600"])
    with open(pid_file, "w") as f:
        f.write(str(child.pid))
    while True:
        time.sleep(1)


def abort(device: str = "") -> None:
    os.abort()


def segfault(device: str = "") -> None:
    import ctypes

    ctypes.string_at(0)


def exit_code(code: int = 3, device: str = "") -> None:
    os._exit(code)


def fail(message: str = "boom", device: str = "") -> None:
    raise ValueError(message)


def fake_cuda_error(device: str = "") -> None:
    raise RuntimeError(
        "CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call"
    )


def allocate(mb: int = 1024, device: str = "") -> int:
    """Allocate and touch ``mb`` megabytes (runs out of memory under an RLIMIT_AS)."""
    block = bytearray(mb * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return len(block)


def unpicklable_result(device: str = ""):
    return lambda: None


def set_global(value, device: str = "") -> int:
    """Leave state behind in the worker process (a candidate monkey-patching something)."""
    os.environ["CUDA_AGENT_SELFTEST_STATE"] = str(value)
    return os.getpid()


def get_global(device: str = ""):
    return os.environ.get("CUDA_AGENT_SELFTEST_STATE")


def cuda_illegal_access(device: str = "cuda:0") -> None:
    """A real illegal memory access on the GPU (reads through a null pointer)."""
    import torch

    x = torch.empty(1, device=device)
    # an index far out of bounds through an unchecked path: write via a bad storage offset
    bad = torch.empty(0, device=device).as_strided((1,), (1,), 1 << 40)
    bad.fill_(1.0)
    torch.cuda.synchronize()
    return float(x.sum())


def cuda_oom(device: str = "cuda:0") -> None:
    import torch

    blocks = []
    while True:
        blocks.append(torch.empty(1 << 34, dtype=torch.uint8, device=device))


def cuda_ok(device: str = "cuda:0") -> float:
    import torch

    x = torch.arange(1024, device=device, dtype=torch.float32)
    return float(x.sum().item())
