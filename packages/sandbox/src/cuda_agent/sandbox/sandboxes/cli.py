"""``cuda-agent sandbox ...`` commands."""

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
        from .image import DEFAULT_IMAGE, build_image

        build_image(tag or DEFAULT_IMAGE, rootfs=rootfs, mirror=mirror, force=force, log=click.echo)
