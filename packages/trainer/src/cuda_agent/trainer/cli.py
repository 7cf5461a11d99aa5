"""``cuda-agent train CONFIG... [key=value ...]``: compose the run and run its stages."""

from __future__ import annotations

import click


@click.command("train", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def train_cmd(args: tuple[str, ...], no_progress: bool) -> None:
    """Train: run the stages of trainer.stages (files and key=value overrides, e.g. configs/toy.yaml).

    Resume a killed run with run.resume=<run folder>.
    """
    from cuda_agent.core.cli import split_args
    from cuda_agent.core.config import compose
    from cuda_agent.core.run import Run

    from .stages import StageRunner, validate

    files, overrides = split_args(args)
    cfg = compose(files, overrides)
    validate(cfg)
    with Run(cfg, command="train") as run:
        click.echo(f"run folder: {run.dir}")
        history = StageRunner(cfg, run, show_progress=not no_progress).run_all()
        if history:
            last = history[-1]
            click.echo(f"done: {len(history)} steps; last reward/mean={last.get('reward/mean', float('nan')):.4g}")
