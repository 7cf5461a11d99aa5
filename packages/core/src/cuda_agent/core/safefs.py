"""Reaching the files of a folder without following symbolic links.

Whatever runs with more rights than the agent (the host-side file tools, the workspace
service, snapshot and restore) reaches the agent's files through a :class:`Tree` only.
The tree's root is opened as given (the caller chose it); every component below it is
opened relative to its parent's descriptor with ``O_NOFOLLOW``, so a link anywhere on the
way (a folder swapped for a link to ``/etc``, ``model_new.py`` linked to a secret) is
refused, also one swapped in while the call runs. Only folders and regular files with a
single name are opened: hard links, FIFOs, sockets and devices are refused as well.
"""

from __future__ import annotations

import errno
import os
import stat
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterator

from .errors import CudaAgentError

RULE = "the tools never follow symbolic links (nothing is read or written through one)"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class UnsafePath(CudaAgentError):
    """A path that leaves the tree, crosses a symbolic link or names no plain file.

    ``kind``: ``outside``, ``link``, ``not_folder``, ``folder``, ``missing``, ``hard_link``,
    ``special`` or ``changed``; ``where``: the tree-relative path of the entry refused (the
    link, the file in the way, ...), ``target``: what a link points to, ``outside``: whether
    the path or link leads out of the tree."""

    def __init__(self, message: str, kind: str = "", where: str = "", target: str = "", outside: bool = False):
        super().__init__(message)
        self.kind = kind
        self.where = where
        self.link = where if kind == "link" else ""
        self.target = target
        self.outside = outside


def _join(parts: list[str] | tuple[str, ...]) -> str:
    return "/".join(parts) if parts else "."


class Tree:
    """The folder ``root`` and what lies below it, never through a link."""

    def __init__(self, root: str | os.PathLike, name: str = "the workspace"):
        self.root = Path(os.path.abspath(root))
        self.name = name

    # -- paths --------------------------------------------------------------------------

    def parts(self, path: str | os.PathLike) -> list[str]:
        """Components of ``path`` below the root (relative to it, or absolute inside it),
        ``..`` taken lexically; UnsafePath when the path leaves the tree."""
        text = os.fspath(path)
        if not isinstance(text, str) or not text.strip() or "\x00" in text:
            raise UnsafePath("a path is required", "missing")
        p = PurePosixPath(text)
        if p.is_absolute():
            try:
                p = PurePosixPath(os.path.normpath(text)).relative_to(self.root)
            except ValueError:
                raise UnsafePath(f"{text}: outside {self.name} {self.root}", "outside", outside=True) from None
        out: list[str] = []
        for part in p.parts:
            if part in ("", "."):
                continue
            if part == "..":
                if not out:
                    raise UnsafePath(f"{text}: outside {self.name} {self.root}", "outside", outside=True)
                out.pop()
            else:
                out.append(part)
        return out

    def rel(self, path: str | os.PathLike) -> str:
        """``path`` as a tree-relative POSIX path ("." for the root)."""
        return _join(self.parts(path))

    def points_outside(self, link: str, target: str) -> bool:
        """Whether a link at ``link`` (tree-relative) with ``target`` leads out of the tree."""
        if os.path.isabs(target):
            norm = os.path.normpath(target)
            return not (norm == str(self.root) or norm.startswith(str(self.root).rstrip("/") + "/"))
        depth = len(self.parts(link)) - 1
        for part in PurePosixPath(target).parts:
            if part == "..":
                depth -= 1
                if depth < 0:
                    return True
            elif part not in ("", "."):
                depth += 1
        return False

    def link_error(self, link: str, target: str, shown: str | None = None) -> UnsafePath:
        """The refusal for a path that meets the link ``link`` (pointing to ``target``)."""
        shown = shown or link
        outside = self.points_outside(link, target)
        if outside:
            msg = (f"{shown}: refused: {link} is a symbolic link to {target}, outside {self.name}; {RULE}. "
                   "Use a regular file or folder instead")
        else:
            msg = f"{shown}: refused: {link} is a symbolic link (to {target}); {RULE}. Use the path it points to"
        return UnsafePath(msg, "link", where=link, target=target, outside=outside)

    def _refusal(self, dir_fd: int, name: str, done: list[str], shown: str) -> UnsafePath:
        here = _join(done)
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return UnsafePath(f"{shown}: {here} changed while it was opened; try again", "changed", here)
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(name, dir_fd=dir_fd)
            except OSError:
                target = "?"
            return self.link_error(here, target, shown)
        return UnsafePath(f"{shown}: {here} is not a folder", "not_folder", here)

    # -- folders ------------------------------------------------------------------------

    @contextmanager
    def folder(self, parts: list[str], create: bool = False, mode: int = 0o777,
               owner: tuple[int, int] | None = None) -> Iterator[int]:
        """A descriptor of the folder ``parts`` (made, with its parents, when ``create``;
        new folders belong to ``owner``, by default to the owner of the folder they are made in)."""
        shown = _join(parts)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i, name in enumerate(parts):
                try:
                    nfd = os.open(name, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise UnsafePath(f"{shown}: no such folder", "missing", _join(parts[: i + 1])) from None
                    try:
                        os.mkdir(name, mode, dir_fd=fd)
                        _inherit_owner(fd, name, owner)
                    except FileExistsError:
                        pass
                    try:
                        nfd = os.open(name, _DIR, dir_fd=fd)
                    except OSError as exc:
                        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                            raise self._refusal(fd, name, parts[: i + 1], shown) from None
                        raise
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise self._refusal(fd, name, parts[: i + 1], shown) from None
                    raise
                os.close(fd)
                fd = nfd
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def parent(self, path: str | os.PathLike, create: bool = False, owner: tuple[int, int] | None = None
               ) -> Iterator[tuple[int, str, list[str]]]:
        """(descriptor of the folder holding ``path``, its last name, all its parts)."""
        parts = self.parts(path)
        if not parts:
            raise UnsafePath(f"{os.fspath(path)}: names the root folder, not a file", "folder", ".")
        with self.folder(parts[:-1], create=create, owner=owner) as fd:
            yield fd, parts[-1], parts

    # -- files --------------------------------------------------------------------------

    def lstat(self, path: str | os.PathLike) -> os.stat_result | None:
        """The entry's own status (a link is not followed); None when it or a folder on the
        way does not exist. UnsafePath when a folder on the way is a link."""
        parts = self.parts(path)
        if not parts:
            return os.stat(self.root)
        try:
            with self.folder(parts[:-1]) as fd:
                return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except UnsafePath as exc:
            if exc.link:
                raise
            return None

    def readlink(self, path: str | os.PathLike) -> str:
        with self.parent(path) as (fd, name, _):
            return os.readlink(name, dir_fd=fd)

    def _check_file(self, fd: int, shown: str) -> os.stat_result:
        st = os.fstat(fd)
        why = file_refusal(st, shown)
        if why is not None:
            raise why
        return st

    def _open(self, dir_fd: int, name: str, flags: int, parts: list[str], mode: int = 0o666) -> int:
        try:
            return os.open(name, flags | _FILE, mode, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._refusal(dir_fd, name, parts, _join(parts)) from None
            if exc.errno == errno.ENOENT:
                raise UnsafePath(f"{_join(parts)}: no such file", "missing", _join(parts)) from None
            if exc.errno == errno.EISDIR:
                raise UnsafePath(f"{_join(parts)} is a folder, not a file", "folder", _join(parts)) from None
            raise

    def read_bytes(self, path: str | os.PathLike, limit: int | None = None) -> bytes:
        """The content of a regular file (at most ``limit`` bytes)."""
        with self.parent(path) as (dfd, name, parts):
            fd = self._open(dfd, name, os.O_RDONLY, parts)
            try:
                st = self._check_file(fd, _join(parts))
                want = st.st_size if limit is None else min(st.st_size, limit)
                chunks, got = [], 0
                while limit is None or got < want:
                    chunk = os.read(fd, max(1 << 16, want - got) if limit is None else want - got)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    got += len(chunk)
                return b"".join(chunks)
            finally:
                os.close(fd)

    def read_text(self, path: str | os.PathLike, limit: int | None = None) -> str:
        return self.read_bytes(path, limit).decode("utf-8", errors="replace")

    def write_bytes(self, path: str | os.PathLike, data: bytes, make_dirs: bool = False, mode: int = 0o666,
                    owner: tuple[int, int] | None = None) -> bool:
        """Replace the content of a regular file (created when missing, and then owned by
        ``owner`` or by the owner of its folder; an existing one keeps its owner and mode).
        True when the file existed."""
        with self.parent(path, create=make_dirs, owner=owner) as (dfd, name, parts):
            existed = False
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE, mode, dir_fd=dfd)
                _inherit_owner(dfd, name, owner)
            except FileExistsError:
                existed = True
                fd = self._open(dfd, name, os.O_WRONLY, parts)
            try:
                self._check_file(fd, _join(parts))
                os.ftruncate(fd, 0)
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            finally:
                os.close(fd)
            return existed

    def write_text(self, path: str | os.PathLike, text: str, make_dirs: bool = False,
                   owner: tuple[int, int] | None = None) -> bool:
        return self.write_bytes(path, text.encode("utf-8"), make_dirs=make_dirs, owner=owner)

    def unlink(self, path: str | os.PathLike) -> None:
        """Remove a file or a link (the link itself, never what it points to)."""
        with self.parent(path) as (fd, name, _):
            os.unlink(name, dir_fd=fd)

    def remove_tree(self, path: str | os.PathLike) -> None:
        """Remove a folder and everything below it, links as links."""
        with self.parent(path) as (fd, name, parts):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=fd)
                return
            for rel, est in sorted(self.walk(_join(parts)), key=lambda e: -e[0].count("/")):
                with self.parent(rel) as (pfd, pname, _):
                    if stat.S_ISDIR(est.st_mode):
                        os.rmdir(pname, dir_fd=pfd)
                    else:
                        os.unlink(pname, dir_fd=pfd)
            os.rmdir(name, dir_fd=fd)

    def set_owner(self, path: str | os.PathLike, uid: int | None, gid: int | None, mode) -> os.stat_result | None:
        """Change a folder's or file's owner and mode through a descriptor (a link, or an
        entry swapped for one meanwhile, is left alone: None). ``mode``: a number, or a
        function of the entry's status returning one (None: keep the mode)."""
        parts = self.parts(path)
        if not parts:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            with self.folder(parts[:-1]) as dfd:
                try:
                    before = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
                    if not (stat.S_ISDIR(before.st_mode) or stat.S_ISREG(before.st_mode)
                            or stat.S_ISFIFO(before.st_mode)):
                        return None  # links, sockets and devices are never opened
                    fd = os.open(parts[-1], os.O_RDONLY | _FILE, dir_fd=dfd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENXIO, errno.ENOENT, errno.EOPNOTSUPP):
                        return None  # swapped for a link, or gone
                    raise
        try:
            st = os.fstat(fd)
            if parts and (st.st_ino, st.st_dev) != (before.st_ino, before.st_dev):
                return None  # replaced meanwhile
            if uid is not None and (st.st_uid != uid or st.st_gid != gid):
                os.fchown(fd, uid, -1 if gid is None else gid)
            want = mode(st) if callable(mode) else mode
            if want is not None and stat.S_IMODE(st.st_mode) != want:
                os.fchmod(fd, want)
            return st
        finally:
            os.close(fd)

    # -- walking --------------------------------------------------------------------------

    def walk(self, path: str | os.PathLike = ".", skip: frozenset[str] | set[str] = frozenset()
             ) -> Iterator[tuple[str, os.stat_result]]:
        """Every entry below the folder ``path`` as (tree-relative path, own status), sorted
        by name; folders are entered (never through a link), names in ``skip`` are not."""
        parts = self.parts(path)
        with self.folder(parts) as fd:
            yield from self._walk(fd, parts, skip)

    def _walk(self, fd: int, parts: list[str], skip) -> Iterator[tuple[str, os.stat_result]]:
        try:
            names = sorted(os.listdir(fd))
        except OSError:
            return
        for name in names:
            if name in skip:
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            here = [*parts, name]
            yield _join(here), st
            if stat.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(name, _DIR, dir_fd=fd)
                except OSError:
                    continue
                try:
                    yield from self._walk(sub, here, skip)
                finally:
                    os.close(sub)


def file_refusal(st: os.stat_result, shown: str) -> UnsafePath | None:
    """Why an entry with status ``st`` is not opened as a file (None: a plain file)."""
    if stat.S_ISDIR(st.st_mode):
        return UnsafePath(f"{shown} is a folder, not a file", "folder", shown)
    if stat.S_ISLNK(st.st_mode):
        return UnsafePath(f"{shown}: refused: it is a symbolic link; {RULE}", "link", shown)
    if not stat.S_ISREG(st.st_mode):
        return UnsafePath(f"{shown} is not a regular file (a FIFO, socket or device); only plain files are used",
                          "special", shown)
    if st.st_nlink > 1:
        return UnsafePath(f"{shown}: refused: the file has {st.st_nlink} hard links; the tools use only files "
                          "with a single name (copy it instead of linking it)", "hard_link", shown)
    return None


def _inherit_owner(dir_fd: int, name: str, owner: tuple[int, int] | None = None) -> None:
    """As root, a new entry belongs to ``owner``, by default to the owner of the folder it
    is made in (the agent's files stay the agent's)."""
    if os.geteuid() != 0:
        return
    if owner is None:
        st = os.fstat(dir_fd)
        owner = (st.st_uid, st.st_gid)
    if owner != (0, 0):
        os.chown(name, owner[0], owner[1], dir_fd=dir_fd, follow_symlinks=False)
