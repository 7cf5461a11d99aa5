"""A private copy of a workspace's build inputs, for compiles that run with more rights
than the agent.

The compiler reads its sources as the service's user (root on our hosts). Were it given
the live workspace, a source swapped for a link to a secret between the checks and the
read would print the secret in the compiler's diagnostics. So a build reads a copy made
through the workspace's :class:`~cuda_agent.core.safefs.Tree` (no link followed, plain
files with one name only): the files at the workspace's top and all of ``kernels/``, in a
folder of ``.cuda_agent/`` that only root may enter. Paths in the result name the
workspace again.
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


def _copy(tree: Tree, rel: str, st: os.stat_result, dest: Path) -> None:
    if file_refusal(st, rel) is not None or st.st_size > MAX_FILE:
        return
    with contextlib.suppress(OSError, UnsafePath):  # changed since it was listed: left out
        data = tree.read_bytes(rel, MAX_FILE)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


@contextlib.contextmanager
def frozen_sources(root: str | os.PathLike) -> Iterator[Path]:
    """A folder holding a copy of ``root``'s build inputs, removed afterwards."""
    root = Path(root)
    state = root / STATE_DIR
    state.mkdir(exist_ok=True)
    dest = Path(tempfile.mkdtemp(prefix="sources-", dir=state))  # mode 0700, root's
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
                            _copy(tree, rel, est, dest)
                continue
            _copy(tree, name, st, dest)
        yield dest
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def name_workspace(result: CompileResult, frozen: Path, root: Path) -> CompileResult:
    """``result`` with the copy's paths replaced by the workspace's."""
    a, b = str(frozen), str(root)
    return replace(result, errors=[e.replace(a, b) for e in result.errors], log=(result.log or "").replace(a, b))
