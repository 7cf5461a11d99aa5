"""The files a job judges, copied once when the job starts.

The static checks and the candidate process read the same bytes: a copy taken at the
start of the job, into a folder of the job's own. An agent that rewrites ``model_new.py``
while its job runs changes nothing the job sees, and the candidate process reads no file
of the workspace itself. Every path is opened component by component with
``O_NOFOLLOW`` below the source folder: a symbolic link anywhere on the way (or a file
that is not a regular file) is not copied, and the job says so.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cuda_agent.core.safefs import Tree, UnsafePath

MAX_FILE = 2 << 30  # bytes of one copied file
_RUNTIME = "cuda_agent_runtime.py"
_BUILD = os.path.join(".cuda_agent", "build")


@dataclass
class Snapshot:
    root: Path  # the job's copy (the candidate's workspace from now on)
    files: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # relative path -> why it was not copied

    def path(self, rel: str) -> Path:
        return self.root / rel

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _regular_files(tree: Tree, folder: str) -> list[str]:
    try:
        return [rel for rel, st in tree.walk(folder) if stat.S_ISREG(st.st_mode)]
    except UnsafePath:
        return []


def take(source: Path, files: list[str], folders: tuple[str, ...] = (), parent: str | None = None) -> Snapshot:
    """Copy ``files`` (and the regular files under ``folders``) of ``source`` into a new
    private folder, reading through :class:`~cuda_agent.core.safefs.Tree` (no link followed);
    those missing are skipped, those that cannot be read safely are listed in ``refused``.
    The folder is readable by every user, writable only by its creator."""
    root = Path(tempfile.mkdtemp(prefix="cuda-agent-judge-", dir=parent))
    os.chmod(root, 0o755)
    snap = Snapshot(root=root)
    tree = Tree(source, "the judged folder")
    wanted = list(files)
    for d in folders:
        wanted.extend(_regular_files(tree, d))
    for rel in dict.fromkeys(wanted):
        try:
            data = tree.read_bytes(rel, limit=MAX_FILE)
        except UnsafePath as exc:
            if exc.kind != "missing":
                snap.refused[rel] = str(exc)
            continue
        except OSError as exc:
            snap.refused[rel] = str(exc.strerror or exc)
            continue
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        os.chmod(target, 0o755 if rel.endswith(".so") else 0o644)
        snap.files.append(rel)
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
    return snap


def workspace_files(workspace: Path, candidate: str, reference: str) -> tuple[list[str], tuple[str, ...]]:
    """What a judge of ``workspace`` needs: the reference, the candidate module, the runtime
    loader, the kernel sources and the latest build's manifest and library."""
    files = [reference, candidate, _RUNTIME, f"{_BUILD}/manifest.json"]
    try:
        man = json.loads(Tree(workspace).read_bytes(f"{_BUILD}/manifest.json", limit=1 << 20))
        art = str(man.get("artifact") or "")
        if art and ".." not in art.split("/") and not art.startswith("/"):
            files.append(f"{_BUILD}/{art}")
    except (UnsafePath, OSError, ValueError, AttributeError):
        pass
    return files, ("kernels",)
