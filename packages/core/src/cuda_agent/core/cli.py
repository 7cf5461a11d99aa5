"""The ``cuda-agent`` command line. Packages add subcommands through ``register_commands``."""

from __future__ import annotations

import sys
from typing import Sequence

import click

from .configreads import EVERYTHING, command_reads
from .errors import CudaAgentError
from .plugins import get_plugin_manager

CONFIG_SHOW = command_reads("config show", EVERYTHING)


def split_args(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """Positional arguments: ``key=value`` ones are overrides, the rest config files."""
    files = [a for a in args if "=" not in a]
    overrides = [a for a in args if "=" in a]
    return files, overrides


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cuda-agent-core", prog_name="cuda-agent")
def cli() -> None:
    """cuda-agent: agents that write CUDA kernels faster than torch.compile."""


@cli.command("plugins")
@click.option("--kind", default=None, help="Only components of this kind.")
def plugins_cmd(kind: str | None) -> None:
    """List installed plugins and the components they register."""
    pm = get_plugin_manager()
    rows = [("KIND", "NAME", "VERSION", "DISTRIBUTION", "PLUGIN")]
    for c in pm.all_components():
        if kind and c.kind != kind:
            continue
        rows.append((c.kind, c.name, c.plugin.version, c.plugin.distribution, c.plugin.name))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    third = [p for p in pm.plugins() if not p.builtin]
    click.echo(f"\n{len(pm.plugins())} plugins loaded ({len(third)} third-party).")


@cli.group("config")
def config_group() -> None:
    """Compose and inspect run configurations."""


@config_group.command("show", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1)
def config_show(args: tuple[str, ...]) -> None:
    """Print the resolved config for FILES and key=value OVERRIDES."""
    from .config import compose, to_yaml

    files, overrides = split_args(args)
    click.echo(to_yaml(compose(files, overrides, reads=CONFIG_SHOW)), nl=False)


_commands_loaded = False


def _load_plugin_commands() -> None:
    global _commands_loaded
    if not _commands_loaded:
        _commands_loaded = True
        get_plugin_manager().hook.register_commands(cli=cli)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        _load_plugin_commands()
        cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
        return 0
    except CudaAgentError as exc:
        click.echo(f"error: {exc.one_line()}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
