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
    from cuda_agent.core.configcheck import schema_defaults

    from .service import ServiceOptions

    register("sandbox.executor", Path(__file__).parent / "configs" / "executor.yaml")
    register("sandbox.service", {"service": schema_defaults(ServiceOptions)})
    register("sandbox.environment", Path(__file__).parent / "configs" / "environment.yaml")


@hookimpl
def register_config_schemas(register):
    from .environment import EnvironmentOptions
    from .service import ServiceOptions

    register("service", ServiceOptions)
    register("environment", EnvironmentOptions)


@hookimpl
def register_compilers(register):
    from .compilers import CppExtensionCompiler, GxxCompiler, NvccCompiler

    register(CppExtensionCompiler)
    register(NvccCompiler)
    register(GxxCompiler)


@hookimpl
def register_profilers(register):
    from .profilers import BUILTIN_PROFILERS

    for cls in BUILTIN_PROFILERS:
        register(cls)


@hookimpl
def register_correctness_checks(register):
    from .checks import BUILTIN_CHECKS

    for cls in BUILTIN_CHECKS:
        register(cls)


@hookimpl
def register_commands(cli):
    from .optimize import register
    from .executors.cli import register_executor_commands
    from .sandboxes.cli import register_sandbox_commands

    register(cli)
    register_sandbox_commands(cli)
    register_executor_commands(cli)


@hookimpl
def register_sandboxes(register):
    from .sandboxes import DockerSandbox, LocalSandbox

    register(LocalSandbox)
    register(DockerSandbox)
