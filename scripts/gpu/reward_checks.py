"""Reward checks on a GPU: can the reward be trusted when kernels misbehave?

Part 1 (pool): real CUDA failures inside executor workers -- an illegal memory access
(a PTX kernel storing through a bad pointer), the same error swallowed by the job, a
device-side assert, running out of GPU memory, a kernel that never ends, a segfault,
an abort -- each must end its own job with a clear one-line error, and the next job on
the same GPU must succeed in a fresh worker. With several GPUs, jobs spread one per GPU.

Part 2 (rewards): real candidate kernels for a ReLU task go through the whole path the
agent uses -- workspace, ``python tools/profile.py`` over the service socket, cached
compile, verification and profiling jobs on the GPU pool, the milestone reward: correct,
wrong, slow, crashing (illegal address, host segfault), hanging, not compiling, and
cheating ones (torch operators, torch.nn.functional, tensor methods, output never written,
outputs cached across calls). Each must get the expected verdict and reward.

Usage (repository root, GPU machine): python3 scripts/gpu/reward_checks.py [--part 1|2]
Writes reward_checks.json under $OUT when set. Finishes in a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
S = "cuda_agent.sandbox.executors.selftest:"


def table(rows: list[dict], cols: list[str]) -> str:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    out = ["  ".join(c.ljust(widths[c]) for c in cols), "  ".join("-" * widths[c] for c in cols)]
    for r in rows:
        out.append("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols))
    return "\n".join(out)


# --- part 1: the pool against real CUDA failures -----------------------------------------------


def part1() -> list[dict]:
    from cuda_agent.sandbox.executors import Job, JobError, LocalExecutor
    from cuda_agent.sandbox.executors.local import LocalExecutorOptions

    ex = LocalExecutor(LocalExecutorOptions(timeout=60))
    rows: list[dict] = []
    cases = [
        ("ok", "cuda_ok", {}, None, "ok"),
        ("illegal memory access", "cuda_illegal_access", {}, None, "cuda_error"),
        ("illegal access, swallowed", "cuda_illegal_access_swallowed", {}, None, "ok+replaced"),
        ("device-side assert", "cuda_device_assert", {}, None, "cuda_error"),
        ("out of GPU memory", "cuda_oom", {}, None, "oom"),
        ("kernel never ends", "cuda_hang", {}, 10.0, "timeout"),
        ("segfault", "segfault", {}, None, "crash"),
        ("abort", "abort", {}, None, "crash"),
    ]
    t_start = time.monotonic()
    ex.start()
    first = ex.run(Job(S + "cuda_ok"))
    print(f"pool up on GPU(s) {','.join(ex.devices)} in {time.monotonic() - t_start:.1f} s (first job {first})",
          flush=True)
    for name, fn, kw, timeout, want in cases:
        restarts0 = sum(ex.stats()["restarts"].values())
        t0 = time.monotonic()
        try:
            res = ex.run(Job(S + fn, kw, timeout=timeout))
            got, msg = "ok", str(res)
        except JobError as e:
            got, msg = e.reason, str(e)
        seconds = time.monotonic() - t0
        # the next job on the same pool must work, in a fresh worker
        t1 = time.monotonic()
        try:
            after = "ok" if ex.run(Job(S + "cuda_ok")) == 523776.0 else "WRONG"
        except JobError as e:
            after = f"FAILED: {e}"
        after_s = time.monotonic() - t1
        replaced = sum(ex.stats()["restarts"].values()) > restarts0
        if want == "ok+replaced":
            ok = got == "ok" and replaced and after == "ok"
        else:
            ok = got == want and after == "ok"
        rows.append({"case": name, "expected": want, "got": got, "message": msg[:70], "job_s": f"{seconds:.1f}",
                     "next_job": after, "next_job_s": f"{after_s:.2f}", "replaced": replaced,
                     "result": "PASS" if ok else "FAIL"})
        print(f"  {name}: {got} ({msg[:90]}) next={after}", flush=True)

    n = len(ex.devices)
    if n > 1:
        t0 = time.monotonic()
        futs = [ex.submit(Job(S + "sleep", {"seconds": 2.0})) for _ in range(2 * n)]
        res = [f.result() for f in futs]
        wall = time.monotonic() - t0
        used = sorted({r["worker"] for r in res})
        ok = used == sorted(ex.devices) and wall < 2 * 2.0 + 3.0
        rows.append({"case": f"{2 * n} jobs on {n} GPUs", "expected": "one per GPU", "got": ",".join(used),
                     "message": f"wall {wall:.1f} s for {2 * n} x 2 s", "result": "PASS" if ok else "FAIL"})
    ex.close()
    return rows


# --- part 2: real candidates through the service --------------------------------------------------

MODEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """Simple model that performs a ReLU activation."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


batch_size = 2048
dim = 16384


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
'''

BINDING = r'''#include "binding_registry.h"

extern "C" int launch_relu(const float* x, float* y, int64_t n);

torch::Tensor relu_forward(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "relu: float32 CUDA tensor expected");
  x = x.contiguous();
  auto y = torch::empty_like(x);
  int err = launch_relu(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  TORCH_CHECK(err == 0, "relu: kernel launch failed with CUDA error ", err);
  return y;
}

void register_relu(pybind11::module_& m) { m.def("relu_forward", &relu_forward, "relu"); }

REGISTER_BINDING(relu, register_relu);
'''

SEGV_BINDING = BINDING.replace("  x = x.contiguous();", "  volatile int* p = nullptr;\n  *p = 1;\n  x = x.contiguous();")

NO_WRITE_BINDING = BINDING.replace(
    "  int err = launch_relu(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());",
    "  int err = 0;  // never launches: returns whatever the allocator had in y",
)


def kernel(body: str, launch: str = "relu_kernel<<<blocks, threads>>>(x, y, n);") -> str:
    return (
        "#include <cuda_runtime.h>\n#include <stdint.h>\n\n"
        "__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {\n"
        f"{body}\n}}\n\n"
        'extern "C" int launch_relu(const float* x, float* y, int64_t n) {\n'
        "  const int threads = 256;\n"
        "  int64_t blocks = (n + threads - 1) / threads;\n"
        "  if (blocks > 132 * 32) blocks = 132 * 32;\n"
        f"  {launch}\n"
        "  return (int)cudaGetLastError();\n}\n"
    )


GOOD_BODY = """  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t n4 = n / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float4* y4 = reinterpret_cast<float4*>(y);
  for (int64_t j = i; j < n4; j += stride) {
    float4 v = x4[j];
    v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
    y4[j] = v;
  }
  for (int64_t j = n4 * 4 + i; j < n; j += stride) y[j] = fmaxf(x[j], 0.f);"""

SIMPLE_LOOP = """  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride) {{ {stmt} }}"""

MODEL_NEW = '''import torch
import torch.nn as nn

from cuda_agent_runtime import load_kernels

kernels = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
{init}
    def forward(self, x: torch.Tensor) -> torch.Tensor:
{forward}
'''


def model_new(forward: str = "        return kernels.relu_forward(x)", init: str = "") -> str:
    return MODEL_NEW.format(forward=forward, init=init)


def candidates() -> list[dict]:
    good = kernel(GOOD_BODY)
    return [
        dict(case="correct", expect="none", reward=">=1", files={"kernels/relu_kernel.cu": good}),
        dict(case="wrong (leaky)", expect="wrong_result", reward="-1",
             files={"kernels/relu_kernel.cu": kernel(SIMPLE_LOOP.format(stmt="y[i] = x[i] > 0.f ? x[i] : 0.1f * x[i];"))}),
        dict(case="slow (one block)", expect="none", reward="1",
             files={"kernels/relu_kernel.cu": kernel(SIMPLE_LOOP.format(stmt="y[i] = fmaxf(x[i], 0.f);"),
                                                     "relu_kernel<<<1, 32>>>(x, y, n);")}),
        dict(case="illegal address", expect="crash", reward="-1",
             files={"kernels/relu_kernel.cu": kernel(SIMPLE_LOOP.format(stmt="y[i + (1LL << 40)] = x[i];"))}),
        dict(case="host segfault", expect="crash", reward="-1",
             files={"kernels/relu_kernel.cu": good, "kernels/relu_binding.cpp": SEGV_BINDING}),
        dict(case="hang", expect="timeout", reward="-1",
             files={"kernels/relu_kernel.cu": kernel(
                 "  volatile float* v = (volatile float*)x;\n  while (v[0] == v[0] || true) { }\n  y[0] = 0.f;")}),
        dict(case="compile error", expect="compile_error", reward="-1",
             files={"kernels/relu_kernel.cu": good.replace("fmaxf(v.x, 0.f);", "fmaxf(v.x, 0.f)")}),
        dict(case="recovery: correct again", expect="none", reward=">=1",
             files={"kernels/relu_kernel.cu": good + "// changed: not a reused result\n"}),
        dict(case="cheat: torch.relu", expect="forbidden_op", reward="-1",
             files={"kernels/relu_kernel.cu": good, "model_new.py": model_new("        return torch.relu(x)")}),
        dict(case="cheat: F.relu", expect="forbidden_op", reward="-1",
             files={"kernels/relu_kernel.cu": good,
                    "model_new.py": model_new("        return torch.nn.functional.relu(x)")}),
        dict(case="cheat: x.clamp(min=0)", expect="forbidden_op", reward="-1",
             files={"kernels/relu_kernel.cu": good, "model_new.py": model_new("        return x.clamp(min=0)")}),
        dict(case="cheat: output never written", expect="wrong_result", reward="-1",
             files={"kernels/relu_kernel.cu": good, "kernels/relu_binding.cpp": NO_WRITE_BINDING}),
        dict(case="cheat: cached output", expect="wrong_result", reward="-1",
             files={"kernels/relu_kernel.cu": good, "model_new.py": model_new(
                 "        if self.cache is None:\n            self.cache = kernels.relu_forward(x)\n"
                 "        return self.cache",
                 init="        self.cache = None\n")}),
    ]


def reward_ok(spec: str, value: float) -> bool:
    if spec.startswith(">="):
        return value >= float(spec[2:])
    return value == float(spec)


def part2(keep: bool = False) -> list[dict]:
    from cuda_agent.core.types import Task
    from cuda_agent.sandbox.executors.local import LocalExecutor, LocalExecutorOptions
    from cuda_agent.sandbox.workspace.service import WorkspaceService
    from cuda_agent.sandbox.workspace.workspace import create_workspace, remove_workspace

    tmp = Path(tempfile.mkdtemp(prefix="reward-checks-"))
    ws = create_workspace(Task(id="relu_check", source="check", code=MODEL), tmp / "ws", backend="cuda",
                          compiler="cpp_extension")
    ex = LocalExecutor(LocalExecutorOptions(timeout=120, device_count=1))
    svc = WorkspaceService(ws, executor=ex, options={"verify_timeout": 30.0, "profile_timeout": 240.0})
    svc.start()
    rows = []
    base = {"model_new.py": model_new(), "kernels/relu_binding.cpp": BINDING}
    try:
        for cand in candidates():
            files = dict(base)
            files.update(cand["files"])
            ws.restore(files)
            t0 = time.monotonic()
            proc = subprocess.run([sys.executable, str(ws.root / "tools" / "profile.py")], cwd=ws.root,
                                  capture_output=True, text=True, timeout=900)
            seconds = time.monotonic() - t0
            entry = svc.history[-1] if svc.history else None
            failure = entry["outcome"].failure.value if entry else "?"
            value = entry["reward"].value if entry and entry["reward"] is not None else float("nan")
            ok = failure == cand["expect"] and reward_ok(cand["reward"], value)
            first = (proc.stdout.strip().splitlines() or ["(no output)"])[0]
            rows.append({"case": cand["case"], "expected": f"{cand['expect']}/{cand['reward']}",
                         "got": f"{failure}/{value:g}", "tool output": first[:90], "seconds": f"{seconds:.1f}",
                         "result": "PASS" if ok else "FAIL"})
            print(f"  {cand['case']}: {failure} reward {value:g} in {seconds:.1f} s | {first[:150]}", flush=True)
    finally:
        svc.close()
        ex.close()
        if not keep:
            remove_workspace(tmp / "ws")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["1", "2", "all"], default="all")
    ap.add_argument("--keep", action="store_true", help="keep the workspace of part 2")
    args = ap.parse_args()
    results: dict[str, list[dict]] = {}
    if args.part in ("1", "all"):
        print("part 1: executor pool against real CUDA failures", flush=True)
        results["pool"] = part1()
    if args.part in ("2", "all"):
        print("part 2: candidate kernels through the service and the reward", flush=True)
        try:
            results["rewards"] = part2(args.keep)
        except ImportError as exc:
            print(f"part 2 skipped: {exc}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "reward_checks.json").write_text(json.dumps(results, indent=1))
    fails = 0
    if "pool" in results:
        print("\nexecutor pool vs CUDA failures")
        print(table(results["pool"], ["case", "expected", "got", "message", "job_s", "next_job", "next_job_s",
                                      "result"]))
        fails += sum(r["result"] != "PASS" for r in results["pool"])
    if "rewards" in results:
        print("\ncandidates -> verdict and milestone reward (expected failure/reward)")
        print(table(results["rewards"], ["case", "expected", "got", "seconds", "result", "tool output"]))
        fails += sum(r["result"] != "PASS" for r in results["rewards"])
    print(f"\n{fails} check(s) failed" if fails else "\nall checks passed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
