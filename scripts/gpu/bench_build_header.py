"""What the judge's precompiled ``torch/extension.h`` saves a single-file solution's build.

A KernelBench solution builds its extension with ``load_inline`` when imported; the judge
runs that build ahead of the GPU job, several at a time on the host's cores (about 55 s each,
7 at a time on 16 cores, in ``bench_judge_throughput``). The build's ``main.cpp`` is
``#include <torch/extension.h>`` and a pybind11 module: most of its compile is the header.
The judge makes that header once, precompiled, and its build jobs find it through ``CPATH``
(:mod:`cuda_agent.sandbox.compilers.torch_header`). This measures, on this host:

* making the header as the judge does (the probe build of torch's flags, then the plain and
  the ``-O3`` variant at once), its seconds and size;
* whole ``load_inline`` builds as solutions make them (a CUDA kernel where torch has CUDA,
  else C++ only; ``-O3``; two compiler processes each, as the build pool sets ``MAX_JOBS``),
  ``--parallel`` at once as the pool runs them, without and with the header on ``CPATH``,
  each build a fresh extension of its own name;
* with ``--alone``, also one build at a time;
* for each row, the median seconds of each of a build's steps as ninja logged them
  (``main.o``, the CUDA unit ``cuda.cuda.o``, the link): which step is a build's long pole.

    python3 scripts/gpu/bench_build_header.py                   # anywhere with gcc and torch
    python3 scripts/gpu/bench_build_header.py --parallel 7      # as the pool runs on 16 cores
    python3 scripts/gpu/bench_build_header.py --parallel 7,14   # the pool's width against one build a core

With OUT set, the rows are written to ``$OUT/bench_build_header.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CPP = """
torch::Tensor bbh_scale(torch::Tensor x, double p) {
    return x * p;
}
"""

CUDA = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void bbh_kernel(const float* x, float* y, long n, float p) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * p;
}

torch::Tensor bbh_scale(torch::Tensor x, double p) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    bbh_kernel<<<(unsigned)((n + 255) / 256), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n, (float)p);
    return y;
}
"""


PROBE = r"""
import os, sys, time, uuid
from torch.utils import cpp_extension
name = "bbh_" + uuid.uuid4().hex[:8]
t = time.perf_counter()
if sys.argv[1] == "cuda":
    cpp_extension.load_inline(name, cpp_sources="torch::Tensor bbh_scale(torch::Tensor x, double p);",
                              cuda_sources=sys.argv[2], functions=["bbh_scale"], extra_cflags=["-O3"],
                              extra_cuda_cflags=["-O3"])
else:
    cpp_extension.load_inline(name, cpp_sources=sys.argv[2], functions=["bbh_scale"], with_cuda=False,
                              extra_cflags=["-O3"])
print(time.perf_counter() - t)
"""


def ninja_steps(ext_dir: Path) -> dict[str, float]:
    """Seconds of each step of the build under ``ext_dir`` (its extension's folder), from
    ninja's log: ``main.o``, ``cuda.cuda.o``, ``link`` (the shared object)."""
    steps: dict[str, float] = {}
    for log in ext_dir.glob("*/.ninja_log"):
        for line in log.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) < 4 or line.startswith("#"):
                continue
            name = "link" if parts[3].endswith(".so") else parts[3]
            steps[name] = (int(parts[1]) - int(parts[0])) / 1000.0
    return steps


def build_once(work: Path, cuda: bool, header: str, i: int) -> float:
    """Seconds of one whole load_inline build in a process of its own (``header``: the
    folder put on ``CPATH``, "" for none); its steps' seconds are in ``ext-<i>/*/.ninja_log``."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(work / f"ext-{i}"), "MAX_JOBS": "2"}
    env.pop("CPATH", None)
    if header:
        env["CPATH"] = header
    res = subprocess.run([sys.executable, "-c", PROBE, "cuda" if cuda else "cpp", CUDA if cuda else CPP],
                         capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"the build failed: {res.stderr[-800:]}")
    return float(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", default="",
                    help="builds at once, one or more widths (7,14); default: the judge's build pool "
                         "width on this host (auto_build_workers)")
    ap.add_argument("--alone", action="store_true", help="also one build at a time")
    ap.add_argument("--cpp-only", action="store_true", help="no CUDA kernel even where torch has CUDA")
    args = ap.parse_args()

    import torch
    from torch.utils import cpp_extension

    cores = os.cpu_count() or 2
    try:
        widths = sorted({int(w) for w in args.parallel.split(",") if w.strip()})
    except ValueError:
        ap.error(f"--parallel takes whole numbers separated by commas, not {args.parallel!r}")
    if any(w < 1 for w in widths):
        ap.error("--parallel: every width must be at least 1")
    if not widths:  # the judge's own build pool width on this host
        from cuda_agent.sandbox.judge.pipeline import JudgeOptions, auto_build_workers

        widths = [auto_build_workers(JudgeOptions(), torch.cuda.device_count())]
    cuda = torch.cuda.is_available() and cpp_extension.CUDA_HOME is not None and not args.cpp_only
    work = Path(tempfile.mkdtemp(prefix="bench-build-header-"))
    try:
        measure(work, cores, widths, cuda, args.alone)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the header alone is 1.6 GB


def measure(work: Path, cores: int, widths: list[int], cuda: bool, alone: bool) -> None:
    import torch

    from cuda_agent.sandbox.compilers.torch_header import TorchHeader, variant_taken

    print(f"host: {cores} cores; torch {torch.__version__}; {'a CUDA kernel' if cuda else 'C++ only'}; "
          f"{', '.join(map(str, widths))} builds at once", flush=True)
    header = TorchHeader(work / "header")
    t = time.perf_counter()
    info = header.build()
    header_s = time.perf_counter() - t
    header_mb = sum(v["bytes"] for v in info["variants"].values()) / 1e6
    print(f"  the header made in {header_s:.1f} s ({header_mb:.0f} MB, {len(info['variants'])} variants)", flush=True)

    rows = []
    n_builds = 0
    for with_header in (False, True):
        for n in sorted({1, *widths} if alone else set(widths)):
            idx = range(n_builds, n_builds + n)
            n_builds += n
            t0 = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                each = list(pool.map(lambda i: build_once(work, cuda, str(header.folder) if with_header else "", i), idx))
            wall = time.perf_counter() - t0
            logged = [ninja_steps(work / f"ext-{i}") for i in idx]
            steps = {k: round(statistics.median(d[k] for d in logged if k in d), 2)
                     for k in sorted({k for d in logged for k in d})}
            rows.append({"header": with_header, "at_once": n, "wall_s": round(wall, 2),
                         "median_s": round(statistics.median(each), 2), "builds_per_min": round(60 * n / wall, 2),
                         "steps_median_s": steps})
            print(f"  {n} builds {'with' if with_header else 'without'} the header: wall {wall:.1f} s, "
                  f"median {statistics.median(each):.1f} s; steps {steps}", flush=True)

    last = work / f"ext-{n_builds - 1}"  # a build made with the header: did its main.cpp take it?
    dirs = [d for d in last.iterdir() if (d / "build.ninja").is_file()] if last.is_dir() else []
    used = variant_taken(dirs[0], header.folder) if dirs else ""
    print(f"\nthe header made once in {header_s:.1f} s, {header_mb:.0f} MB; builds: "
          f"{'C++ and CUDA' if cuda else 'C++'}, -O3; their main.cpp takes the variant "
          f"{used or 'none (the flags fit no variant)'}")
    names = sorted({k for r in rows for k in r["steps_median_s"]}, key=lambda k: (k == "link", k))
    print("| builds | at once | wall s | median s per build | builds a minute | "
          + " | ".join(f"{k} s" for k in names) + " |")
    print("| --- | ---: | ---: | ---: | ---: |" + " ---: |" * len(names))
    for r in rows:
        print(f"| {'with the header' if r['header'] else 'without'} | {r['at_once']} | {r['wall_s']:.1f} | "
              f"{r['median_s']:.1f} | {r['builds_per_min']:.1f} | "
              + " | ".join(f"{r['steps_median_s'][k]:.1f}" if k in r["steps_median_s"] else "-" for k in names) + " |")
    base = {r["at_once"]: r["median_s"] for r in rows if not r["header"]}
    for r in rows:
        if r["header"] and base.get(r["at_once"]):
            print(f"{r['at_once']} at once: a build with the header takes {r['median_s'] / base[r['at_once']]:.2f}x "
                  f"the time without")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_build_header.json").write_text(json.dumps({
            "cores": cores, "cuda": cuda, "variant_used": used, "header_s": header_s, "header_mb": header_mb, "flags": info["flags"],
            "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
