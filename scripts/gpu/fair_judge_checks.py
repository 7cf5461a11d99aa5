"""GPU check: honest kernels in third-party styles pass, degenerate outputs and decoys fail.

Run from the repo root on a GPU machine: ``python3 scripts/gpu/fair_judge_checks.py``.
A Linear+ReLU task and a wide-softmax task (outputs far below atol) are judged through the
``local`` executor under the ``cuda-agent`` and ``kernelbench`` rule profiles: a plain
``load_inline`` CUDA solution whose parameters have other names than ``Model``'s (KernelBench's
seeded weights), the same kernel behind ``torch.library``, a decoy whose kernel result is
unused, and outputs that are zeros or constant where the reference is tiny. Prints one row per
sample: profile, verdict, rule, weights; writes JSON under ``$OUT``.

As ``cuda-agent eval`` judges single files: the refusals that need no GPU first, each file's
extension built once ahead in the CPU build pool (all files at once; the second profile finds
the build), then one verification job each, with a bounded timeout (``--timeout``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in ("core", "sandbox"):
    sys.path.insert(0, str(ROOT / "packages" / p / "src"))

GEMM_TASK = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, in_features, out_features):
            super().__init__()
            self.gemm = nn.Linear(in_features, out_features)

        def forward(self, x):
            return torch.relu(self.gemm(x))

    def get_inputs():
        return [torch.randn(256, 512)]

    def get_init_inputs():
        return [512, 384]
''')

SOFTMAX_TASK = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.softmax(x, dim=1)

    def get_inputs():
        return [torch.randn(64, 200000)]

    def get_init_inputs():
        return []
''')

CUDA = r'''
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
__global__ void linear_relu_kernel(const float* x, const float* w, const float* b, float* y, int m, int k, int n) {
    int i = blockIdx.y * blockDim.y + threadIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < m && j < n) {
        float acc = b[j];
        for (int t = 0; t < k; ++t) acc += x[i * k + t] * w[j * k + t];
        y[i * n + j] = acc > 0.f ? acc : 0.f;
    }
}
torch::Tensor linear_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    x = x.to(torch::kFloat32).contiguous();
    auto y = torch::empty({x.size(0), w.size(0)}, x.options());
    dim3 block(16, 16), grid((w.size(0) + 15) / 16, (x.size(0) + 15) / 16);
    linear_relu_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(),
        x.size(0), x.size(1), w.size(0));
    return y;
}
'''

HEAD = f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""{CUDA}"""
cpp_source = "torch::Tensor linear_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b);"
try:
    custom_op = load_inline(name="fair_gpu_linear_relu", cpp_sources=cpp_source, cuda_sources=cuda_source,
                            functions=["linear_relu"], verbose=False)
except Exception as e:
    print("building the extension failed:", e)
    raise
'''

OTHER_NAMES = HEAD + '''

class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        lin = nn.Linear(in_features, out_features)
        self.weight = nn.Parameter(lin.weight.detach().clone())
        self.bias = nn.Parameter(lin.bias.detach().clone())

    def forward(self, x):
        return custom_op.linear_relu(x, self.weight, self.bias)
'''

TORCH_LIBRARY = HEAD + '''

@torch.library.custom_op("fairgpu::linear_relu", mutates_args=())
def linear_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return custom_op.linear_relu(x, w, b)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.ops.fairgpu.linear_relu(x, self.gemm.weight, self.gemm.bias)
'''

DECOY = OTHER_NAMES.replace("        return custom_op.linear_relu(x, self.weight, self.bias)",
                            "        custom_op.linear_relu(x, self.weight, self.bias)\n"
                            "        return torch.relu(torch.nn.functional.linear(x, self.weight, self.bias))")

TINY = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return {ret}
'''

SAMPLES = [
    ("gemm", "other_names_load_inline", OTHER_NAMES, ("cuda-agent", "kernelbench"), True),
    ("gemm", "torch_library", TORCH_LIBRARY, ("cuda-agent", "kernelbench"), True),
    ("gemm", "decoy", DECOY, ("kernelbench", "cuda-agent"), False),
    ("softmax", "zeros", TINY.format(ret="torch.zeros_like(x)"), ("kernelbench", "none"), False),
    ("softmax", "constant", TINY.format(ret="torch.full_like(x, 5e-6)"), ("kernelbench", "none"), False),
]


def main() -> int:
    import argparse
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from cuda_agent.core.types import Task
    from cuda_agent.sandbox.executors import LocalExecutor
    from cuda_agent.sandbox.executors.local import LocalExecutorOptions
    from cuda_agent.sandbox.judge.pipeline import Judge, JudgeOptions
    from cuda_agent.sandbox.workspace.workspace import create_workspace

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for one verification job")
    ap.add_argument("--build-timeout", type=float, default=300.0, help="seconds for one file's build")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="fair-judge-"))
    os.chmod(tmp, 0o755)
    codes = {"gemm": GEMM_TASK, "softmax": SOFTMAX_TASK}
    ex = LocalExecutor(LocalExecutorOptions(device_count=1, timeout=900)).start()
    judge = Judge(JudgeOptions(verify_timeout=args.timeout, build_timeout=args.build_timeout,
                               build_workers=len(SAMPLES), prebuilt_cache=str(tmp / "prebuilt")), ex, backend="cuda")
    rows: list[dict] = []

    def one(item: tuple) -> list[dict]:
        task, sample, code, profiles, honest = item
        out = []
        for rules in profiles:  # the same file: built once, the second profile finds the build
            root = Path(create_workspace(Task(id=task, source="check", code=codes[task]),
                                         tmp / f"{sample}-{rules}", backend="cuda").root)
            (root / "model_new.py").write_text(code)
            options = {"seed": 3, "rules": rules, "weights": "auto"}
            t0 = time.perf_counter()
            r = judge.precheck(root, options)
            info: dict = {}
            if r is None:
                info = judge.prebuild(root)
                r = judge.verify(root, options=options, prebuilt=str(info.get("built", "")).startswith("ahead"))
            m = re.search(r"rule ([\w.\-]+)[:)]", r.message)
            row = {"task": task, "sample": sample, "profile": rules, "ok": r.ok, "expected": honest,
                   "rule": r.metadata.get("rule") or (m.group(1) if m else ""), "weights": r.metadata.get("weights"),
                   "seconds": round(time.perf_counter() - t0, 1), "build_s": info.get("build_seconds"),
                   "build_cached": info.get("cached"), "job_s": round(r.seconds, 1), "message": r.message[:300]}
            out.append(row)
            print(f"{task:8s} {sample:24s} {rules:12s} {'correct' if r.ok else 'refused':8s} {row['rule']:22s} "
                  f"{row['weights'] or '':10s} {row['seconds']:6.1f} s  {r.message[:100]}", flush=True)
            with lock:
                rows.append(row)
                if os.environ.get("OUT"):
                    Path(os.environ["OUT"], "fair_judge_checks.json").write_text(json.dumps(rows, indent=1))
        return out

    import threading

    lock = threading.Lock()
    try:
        with ThreadPoolExecutor(len(SAMPLES)) as pool:
            list(pool.map(one, SAMPLES))
    finally:
        judge.close()
        ex.close()
    wrong = [f"{r['sample']}/{r['profile']}" for r in rows
             if r["ok"] != (r["expected"] and not (r["sample"] == "decoy"))]
    # the decoy is refused under both: kernelbench.decoy, and the run-time guard under cuda-agent
    print(f"\n| task | sample | profile | verdict | rule | weights | build s | job s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: (r["task"], r["sample"], r["profile"])):
        build = "cached" if r["build_cached"] else (f"{r['build_s']:.1f}" if r["build_s"] else "-")
        print(f"| {r['task']} | {r['sample']} | {r['profile']} | {'correct' if r['ok'] else 'refused'} | "
              f"{r['rule'] or '-'} | {r['weights'] or '-'} | {build} | {r['job_s']:.1f} |")
    print(f"\nsamples judged against expectation: {len(rows) - len(wrong)}/{len(rows)}; unexpected: {wrong or 'none'}; "
          f"wall {time.perf_counter() - t_start:.0f} s")
    return 0 if not wrong and len(rows) == sum(len(s[3]) for s in SAMPLES) else 1


if __name__ == "__main__":
    sys.exit(main())
