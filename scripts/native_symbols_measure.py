"""Measure what honest extensions import: the Python C API and run-time lookups.

Builds, with the project's real compilers (and torch's ``load_inline``), honest kernels and
bindings of every form the judge accepts, reads their undefined dynamic symbols
(``cuda_agent.sandbox.judge.checks.native_symbols``) and prints, per build, the Python C API
and ``dl*`` symbols it imports, then the union for torch extensions: the allowlist
``BINDING_PYTHON_API`` is that union. Builds that need a tool this host lacks are skipped and
say so. CPU only (nvcc compiles without a GPU).

    python scripts/native_symbols_measure.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

from cuda_agent.sandbox.judge.checks import native_symbols as ns

REPO = Path(__file__).resolve().parents[1]

GXX_KERNEL = textwrap.dedent(r'''
    #include <cstdint>
    #include <cmath>
    #include <omp.h>
    extern "C" void relu(const float* x, float* y, int64_t n) {
        #pragma omp parallel for
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
    }
    extern "C" void softmax_rows(const float* x, float* y, int64_t m, int64_t n) {
        for (int64_t i = 0; i < m; ++i) {
            float mx = x[i * n];
            for (int64_t j = 1; j < n; ++j) mx = fmaxf(mx, x[i * n + j]);
            double s = 0.0;
            for (int64_t j = 0; j < n; ++j) s += std::exp(x[i * n + j] - mx);
            for (int64_t j = 0; j < n; ++j) y[i * n + j] = (float)(std::exp(x[i * n + j] - mx) / s);
        }
    }
''')

# a binding with the features honest solutions use: tensor checks, optional tensors, scalars,
# lists, tuples of tensors, keyword arguments, docstrings, a std::string argument
BINDING = textwrap.dedent(r'''
    #include <torch/extension.h>
    #include <vector>
    #include <tuple>
    #include <string>
    torch::Tensor linear_relu(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> b, double alpha) {
        TORCH_CHECK(x.dim() == 2 && w.dim() == 2, "x and w must be matrices");
        TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
        x = x.contiguous();
        auto y = torch::empty({x.size(0), w.size(0)}, x.options());
        const float* xp = x.data_ptr<float>();
        const float* wp = w.data_ptr<float>();
        float* yp = y.data_ptr<float>();
        int64_t m = x.size(0), k = x.size(1), n = w.size(0);
        const float* bp = b.has_value() ? b->data_ptr<float>() : nullptr;
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                float acc = bp ? bp[j] : 0.f;
                for (int64_t t = 0; t < k; ++t) acc += xp[i * k + t] * wp[j * k + t];
                yp[i * n + j] = acc > 0.f ? (float)alpha * acc : 0.f;
            }
        return y;
    }
    std::tuple<torch::Tensor, torch::Tensor> split(torch::Tensor x, int64_t at) {
        return {x.narrow(0, 0, at), x.narrow(0, at, x.size(0) - at)};
    }
    std::vector<torch::Tensor> many(std::vector<torch::Tensor> xs, std::vector<int64_t> dims, std::string mode) {
        TORCH_CHECK(mode == "same", "unknown mode ", mode);
        return xs;
    }
''')
PYBIND_MODULE = textwrap.dedent(r'''
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
        m.def("linear_relu", &linear_relu, "linear + relu", pybind11::arg("x"), pybind11::arg("w"),
              pybind11::arg("b") = pybind11::none(), pybind11::arg("alpha") = 1.0);
        m.def("split", &split);
        m.def("many", &many);
    }
''')


def gxx_build(tmp: Path) -> list[Path]:
    from cuda_agent.sandbox.compilers.gxx import GxxCompiler

    ws = tmp / "gxx"
    (ws / "kernels").mkdir(parents=True)
    (ws / "kernels" / "k.cpp").write_text(GXX_KERNEL)
    res = GxxCompiler(GxxCompiler.Options()).build(ws)
    if not res.ok:
        raise RuntimeError("; ".join(res.errors) or res.log)
    return [Path(res.artifact)]


def cpp_extension_build(tmp: Path) -> list[Path]:
    from cuda_agent.sandbox.compilers.cpp_extension import CppExtensionCompiler

    ws = tmp / "cppext"
    shutil.copytree(REPO / "tools" / "template" / "cpp_extension" / "examples" / "kernels", ws / "kernels")
    for name in ("binding.cpp", "binding_registry.h"):
        shutil.copy(REPO / "tools" / "template" / "cpp_extension" / name, ws / name)
    res = CppExtensionCompiler(CppExtensionCompiler.Options(arch="sm_90")).build(ws)
    if not res.ok:
        raise RuntimeError("; ".join(res.errors) or res.log)
    return [Path(res.artifact)]


def nvcc_build(tmp: Path) -> list[Path]:
    from cuda_agent.sandbox.compilers.nvcc import NvccCompiler

    ws = tmp / "nvcc"
    shutil.copytree(REPO / "tools" / "template" / "nvcc" / "examples" / "kernels", ws / "kernels")
    res = NvccCompiler(NvccCompiler.Options()).build(ws)
    if not res.ok:
        raise RuntimeError("; ".join(res.errors) or res.log)
    return [Path(res.artifact)]


def load_inline_build(tmp: Path, cuda: bool = False) -> list[Path]:
    import os

    from torch.utils.cpp_extension import load_inline

    build = tmp / ("inline_cuda" if cuda else "inline")
    build.mkdir()
    kw = {}
    if cuda:
        kw["cuda_sources"] = ("__global__ void k(float* y, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; "
                              "if (i < n) y[i] = 0.f; }\n"
                              "void launch(torch::Tensor y) { k<<<(y.numel() + 255) / 256, 256>>>("
                              "y.data_ptr<float>(), y.numel()); }\n")
        kw["extra_cuda_cflags"] = ["-gencode=arch=compute_90,code=sm_90"]
    src = BINDING + ("void launch(torch::Tensor y);\n" if cuda else "") + PYBIND_MODULE.replace(
        'm.def("many", &many);', 'm.def("many", &many);' + ('\n    m.def("launch", &launch);' if cuda else ""))
    os.environ.setdefault("MAX_JOBS", "2")
    load_inline(name="honest_inline_cuda" if cuda else "honest_inline", cpp_sources=src, build_directory=str(build),
                verbose=False, is_python_module=False, **kw)
    return sorted(build.glob("*.so"))


BUILDS = {
    "gxx (ctypes)": ("ctypes", gxx_build),
    "nvcc (ctypes)": ("ctypes", nvcc_build),
    "cpp_extension (binding registry)": ("torch_extension", cpp_extension_build),
    "load_inline (C++)": ("torch_extension", load_inline_build),
    "load_inline (CUDA)": ("torch_extension", lambda t: load_inline_build(t, cuda=True)),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="")
    ap.add_argument("--only", default="", help="comma-separated build names (substrings)")
    args = ap.parse_args()
    rows, union = [], set()
    with tempfile.TemporaryDirectory() as td:
        for name, (kind, fn) in BUILDS.items():
            if args.only and not any(s and s in name for s in args.only.split(",")):
                continue
            try:
                libs = fn(Path(td))
            except Exception as exc:  # noqa: BLE001 - a missing tool skips the build, and says so
                rows.append({"build": name, "kind": kind, "skipped": f"{type(exc).__name__}: {str(exc)[:200]}"})
                continue
            for lib in libs:
                syms = ns.read_symbols(lib)
                py = sorted(ns.python_api(syms.undefined))
                if kind == "torch_extension":
                    union |= set(py)
                rows.append({"build": name, "kind": kind, "python_api": py,
                             "dynamic_lookup": sorted(syms.undefined & ns.DYNAMIC_LOOKUP), "needed": syms.needed,
                             "refused_now": ns.refusals(syms, kind)})
    print(f"{'build':36} {'kind':16} {'Py* symbols':>11} {'dl* symbols':>11}  refused now")
    for r in rows:
        if "skipped" in r:
            print(f"{r['build']:36} {r['kind']:16} skipped: {r['skipped']}")
        else:
            print(f"{r['build']:36} {r['kind']:16} {len(r['python_api']):11d} {len(r['dynamic_lookup']):11d}  "
                  f"{len(r['refused_now'])} {r['refused_now'][:2]}")
    print("\nPython C API imported by the torch extensions (the allowlist):")
    print(json.dumps(sorted(union)))
    if args.json:
        Path(args.json).write_text(json.dumps({"builds": rows, "binding_python_api": sorted(union)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
