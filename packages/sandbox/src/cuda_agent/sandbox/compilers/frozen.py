"""A private copy of a workspace's build inputs, for compiles that run with more rights
than the agent.

The compiler reads its sources as the service's user (root on our hosts). Were it given
the live workspace, a source swapped for a link to a secret between the checks and the
read would print the secret in the compiler's diagnostics. So a build reads a copy made
through the workspace's :class:`~cuda_agent.core.safefs.Tree` (no link followed, plain
files with one name only): the files at the workspace's top and all of ``kernels/``, in a
folder of ``.cuda_agent/`` that only root may enter (the service's copy), or in a folder of
the build's own (every build's copy, which its tools read in their jail, see :mod:`.jail`).
Paths in the result name the workspace again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Iterator

from cuda_agent.core.safefs import Tree, UnsafePath, file_refusal
from cuda_agent.core.types import CompileResult

STATE_DIR = ".cuda_agent"
SOURCE_DIRS = ("kernels",)
MAX_FILE = 8 << 20  # a larger file is no build input


SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".cuh", ".hh", ".inc", ".inl")


def _copy(tree: Tree, rel: str, st: os.stat_result, dest: Path, refused: list | None) -> None:
    why = file_refusal(st, rel)
    if why is not None or st.st_size > MAX_FILE:
        if refused is not None and (rel.split("/")[0] in SOURCE_DIRS or rel.endswith(SOURCE_SUFFIXES)):
            if why is not None and why.kind == "link":
                try:
                    why = tree.link_error(rel, tree.readlink(rel))
                except (OSError, UnsafePath):
                    pass
            refused.append((rel, str(why) if why is not None else f"{rel} is larger than {MAX_FILE >> 20} MB"))
        return
    try:
        data = tree.read_bytes(rel, MAX_FILE)
    except (OSError, UnsafePath) as exc:  # changed since it was listed
        if refused is not None:
            refused.append((rel, f"{rel} changed while it was copied ({exc})"))
        return
    target = dest / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    os.chmod(target, 0o644)


@contextlib.contextmanager
def frozen_sources(root: str | os.PathLike, parent: str | os.PathLike | None = None,
                   refused: list | None = None) -> Iterator[Path]:
    """A folder holding a copy of ``root``'s build inputs, removed afterwards: in a new
    folder of ``root/.cuda_agent/`` (mode 0700) or, with ``parent`` (a folder only root may
    enter), in ``parent/src`` (mode 0755, so that a build user may read it in its jail).
    ``refused``: a list that gets ``(path, why)`` for every source that was not copied (a
    link, a file with several names, a FIFO, one that changed while it was read)."""
    root = Path(root)
    if parent is None:
        state = root / STATE_DIR
        state.mkdir(exist_ok=True)
        dest = Path(tempfile.mkdtemp(prefix="sources-", dir=state))  # mode 0700, root's
    else:
        dest = Path(parent) / "src"
        dest.mkdir(mode=0o755)
        os.chmod(dest, 0o755)
    tree = Tree(root)
    try:
        for name in sorted(os.listdir(root)):
            if name == STATE_DIR:
                continue
            st = tree.lstat(name)
            if st is None:
                continue
            if stat.S_ISDIR(st.st_mode):
                if name in SOURCE_DIRS:
                    (dest / name).mkdir(exist_ok=True)
                    for rel, est in tree.walk(name):
                        if stat.S_ISDIR(est.st_mode):
                            (dest / rel).mkdir(parents=True, exist_ok=True)
                        else:
                            _copy(tree, rel, est, dest, refused)
                continue
            _copy(tree, name, st, dest, refused)
        for dirpath, dirnames, _ in os.walk(dest):
            for d in dirnames:
                os.chmod(os.path.join(dirpath, d), 0o755)
        yield dest
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def name_workspace(result: CompileResult, frozen: Path, root: Path) -> CompileResult:
    """``result`` with the copy's paths replaced by the workspace's."""
    a, b = str(frozen), str(root)
    return replace(result, errors=[e.replace(a, b) for e in result.errors], log=(result.log or "").replace(a, b))
