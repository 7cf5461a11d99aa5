"""Built-in sandbox plugin: registers this package's components."""

from __future__ import annotations

from pathlib import Path

from cuda_agent.core.hookspecs import hookimpl  # noqa: F401


@hookimpl
def register_executors(register):
    from .executors.local import CpuExecutor, LocalExecutor

    register(LocalExecutor)
    register(CpuExecutor)


@hookimpl
def register_config_fragments(register):
    register("sandbox.executor", Path(__file__).parent / "configs" / "executor.yaml")


@hookimpl
def register_compilers(register):
    from .compilers import CppExtensionCompiler, GxxCompiler, NvccCompiler

    register(CppExtensionCompiler)
    register(NvccCompiler)
    register(GxxCompiler)
