"""Built-in trainer plugin: algorithms, training environments, the TensorBoard tracker, the
trainer config, ``cuda-agent train``."""

from __future__ import annotations

from pathlib import Path

from cuda_agent.core.hookspecs import hookimpl


@hookimpl
def register_algorithms(register):
    from .algorithms import ALGORITHMS

    for cls in ALGORITHMS:
        register(cls)


@hookimpl
def register_environments(register):
    from .envs.cuda import CudaEnvironmentFactory
    from .envs.toy import ToyEnvironmentFactory

    register(ToyEnvironmentFactory)
    register(CudaEnvironmentFactory)


@hookimpl
def register_trackers(register):
    from .trackers import TensorBoardTracker

    register(TensorBoardTracker)


@hookimpl
def register_config_fragments(register):
    from cuda_agent.core.configcheck import schema_defaults

    from .engine import EngineOptions

    register("trainer", Path(__file__).parent / "configs" / "trainer.yaml")
    register("trainer.engine", {"trainer": {"engine": schema_defaults(EngineOptions)}})


@hookimpl
def register_config_schemas(register):
    from cuda_agent.core.agent import AgentOptions

    from .engine import EngineOptions
    from .rollout import RolloutOptions
    from .stages import StageSpec

    register("trainer.rollout", RolloutOptions)
    register("trainer.engine", EngineOptions)
    register("trainer.stages[]", StageSpec)
    register("trainer.stages[].agent", AgentOptions)
    register("trainer.agent_defaults", AgentOptions)


@hookimpl
def register_commands(cli):
    from .cli import train_cmd

    cli.add_command(train_cmd)
