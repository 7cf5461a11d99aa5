"""Compiler plugins with the real toolchains: g++ builds that run, nvcc and cpp_extension
builds that compile and link (nothing CUDA runs here), the cache and incremental builds."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from cuda_agent.core.plugins import get_plugin_manager
from cuda_agent.core.types import Task
from cuda_agent.sandbox.compilers.buildcache import JobSlots
from cuda_agent.sandbox.compilers import CppExtensionCompiler, GxxCompiler, NvccCompiler, read_manifest
from cuda_agent.sandbox.compilers.diagnostics import trim_errors
from cuda_agent.sandbox.compilers.signatures import SignatureError, extern_c_functions
from cuda_agent.sandbox.workspace.workspace import create_workspace

TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha
    def forward(self, x, y):
        return torch.relu(x) * self.alpha + y

def get_inputs():
    return [torch.randn(64, 64), torch.randn(64, 64)]

def get_init_inputs():
    return [1.5]
"""

RELU_CPP = """
#include <cstdint>
#include "common.h"
extern "C" void relu_scale(const float* x, float* y, float alpha, int64_t n) {
#pragma omp parallel for simd
  for (int64_t i = 0; i < n; ++i) y[i] = scale(x[i] > 0.f ? x[i] : 0.f, alpha);
}
"""
ADD_CPP = """
#include <cstdint>
extern "C" int add_into(float* y, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += b[i];
  return 7;
}
"""
COMMON_H = "#pragma once\ninline float scale(float v, float a) { return v * a; }\n"

NEEDS_NVCC = pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                                reason="nvcc not installed")


def cpu_workspace(tmp_path, name="ws"):
    ws = create_workspace(Task(id="t", source="test", code=TASK), tmp_path / name, backend="cpu")
    (ws.root / "kernels" / "relu.cpp").write_text(RELU_CPP)
    (ws.root / "kernels" / "add.cpp").write_text(ADD_CPP)
    (ws.root / "kernels" / "common.h").write_text(COMMON_H)
    return ws


def gxx(tmp_path):
    return GxxCompiler(GxxCompiler.Options(cache_dir=str(tmp_path / "cache")))


def test_gxx_builds_runs_and_caches(tmp_path):
    import torch

    ws = cpu_workspace(tmp_path)
    c = gxx(tmp_path)
    r = c.build(ws.root)
    assert r.ok, r.errors
    assert sorted(r.rebuilt_units) == ["kernels/add.cpp", "kernels/relu.cpp"] and not r.cached
    assert Path(r.artifact).parent == ws.build_dir

    # the kernels run through load_kernels, with torch CPU tensors
    k = ws.load_kernels()
    x, b = torch.randn(1000), torch.randn(1000)
    y = torch.empty_like(x)
    k.relu_scale(x, y, 1.5, x.numel())
    assert torch.allclose(y, torch.relu(x) * 1.5)
    assert k.add_into(y, b, y.numel()) == 7
    assert torch.allclose(y, torch.relu(x) * 1.5 + b)
    with pytest.raises(TypeError, match="not contiguous"):
        k.relu_scale(x.view(10, 100).t(), y, 1.0, 10)
    with pytest.raises(TypeError, match="takes 4 arguments"):
        k.relu_scale(x, y)
    with pytest.raises(AttributeError, match="relu_scale"):
        k.nope

    # unchanged: nothing rebuilt, nothing linked
    r2 = c.build(ws.root)
    assert r2.ok and r2.cached and r2.rebuilt_units == [] and r2.artifact == r.artifact

    # one unit edited: only that unit compiles, then a relink
    (ws.root / "kernels" / "add.cpp").write_text(ADD_CPP.replace("return 7", "return 8"))
    r3 = c.build(ws.root)
    assert r3.ok and r3.rebuilt_units == ["kernels/add.cpp"] and not r3.cached
    assert r3.artifact != r.artifact and not Path(r.artifact).exists()
    k3 = ws.load_kernels()
    assert k3.add_into(y, b, y.numel()) == 8

    # a header edit rebuilds the units that may include it
    (ws.root / "kernels" / "common.h").write_text(COMMON_H + "// changed\n")
    r4 = c.build(ws.root)
    assert sorted(r4.rebuilt_units) == ["kernels/add.cpp", "kernels/relu.cpp"]

    # another workspace with the same sources reuses the objects (content-addressed)
    ws2 = cpu_workspace(tmp_path, "ws2")
    (ws2.root / "kernels" / "add.cpp").write_text(ADD_CPP.replace("return 7", "return 8"))
    (ws2.root / "kernels" / "common.h").write_text(COMMON_H + "// changed\n")
    r5 = c.build(ws2.root)
    assert r5.ok and r5.rebuilt_units == []


def test_gxx_errors_are_trimmed(tmp_path):
    ws = cpu_workspace(tmp_path)
    (ws.root / "kernels" / "add.cpp").write_text(
        '#include <vector>\n#include <map>\nextern "C" void f() {\n  std::map<int, std::vector<int>> m;\n'
        '  m.insert(3.5, "x");\n  undefined_call();\n}\n')
    r = gxx(tmp_path).build(ws.root)
    assert not r.ok
    assert r.errors[0].startswith("kernels/add.cpp:5: error:"), r.errors
    assert any(e.startswith("kernels/add.cpp:6: error:") and "undefined_call" in e for e in r.errors)
    assert len(r.errors) <= 6
    assert all("required from" not in e and "note:" not in e for e in r.errors)
    # a failed build is not loadable (no stale library is served)
    man = read_manifest(ws.build_dir)
    assert man["ok"] is False
    with pytest.raises(Exception, match="build|compile"):
        ws.load_kernels()


def test_gxx_rejects_unsupported_launcher(tmp_path):
    ws = cpu_workspace(tmp_path)
    (ws.root / "kernels" / "add.cpp").write_text('#include <string>\nextern "C" void f(std::string s) {}\n')
    r = gxx(tmp_path).build(ws.root)
    assert not r.ok and "std::string" in r.errors[0] and "add.cpp" in r.errors[0]
    (ws.root / "kernels" / "add.cpp").unlink()
    (ws.root / "kernels" / "relu.cpp").write_text("static int x = 1;\n")
    r = gxx(tmp_path).build(ws.root)
    assert not r.ok and 'extern "C"' in r.errors[0]


def test_no_sources(tmp_path):
    ws = create_workspace(Task(id="t", source="test", code=TASK), tmp_path / "ws", backend="cpu")
    r = gxx(tmp_path).build(ws.root)
    assert not r.ok and "no .cpp" in r.errors[0]


def test_signatures():
    src = '''
    // extern "C" void commented_out(int x) {}
    extern "C" void launch_a(const float* __restrict__ x, float *y, int n, int64_t m, cudaStream_t s) { }
    extern "C" __host__ double b(size_t n, bool flag, unsigned int u, float f) { return 0; }
    extern "C" {
      int c(void) { if (1) { return 1; } return 0; }
      static float helper_decl(float);
      void d(const half* p, long long q) {}
    }
    __global__ void k(float* x) {}
    '''
    f = extern_c_functions(src)
    assert f["launch_a"] == {"restype": "void", "argtypes": ["ptr", "ptr", "i32", "i64", "ptr"]}
    assert f["b"] == {"restype": "f64", "argtypes": ["u64", "bool", "u32", "f32"]}
    assert f["c"] == {"restype": "i32", "argtypes": []}
    assert f["d"] == {"restype": "void", "argtypes": ["ptr", "i64"]}
    assert set(f) == {"launch_a", "b", "c", "d"}
    with pytest.raises(SignatureError, match="__global__"):
        extern_c_functions('extern "C" __global__ void k(float* x) {}')


def test_trim_errors_formats():
    nvcc_log = (
        "/ws/kernels/a.cu(12): error: identifier \"foo\" is undefined\n"
        "          foo(x);\n          ^\n\n"
        "/ws/kernels/a.cu(13): error: expected a \";\"\n"
        "2 errors detected in the compilation of \"kernels/a.cu\".\n"
    )
    errs = trim_errors(nvcc_log, Path("/ws"))
    assert errs == ['kernels/a.cu:12: error: identifier "foo" is undefined', 'kernels/a.cu:13: error: expected a ";"']
    link_log = "/usr/bin/ld: k.o: in function `f':\nk.cpp:(.text+0x5): undefined reference to `g'\ncollect2: error: ld returned 1 exit status\n"
    errs = trim_errors(link_log)
    assert errs and "undefined reference to `g'" in errs[0]
    many = "\n".join(f"kernels/x.cpp:{i}:1: error: bad {i}" for i in range(1, 20))
    errs = trim_errors(many, max_errors=3)
    assert errs[:3] == ["kernels/x.cpp:1: error: bad 1", "kernels/x.cpp:2: error: bad 2", "kernels/x.cpp:3: error: bad 3"]
    assert errs[3] == "... and 16 more errors"


def test_job_slots_bound_concurrency(tmp_path):
    slots = JobSlots(tmp_path / "slots", 2)
    active, peak, lock = [0], [0], threading.Lock()

    def job():
        with slots.slot():
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.05)
            with lock:
                active[0] -= 1

    threads = [threading.Thread(target=job) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 2


def test_parallel_workspace_builds(tmp_path):
    c = gxx(tmp_path)
    spaces = [cpu_workspace(tmp_path, f"w{i}") for i in range(3)]
    for i, ws in enumerate(spaces):
        (ws.root / "kernels" / "add.cpp").write_text(ADD_CPP.replace("return 7", f"return {100 + i}"))
    results = [None] * 3

    def build(i):
        results[i] = c.build(spaces[i].root)

    threads = [threading.Thread(target=build, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.ok for r in results), [r.errors for r in results]
    import torch

    y, b = torch.zeros(4), torch.zeros(4)
    assert [ws.load_kernels().add_into(y, b, 4) for ws in spaces] == [100, 101, 102]


def test_plugins_registered():
    comps = get_plugin_manager().components("compiler")
    assert {"cpp_extension", "nvcc", "gxx"} <= set(comps)
    c = get_plugin_manager().create("compiler", {"name": "nvcc", "options": {"arch": "sm_80,sm_90"}})
    assert isinstance(c, NvccCompiler) and c.options.arch == "sm_80,sm_90"


EXAMPLES = Path(__file__).resolve().parents[3] / "tools" / "template"


@NEEDS_NVCC
def test_nvcc_compiles_and_links(tmp_path):
    ws = create_workspace(Task(id="t", source="test", code=TASK), tmp_path / "ws", backend="cuda", compiler="nvcc")
    shutil.copy(EXAMPLES / "nvcc" / "examples" / "kernels" / "axpby_kernel.cu", ws.root / "kernels" / "axpby.cu")
    (ws.root / "kernels" / "scale.cu").write_text(
        '__global__ void s(float* x, float a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }\n'
        'extern "C" void launch_scale(float* x, float a, int n) { s<<<(n + 255) / 256, 256>>>(x, a, n); }\n')
    c = NvccCompiler(NvccCompiler.Options(cache_dir=str(tmp_path / "cache")))
    r = c.build(ws.root)
    assert r.ok, (r.errors, r.log)
    assert sorted(r.rebuilt_units) == ["kernels/axpby.cu", "kernels/scale.cu"]
    man = read_manifest(ws.build_dir)
    assert man["kind"] == "ctypes" and man["backend"] == "cuda"
    assert man["functions"]["launch_axpby"]["argtypes"] == ["ptr", "ptr", "ptr", "f32", "f32", "i64"]
    assert man["functions"]["launch_scale"]["argtypes"] == ["ptr", "f32", "i32"]
    # the library really exports the launchers (ctypes would find them on the GPU machine)
    import subprocess

    syms = subprocess.run(["nm", "-D", "--defined-only", r.artifact], capture_output=True, text=True).stdout
    assert "launch_axpby" in syms and "launch_scale" in syms
    assert c.build(ws.root).cached
    (ws.root / "kernels" / "scale.cu").write_text((ws.root / "kernels" / "scale.cu").read_text() + "// edit\n")
    r2 = c.build(ws.root)
    assert r2.ok and r2.rebuilt_units == ["kernels/scale.cu"]
    (ws.root / "kernels" / "scale.cu").write_text("extern \"C\" void launch_scale(float* x) { s<<<1, 1>>>(x); }\n")
    r3 = c.build(ws.root)
    assert not r3.ok and r3.errors[0].startswith("kernels/scale.cu:1: error:"), r3.errors


@NEEDS_NVCC
@pytest.mark.slow
def test_cpp_extension_builds_and_imports(tmp_path):
    """The paper's torch-extension build, unit by unit through the cache. The binding
    objects and the precompiled torch header are cached across test runs (parsing the
    torch headers takes most of a minute here); the .cu carries a fresh token so it
    really compiles every run."""
    cache = Path(tempfile.gettempdir()) / "cuda-agent-test-build-cache"
    ws = create_workspace(Task(id="t", source="test", code=TASK), tmp_path / "ws", backend="cuda")
    ex = EXAMPLES / "cpp_extension" / "examples" / "kernels"
    shutil.copy(ex / "axpby_binding.cpp", ws.root / "kernels" / "axpby_binding.cpp")
    token = uuid.uuid4().hex
    (ws.root / "kernels" / "axpby_kernel.cu").write_text((ex / "axpby_kernel.cu").read_text() + f"// {token}\n")
    c = CppExtensionCompiler(CppExtensionCompiler.Options(cache_dir=str(cache), pch=True, binding_opt="-O0"))
    r = c.build(ws.root)
    assert r.ok, (r.errors, r.log)
    assert "kernels/axpby_kernel.cu" in r.rebuilt_units
    man = read_manifest(ws.build_dir)
    assert man["kind"] == "torch_extension" and man["module"] == "cuda_extension"
    assert set(man["units"]) == {"binding.cpp", "kernels/axpby_binding.cpp", "kernels/axpby_kernel.cu"}
    mod = ws.load_kernels()  # imports on a CPU-only torch: the launcher is only called on a GPU
    assert hasattr(mod, "axpby_forward")
    assert c.build(ws.root).cached
    (ws.root / "kernels" / "axpby_kernel.cu").write_text((ws.root / "kernels" / "axpby_kernel.cu").read_text() + "// e\n")
    r2 = c.build(ws.root)
    assert r2.ok and r2.rebuilt_units == ["kernels/axpby_kernel.cu"]
    # an error in a binding comes back as file:line, without the torch template noise
    (ws.root / "kernels" / "bad_binding.cpp").write_text(
        '#include "binding_registry.h"\ntorch::Tensor f(torch::Tensor x) { return x.no_such_method(); }\n')
    r3 = c.build(ws.root)
    assert not r3.ok and r3.errors[0].startswith("kernels/bad_binding.cpp:2: error:"), r3.errors
    assert len(r3.log) <= 4000


@pytest.mark.parametrize("source", [
    '#include "/etc/passwd"\n',
    '#include "../../../../etc/passwd"\n',
    '#include <../../etc/passwd>\n',
    '#define P "/etc/passwd"\n#include P\n',
    'asm(".incbin \\"/etc/passwd\\"");\n',
    '#embed "/etc/passwd"\n',
])
def test_sources_may_not_reach_outside(tmp_path, source):
    """What the compiler read decides (rule build.reads), or the file is not there to read
    (the build jail); either way no line of the file comes back (test_build_isolation.py
    has the variants and their honest twins)."""
    ws = cpu_workspace(tmp_path)
    (ws.root / "kernels" / "add.cpp").write_text(source + ADD_CPP)
    r = gxx(tmp_path).build(ws.root)
    assert not r.ok and r.errors[0].startswith("kernels/add.cpp:"), r.errors
    assert "root:" not in r.log and not any("root:" in e for e in r.errors)


def test_symlinks_refused(tmp_path):
    ws = cpu_workspace(tmp_path)
    (ws.root / "kernels" / "add.cpp").unlink()
    (ws.root / "kernels" / "add.cpp").symlink_to("/etc/passwd")
    r = gxx(tmp_path).build(ws.root)
    assert not r.ok and "symbolic link" in r.errors[0]
    # includes inside the workspace stay fine
    (ws.root / "kernels" / "add.cpp").unlink()
    (ws.root / "kernels" / "sub").mkdir()
    (ws.root / "kernels" / "sub" / "x.cpp").write_text('#include "../common.h"\n' + ADD_CPP)
    assert gxx(tmp_path).build(ws.root).ok


def test_cache_prune_keeps_recent_entries(tmp_path):
    from cuda_agent.sandbox.compilers.buildcache import BuildCache

    cache = BuildCache(tmp_path / "c")
    paths = []
    for i in range(5):
        p = cache.object_path(f"{i:02d}" + "a" * 62)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * 1000)
        import os

        os.utime(p, (1000 + i, 1000 + i))
        paths.append(p)
    cache.touch(paths[0])  # used just now
    removed, freed = cache.prune(2500)
    assert removed == 3 and freed == 3000
    assert paths[0].exists() and paths[4].exists()
    assert not paths[1].exists() and not paths[2].exists() and not paths[3].exists()
    assert cache.size() == 2000


@NEEDS_NVCC
def test_nvcc_refuses_torch_bindings(tmp_path):
    ws = create_workspace(Task(id="t", source="test", code=TASK), tmp_path / "ws", backend="cuda", compiler="nvcc")
    shutil.copy(EXAMPLES / "nvcc" / "examples" / "kernels" / "axpby_kernel.cu", ws.root / "kernels" / "axpby.cu")
    (ws.root / "kernels" / "axpby_binding.cpp").write_text("#include <torch/extension.h>\n")
    r = NvccCompiler(NvccCompiler.Options(cache_dir=str(tmp_path / "cache"))).build(ws.root)
    assert not r.ok and "cpp_extension" in r.errors[0] and r.errors[0].startswith("kernels/axpby_binding.cpp:1:")


@NEEDS_NVCC
def test_cublas_is_linked_when_included(tmp_path):
    ws = create_workspace(Task(id="t", source="test", code=TASK), tmp_path / "ws", backend="cuda", compiler="nvcc")
    (ws.root / "kernels" / "gemm.cu").write_text(
        '#include <cublas_v2.h>\n'
        'extern "C" int make_handle(void* out) { return (int)cublasCreate((cublasHandle_t*)out); }\n')
    c = NvccCompiler(NvccCompiler.Options(cache_dir=str(tmp_path / "cache")))
    from cuda_agent.sandbox.compilers.toolchain import cuda_home, find_nvcc

    if not (cuda_home(find_nvcc()) / "include" / "cublas_v2.h").exists():
        pytest.skip("this CUDA toolkit has no cuBLAS")
    r = c.build(ws.root)
    if r.ok:  # the toolkit has cuBLAS
        import subprocess

        deps = subprocess.run(["readelf", "-d", r.artifact], capture_output=True, text=True).stdout
        assert "libcublas" in deps
    else:  # a toolkit without cuBLAS: the link was asked for it
        assert any("cublas" in e for e in r.errors), r.errors
