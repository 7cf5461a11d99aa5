"""Built-in datasets plugin: the dataset loaders, the config fragment and its schema, ``cuda-agent data``."""

from __future__ import annotations

from pathlib import Path

from cuda_agent.core.hookspecs import hookimpl

from .folder import FolderDataset
from .kernelbench import KernelBenchDataset
from .ops6k import Ops6KDataset


@hookimpl
def register_datasets(register):
    register(KernelBenchDataset)
    register(Ops6KDataset)
    register(FolderDataset)


@hookimpl
def register_config_fragments(register):
    register("datasets", Path(__file__).parent / "configs" / "datasets.yaml")


@hookimpl
def register_config_schemas(register):
    from .synthesis.pipeline import SynthesisOptions

    register("synthesis", SynthesisOptions)


@hookimpl
def register_commands(cli):
    from .cli import data_group

    if "data" not in cli.commands:
        cli.add_command(data_group)
