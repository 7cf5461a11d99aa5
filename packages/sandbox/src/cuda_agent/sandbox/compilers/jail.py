"""Where a build's tools run, and as whom.

A compiler reads whatever its input names: an ``#include`` spelled any way the
preprocessor accepts (line splices, comments, digraphs, macros), an assembler ``.include``
or ``.incbin``, a ``#line`` whose file a diagnostic quotes. No check of the spelling can
list them all, so the tools never get the rights to read what is not theirs. As root (on
Linux), every tool of a build (compiler, assembler, linker, the precompiled header's
build) runs through :mod:`._jail_launch`:

* under a user id leased for that run (:data:`BUILD_UID_BASE`.., never a job's or a
  sandbox's), with no groups and ``no_new_privs``; every process of that id is killed and
  checked before the id is released;
* in mount, PID, network and IPC namespaces of its own, whose root file system is a fresh
  tmpfs holding only ``/usr`` and the system library folders, the toolchain's folders
  outside them (CUDA, torch's headers and libraries, Python's headers; :class:`ToolView`'s
  ``readable``), the build's private copy of the sources and the inputs the step names
  (objects, the precompiled header), all read-only; an ``/etc`` of the loader's cache and
  the tools' alternatives and a ``passwd`` naming only root and the build user; ``/dev``'s
  null, zero, full and random devices; a ``/proc`` of its own processes; size-limited
  private ``/tmp``, ``/var/tmp`` and ``/dev/shm``; and one empty output folder, the only
  place it may write. ``/root``, ``/home``, the workspace and every other file of the host
  are not there;
* with an environment of the toolchain's variables only (no key or token of the host
  process reaches ``/proc/self/environ``);
* under limits: wall time, CPU time, address space, file size, processes, and the output it
  may print (:data:`OUTPUT_KEEP` kept, the tool killed past :data:`OUTPUT_KILL`).

``CUDA_AGENT_BUILD_JAIL=0`` switches the jail off (builds then read with the rights of the
process that runs them; for hosts where namespaces cannot be made). Without root there is
no other user to become: tools run as the calling user, with the same environment and
limits. What a build read is checked either way (:mod:`.source_check`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from cuda_agent.core.errors import CudaAgentError

ENV = "CUDA_AGENT_BUILD_JAIL"
BUILD_UID_BASE = 59000  # 59000..59999: below the jobs' (60000..) and the sandboxes' (61000..) user ids
BUILD_UID_COUNT = 1000
JAIL_FAILED = 125
LAUNCHER = str(Path(__file__).with_name("_jail_launch.py"))
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime")
TOOL_ENV = ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH",
            "LIBRARY_PATH", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "SOURCE_DATE_EPOCH")
OUTPUT_KEEP = 256 << 10  # bytes of a tool's output kept from its start (and 64 KiB of its end)
OUTPUT_KILL = 32 << 20  # a tool that prints more than this is killed


class JailError(CudaAgentError):
    """The build jail could not be made on this host (nothing of the tool ran)."""


@dataclass
class ToolView:
    """What one tool run may see: ``sources`` (its working folder, read-only), ``readable``
    (toolchain folders and input files, read-only), ``output`` (the one folder it writes)."""

    sources: str
    output: str
    readable: list[str] = field(default_factory=list)
    scratch_mb: int = 2048


def why_not_jailed() -> str:
    """"" when tools run in the jail, else why not."""
    if os.environ.get(ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return f"switched off by {ENV}=0"
    if not sys.platform.startswith("linux"):
        return f"no build jail on {sys.platform}"
    if os.geteuid() != 0:
        return "not root: tools run as the calling user"
    return ""


def tool_env(tmp: str) -> dict[str, str]:
    """The environment of a tool: the toolchain's variables only, a private temporary folder."""
    env = {k: os.environ[k] for k in TOOL_ENV if os.environ.get(k)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=tmp, TMPDIR=tmp, LC_ALL="C", LANG="C")
    return env


class Lease:
    """A build user id no other run holds (a file lock), with its processes swept at the end."""

    def __init__(self) -> None:
        from ..isolation.sandboxes.uids import UidLease, lock_dir

        self._lease = UidLease(Path(f"build-{uuid.uuid4().hex}"), BUILD_UID_BASE, BUILD_UID_COUNT, lock_dir())
        self.uid = self.gid = self._lease.uid
        self.sweep()  # a process left by a crashed earlier holder

    def sweep(self) -> None:
        from ..isolation.sandboxes.sweeps import processes_of_uid, sweep_uid

        if processes_of_uid(self.uid):
            left = sweep_uid(self.uid, self.gid)
            if left:
                raise OSError(f"processes of build user {self.uid} survive SIGKILL: {left[:5]}")

    def release(self) -> None:
        try:
            self.sweep()
        finally:
            self._lease.release()


def readable_roots(paths: list[str]) -> list[str]:
    """``paths`` that exist, absolute and normalised, each once (``/`` never)."""
    out: list[str] = []
    for p in paths:
        if not p:
            continue
        p = os.path.normpath(os.path.abspath(p))
        if p != "/" and os.path.lexists(p) and p not in out:
            out.append(p)
    return out


def launcher_argv(view: ToolView, argv: list[str], lease: Lease, root: str, limits: dict) -> tuple[list[str], dict]:
    """The command that runs ``argv`` in the jail, and the launcher's environment."""
    env = tool_env("/tmp")
    binds = [[p, False] for p in readable_roots([view.sources, *view.readable])]
    binds.append([os.path.abspath(view.output), True])
    cfg = {"root": root, "system": list(SYSTEM), "etc": list(ETC), "binds": binds, "uid": lease.uid,
           "gid": lease.gid, "cwd": os.path.abspath(view.sources), "env": env,
           "scratch_mb": max(16, int(view.scratch_mb)), "rlimits": limits}
    return [sys.executable, "-I", "-S", LAUNCHER, json.dumps(cfg), "--", *argv], env


@contextlib.contextmanager
def prepared(view: ToolView, lease: Lease):
    """The output folder handed to the build user, and an empty folder for the jail's root;
    afterwards the outputs are root's again (see :func:`claim`)."""
    out = Path(view.output)
    out.mkdir(parents=True, exist_ok=True)
    os.chown(out, lease.uid, lease.gid)
    os.chmod(out, 0o700)
    root = tempfile.mkdtemp(prefix="jail-", dir=out.parent)
    try:
        yield root
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(root)
        with contextlib.suppress(OSError):
            os.chown(out, 0, 0)


def claim(path: str | os.PathLike) -> bool:
    """Make a tool's output file root's, if it is a plain file with one name (never through a
    link: a build user that left a link or a hard link in its output folder gets nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return False
        if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
            os.fchown(fd, 0, 0)
        os.fchmod(fd, 0o644)
        return True
    finally:
        os.close(fd)


def remove(path: str | os.PathLike) -> None:
    shutil.rmtree(path, ignore_errors=True)
