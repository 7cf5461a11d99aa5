"""What a precompiled ``torch/extension.h`` would save a single-file solution's build.

A KernelBench solution builds its extension with ``load_inline`` when imported; the judge
runs that build ahead of the GPU job, several at a time on the host's cores (about 55 s each,
7 at a time on 16 cores, in ``bench_judge_throughput``). The build's ``main.cpp`` is
``#include <torch/extension.h>`` and a pybind11 module: most of its compile is the header.
This measures, on this host:

* one ``load_inline`` build as a solution makes it (C++ only, or with a CUDA kernel where
  torch has CUDA), its ``main.cpp`` flags taken from the ``build.ninja`` it wrote;
* building ``torch/extension.h`` once as a precompiled header with those flags (less the
  extension's name), its seconds and size;
* compiling that ``main.cpp`` without and with the header (found through one more ``-I``
  folder; gcc's ``-H`` says whether it was used), one alone and ``--parallel`` at once, as the
  build pool runs them.

    python3 scripts/gpu/bench_build_header.py                # anywhere with gcc and torch
    python3 scripts/gpu/bench_build_header.py --parallel 7   # as the pool runs on 16 cores

With OUT set, the rows are written to ``$OUT/bench_build_header.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
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


def ninja_cflags(build_dir: Path) -> list[str]:
    """The ``cflags`` of the ``build.ninja`` that ``load_inline`` wrote."""
    for line in (build_dir / "build.ninja").read_text().splitlines():
        if line.startswith("cflags ="):
            return shlex.split(line.split("=", 1)[1])
    raise SystemExit(f"no cflags line in {build_dir / 'build.ninja'}")


def compile_once(cxx: str, flags: list[str], src: Path, out: Path) -> tuple[float, bool]:
    """Seconds to compile ``src``, and whether gcc used a precompiled header (``-H`` marks
    one it used with ``!``)."""
    t = time.perf_counter()
    res = subprocess.run([cxx, "-H", "-Winvalid-pch", *flags, "-c", str(src), "-o", str(out)],
                         capture_output=True, text=True)
    secs = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"compile failed: {res.stderr[-800:]}")
    used = any(line.startswith("! ") and line.rstrip().endswith(".gch") for line in res.stderr.splitlines())
    return secs, used


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", type=int, default=0,
                    help="compiles at once (default: the build pool's width, (cores - 2) / 2, at most 8)")
    ap.add_argument("--cpp-only", action="store_true", help="no CUDA kernel even where torch has CUDA")
    args = ap.parse_args()

    import torch
    from torch.utils import cpp_extension

    cores = os.cpu_count() or 2
    parallel = args.parallel or max(1, min(8, (cores - 2) // 2))
    cuda = torch.cuda.is_available() and cpp_extension.CUDA_HOME is not None and not args.cpp_only
    cxx = os.environ.get("CXX", "c++")
    work = Path(tempfile.mkdtemp(prefix="bench-build-header-"))
    try:
        measure(work, cores, parallel, cuda, cxx)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the header alone is most of a GB


def measure(work: Path, cores: int, parallel: int, cuda: bool, cxx: str) -> None:
    import torch
    from torch.utils import cpp_extension

    os.environ["TORCH_EXTENSIONS_DIR"] = str(work / "ext")
    os.environ.setdefault("MAX_JOBS", "2")
    name = f"bbh_{uuid.uuid4().hex[:8]}"
    print(f"host: {cores} cores; compiler {cxx}; torch {torch.__version__}; "
          f"{'a CUDA kernel' if cuda else 'C++ only'}; {parallel} at once", flush=True)

    t = time.perf_counter()
    if cuda:
        cpp_extension.load_inline(name, cpp_sources="torch::Tensor bbh_scale(torch::Tensor x, double p);",
                                  cuda_sources=CUDA, functions=["bbh_scale"], extra_cuda_cflags=["-O3"])
    else:
        cpp_extension.load_inline(name, cpp_sources=CPP, functions=["bbh_scale"], with_cuda=False)
    build_s = time.perf_counter() - t
    build_dir = work / "ext" / name
    flags = ninja_cflags(build_dir)
    header_flags = [f for f in flags if not f.startswith("-DTORCH_EXTENSION_NAME=")]
    main_cpp = build_dir / "main.cpp"

    torch_include = Path(cpp_extension.include_paths()[0])
    pch = work / "pch" / "torch" / "extension.h.gch"
    pch.parent.mkdir(parents=True)
    t = time.perf_counter()
    res = subprocess.run([cxx, "-x", "c++-header", *header_flags, str(torch_include / "torch" / "extension.h"),
                          "-o", str(pch)], capture_output=True, text=True)
    header_s = time.perf_counter() - t
    if res.returncode != 0:
        raise SystemExit(f"building the header failed: {res.stderr[-800:]}")
    header_mb = pch.stat().st_size / 1e6

    def batch(with_header: bool, n: int) -> tuple[float, list[float], int]:
        extra = ["-I", str(work / "pch")] if with_header else []
        outs = [work / f"main-{with_header}-{n}-{i}.o" for i in range(n)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            got = list(pool.map(lambda o: compile_once(cxx, extra + flags, main_cpp, o), outs))
        return time.perf_counter() - t0, [s for s, _ in got], sum(u for _, u in got)

    rows = []
    for with_header in (False, True):
        for n in sorted({1, parallel}):
            wall, each, used = batch(with_header, n)
            rows.append({"header": with_header, "at_once": n, "wall_s": round(wall, 2),
                         "median_s": round(statistics.median(each), 2), "used_header": used})
            print(f"  main.cpp {'with' if with_header else 'without'} the header, {n} at once: wall {wall:.1f} s, "
                  f"median {statistics.median(each):.1f} s, header used by {used} of {n}", flush=True)
            if with_header and used < n:
                print("  the header was not used (flags differ from the ones it was built with)", flush=True)

    print(f"\none load_inline build ({'C++ and CUDA' if cuda else 'C++'}): {build_s:.1f} s; the header built once in "
          f"{header_s:.1f} s, {header_mb:.0f} MB")
    print("| main.cpp | at once | wall s | median s per compile | header used |\n| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {'with the header' if r['header'] else 'without'} | {r['at_once']} | {r['wall_s']:.1f} | "
              f"{r['median_s']:.1f} | {r['used_header']}/{r['at_once']} |")
    base = {r["at_once"]: r["median_s"] for r in rows if not r["header"]}
    for r in rows:
        if r["header"] and base.get(r["at_once"]):
            print(f"{r['at_once']} at once: a compile with the header takes {r['median_s'] / base[r['at_once']]:.2f}x "
                  f"the time without")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_build_header.json").write_text(json.dumps({
            "cores": cores, "cuda": cuda, "load_inline_s": build_s, "header_s": header_s, "header_mb": header_mb,
            "flags": flags, "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
