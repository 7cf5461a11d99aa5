"""Entry point of the plugin: the ``cuda-agent openenv-serve`` command."""

from __future__ import annotations

import click

from cuda_agent.core import hookimpl


@hookimpl
def register_commands(cli):
    @cli.command("openenv-serve")
    @click.option("--dataset", "dataset", default="kernelbench", show_default=True,
                  help="dataset plugin the tasks come from (kernelbench, ops6k, folder, jsonl, ...)")
    @click.option("--dataset-option", "dataset_options", multiple=True, metavar="KEY=VALUE",
                  help="an option of the dataset, e.g. path=my_tasks/ or levels=[1] (repeatable)")
    @click.option("--backend", default="auto", show_default=True, type=click.Choice(["auto", "cuda", "cpu"]))
    @click.option("--reward", default="milestone", show_default=True, help="reward plugin: milestone or speedup")
    @click.option("--max-turns", default=150, show_default=True, type=int)
    @click.option("--host", default="127.0.0.1", show_default=True)
    @click.option("--port", default=8000, show_default=True, type=int)
    @click.option("--max-sessions", default=8, show_default=True, type=int, help="concurrent client sessions")
    def openenv_serve(dataset, dataset_options, backend, reward, max_turns, host, port, max_sessions):
        """Serve the CUDA environment as an OpenEnv environment (reset/step over WebSocket and HTTP)."""
        import yaml

        from cuda_agent.core.errors import ConfigError
        from cuda_agent.sandbox.workspace.episodes import EpisodeFactory, EpisodeOptions

        from .server import serve

        options = {}
        for item in dataset_options:
            if "=" not in item:
                raise ConfigError(f"--dataset-option {item!r}: write KEY=VALUE")
            key, value = item.split("=", 1)
            options[key] = yaml.safe_load(value)
        episodes = EpisodeFactory(dataset={"name": dataset, "options": options},
                                  options=EpisodeOptions(backend=backend, reward=reward, max_turns=max_turns))
        click.echo(f"cuda-agent OpenEnv server on http://{host}:{port} ({len(episodes.tasks)} tasks, "
                   f"{episodes.backend} backend, reward {reward})")
        serve(episodes, host=host, port=port, max_concurrent_envs=max_sessions)
