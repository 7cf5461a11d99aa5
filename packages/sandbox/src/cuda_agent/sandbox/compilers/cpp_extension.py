"""cpp_extension: the paper's build (CUDA kernels + torch bindings through the binding
registry into one torch extension module), with our cache.

The paper calls ``torch.utils.cpp_extension.load`` on every compile with a wiped build
folder: every ``.cu``/``.cpp`` recompiled, the torch headers parsed again for each
binding. Here the same commands (torch's include paths, defines, ABI and nvcc flags)
are driven unit by unit through the content-addressed cache; the torch headers are
parsed once per toolchain into a precompiled header shared by all workspaces; the fixed
``binding.cpp`` of the registry compiles once per machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .buildcache import atomic_write, run_tool, sha256, tool_version
from .jail import claim
from .base import BuildError, CommonOptions, IncrementalCompiler, Unit, agent_sources
from .toolchain import arch_flags, cuda_home, cuda_lib_dir, cuda_paths, find_cxx, find_nvcc, link_flags_for, torch_paths

MODULE_NAME = "cuda_extension"
COMMON_NVCC_FLAGS = [
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
]
# what binding_registry.h includes: the tensor API and pybind11 with torch's type casters
# (a third lighter than <torch/extension.h>, which also pulls in the whole C++ frontend)
PCH_HEADER = "#include <torch/types.h>\n#include <torch/csrc/utils/pybind.h>\n"


@dataclass
class CppExtensionOptions(CommonOptions):
    arch: str = "sm_90"
    ptx: bool = True
    opt: str = "-O3"  # kernels (.cu)
    fast_math: bool = True
    binding_opt: str = "-O1"  # host glue in *_binding.cpp; -O3 buys nothing there and costs seconds
    pch: bool = True  # precompile the torch headers of binding_registry.h once per toolchain
    nvcc: str = ""
    cxx: str = ""
    libraries: list[str] = field(default_factory=lambda: ["cudart"])


class CppExtensionCompiler(IncrementalCompiler):
    name = "cpp_extension"
    backend = "cuda"
    description = "CUDA kernels + torch bindings (binding registry) into one torch extension, cached per unit"
    Options = CppExtensionOptions
    artifact_kind = "torch_extension"
    artifact_stem = MODULE_NAME
    exports_c_functions = False
    module_name = MODULE_NAME

    def _common(self) -> list[str]:
        tp = torch_paths()
        flags = [f"-DTORCH_EXTENSION_NAME={MODULE_NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H",
                 f"-D_GLIBCXX_USE_CXX11_ABI={tp.cxx11_abi}", "-I", "kernels", "-I", "."]
        for inc in [*tp.include, tp.python_include]:
            flags += ["-isystem", str(inc)]
        return flags

    def nvcc_flags(self) -> list[str]:
        o = self.options
        tp = torch_paths()
        flags = ["-c", o.opt, *self._common(), *COMMON_NVCC_FLAGS, "--compiler-options", "-fPIC",
                 f"-std={tp.std}", *arch_flags(o.arch, o.ptx)]
        if o.fast_math:
            flags.append("--use_fast_math")
        return flags + list(o.extra_flags)

    def cxx_flags(self) -> list[str]:
        tp = torch_paths()
        return [self.options.binding_opt, "-fPIC", f"-std={tp.std}", *self._common(), *self.options.extra_flags]

    def toolchain_id(self) -> str:
        tp = torch_paths()
        return "\n".join([tool_version([find_nvcc(self.options.nvcc)]), tool_version([find_cxx(self.options.cxx)]),
                          f"torch {tp.version} {tp.root}", " ".join(self.nvcc_flags()),
                          " ".join(self.cxx_flags()), f"pch={self.options.pch}",
                          " ".join(self.options.libraries)])

    # -- precompiled torch header -----------------------------------------------------

    def _pch_dir(self) -> Path:
        key = sha256("pch", tool_version([find_cxx(self.options.cxx)]), " ".join(self.cxx_flags()),
                     torch_paths().version, PCH_HEADER)
        return self.cache.root / "pch" / key[:24]

    def prepare(self, root: Path) -> None:
        if not self.options.pch:
            return
        d = self._pch_dir()
        gch = d / "torch_pch.h.gch"
        if gch.exists():
            return
        with self.cache.lock(f"pch-{d.name}"):
            if gch.exists():
                return
            d.mkdir(parents=True, exist_ok=True)
            atomic_write(d / "torch_pch.h", PCH_HEADER)
            with self.cache.run_dir("pch-") as run:
                out = run / "out"
                tmp = out / "torch_pch.h.gch"
                argv = [find_cxx(self.options.cxx), "-x", "c++-header", *self.cxx_flags(), str(d / "torch_pch.h"),
                        "-o", str(tmp)]
                res = run_tool(argv, root, self.limits(), slots=self.slots, view=self.view(root, out, [str(d)]))
                if res.exit_code != 0 or not claim(tmp):
                    raise BuildError(f"building the torch precompiled header failed: {res.output.strip()[-300:]}")
                os.replace(tmp, gch)

    # -- what the tools may see and read ----------------------------------------------------

    def compilers(self) -> list[str]:
        return [find_nvcc(self.options.nvcc), find_cxx(self.options.cxx)]

    def _torch_dirs(self) -> list[str]:
        tp = torch_paths()
        return [*(str(i) for i in tp.include), str(tp.python_include)]

    def toolchain_paths(self) -> list[str]:
        nvcc = find_nvcc(self.options.nvcc)
        return [*super().toolchain_paths(), *self._torch_dirs(), str(torch_paths().lib),
                *cuda_paths(nvcc, self.used_libraries)]

    def header_roots(self) -> list[str]:
        roots = [*super().header_roots(), *self._torch_dirs(), str(cuda_home(find_nvcc(self.options.nvcc)))]
        if self.options.pch:
            roots.append(str(self._pch_dir()))
        return roots

    def unit_inputs(self, unit: Unit) -> list[str]:
        return [str(self._pch_dir())] if self.options.pch and unit.tool == "cxx" else []

    def _cxx_argv(self, src: str, out: str) -> list[str]:
        argv = [find_cxx(self.options.cxx), "-c", *self.cxx_flags()]
        if self.options.pch:
            argv += ["-include", str(self._pch_dir() / "torch_pch.h")]
        return argv + [src, "-o", out]

    def units(self, root: Path) -> list[Unit]:
        nvcc = find_nvcc(self.options.nvcc)
        units = [Unit(s, lambda out, s=s: [nvcc, *self.nvcc_flags(), s, "-o", out], tool="nvcc")
                 for s in agent_sources(root, (".cu",))]
        cpp = agent_sources(root, (".cpp", ".cc"))
        if not units and not cpp:
            return []
        if (root / "binding.cpp").exists():
            cpp = ["binding.cpp", *cpp]
        units += [Unit(s, lambda out, s=s: self._cxx_argv(s, out)) for s in cpp]
        return units

    def no_sources_message(self) -> str:
        return "kernels/ holds no .cu or *_binding.cpp file to build"

    def link_argv(self, objects: list[str], out: str) -> list[str]:
        tp = torch_paths()
        nvcc = find_nvcc(self.options.nvcc)
        cuda_lib = cuda_lib_dir(nvcc)
        return [find_cxx(self.options.cxx), "-shared", *objects, "-o", out,
                "-L", str(tp.lib), f"-Wl,-rpath,{tp.lib}", *[f"-l{x}" for x in tp.libraries()],
                "-L", str(cuda_lib), f"-Wl,-rpath,{cuda_lib}", *[f"-l{x}" for x in self.options.libraries],
                *link_flags_for([x for x in self.used_libraries if x not in self.options.libraries],
                                nvcc)]
