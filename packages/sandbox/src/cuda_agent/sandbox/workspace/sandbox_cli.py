"""``cuda-agent sandbox ...`` commands: the docker image, the build cache, the isolation probes."""

from __future__ import annotations

import click


def register_sandbox_commands(cli: click.Group) -> None:
    group = cli.commands.get("sandbox")
    if group is None:

        @cli.group("sandbox")
        def group() -> None:
            """Agent sandboxes: the docker image, checks."""

    @group.command("build-image")
    @click.option("--rootfs", type=click.Path(exists=True, file_okay=False), default=None,
                  help="Import this local root file system instead of running debootstrap.")
    @click.option("--tag", default=None, help="Image tag (default: the sandbox's default image).")
    @click.option("--mirror", default=None, help="Debian mirror (default: from /etc/apt/sources.list).")
    @click.option("--force", is_flag=True, help="Rebuild even if the image exists.")
    def build_image_cmd(rootfs, tag, mirror, force):
        """Build the docker sandbox image locally (debootstrap + docker import; never pulled)."""
        from ..isolation.sandboxes.image import DEFAULT_IMAGE, build_image

        build_image(tag or DEFAULT_IMAGE, rootfs=rootfs, mirror=mirror, force=force, log=click.echo)

    @group.command("prune-cache")
    @click.option("--max-gb", type=float, default=20.0, show_default=True, help="Size to trim the cache to.")
    @click.option("--cache-dir", default=None, help="Build cache (default: $CUDA_AGENT_BUILD_CACHE or ~/.cache/cuda-agent/build).")
    def prune_cache_cmd(max_gb, cache_dir):
        """Delete the least recently used build objects and libraries beyond --max-gb."""
        from ..compilers.buildcache import BuildCache

        cache = BuildCache(cache_dir)
        with cache.lock("prune"):
            before = cache.size()
            removed, freed = cache.prune(int(max_gb * (1 << 30)))
        click.echo(f"{cache.root}: {before / 2**20:.0f} MB, removed {removed} files ({freed / 2**20:.0f} MB)")

    @group.command("check")
    @click.option("--docker", "with_docker", is_flag=True, help="Also check the docker sandbox.")
    def check_cmd(with_docker):
        """Show which isolation guarantees hold on this machine (runs probes in a scratch workspace)."""
        import tempfile
        from pathlib import Path

        from cuda_agent.core.types import Task

        from ..isolation.sandboxes.docker import DockerSandbox
        from ..isolation.sandboxes.local import LocalSandbox
        from .workspace import create_workspace

        import os

        try:
            host_home_entries = len(os.listdir("/root"))
        except OSError:
            host_home_entries = 1 << 30  # not readable here either
        code = "class Model: pass\ndef get_inputs(): return []\ndef get_init_inputs(): return []\n"
        probes = [
            ("protected files", "echo x > model.py", lambda r: r.exit_code != 0),
            ("no network", "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\"",
             lambda r: r.exit_code != 0),
            ("own user id", "id -u", lambda r: r.output.strip() not in ("0", str(__import__('os').getuid()))),
            ("file size limit", "head -c 300M /dev/zero > kernels/big.bin; rc=$?; rm -f kernels/big.bin; exit $rc",
             lambda r: r.exit_code != 0),
            ("host home hidden", "ls -A /root 2>/dev/null | wc -l",
             lambda r: int((r.output.strip().splitlines() or ["0"])[-1]) < host_home_entries),
        ]
        kinds = [("local", LocalSandbox())] + ([("docker", DockerSandbox())] if with_docker else [])
        with tempfile.TemporaryDirectory(prefix="cuda-agent-check-") as tmp:
            for kind, sandbox in kinds:
                ws = create_workspace(Task(id="check", source="check", code=code), Path(tmp) / kind, backend="cpu")
                with sandbox.open(ws.root, ws.protected) as session:
                    click.echo(f"{kind} sandbox" + (f" (mode: {session.mode})" if hasattr(session, "mode") else ""))
                    for name, cmd, holds in probes:
                        r = session.run(cmd, timeout=30)
                        click.echo(f"  {name:18s} {'holds' if holds(r) else 'DOES NOT HOLD'}")
