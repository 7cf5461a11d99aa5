"""Benchmark: the wall time of one reward (compile + verify + profile) for a small candidate.

Tasks: a 1x128 axpby (alpha * a + beta * b) and KernelBench level-1 19_ReLU (4096 x 393216),
each with a correct cpp_extension candidate (kernels/*.cu + *_binding.cpp + model_new.py).

Ours, per task, through the workspace service and the GPU executor pool:
  * cold      -- first reward of the task: empty build cache and empty baseline cache
                 (builds everything, measures eager and torch.compile once);
  * edit      -- the agent's loop: one .cu changed, baselines cached (median of --repeat);
  * unchanged -- nothing changed since the last build (cache hits), fresh verification;
  * tool      -- ``python tools/profile.py`` after an edit, as the agent runs it.

The paper's method, re-implemented side by side (``--paper``, on by default): a forced
``torch.utils.cpp_extension.load`` rebuild in a fresh build folder, a fresh process that
verifies on 5 inputs made on the CPU, a fresh process that profiles eager, torch.compile
(compiled again) and the candidate with the torch profiler.

Targets (H200): one reward <= 6 s for axpby 1x128 and <= 15 s for L1 ReLU.
Usage (repository root, GPU machine): python3 scripts/gpu/bench_reward.py [--repeat 3] [--no-paper]
Writes bench_reward.json under $OUT when set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGETS = {"axpby_1x128": 6.0, "relu_l1": 15.0}

AXPBY_MODEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, alpha: float, beta: float):
        super().__init__()
        self.alpha = alpha
        self.beta = beta

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.alpha * a + self.beta * b


def get_inputs():
    return [torch.randn(1, 128), torch.randn(1, 128)]


def get_init_inputs():
    return [2.0, 0.5]
'''

AXPBY_KERNEL = r'''#include <cuda_runtime.h>
#include <stdint.h>

__global__ void axpby_kernel(const float* __restrict__ a, const float* __restrict__ b,
                             float* __restrict__ out, float alpha, float beta, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = alpha * a[i] + beta * b[i];
}

extern "C" int launch_axpby(const float* a, const float* b, float* out, float alpha, float beta,
                            int64_t n) {
  const int threads = 128;
  int64_t blocks = (n + threads - 1) / threads;
  axpby_kernel<<<(unsigned)blocks, threads>>>(a, b, out, alpha, beta, n);
  return (int)cudaGetLastError();
}
'''

AXPBY_BINDING = r'''#include "binding_registry.h"

extern "C" int launch_axpby(const float* a, const float* b, float* out, float alpha, float beta,
                            int64_t n);

torch::Tensor axpby_forward(torch::Tensor a, torch::Tensor b, double alpha, double beta) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda(), "axpby: inputs must be CUDA tensors");
  TORCH_CHECK(a.sizes() == b.sizes(), "axpby: shapes differ");
  a = a.contiguous();
  b = b.contiguous();
  auto out = torch::empty_like(a);
  int err = launch_axpby(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(),
                         (float)alpha, (float)beta, a.numel());
  TORCH_CHECK(err == 0, "axpby: kernel launch failed with CUDA error ", err);
  return out;
}

void register_axpby(pybind11::module_& m) { m.def("axpby_forward", &axpby_forward, "axpby"); }

REGISTER_BINDING(axpby, register_axpby);
'''

AXPBY_NEW = '''import torch
import torch.nn as nn

from cuda_agent_runtime import load_kernels

kernels = load_kernels()


class ModelNew(nn.Module):
    def __init__(self, alpha: float, beta: float):
        super().__init__()
        self.alpha = alpha
        self.beta = beta

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return kernels.axpby_forward(a, b, self.alpha, self.beta)
'''

RELU_KERNEL = r'''#include <cuda_runtime.h>
#include <stdint.h>

__global__ void relu_kernel(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (; i < n4; i += stride) {
    float4 v = x[i];
    v.x = fmaxf(v.x, 0.f); v.y = fmaxf(v.y, 0.f); v.z = fmaxf(v.z, 0.f); v.w = fmaxf(v.w, 0.f);
    y[i] = v;
  }
}

__global__ void relu_tail(const float* __restrict__ x, float* __restrict__ y, int64_t start, int64_t n) {
  int64_t i = start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaxf(x[i], 0.f);
}

extern "C" int launch_relu(const float* x, float* y, int64_t n) {
  int64_t n4 = n / 4;
  if (n4 > 0) relu_kernel<<<132 * 16, 512>>>((const float4*)x, (float4*)y, n4);
  if (n4 * 4 < n) relu_tail<<<1, 256>>>(x, y, n4 * 4, n);
  return (int)cudaGetLastError();
}
'''

RELU_BINDING = r'''#include "binding_registry.h"

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

RELU_NEW = '''import torch
import torch.nn as nn

from cuda_agent_runtime import load_kernels

kernels = load_kernels()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.relu_forward(x)
'''


def relu_model(root: str | None) -> str:
    for cand in (root, os.environ.get("CUDA_AGENT_KERNELBENCH"), REPO / "shared" / "kernelbench",
                 REPO.parent / "shared" / "kernelbench"):
        if cand and (Path(cand) / "level1" / "19_ReLU.py").is_file():
            return (Path(cand) / "level1" / "19_ReLU.py").read_text()
    # KernelBench level1/19_ReLU.py, as published
    return textwrap.dedent('''\
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            """Simple model that performs a ReLU activation."""
            def __init__(self):
                super(Model, self).__init__()

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return torch.relu(x)

        batch_size = 4096
        dim = 393216

        def get_inputs():
            x = torch.rand(batch_size, dim)
            return [x]

        def get_init_inputs():
            return []
        ''')


def tasks(root: str | None) -> dict[str, dict]:
    return {
        "axpby_1x128": {"model": AXPBY_MODEL, "kernel": "kernels/axpby_kernel.cu",
                        "files": {"kernels/axpby_kernel.cu": AXPBY_KERNEL, "kernels/axpby_binding.cpp": AXPBY_BINDING,
                                  "model_new.py": AXPBY_NEW}},
        "relu_l1": {"model": relu_model(root), "kernel": "kernels/relu_kernel.cu",
                    "files": {"kernels/relu_kernel.cu": RELU_KERNEL, "kernels/relu_binding.cpp": RELU_BINDING,
                              "model_new.py": RELU_NEW}},
    }


# --- ours ------------------------------------------------------------------------------------------


def one_reward(svc) -> dict:
    """compile + verify + profile + score, timed by step."""
    t0 = time.perf_counter()
    c = svc.compile()
    t1 = time.perf_counter()
    v = svc.jobs.verify(svc.root, c)
    t2 = time.perf_counter()
    p = svc.jobs.profile(svc.root) if v.ok else None
    t3 = time.perf_counter()
    from cuda_agent.core.types import CandidateOutcome

    r = svc.reward.score(CandidateOutcome(compile=c, verify=v, profile=p))
    t4 = time.perf_counter()
    return {"compile_s": t1 - t0, "verify_s": t2 - t1, "profile_s": t3 - t2, "total_s": t4 - t0,
            # time inside the jobs themselves; the rest of verify_s/profile_s is queueing and worker start
            "verify_job_s": v.seconds, "profile_job_s": p.seconds if p else None,
            "reward": r.value, "correct": r.correct, "failure": r.failure.value,
            "compile_cached": c.cached, "baselines": (p.metadata.get("baseline_cache") if p else None),
            "t_ms": p.candidate.median_ms if p and p.candidate else None,
            "eager_ms": p.eager.median_ms if p and p.eager else None,
            "compile_ms": p.compile.median_ms if p and p.compile else None,
            "message": (v.message if not v.ok else (p.message if p and not p.ok else ""))[:200]}


def bench_ours(name: str, task: dict, repeat: int, tmp: Path) -> list[dict]:
    from cuda_agent.core.types import Task
    from cuda_agent.sandbox.executors.local import LocalExecutor, LocalExecutorOptions
    from cuda_agent.sandbox.workspace.service import WorkspaceService
    from cuda_agent.sandbox.workspace.workspace import create_workspace

    rows = []
    ws = create_workspace(Task(id=name, source="bench", code=task["model"]), tmp / f"ws-{name}", backend="cuda",
                          compiler="cpp_extension")
    ws.restore(task["files"])
    t0 = time.perf_counter()
    ex = LocalExecutor(LocalExecutorOptions(device_count=1, timeout=600)).start()
    svc = WorkspaceService(ws, executor=ex, options={"verify_timeout": 300.0, "profile_timeout": 600.0}).start()
    ex.pool._slots[0]._ready_worker()  # wait for the first worker (pool start-up is not part of a reward)
    pool_s = time.perf_counter() - t0
    print(f"[{name}] pool and service up in {pool_s:.1f} s", flush=True)
    try:
        r = one_reward(svc)
        rows.append({"task": name, "method": "ours", "case": "cold (first reward of the task)", **r})
        print(f"[{name}] cold: {r}", flush=True)
        kernel_path = ws.root / task["kernel"]
        edits = []
        for i in range(repeat):
            kernel_path.write_text(task["files"][task["kernel"]] + f"\n// edit {i} {time.time()}\n")
            r = one_reward(svc)
            edits.append(r)
            print(f"[{name}] edit {i}: {r}", flush=True)
        rows.append({"task": name, "method": "ours", "case": f"edit one .cu (median of {repeat})", **median_row(edits)})
        same = [one_reward(svc) for _ in range(repeat)]
        rows.append({"task": name, "method": "ours", "case": f"unchanged files (median of {repeat})", **median_row(same)})
        kernel_path.write_text(task["files"][task["kernel"]] + f"\n// tool edit {time.time()}\n")
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, str(ws.root / "tools" / "profile.py")], cwd=ws.root,
                              capture_output=True, text=True, timeout=900)
        tool_s = time.perf_counter() - t
        first = (proc.stdout.strip().splitlines() or [""])[0]
        last = svc.history[-1]
        rows.append({"task": name, "method": "ours", "case": "python tools/profile.py after an edit",
                     "total_s": tool_s, "reward": last["reward"].value if last.get("reward") else None,
                     "correct": last["outcome"].correct, "message": first[:200]})
        print(f"[{name}] tool: {tool_s:.2f} s: {first}", flush=True)
    finally:
        svc.close()
        ex.close()
    return rows


def median_row(rows: list[dict]) -> dict:
    out = dict(rows[-1])
    for k in ("compile_s", "verify_s", "profile_s", "total_s", "verify_job_s", "profile_job_s"):
        vals = [r[k] for r in rows if r.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None
    out["correct"] = all(r["correct"] for r in rows)
    return out


# --- the paper's method, re-implemented --------------------------------------------------------------

PAPER_COMPILE = r'''
import glob, os, sys, time
from torch.utils.cpp_extension import load
ws, build = sys.argv[1], sys.argv[2]
srcs = [os.path.join(ws, "binding.cpp")] + sorted(glob.glob(os.path.join(ws, "kernels", "*.cu"))) \
    + sorted(glob.glob(os.path.join(ws, "kernels", "*_binding.cpp")))
t = time.perf_counter()
load(name="cuda_extension", sources=srcs, build_directory=build, extra_include_paths=[ws, os.path.join(ws, "kernels")],
     extra_cflags=["-O3"], extra_cuda_cflags=["-O3", "--use_fast_math"], with_cuda=True, verbose=False)
print("built in", time.perf_counter() - t)
'''

PAPER_COMMON = r'''
import importlib.util, os, sys, time, torch
ws, build = sys.argv[1], sys.argv[2]
sys.path.insert(0, build)
import cuda_extension
import types
rt = types.ModuleType("cuda_agent_runtime"); rt.load_kernels = lambda *a, **k: cuda_extension
sys.modules["cuda_agent_runtime"] = rt
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m); return m
ref = load(os.path.join(ws, "model.py"), "model"); new = load(os.path.join(ws, "model_new.py"), "model_new")
init = ref.get_init_inputs()
model = ref.Model(*init).cuda(); cand = new.ModelNew(*init).cuda()
'''

PAPER_VERIFY = PAPER_COMMON + r'''
import torch.nn.functional as F
ok = True
with torch.no_grad():
    for trial in range(5):
        torch.manual_seed(trial)
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ref.get_inputs()]
        want = model(*inputs); got = cand(*inputs); torch.cuda.synchronize()
        ok = ok and torch.allclose(want, got, atol=1e-2, rtol=1e-2)
print("correct" if ok else "wrong")
'''

PAPER_PROFILE = PAPER_COMMON + r'''
from torch.profiler import profile, ProfilerActivity
def device_ms(fn, inputs, warmup=3, iters=10):
    with torch.no_grad():
        for _ in range(warmup):
            fn(*inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn(*inputs)
            torch.cuda.synchronize()
    total_us = sum(e.self_device_time_total for e in prof.key_averages())
    return total_us / iters / 1000.0
inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ref.get_inputs()]
t_eager = device_ms(model, inputs)
compiled = torch.compile(model)
t_compile = device_ms(compiled, inputs)
t = device_ms(cand, inputs)
print(f"eager {t_eager:.4f} ms compile {t_compile:.4f} ms candidate {t:.4f} ms")
'''


def bench_paper(name: str, task: dict, tmp: Path) -> dict:
    from cuda_agent.core.types import Task
    from cuda_agent.sandbox.workspace.workspace import create_workspace

    ws = create_workspace(Task(id=name, source="bench", code=task["model"]), tmp / f"paper-{name}", backend="cuda",
                          compiler="cpp_extension")
    ws.restore(task["files"])
    build = tmp / f"paper-build-{name}"
    out: dict = {"task": name, "method": "paper (re-implemented)", "case": "forced rebuild + 5-input verify + profile"}
    steps = [("compile_s", PAPER_COMPILE), ("verify_s", PAPER_VERIFY), ("profile_s", PAPER_PROFILE)]
    env = dict(os.environ)
    env["TORCH_EXTENSIONS_DIR"] = str(tmp / "torch-ext")
    for key, code in steps:
        if key == "compile_s":
            import shutil

            shutil.rmtree(build, ignore_errors=True)
            build.mkdir(parents=True)
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code, str(ws.root), str(build)], capture_output=True, text=True,
                              timeout=900, env=env)
        out[key] = time.perf_counter() - t
        if proc.returncode != 0:
            out["message"] = f"{key[:-2]} failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:150]
            break
        if key == "verify_s":
            out["correct"] = proc.stdout.strip().endswith("correct")
        if key == "profile_s":
            out["message"] = proc.stdout.strip().splitlines()[-1][:200]
        print(f"[{name}] paper {key}: {out[key]:.1f} s {proc.stdout.strip()[-120:]}", flush=True)
    out["total_s"] = sum(out.get(k, 0.0) for k, _ in steps)
    return out


def fmt(v, nd=2):
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tasks", default="axpby_1x128,relu_l1")
    ap.add_argument("--no-paper", action="store_true", help="skip the re-implementation of the paper's method")
    ap.add_argument("--root", default=None, help="KernelBench folder (default: $CUDA_AGENT_KERNELBENCH, shared/kernelbench)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-reward-"))
    # empty caches: the cold row pays for the build of everything and for the baselines, once
    os.environ["CUDA_AGENT_BUILD_CACHE"] = str(tmp / "build-cache")
    os.environ["CUDA_AGENT_BASELINE_CACHE"] = str(tmp / "baseline-cache")
    all_tasks = tasks(args.root)
    rows: list[dict] = []
    for name in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        rows += bench_ours(name, all_tasks[name], args.repeat, tmp)
        if not args.no_paper:
            rows.append(bench_paper(name, all_tasks[name], tmp))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_reward.json").write_text(json.dumps(rows, indent=1, default=str))

    cols = ["task", "method", "case", "compile_s", "verify_s", "profile_s", "total_s", "target", "reward",
            "verify_job_s", "profile_job_s", "message"]
    table = []
    for r in rows:
        row = {c: fmt(r.get(c)) for c in cols}
        if r["method"] == "ours" and r["case"].startswith(("edit", "python tools")):
            tgt = TARGETS.get(r["task"])
            ok = r.get("total_s") is not None and r["total_s"] <= tgt and r.get("correct")
            row["target"] = f"<={tgt:g} {'OK' if ok else 'MISSED'}"
        row["message"] = (r.get("message") or "")[:60]
        table.append(row)
    widths = {c: max(len(c), *(len(t[c]) for t in table)) for c in cols}
    print("\none reward = compile + verify + profile (seconds, wall; *_job_s: inside the job)")
    print("  ".join(c.ljust(widths[c]) for c in cols))
    print("  ".join("-" * widths[c] for c in cols))
    for t in table:
        print("  ".join(t[c].ljust(widths[c]) for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
