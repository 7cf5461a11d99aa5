"""Built-in evaluation plugin: the ``eval`` config section and the ``eval``/``baselines`` commands."""

from __future__ import annotations

from pathlib import Path

from cuda_agent.core.hookspecs import hookimpl


@hookimpl
def register_config_fragments(register):
    register("evaluation", Path(__file__).parent / "configs" / "eval.yaml")


@hookimpl
def register_config_schemas(register):
    from .options import EvalOptions

    register("eval", EvalOptions)


@hookimpl
def register_commands(cli):
    from .commands import register

    register(cli)
