"""The docker sandbox image, built locally: never pulled from a registry.

``cuda-agent sandbox build-image`` runs debootstrap (Debian bookworm, variant minbase,
with python3 and procps) into a folder, trims it, and imports it with the Docker SDK
(``docker import``). ``--rootfs DIR`` imports any local root file system instead. The
image holds only what the agent's shell needs (bash, coreutils, python3 standard
library; ``python`` is ``python3``); compiles run host-side.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from .results import SandboxError

IMAGE_REPO = "cuda-agent-sandbox"
IMAGE_TAG = "bookworm-2"  # bump when the recipe changes
DEFAULT_IMAGE = f"{IMAGE_REPO}:{IMAGE_TAG}"
SUITE = "bookworm"
INCLUDE = ["python3", "procps"]
TRIM = ["usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt/archives",
        "var/lib/apt/lists", "var/log"]
CHANGES = ['WORKDIR /workspace', 'ENV LANG=C.UTF-8 PATH=/usr/local/bin:/usr/bin:/bin', 'CMD ["/bin/bash"]']


def docker_client(timeout: float | None = None):
    """A client of the engine ``DOCKER_HOST`` names (or the local one); ``timeout``: its
    socket timeout in seconds (the SDK's default, 60 s, when None)."""
    try:
        import docker
    except ImportError as exc:  # pragma: no cover
        raise SandboxError("the docker sandbox needs the docker SDK: pip install docker") from exc
    try:
        client = docker.from_env(**({} if timeout is None else {"timeout": timeout}))
        client.ping()
    except Exception as exc:
        host = os.environ.get("DOCKER_HOST", "the local socket")
        raise SandboxError(f"cannot reach a Docker engine at {host}: {str(exc).splitlines()[0][:200]}") from exc
    return client


def image_exists(client, tag: str = DEFAULT_IMAGE) -> bool:
    import docker

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def default_mirror() -> str:
    """The Debian mirror of this machine's apt sources (or deb.debian.org)."""
    for path in ["/etc/apt/sources.list", *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        with contextlib.suppress(OSError):
            for line in Path(path).read_text().splitlines():
                line = line.strip()
                if line.startswith("deb ") and "debian" in line and "security" not in line:
                    for word in line.split()[1:]:
                        if word.startswith("http"):
                            return word
                if line.startswith("URIs:") and "security" not in line:
                    return line.split()[1]
    return "http://deb.debian.org/debian"


def debootstrap(dest: Path, mirror: str | None = None, suite: str = SUITE, log=print) -> None:
    if not shutil.which("debootstrap"):
        raise SandboxError("debootstrap is not installed (apt-get install debootstrap), or pass --rootfs DIR")
    if os.geteuid() != 0:
        raise SandboxError("debootstrap needs root; or pass --rootfs DIR with a prepared root file system")
    mirror = mirror or default_mirror()
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(INCLUDE)}", suite, str(dest), mirror]
    log(f"running: {' '.join(argv)}")
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-5:])
        raise SandboxError(f"debootstrap failed ({proc.returncode}): {tail}")
    for rel in TRIM:
        p = dest / rel
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
            p.mkdir(parents=True, exist_ok=True)
    (dest / "workspace").mkdir(exist_ok=True)


def import_rootfs(client, rootfs: Path, tag: str = DEFAULT_IMAGE, log=print) -> str:
    rootfs = Path(rootfs)
    if not (rootfs / "bin").exists() and not (rootfs / "usr" / "bin").exists():
        raise SandboxError(f"{rootfs} does not look like a root file system (no bin/ or usr/bin/)")
    for need in ("bin/bash", "usr/bin/python3"):
        if not (rootfs / need).exists() and not (rootfs / need).is_symlink():
            raise SandboxError(f"{rootfs} lacks {need}: the agent shell needs bash and python3")
    (rootfs / "workspace").mkdir(exist_ok=True)
    repo, _, version = tag.partition(":")
    with tempfile.TemporaryDirectory(prefix="cuda-agent-image-") as tmp:
        tar_path = Path(tmp) / "rootfs.tar"
        log(f"packing {rootfs} ...")
        with tarfile.open(tar_path, "w") as tar:
            for entry in sorted(os.listdir(rootfs)):
                tar.add(rootfs / entry, arcname=entry)
            if not os.path.lexists(rootfs / "usr/bin/python"):  # SKILL.md's `python tools/verify.py`
                link = tarfile.TarInfo("usr/bin/python")
                link.type, link.linkname = tarfile.SYMTYPE, "python3"
                tar.addfile(link)
        log(f"importing into the Docker engine as {tag} ...")
        client.api.import_image_from_file(str(tar_path), repository=repo, tag=version or "latest",
                                          changes=CHANGES)
    img = client.images.get(tag)
    return img.id


def build_image(tag: str = DEFAULT_IMAGE, rootfs: str | Path | None = None, mirror: str | None = None,
                force: bool = False, log=print) -> str:
    """Build (or reuse) the sandbox image; returns its id."""
    client = docker_client()
    if not force and image_exists(client, tag):
        log(f"{tag} already exists (use --force to rebuild)")
        return client.images.get(tag).id
    t0 = time.monotonic()
    if rootfs:
        image_id = import_rootfs(client, Path(rootfs), tag, log)
    else:
        work = Path(tempfile.mkdtemp(prefix="cuda-agent-rootfs-"))
        try:
            debootstrap(work / "rootfs", mirror, log=log)
            image_id = import_rootfs(client, work / "rootfs", tag, log)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    log(f"built {tag} ({image_id[:19]}) in {time.monotonic() - t0:.0f} s")
    return image_id


def ensure_image(tag: str = DEFAULT_IMAGE, log=print) -> str:
    return build_image(tag, log=log)
