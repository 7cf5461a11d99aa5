"""Workspaces as bytes: what travels with a job so that cluster nodes need no shared file system.

:func:`pack` reads a workspace folder into one compressed blob: every regular file with
its mode (and owner, which a root process restores), every folder with its mode. Left
behind: what belongs to the client's live service (the socket, ``tmp/``, the request
history, lock files) and symbolic links (never the agent's files; following one could
carry a file from outside the workspace). The build folder travels, so a node loads the
kernels the client (or a build node) built, and a build node sees an unchanged build as
up to date.

:func:`unpack` writes a blob into a fresh folder, refusing any path that would leave it.
:func:`rebase` rewrites paths in a job's result from the node's copy back to the client's
workspace, so results read as they do with the ``local`` executor.

Standard library only: the same module runs in the client, the slot actors and the build
tasks.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import stat
import zlib
from pathlib import Path, PurePosixPath
from typing import Any

FORMAT = 1
STATE_DIR = ".cuda_agent"
# parts of <ws>/.cuda_agent that stay with the client
STATE_LEFT_BEHIND = ("tmp", "service.sock", "history.jsonl")


class TransferError(ValueError):
    """A workspace cannot be packed or unpacked (too large, unsafe path, bad blob)."""


def _skip(rel: PurePosixPath) -> bool:
    parts = rel.parts
    if len(parts) >= 2 and parts[0] == STATE_DIR:
        if parts[1] in STATE_LEFT_BEHIND or parts[-1].endswith(".lock"):
            return True
    return False


def pack(root: str | os.PathLike, max_bytes: int = 256 << 20) -> bytes:
    """The workspace at ``root`` as one blob (see the module docstring)."""
    root = Path(root)
    if not root.is_dir():
        raise TransferError(f"workspace {root} is not a folder")
    dirs: list[tuple[str, int, int, int]] = []
    files: list[tuple[str, int, int, int, bytes]] = []
    total = 0
    for base, dirnames, filenames in os.walk(root):
        here = Path(base)
        rel_here = PurePosixPath(here.relative_to(root).as_posix())
        keep = []
        for d in sorted(dirnames):
            rel = rel_here / d if str(rel_here) != "." else PurePosixPath(d)
            st = os.lstat(here / d)
            if stat.S_ISLNK(st.st_mode) or _skip(rel):
                continue
            keep.append(d)
            dirs.append((str(rel), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid))
        dirnames[:] = keep
        for f in sorted(filenames):
            rel = rel_here / f if str(rel_here) != "." else PurePosixPath(f)
            st = os.lstat(here / f)
            if not stat.S_ISREG(st.st_mode) or _skip(rel):
                continue
            total += st.st_size
            if total > max_bytes:
                raise TransferError(
                    f"workspace {root} holds more than {max_bytes / (1 << 20):.3g} MiB of files; "
                    "remove large files from it or raise executor.options.max_transfer_mb")
            files.append((str(rel), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, (here / f).read_bytes()))
    st = os.stat(root)
    blob = {"format": FORMAT, "root_mode": stat.S_IMODE(st.st_mode), "dirs": dirs, "files": files}
    return zlib.compress(pickle.dumps(blob, protocol=pickle.HIGHEST_PROTOCOL), 1)


def _safe_rel(rel: str) -> PurePosixPath:
    p = PurePosixPath(rel)
    if p.is_absolute() or not p.parts or any(part in ("..", "") for part in p.parts):
        raise TransferError(f"unsafe path in a workspace blob: {rel!r}")
    return p


def unpack(blob: bytes, dest: str | os.PathLike, owners: bool | None = None) -> Path:
    """Write ``blob`` into ``dest`` (created; must not exist or be empty). Modes are kept
    without set-id bits or group/other write; owners are kept when ``owners`` (default: when
    this process is root)."""
    try:
        data = pickle.loads(zlib.decompress(blob))
    except Exception as exc:  # noqa: BLE001 - any decoding failure is a bad blob
        raise TransferError(f"not a workspace blob: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TransferError("not a workspace blob of this version")
    if owners is None:
        owners = hasattr(os, "geteuid") and os.geteuid() == 0
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise TransferError(f"{dest} is not empty")
    mask = 0o755  # no set-id bits, no group/other write
    for rel, _mode, _uid, _gid in data["dirs"]:
        (dest / _safe_rel(rel)).mkdir(parents=True, exist_ok=True)
    for rel, mode, uid, gid, content in data["files"]:
        p = dest / _safe_rel(rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        if owners:
            os.chown(p, uid, gid)
        os.chmod(p, mode & mask)
    # folders last and deepest first: a read-only folder is made read-only once it is full
    for rel, mode, uid, gid in sorted(data["dirs"], key=lambda d: -len(PurePosixPath(d[0]).parts)):
        p = dest / _safe_rel(rel)
        if owners:
            os.chown(p, uid, gid)
        os.chmod(p, mode & mask)
    os.chmod(dest, data.get("root_mode", 0o755) & mask)
    return dest


def file_text(blob: bytes, rel: str) -> str | None:
    """The text of one file of a blob (``model.py``), or None."""
    data = pickle.loads(zlib.decompress(blob))
    for name, _mode, _uid, _gid, content in data["files"]:
        if name == rel:
            return content.decode("utf-8", "replace")
    return None


def read_tree(root: str | os.PathLike, sub: str) -> dict[str, bytes]:
    """``{path relative to root: bytes}`` of the regular files under ``root/sub``."""
    root = Path(root)
    out: dict[str, bytes] = {}
    base = root / sub
    if not base.is_dir():
        return out
    for p in sorted(base.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[p.relative_to(root).as_posix()] = p.read_bytes()
    return out


def write_tree(root: str | os.PathLike, files: dict[str, bytes], sub: str) -> None:
    """Make ``root/sub`` hold exactly ``files`` (paths relative to ``root``, all under ``sub``);
    each file is replaced atomically, so a process loading the old build never sees half a file."""
    root = Path(root)
    base = root / sub
    base.mkdir(parents=True, exist_ok=True)
    wanted = set()
    for rel, content in files.items():
        p = _safe_rel(rel)
        if not str(p).startswith(sub.rstrip("/") + "/"):
            raise TransferError(f"{rel!r} is not under {sub}")
        target = root / p
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        tmp.write_bytes(content)
        os.chmod(tmp, 0o755 if target.suffix == ".so" else 0o644)
        os.replace(tmp, target)
        wanted.add(target)
    for p in base.rglob("*"):
        if p.is_file() and p not in wanted:
            try:
                p.unlink()
            except OSError:
                pass


def remove_tree(path: str | os.PathLike) -> None:
    """Delete a folder made by :func:`unpack`, read-only parts included."""
    try:
        from cuda_agent.sandbox.workspace.workspace import remove_workspace

        remove_workspace(path)
    except Exception:  # noqa: BLE001 - best effort: a temporary folder
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def rebase(obj: Any, old: str, new: str) -> Any:
    """``obj`` with every string that starts with the folder ``old`` starting with ``new``
    (through dataclasses, mappings, lists and tuples; other values as they are)."""
    if not old or old == new:
        return obj
    return _rebase(obj, old.rstrip("/"), new.rstrip("/"), 0)


def _rebase(obj: Any, old: str, new: str, depth: int) -> Any:
    if depth > 20:
        return obj
    if isinstance(obj, str):
        if obj == old or obj.startswith(old + "/"):
            return new + obj[len(old):]
        if old + "/" in obj:  # a message naming a file of the workspace
            return obj.replace(old + "/", new + "/")
        return obj
    if isinstance(obj, dict):
        return {k: _rebase(v, old, new, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rebase(v, old, new, depth + 1) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_rebase(v, old, new, depth + 1) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {}
        for f in dataclasses.fields(obj):
            if not f.init:
                continue
            v = getattr(obj, f.name)
            nv = _rebase(v, old, new, depth + 1)
            if nv is not v:
                changes[f.name] = nv
        return dataclasses.replace(obj, **changes) if changes else obj
    return obj
