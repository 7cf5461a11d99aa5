"""g++ for the CPU backend: ``kernels/*.cpp`` (C++17, OpenMP, SIMD) into a shared library of
``extern "C"`` functions, loaded with ctypes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .buildcache import tool_version
from .base import CommonOptions, IncrementalCompiler, Unit, agent_sources
from .toolchain import find_cxx, host_cpu_id


@dataclass
class GxxOptions(CommonOptions):
    opt: str = "-O3"
    std: str = "c++17"
    march_native: bool = True
    openmp: bool = True
    cxx: str = ""  # default: $CXX or g++
    libraries: list[str] = field(default_factory=list)


class GxxCompiler(IncrementalCompiler):
    name = "gxx"
    backend = "cpu"
    description = 'g++ -O3 -fopenmp C++ kernels in a shared library of extern "C" functions (ctypes)'
    Options = GxxOptions
    artifact_kind = "ctypes"
    artifact_stem = "kernels"

    def flags(self) -> list[str]:
        o = self.options
        flags = ["-c", o.opt, f"-std={o.std}", "-fPIC", "-I", "kernels", "-I", "."]
        if o.march_native:
            flags.append("-march=native")
        if o.openmp:
            flags.append("-fopenmp")
        return flags + list(o.extra_flags)

    def toolchain_id(self) -> str:
        parts = [tool_version([find_cxx(self.options.cxx)]), " ".join(self.flags()),
                 " ".join(self.options.libraries)]
        if self.options.march_native:
            parts.append(host_cpu_id())
        return "\n".join(parts)

    def units(self, root: Path) -> list[Unit]:
        cxx = find_cxx(self.options.cxx)
        return [Unit(src, lambda out, s=src: [cxx, *self.flags(), s, "-o", out])
                for src in agent_sources(root, (".cpp", ".cc", ".cxx"))]

    def no_sources_message(self) -> str:
        return "kernels/ holds no .cpp file to build"

    def link_argv(self, objects: list[str], out: str) -> list[str]:
        flags = ["-shared"] + (["-fopenmp"] if self.options.openmp else [])
        return [find_cxx(self.options.cxx), *flags, *objects, "-o", out,
                *[f"-l{x}" for x in self.options.libraries]]
