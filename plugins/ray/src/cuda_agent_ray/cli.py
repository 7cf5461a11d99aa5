"""``cuda-agent ray status|down``: the pool of a Ray cluster as the ``ray`` executor sees it.

Both take the run's CONFIG files and ``key=value`` overrides (``executor.options.address=auto``
...). ``status`` starts the pool if needed and prints a line per slot; ``down`` ends the slot
actors (their worker processes first) and the baseline store of the namespace, for every
client; the baseline records stay on the head's disk.
"""

from __future__ import annotations

import click

from cuda_agent.core.configreads import command_reads

READS = {cmd: command_reads(f"ray {cmd}", "executor", "backend") for cmd in ("status", "down")}


def _executor(args: tuple[str, ...], command: str):
    from cuda_agent.core.cli import split_args
    from cuda_agent.core.config import compose
    from cuda_agent.sandbox.executors.configured import make_executor

    files, overrides = split_args(args)
    cfg = compose(files, ["executor.name=ray", *overrides], reads=READS[command])
    return make_executor(cfg)  # the run's backend=cpu reaches executor.options.backend


def register_ray_commands(cli) -> None:
    @cli.group("ray")
    def group() -> None:
        """The executor pool on a Ray cluster (executor `ray`)."""

    @group.command("status", context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1)
    def status_cmd(args: tuple[str, ...]) -> None:
        """Slots of the pool, one line each (CONFIG files, key=value overrides)."""
        ex = _executor(args, "status")
        try:
            ex.start()
            rows = ex.slot_table()
            store = ex.store_info()
        finally:
            ex.close()
        head = ("slot", "device", "torch", "jobs", "busy", "actor pid")
        widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
        for r in [head, tuple("-" * w for w in widths), *rows]:
            click.echo("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())
        if store:
            click.echo(f"baselines: {store['records']} records in {store['dir']} (head node)")

    @group.command("down", context_settings={"ignore_unknown_options": True})
    @click.argument("args", nargs=-1)
    def down_cmd(args: tuple[str, ...]) -> None:
        """End the pool's slot actors and baseline store (all clients' of the namespace)."""
        ex = _executor(args, "down")
        try:
            n = ex.shutdown_pool()
        finally:
            ex.close()
        click.echo(f"ended {n} actor(s) of namespace {ex.options.namespace}")
