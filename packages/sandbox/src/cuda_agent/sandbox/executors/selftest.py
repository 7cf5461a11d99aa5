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
        "parent": os.getppid(),
        "worker": os.environ.get("CUDA_AGENT_WORKER_DEVICE", ""),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def prestarted(device: str = "") -> bool:
    """Whether this worker started a candidate process for the judge ahead of its job (the
    pool's ``prestart`` option), without claiming it."""
    import sys

    client = sys.modules.get("cuda_agent.sandbox.judge.client")
    return client is not None and getattr(client, "_prestarted", None) is not None


def imported(names: list, device: str = "") -> list:
    """Which of the modules ``names`` this worker had imported before its job ran."""
    import sys

    return [n for n in names if n in sys.modules]


def sleep(seconds: float = 0.1, value=None, device: str = "") -> dict:
    start = time.monotonic()
    time.sleep(seconds)
    return {**echo(value, device), "start": start, "end": time.monotonic()}


def record(path: str, value, seconds: float = 0.0, device: str = "") -> dict:
    """Append ``value`` to ``path`` (order of execution), then sleep."""
    with open(path, "a") as f:
        f.write(f"{value}\n")
    time.sleep(seconds)
    return echo(value, device)


def quiet_section(kind: str, seconds: float, device: str = "") -> dict:
    """Hold the host's quiet lock (``timing`` or ``cpu_heavy``) for ``seconds``; returns
    when the section began and ended (``time.monotonic``, shared by all processes)."""
    from cuda_agent.sandbox.isolation import hostlock

    with getattr(hostlock, kind)() as waited:
        start = time.monotonic()
        time.sleep(seconds)
        end = time.monotonic()
    return {"start": start, "end": end, "waited": waited, "active": hostlock.active()}


def mark_init(device: str = "", seconds: float = 0.0) -> None:
    """A worker init step that stands for making a CUDA context: under the device's quiet lock,
    append this process's id and the time to $CUDA_AGENT_TEST_INIT_LOG. Before it, ``seconds``
    of work that takes no lock (as imports take none); $CUDA_AGENT_TEST_INIT_SECONDS sets it."""
    from cuda_agent.sandbox.isolation import hostlock

    time.sleep(seconds or float(os.environ.get("CUDA_AGENT_TEST_INIT_SECONDS", "0") or 0))
    path = os.environ.get("CUDA_AGENT_TEST_INIT_LOG")
    with hostlock.device_quiet():
        if path:
            with open(path, "a") as f:
                f.write(f"{os.getpid()} {time.monotonic()}\n")


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


_PTX_BAD_STORE = """
.version 7.0
.target sm_70
.address_size 64
.visible .entry bad_store(.param .u64 p)
{
  .reg .u64 %rd<2>;
  .reg .u32 %r<2>;
  ld.param.u64 %rd1, [p];
  mov.u32 %r1, 1;
  st.global.u32 [%rd1], %r1;
  ret;
}
"""

_PTX_SPIN = """
.version 7.0
.target sm_70
.address_size 64
.visible .entry spin(.param .u64 p)
{
  .reg .u64 %rd<2>;
  .reg .u32 %r<3>;
  ld.param.u64 %rd1, [p];
  mov.u32 %r1, 0;
LOOP:
  add.u32 %r1, %r1, 1;
  st.volatile.global.u32 [%rd1], %r1;
  bra LOOP;
}
"""


def _launch_ptx(ptx: str, name: str, arg: int, device: str) -> None:
    """Launch a one-thread PTX kernel through the driver API (no compiler needed)."""
    import ctypes

    import torch

    torch.zeros(1, device=device)  # makes torch's primary context current on this thread
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"CUDA driver error {code} in {what}")

    mod = ctypes.c_void_p()
    check(cuda.cuModuleLoadData(ctypes.byref(mod), ptx.encode()), "cuModuleLoadData")
    fn = ctypes.c_void_p()
    check(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), "cuModuleGetFunction")
    value = ctypes.c_uint64(arg)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(value), ctypes.c_void_p))
    check(cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, None), "cuLaunchKernel")
    torch.cuda.synchronize()


def cuda_illegal_access(device: str = "cuda:0") -> None:
    """A real illegal memory access: a kernel stores through a bad pointer."""
    _launch_ptx(_PTX_BAD_STORE, "bad_store", 0x10, device)


def cuda_illegal_access_swallowed(device: str = "cuda:0") -> str:
    """The same, but the job catches the error and returns normally: the worker's health
    check must still notice the sticky error and get the worker replaced."""
    try:
        _launch_ptx(_PTX_BAD_STORE, "bad_store", 0x10, device)
    except Exception as exc:
        return f"swallowed: {str(exc).splitlines()[0]}"
    return "no error"


def cuda_device_assert(device: str = "cuda:0") -> None:
    """An out-of-range index: torch's kernel fails a device-side assert."""
    import torch

    x = torch.zeros(16, device=device)
    idx = torch.tensor([1 << 30], device=device)
    y = x[idx]
    torch.cuda.synchronize()
    return float(y.sum())


def cuda_hang(device: str = "cuda:0") -> None:
    """A kernel that never ends."""
    import torch

    buf = torch.zeros(4, dtype=torch.int32, device=device)
    _launch_ptx(_PTX_SPIN, "spin", buf.data_ptr(), device)


def cuda_oom(device: str = "cuda:0") -> None:
    import torch

    blocks = []
    while True:
        blocks.append(torch.empty(1 << 34, dtype=torch.uint8, device=device))


def cuda_ok(device: str = "cuda:0") -> float:
    import torch

    x = torch.arange(1024, device=device, dtype=torch.float32)
    return float(x.sum().item())
