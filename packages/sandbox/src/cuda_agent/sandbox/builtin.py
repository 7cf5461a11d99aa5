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

    from .workspace.service_options import ServiceOptions

    register("sandbox.executor", Path(__file__).parent / "configs" / "executor.yaml")
    register("sandbox.service", {"service": schema_defaults(ServiceOptions)})
    register("sandbox.environment", Path(__file__).parent / "configs" / "environment.yaml")


@hookimpl
def register_config_schemas(register):
    from .workspace.environment import EnvironmentOptions
    from .workspace.service_options import ServiceOptions

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
    from .judge.profilers import BUILTIN_PROFILERS

    for cls in BUILTIN_PROFILERS:
        register(cls)


@hookimpl
def register_correctness_checks(register):
    from .judge.checks import BUILTIN_CHECKS

    for cls in BUILTIN_CHECKS:
        register(cls)


@hookimpl
def register_commands(cli):
    from .workspace.optimize import register
    from .executors.cli import register_executor_commands
    from .workspace.sandbox_cli import register_sandbox_commands
    from .workspace.solution import register as register_solution_commands

    register(cli)
    register_solution_commands(cli)
    register_sandbox_commands(cli)
    register_executor_commands(cli)


@hookimpl
def register_sandboxes(register):
    from .isolation.sandboxes import DockerSandbox, LocalSandbox

    register(LocalSandbox)
    register(DockerSandbox)
