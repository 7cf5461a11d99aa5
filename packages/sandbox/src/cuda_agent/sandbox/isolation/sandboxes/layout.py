"""The permission layout of a workspace: protected files unwritable by the agent, the rest
the agent's own, the host side's state folder (``.cuda_agent``) readable only; and files that
host-side tools created handed to the agent's user. Links are never followed."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from cuda_agent.core.safefs import Tree, UnsafePath

STATE_DIR = ".cuda_agent"


def is_root() -> bool:
    """Whether this process may give files away (set owners) and run as other users."""
    return os.geteuid() == 0


def _is_protected(rel: str, protected: list[str]) -> bool:
    return any(rel == p.rstrip("/") or rel.startswith(p.rstrip("/") + "/") for p in protected)


def _agent_mode(st: os.stat_result) -> int:
    return 0o770 if stat.S_ISDIR(st.st_mode) else (0o660 | (st.st_mode & 0o110))


def apply_layout(root: Path, protected: list[str], uid: int | None, gid: int | None) -> None:
    """Make ``protected`` paths unwritable by the agent and the rest writable.

    As root with an agent ``uid``: the workspace folder is ``root:<gid>`` mode ``1770``
    (only the agent's group may enter; the sticky bit stops it deleting or renaming files
    it does not own), protected files are ``root:root`` ``0444`` (folders ``0555``),
    everything else belongs to the agent, ``.cuda_agent`` is ``root:<gid>`` ``0750``.
    Without root only the modes are set, which the agent could undo (advisory).
    Every change goes through a descriptor opened without following links
    (:meth:`~cuda_agent.core.safefs.Tree.set_owner`): links are left as they are.
    """
    root = Path(root)
    tree = Tree(root)
    owner = uid is not None and is_root()
    for rel, st in list(tree.walk(".", skip={STATE_DIR})):
        if stat.S_ISLNK(st.st_mode):
            continue
        with contextlib.suppress(OSError, UnsafePath):
            if _is_protected(rel, protected):
                tree.set_owner(rel, 0 if owner else None, 0, 0o555 if stat.S_ISDIR(st.st_mode) else 0o444)
            elif owner:
                tree.set_owner(rel, uid, gid, _agent_mode)
            else:
                tree.set_owner(rel, None, None, lambda s: stat.S_IMODE(s.st_mode) | stat.S_IWUSR)
    state = root / STATE_DIR
    if state.is_dir() and not state.is_symlink():
        tree.set_owner(STATE_DIR, 0 if owner else None, gid or 0, 0o750 if owner else 0o755)
        for name in os.listdir(state):
            rel = f"{STATE_DIR}/{name}"
            with contextlib.suppress(OSError, UnsafePath):
                if name == "service.sock":
                    sock = state / name
                    if stat.S_ISSOCK(os.lstat(sock).st_mode):
                        os.chmod(sock, 0o666)
                elif stat.S_ISDIR(os.lstat(state / name).st_mode):
                    tree.set_owner(rel, None, None, 0o755)
        if owner:  # jobs that run the agent's code as root drop to this user (see ..privdrop)
            from ..privdrop import record_user

            record_user(root, uid, gid)
    tree.set_owner(".", 0 if owner else None, gid or 0, 0o1770 if owner else 0o755)


def adopt_files(root: Path, protected: list[str], uid: int, gid: int) -> int:
    """Give the agent the files that host-side tools (the agent's write/edit tools run
    outside the sandbox) created in its part of the workspace; returns how many changed.
    Links are never followed (see :func:`apply_layout`)."""
    changed = 0
    tree = Tree(root)
    try:
        entries = list(tree.walk(".", skip={STATE_DIR}))
    except (OSError, UnsafePath):
        return 0
    for rel, st in entries:
        if st.st_uid == uid or stat.S_ISLNK(st.st_mode) or _is_protected(rel, protected):
            continue
        with contextlib.suppress(OSError, UnsafePath):
            if tree.set_owner(rel, uid, gid, _agent_mode) is not None:
                changed += 1
    return changed
