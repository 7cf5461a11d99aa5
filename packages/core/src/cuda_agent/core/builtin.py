"""Core's own built-in plugin: registered through the same hooks as any other."""

from __future__ import annotations

from .hookspecs import hookimpl
from .trackers import ConsoleTracker, JsonlTracker


@hookimpl
def register_trackers(register):
    register(JsonlTracker)
    register(ConsoleTracker)


@hookimpl
def register_agent_tools(register):
    from .tools import ALL_TOOLS

    for tool in ALL_TOOLS:
        register(tool)


@hookimpl
def register_policies(register):
    from .policies import policy_classes

    for policy in policy_classes():
        register(policy)


@hookimpl
def register_config_schemas(register):
    from .agent.loop import AgentOptions

    register("agent", AgentOptions)


@hookimpl
def register_commands(cli):
    from .models.cli import models_cmd

    cli.add_command(models_cmd)
