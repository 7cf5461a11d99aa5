"""Compilers: turning the agent's sources into something the judge can load.

* compiler plugins: :mod:`.cpp_extension` and :mod:`.nvcc` (backend cuda), :mod:`.gxx` (backend
  cpu), on :class:`.base.IncrementalCompiler` (per-file objects, incremental rebuilds);
* :mod:`.buildcache` -- the content-addressed object and library cache, machine-wide job slots;
* :mod:`.frozen` -- the private copy of a workspace's build inputs a build reads;
* :mod:`.source_check` -- sources may not make the compiler read files outside the workspace;
* :mod:`.torch_header` -- a precompiled ``torch/extension.h`` for single files' ``load_inline`` builds;
* :mod:`.toolchain`, :mod:`.signatures`, :mod:`.diagnostics` -- tools found, binding signatures,
  compiler messages made short.

May import: ``cuda_agent.core`` and :mod:`..isolation`.
"""

from .base import BuildError, IncrementalCompiler, read_manifest
from .cpp_extension import CppExtensionCompiler
from .gxx import GxxCompiler
from .nvcc import NvccCompiler

COMPILERS = (CppExtensionCompiler, NvccCompiler, GxxCompiler)
DEFAULT_COMPILER = {"cuda": "cpp_extension", "cpu": "gxx"}

__all__ = ["BuildError", "COMPILERS", "CppExtensionCompiler", "DEFAULT_COMPILER", "GxxCompiler",
           "IncrementalCompiler", "NvccCompiler", "read_manifest"]
