"""A size-limited file system for a sandbox's workspace, so the agent's disk use is bounded
for real (preallocated blocks included).

As root, the first session on a workspace mounts a file system of ``disk_mb`` on the
workspace folder, in the host's mount namespace, so the service, the compiler, the host-side
file tools and a docker bind mount all see the same files; the last session to close takes
it away again. Kinds:

* ``loop``: an ext4 image (sparse, grows as it is used, never past its size) on a loop
  device: disk-backed; the default where ``mkfs.ext4`` and loop devices work;
* ``tmpfs``: memory-backed, the fallback.

Writes past the size fail with "No space left on device": ``fallocate`` included, which a
file-size limit does not stop. Sparse files take no blocks here; the file-size limit bounds
each of them and the disk watchdog counts their apparent size.

The workspace's files (``.cuda_agent/`` aside) are copied in when the file system is
mounted and back when it goes (owners, modes and links kept, links as links, sparse files
sparse); ``.cuda_agent/``, written only by the host side (builds, history, the service's
socket), is bind-mounted into it from the disk and never copied. A run killed before
closing leaves the file system mounted on the workspace with the latest files; the next
session on it takes it over (or ``umount`` it by hand after copying the files out).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from .layout import STATE_DIR, is_root
from .results import SandboxError

KINDS = ("auto", "loop", "tmpfs", "none")
STAGE_SUFFIX = ".disk"  # <parent>/.<name>.disk: the image, the mount point used while setting up
INODES_PER_MB = 64


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise SandboxError(f"{' '.join(argv[:3])}: {proc.stdout.strip()[-300:] or f'exit {proc.returncode}'}")


def _mounted(path: Path) -> bool:
    return os.path.ismount(path)


_loop_ok: bool | None = None


def loop_works() -> bool:
    """Whether ext4 images can be made and loop-mounted here (once per process)."""
    global _loop_ok
    if _loop_ok is None:
        _loop_ok = bool(is_root() and shutil.which("mkfs.ext4") and shutil.which("mount")
                        and os.path.exists("/dev/loop-control"))
    return _loop_ok


def choose_kind(kind: str) -> str:
    """The file system ``kind`` asks for here: ``loop``, ``tmpfs`` or ``none``."""
    if kind not in KINDS:
        raise SandboxError(f"disk_fs must be one of {', '.join(KINDS)}, not {kind!r}")
    if kind == "none":
        return "none"
    if not is_root() or not shutil.which("mount"):
        if kind != "auto":
            raise SandboxError(f"disk_fs {kind!r} needs root (mount); use disk_fs: none")
        return "none"
    if kind == "auto":
        return "loop" if loop_works() else "tmpfs"
    if kind == "loop" and not loop_works():
        raise SandboxError("disk_fs 'loop' needs mkfs.ext4 and loop devices (/dev/loop-control); use tmpfs")
    return kind


def _copy_tree(src: Path, dst: Path, skip: str) -> None:
    """Copy ``src``'s entries (but ``skip``) into ``dst`` as they are: owners, modes, times,
    links as links, sparse files sparse (``cp -a``: it never follows a link inside)."""
    names = [n for n in os.listdir(src) if n != skip]
    if names:
        _run(["cp", "-a", "--sparse=always", "--", *[str(src / n) for n in names], str(dst) + "/"])
    st = os.stat(src)
    os.chown(dst, st.st_uid, st.st_gid)
    os.chmod(dst, st.st_mode & 0o7777)


@dataclass
class _Mount:
    root: Path
    kind: str
    size_mb: int
    users: int = 0


_mounts: dict[str, _Mount] = {}
_lock = threading.Lock()


def release_all() -> None:
    """Copy back and unmount every file system this process still holds (at exit: a
    session that was never closed leaves no mount behind)."""
    with _lock:
        roots = list(_mounts)
        _mounts.clear()
    for root in roots:
        with contextlib.suppress(Exception):
            _unmount(Path(root))


atexit.register(release_all)


def stage_of(root: Path) -> Path:
    return root.parent / f".{root.name}{STAGE_SUFFIX}"


def acquire(root: Path, size_mb: int, kind: str) -> str:
    """Mount (or share) the bounded file system on ``root``; returns the kind in use."""
    root = Path(root)
    kind = choose_kind(kind)
    if kind == "none" or size_mb <= 0:
        return "none"
    with _lock:
        m = _mounts.get(str(root))
        if m is None:
            if _mounted(root) and stage_of(root).is_dir():
                m = _Mount(root, "adopted", size_mb)  # left mounted by a run that was killed
            else:
                _mount(root, size_mb, kind)
                m = _Mount(root, kind, size_mb)
            _mounts[str(root)] = m
        m.users += 1
        return m.kind


def release(root: Path) -> None:
    """Drop one user; the last one copies the files back to the disk and unmounts."""
    root = Path(root)
    with _lock:
        m = _mounts.get(str(root))
        if m is None:
            return
        m.users -= 1
        if m.users > 0:
            return
        del _mounts[str(root)]
        _unmount(root)


def _mount(root: Path, size_mb: int, kind: str) -> None:
    stage = stage_of(root)
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(mode=0o700)
    mnt = stage / "mnt"
    mnt.mkdir()
    try:
        inodes = max(1024, size_mb * INODES_PER_MB)
        if kind == "loop":
            image = stage / "disk.img"
            with open(image, "wb") as f:
                f.truncate(size_mb << 20)
            _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-N", str(inodes),
                  "-E", "root_owner=0:0,nodiscard", str(image)])
            _run(["mount", "-o", "loop,nosuid,nodev", str(image), str(mnt)])
            with contextlib.suppress(OSError):
                os.rmdir(mnt / "lost+found")
        else:
            _run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,nr_inodes={inodes},mode=700,nosuid,nodev",
                  "tmpfs", str(mnt)])
        _copy_tree(root, mnt, STATE_DIR)
        if (root / STATE_DIR).is_dir():
            (mnt / STATE_DIR).mkdir(exist_ok=True)
            _run(["mount", "--bind", str(root / STATE_DIR), str(mnt / STATE_DIR)])
        _run(["mount", "--move", str(mnt), str(root)])
    except BaseException:
        with contextlib.suppress(Exception):
            if _mounted(mnt / STATE_DIR):
                _run(["umount", str(mnt / STATE_DIR)])
            if _mounted(mnt):
                _run(["umount", str(mnt)])
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _unmount(root: Path) -> None:
    """Copy the files back under the mount point, then unmount (lazily if still busy)."""
    stage = stage_of(root)
    out = stage / "out"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    _copy_tree(root, out, STATE_DIR)
    st = os.stat(root)
    if _mounted(root / STATE_DIR):
        _umount(root / STATE_DIR)
    _umount(root)
    for name in os.listdir(root):  # the files as they were when the file system was mounted
        if name == STATE_DIR:
            continue
        p = root / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    for name in os.listdir(out):
        os.rename(out / name, root / name)
    os.chown(root, st.st_uid, st.st_gid)
    os.chmod(root, st.st_mode & 0o7777)
    shutil.rmtree(stage, ignore_errors=True)


def _umount(path: Path) -> None:
    proc = subprocess.run(["umount", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        _run(["umount", "-l", str(path)])


def usage(root: Path) -> tuple[int, int] | None:
    """(bytes used, bytes in all) of the bounded file system on ``root``; None without one."""
    with _lock:
        if str(Path(root)) not in _mounts:
            return None
    st = os.statvfs(root)
    total = st.f_blocks * st.f_frsize
    return total - st.f_bavail * st.f_frsize, total


def is_full(root: Path, margin: int = 1 << 20) -> bool:
    """Whether the workspace's bounded file system has (almost) no room left."""
    u = usage(root)
    if u is None:
        return False
    used, total = u
    return total - used <= margin
