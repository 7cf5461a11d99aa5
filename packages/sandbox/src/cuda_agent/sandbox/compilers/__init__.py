"""Compiler plugins: cpp_extension and nvcc (backend cuda), gxx (backend cpu)."""

from .base import BuildError, IncrementalCompiler, read_manifest
from .cpp_extension import CppExtensionCompiler
from .gxx import GxxCompiler
from .nvcc import NvccCompiler

COMPILERS = (CppExtensionCompiler, NvccCompiler, GxxCompiler)
DEFAULT_COMPILER = {"cuda": "cpp_extension", "cpu": "gxx"}

__all__ = ["BuildError", "COMPILERS", "CppExtensionCompiler", "DEFAULT_COMPILER", "GxxCompiler",
           "IncrementalCompiler", "NvccCompiler", "read_manifest"]
