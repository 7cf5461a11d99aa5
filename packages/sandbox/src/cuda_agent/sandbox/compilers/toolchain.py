"""Locating nvcc, g++ and torch's headers/libraries without importing torch."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import sysconfig
from pathlib import Path

from .base import BuildError


@functools.lru_cache(maxsize=None)
def find_nvcc(explicit: str = "") -> str:
    if explicit:
        if not (shutil.which(explicit) or Path(explicit).exists()):
            raise BuildError(f"nvcc not found at {explicit!r}")
        return explicit
    for env in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(env)
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    if Path("/usr/local/cuda/bin/nvcc").exists():
        return "/usr/local/cuda/bin/nvcc"
    raise BuildError("nvcc not found: install the CUDA toolkit or set CUDA_HOME")


@functools.lru_cache(maxsize=None)
def cuda_home(nvcc: str) -> Path:
    """The CUDA toolkit root (nvcc on PATH may be a wrapper script elsewhere)."""
    real = Path(shutil.which(nvcc) or nvcc).resolve()
    cands = [real.parent.parent]
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            cands.append(Path(os.environ[env]))
    cands += [Path("/usr/local/cuda")]
    for c in cands:
        if (c / "include" / "cuda_runtime.h").exists():
            return c
    return cands[0]


def cuda_lib_dir(nvcc: str) -> Path:
    home = cuda_home(nvcc)
    for cand in (home / "lib64", home / "lib", home / "targets" / "x86_64-linux" / "lib"):
        if (cand / "libcudart.so").exists() or (cand / "libcudart_static.a").exists():
            return cand
    return home / "lib64"


@functools.lru_cache(maxsize=None)
def find_cxx(explicit: str = "") -> str:
    name = explicit or os.environ.get("CXX") or "g++"
    found = shutil.which(name)
    if not found:
        raise BuildError(f"C++ compiler {name!r} not found")
    return found


def arch_flags(arch: str, ptx: bool = True) -> list[str]:
    """``sm_90`` -> gencode for sm_90 SASS (+ compute_90 PTX for newer GPUs)."""
    flags: list[str] = []
    archs = [a.strip() for a in arch.split(",") if a.strip()]
    if not archs:
        raise BuildError("no CUDA arch given")
    for a in archs:
        if a == "native":
            flags.append("-arch=native")
            continue
        m = re.fullmatch(r"(?:sm_|compute_)?(\d+[a-z]?)", a)
        if not m:
            raise BuildError(f"bad CUDA arch {a!r}; use e.g. sm_90")
        num = m.group(1)
        flags += ["-gencode", f"arch=compute_{num},code=sm_{num}"]
    if ptx and archs[-1] != "native":
        num = re.fullmatch(r"(?:sm_|compute_)?(\d+[a-z]?)", archs[-1]).group(1)  # type: ignore[union-attr]
        flags += ["-gencode", f"arch=compute_{num},code=compute_{num}"]
    return flags


class TorchPaths:
    def __init__(self) -> None:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.origin:
            raise BuildError("torch is not installed: the cpp_extension compiler needs its headers")
        self.root = Path(spec.origin).parent
        self.include = [self.root / "include", self.root / "include" / "torch" / "csrc" / "api" / "include"]
        self.lib = self.root / "lib"
        text = (self.root / "version.py").read_text()
        m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
        self.version = m.group(1) if m else "unknown"
        self.cuda = bool(re.search(r"^cuda\s*:.*=\s*['\"]", text, re.M))
        self.python_include = sysconfig.get_path("include", scheme="posix_prefix")
        ext = (self.root / "utils" / "cpp_extension.py")
        ext_text = ext.read_text() if ext.exists() else ""
        self.std = "c++20" if "'-std=c++20'" in ext_text else "c++17"
        self.cxx11_abi = self._abi()

    def _abi(self) -> int:
        m = re.match(r"(\d+)\.(\d+)", self.version)
        if m and (int(m.group(1)), int(m.group(2))) >= (2, 7):
            return 1  # only the new C++ ABI is built since torch 2.7
        import subprocess
        import sys

        out = subprocess.run([sys.executable, "-c", "import torch;print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"],
                             capture_output=True, text=True)
        return int(out.stdout.strip() or 1)

    def libraries(self) -> list[str]:
        names = ["c10", "torch", "torch_cpu", "torch_python"]
        if (self.lib / "libc10_cuda.so").exists():
            names.append("c10_cuda")
        if (self.lib / "libtorch_cuda.so").exists():
            names.append("torch_cuda")
        return names


@functools.lru_cache(maxsize=None)
def torch_paths() -> TorchPaths:
    return TorchPaths()


@functools.lru_cache(maxsize=None)
def host_cpu_id() -> str:
    """What ``-march=native`` depends on."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    return f"{model.group(1) if model else ''}|{flags.group(1) if flags else ''}"


def find_cuda_library(name: str, nvcc: str) -> Path | None:
    """The folder holding ``lib<name>.so``: the CUDA toolkit, else pip's nvidia-* wheels."""
    cands = [cuda_lib_dir(nvcc)]
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            cands += sorted(Path(base).glob("*/lib"))
    for d in cands:
        if any(d.glob(f"lib{name}.so*")):
            return d
    return None


def cuda_paths(nvcc: str, libs: list[str] = ()) -> list[str]:
    """The CUDA toolkit's folders a build's tools read (nvcc's own, the toolkit, the folders
    of the libraries linked), for the build jail."""
    out = [os.path.dirname(os.path.abspath(shutil.which(nvcc) or nvcc)), str(cuda_home(nvcc)), str(cuda_lib_dir(nvcc))]
    for lib in libs:
        d = find_cuda_library(lib, nvcc)
        if d is not None:
            out += [str(d), str(d.parent / "include")]
    return out


def used_cuda_libraries(texts: list[str]) -> list[str]:
    """cuBLAS / cuDNN when the sources include them (the libraries the rules allow)."""
    joined = "\n".join(texts)
    out = []
    if re.search(r"#\s*include\s*[<\"]cublas(_v2|Lt)?\.h", joined):
        out.append("cublas")
        if "cublasLt" in joined:
            out.append("cublasLt")
    if re.search(r"#\s*include\s*[<\"]cudnn\.h", joined):
        out.append("cudnn")
    return out


def link_flags_for(libs: list[str], nvcc: str, linker_prefix: str = "-Wl,") -> list[str]:
    flags: list[str] = []
    for lib in libs:
        d = find_cuda_library(lib, nvcc)
        if d is not None and str(d) != str(cuda_lib_dir(nvcc)):
            flags += ["-L", str(d), f"{linker_prefix}-rpath,{d}"]
        flags.append(f"-l{lib}")
    return flags
