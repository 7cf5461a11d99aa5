"""nvcc: each ``kernels/*.cu`` (and plain ``*.cpp``) to an object, linked into one shared
library of ``extern "C"`` launchers; no torch headers, loaded with ctypes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .buildcache import tool_version
from .base import CommonOptions, IncrementalCompiler, Unit, agent_sources
from .toolchain import arch_flags, cuda_home, cuda_lib_dir, cuda_paths, find_cxx, find_nvcc, link_flags_for


@dataclass
class NvccOptions(CommonOptions):
    arch: str = "sm_90"  # comma-separated list; PTX of the last one is embedded too
    ptx: bool = True
    opt: str = "-O3"
    fast_math: bool = True
    std: str = "c++17"
    nvcc: str = ""  # default: $CUDA_HOME/bin/nvcc or PATH
    cxx: str = ""  # host compiler for plain .cpp files
    libraries: list[str] = field(default_factory=lambda: ["cudart"])  # add cublas / cudnn here


class NvccCompiler(IncrementalCompiler):
    name = "nvcc"
    backend = "cuda"
    description = 'nvcc objects linked into a shared library of extern "C" launchers (ctypes, no torch build)'
    Options = NvccOptions
    artifact_kind = "ctypes"
    artifact_stem = "kernels"

    def _nvcc(self) -> str:
        return find_nvcc(self.options.nvcc)

    def nvcc_flags(self) -> list[str]:
        o = self.options
        flags = ["-c", o.opt, f"-std={o.std}", "-Xcompiler", "-fPIC", "-I", "kernels", "-I", "."]
        if o.fast_math:
            flags.append("--use_fast_math")
        return flags + arch_flags(o.arch, o.ptx) + list(o.extra_flags)

    def cxx_flags(self) -> list[str]:
        o = self.options
        return ["-c", "-O3", f"-std={o.std}", "-fPIC", "-I", "kernels", "-I", ".",
                "-I", str(cuda_home(self._nvcc()) / "include")] + list(o.extra_flags)

    def toolchain_id(self) -> str:
        nvcc = self._nvcc()
        cxx = find_cxx(self.options.cxx)
        return "\n".join([tool_version([nvcc]), tool_version([cxx]), " ".join(self.nvcc_flags()),
                          " ".join(self.cxx_flags()), " ".join(self.options.libraries)])

    def compilers(self) -> list[str]:
        return [self._nvcc(), find_cxx(self.options.cxx)]

    def toolchain_paths(self) -> list[str]:
        return [*super().toolchain_paths(), *cuda_paths(self._nvcc(), self.used_libraries)]

    def header_roots(self) -> list[str]:
        return [*super().header_roots(), str(cuda_home(self._nvcc()))]

    def units(self, root: Path) -> list[Unit]:
        nvcc, cxx = self._nvcc(), find_cxx(self.options.cxx)
        units = []
        for src in agent_sources(root, (".cu",)):
            units.append(Unit(src, lambda out, s=src: [nvcc, *self.nvcc_flags(), s, "-o", out], tool="nvcc"))
        for src in agent_sources(root, (".cpp", ".cc"), exclude_suffix="_binding.cpp"):
            units.append(Unit(src, lambda out, s=src: [cxx, *self.cxx_flags(), s, "-o", out]))
        return units

    def layout_errors(self, root: Path) -> list[str]:
        return [f"{src}:1: error: *_binding.cpp files are for the cpp_extension compiler; with nvcc there are "
                'no bindings: export extern "C" launchers from .cu files and call them from model_new.py'
                for src in agent_sources(root, (".cpp",), only_suffix="_binding.cpp")]

    def no_sources_message(self) -> str:
        return "kernels/ holds no .cu file to build"

    def link_argv(self, objects: list[str], out: str) -> list[str]:
        nvcc = self._nvcc()
        lib = cuda_lib_dir(nvcc)
        return [nvcc, "-shared", *arch_flags(self.options.arch, self.options.ptx), *objects, "-o", out,
                "-L", str(lib), f"-Xlinker=-rpath,{lib}", *[f"-l{x}" for x in self.options.libraries],
                *link_flags_for([x for x in self.used_libraries if x not in self.options.libraries],
                                nvcc, "-Xlinker=")]
