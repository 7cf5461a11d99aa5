"""GPU host check: CUDA builds are judged by their dynamic symbols like the CPU builds.

Run from the repo root on a GPU machine: ``python3 scripts/gpu/native_symbol_checks.py``.
Builds with this host's nvcc and torch, in parallel: the honest forms the judge accepts (the
cpp_extension compiler's binding-registry example, the nvcc compiler's ctypes example, a CUDA
``load_inline`` binding with tensor checks) and ``.cu`` files that run Python
(``PyRun_SimpleString`` through ``dlsym(RTLD_DEFAULT, ...)``, a constructor calling it at load,
``PyGILState_Ensure`` + ``PyImport_ImportModule``, a pybind11 binding importing torch), with
the CUDA runtime linked shared and, for ``dlsym``, static (nvcc's default: the runtime's own
``dlopen``/``dlsym`` pass there, what the library names is judged). Each
row: build, kind, expected verdict, what ``judge.checks.native_symbols`` says, and the Python C
API it imports. Honest builds must pass (the allowlist holds for this host's torch and
pybind11), the others must be refused with rule ``native.python-api``. Writes JSON under
``$OUT``; exits 1 on a mismatch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in ("core", "sandbox"):
    sys.path.insert(0, str(ROOT / "packages" / p / "src"))
sys.path.insert(0, str(ROOT / "scripts"))
if not os.environ.get("CUDA_HOME"):  # torch reads it when cpp_extension is first imported
    from cuda_agent.sandbox.compilers.toolchain import cuda_home, find_nvcc

    os.environ["CUDA_HOME"] = str(cuda_home(find_nvcc("")))

HONEST_STATIC_CUDART = ("ctypes", r'''
    __global__ void k(float* y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 0.f; }
    extern "C" int launch(float* y, int n) { k<<<(n + 255) / 256, 256>>>(y, n); return (int)cudaGetLastError(); }
''')
ATTACKS = {
    "dlsym_RTLD_DEFAULT.cu": ("ctypes", r'''
        #include <dlfcn.h>
        __global__ void k(float* y) { y[threadIdx.x] = 0.f; }
        extern "C" int launch(float* y) {
            auto run = (int (*)(const char*))dlsym(RTLD_DEFAULT, "PyRun_SimpleString");
            if (run) run("import torch");
            k<<<1, 32>>>(y);
            return 0;
        }
    '''),
    "constructor_PyRun.cu": ("ctypes", r'''
        extern "C" int PyRun_SimpleString(const char*);
        __attribute__((constructor)) static void at_load() { PyRun_SimpleString("import torch"); }
        __global__ void k(float* y) { y[threadIdx.x] = 0.f; }
        extern "C" int launch(float* y) { k<<<1, 32>>>(y); return 0; }
    '''),
    "GILState_import.cu": ("ctypes", r'''
        extern "C" int PyGILState_Ensure();
        extern "C" void PyGILState_Release(int);
        extern "C" void* PyImport_ImportModule(const char*);
        __global__ void k(float* y) { y[threadIdx.x] = 0.f; }
        extern "C" int launch(float* y) {
            int g = PyGILState_Ensure();
            PyImport_ImportModule("cuda_agent.sandbox.judge");
            PyGILState_Release(g);
            k<<<1, 32>>>(y);
            return 0;
        }
    '''),
    "pybind_imports_torch.cu": ("torch_extension", r'''
        #include <torch/types.h>
        #include <torch/csrc/utils/pybind.h>
        __global__ void k(float* y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = 0.f; }
        torch::Tensor zero(torch::Tensor y) {
            TORCH_CHECK(y.is_cuda(), "y must be a CUDA tensor");
            pybind11::gil_scoped_acquire gil;
            pybind11::module_::import("torch").attr("_C").attr("_set_grad_enabled")(true);
            k<<<(y.numel() + 255) / 256, 256>>>(y.data_ptr<float>(), y.numel());
            return y;
        }
        PYBIND11_MODULE(evil_ext, m) { m.def("zero", &zero); }
    '''),
}


def nvcc_attack(tmp: Path, name: str, src: str, kind: str, cudart: str = "shared") -> list[Path]:
    from cuda_agent.sandbox.compilers.toolchain import find_nvcc

    d = tmp / name.replace(".", "_")
    d.mkdir()
    cu = d / name
    cu.write_text(textwrap.dedent(src))
    so = d / (cu.stem + ".so")
    argv = [find_nvcc(""), "-shared", "-cudart", cudart, "-Xcompiler", "-fPIC", "-std=c++17", str(cu), "-o", str(so)]
    if kind == "torch_extension":
        from torch.utils.cpp_extension import include_paths, library_paths

        import torch

        argv += ["-DTORCH_EXTENSION_NAME=evil_ext", f"-I{sysconfig.get_paths()['include']}",
                 *[f"-I{p}" for p in include_paths()], *[f"-L{p}" for p in library_paths()],
                 "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
                 f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-600:])
    return [so]


def main() -> int:
    import native_symbols_measure as m

    from cuda_agent.sandbox.judge.checks import native_symbols as ns

    os.environ.setdefault("MAX_JOBS", str(max(2, (os.cpu_count() or 4) // 2)))
    t0 = time.time()
    jobs = {
        "cpp_extension (binding registry)": ("torch_extension", "pass", m.cpp_extension_build),
        "nvcc (ctypes)": ("ctypes", "pass", m.nvcc_build),
        "load_inline (CUDA)": ("torch_extension", "pass", lambda t: m.load_inline_build(t, cuda=True)),
        "nvcc -shared (CUDA runtime static)": ("ctypes", "pass", lambda t: nvcc_attack(
            t, "honest_static.cu", HONEST_STATIC_CUDART[1], "ctypes", cudart="static")),
        "attack dlsym, CUDA runtime static": ("ctypes", "refused", lambda t: nvcc_attack(
            t, "dlsym_static.cu", ATTACKS["dlsym_RTLD_DEFAULT.cu"][1], "ctypes", cudart="static")),
        **{f"attack {n}": (kind, "refused", lambda t, n=n, s=s, k=kind: nvcc_attack(t, n, s, k))
           for n, (kind, s) in ATTACKS.items()},
    }
    rows, bad = [], 0
    with tempfile.TemporaryDirectory() as td:
        def run(item):
            name, (kind, want, fn) = item
            sub = Path(td) / f"b{abs(hash(name))}"
            sub.mkdir()
            try:
                return name, kind, want, fn(sub), ""
            except Exception as exc:  # noqa: BLE001 - reported as a row, not a crash
                return name, kind, want, [], f"{type(exc).__name__}: {str(exc)[:300]}"

        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            results = list(pool.map(run, jobs.items()))
        for name, kind, want, libs, err in results:
            if err or not libs:
                rows.append({"build": name, "kind": kind, "expected": want, "got": "build failed", "why": err})
                bad += 1
                continue
            for lib in libs:
                found = ns.check_file(lib, kind)
                syms = ns.read_symbols(lib)
                got = "refused" if found else "pass"
                ok = got == want and (not found or "rule native.python-api" in found[0])
                bad += not ok
                rows.append({"build": name, "kind": kind, "expected": want, "got": got, "ok": ok,
                             "why": found[0] if found else "",
                             "python_api": sorted(ns.python_api(syms.undefined)),
                             "dynamic_lookup": sorted(syms.undefined & ns.DYNAMIC_LOOKUP)})
    print(f"{'build':38} {'kind':16} {'expected':9} {'got':13} {'Py*':>4}  refusal")
    for r in rows:
        print(f"{r['build']:38} {r['kind']:16} {r['expected']:9} {r['got']:13} {len(r.get('python_api', [])):4d}  "
              f"{(r.get('why') or '')[:90]}")
    print(f"\n{len(rows) - bad}/{len(rows)} as expected in {time.time() - t0:.0f} s")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "native_symbol_checks.json").write_text(json.dumps(rows, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
