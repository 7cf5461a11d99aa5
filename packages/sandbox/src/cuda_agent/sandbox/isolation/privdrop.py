"""Dropping root rights inside a job before candidate code is imported or run.

Executor workers inherit the rights of the pool's process (root on our GPU hosts). A job
that verifies or profiles a candidate first does its trusted work as that user (reading
``model.py``, measuring and caching the baselines), then calls :func:`drop_privileges`,
which turns the process, irreversibly, into an unprivileged user:

* the workspace's sandbox user when the workspace records one
  (``.cuda_agent/sandbox_user.json``, written as root by the sandbox's layout), so the
  candidate reads the workspace as the agent does and can change no more than the agent
  can (protected files are root-owned and read-only);
* otherwise a user id of its own from the jobs' range (:data:`FALLBACK_UID`, 60000..60999,
  no files of its own), leased as a job's is, so that no candidate process of a job and no
  other dropped process has it while this one lives (see :func:`fallback_uid`).

The workspace stays reachable through a directory handle opened before the drop
(``/proc/self/fd/N``), so folders on the way to it that the user may not enter (a
``0700`` parent) do not matter. ``HOME``, ``TMPDIR``, ``CUDA_CACHE_PATH``,
``TORCH_EXTENSIONS_DIR``, ``TRITON_CACHE_DIR`` and ``XDG_CACHE_HOME`` point into a
private temporary folder owned by that user (removed after the job; with a private ``/tmp``,
``TORCH_EXTENSIONS_DIR`` is the fixed :data:`EXTENSIONS_DIR`, so an extension built in one
job is up to date in another, see :mod:`cuda_agent.sandbox.judge.prebuild`); supplementary groups
are cleared and ``no_new_privs`` is set. The process can then write neither the baseline
cache, nor the workspace's protected files, nor anything of root's. It also gets a network
namespace of its own (``job_network: none`` in the metadata; ``CUDA_AGENT_JOB_NETWORK=1``
keeps the host's network), so candidate code reaches no other machine and no local server. GPU device files are
world-accessible on our GPU hosts and the CUDA context made before the drop stays usable.

The drop happens only in an executor worker process (the worker marks itself with
``CUDA_AGENT_JOB_PROCESS=<its pid>``; a job function called in the caller's own process
keeps that process's rights), as root, on Linux. Elsewhere, or when switched off (the job option
``drop_privileges: false``, or ``CUDA_AGENT_DROP_PRIVILEGES=0`` in the executor's
environment, for hosts where the drop breaks something), the result's metadata says
``privileges: kept (<why>)``. A worker process that dropped its rights tells the pool
it is unfit for another job (see :func:`after_job`), so every candidate job gets a fresh
process whatever the pool's ``recycle`` setting.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

ENV = "CUDA_AGENT_DROP_PRIVILEGES"
MOUNTS_ENV = "CUDA_AGENT_JOB_MOUNTS"  # "0": no mount namespace (the workspace through a handle)
WORKER_ENV = "CUDA_AGENT_JOB_PROCESS"  # set by an executor worker to its own pid
FALLBACK_UID = 60000  # fixed job users: 60000..60999, below the sandboxes' agent user ids (61000..)
FALLBACK_COUNT = 1000
USER_RECORD = "sandbox_user.json"  # in <workspace>/.cuda_agent/
CACHE_VARS = ("HOME", "TMPDIR", "CUDA_CACHE_PATH", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME")
_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
NETWORK_ENV = "CUDA_AGENT_JOB_NETWORK"  # "1": candidate jobs keep the host's network
EXTENSIONS_DIR = "/tmp/cuda-agent-torch-extensions"  # TORCH_EXTENSIONS_DIR of a job with a private /tmp
_SCRATCH_MB = 4096  # private /tmp of a job (memory-backed, used on demand): extension builds, caches

_state: dict | None = None  # set once this process has dropped its rights
_tainted = False  # a drop was started (even one that failed half-way)


def record_user(workspace: str | Path, uid: int, gid: int) -> None:
    """Note the workspace's sandbox user in ``<ws>/.cuda_agent/`` (as root; readable by all)."""
    state = Path(workspace) / ".cuda_agent"
    if not state.is_dir():
        return
    p = state / USER_RECORD
    tmp = state / f".{USER_RECORD}.tmp"
    tmp.write_text(json.dumps({"uid": int(uid), "gid": int(gid)}))
    os.chmod(tmp, 0o644)
    os.replace(tmp, p)


def workspace_user(workspace: str | Path) -> tuple[int, int] | None:
    """The sandbox user recorded for ``workspace``, if the record is trustworthy (a regular
    file owned by root, writable by no one else, in a root-owned ``.cuda_agent``)."""
    state = Path(workspace) / ".cuda_agent"
    try:
        sst = os.lstat(state)
        st = os.lstat(state / USER_RECORD)
        if not stat.S_ISDIR(sst.st_mode) or sst.st_uid != 0 or sst.st_mode & 0o002:
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            return None
        data = json.loads((state / USER_RECORD).read_text())
        uid, gid = int(data["uid"]), int(data["gid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (uid, gid) if uid > 0 and gid > 0 else None


_fallback: int | None = None


def fallback_uid() -> int:
    """This process's own job user: leased from the jobs' range through the same file locks
    as a job's (:class:`cuda_agent.sandbox.judge.identity.JobIdentity`), so no process of
    another job has it, and what a crashed earlier holder left running is killed first. The
    lock is held by a root process of its own (:func:`_hold`) that ends with this one: code
    run after the drop cannot let it go."""
    global _fallback
    if _fallback is None:
        import uuid

        from .sandboxes.sweeps import sweep_uid
        from .sandboxes.uids import UidLease, lock_dir

        lease = UidLease(Path(f"drop-{uuid.uuid4().hex}"), FALLBACK_UID, FALLBACK_COUNT, lock_dir())
        sweep_uid(lease.uid, lease.gid)
        _hold(lease)
        _fallback = lease.uid
    return _fallback


def _hold(lease: Any) -> None:
    """Hand ``lease``'s lock to a child that keeps it while this process lives, and close
    this process's descriptor of it. The child watches its parent's end itself (a pidfd):
    the parent-death signal of a parent that gave up root would not reach a root child."""
    import select
    import time

    fd = lease._f.fileno()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the holder: root, only the lock's descriptor, ends when its parent does
        try:
            os.closerange(0, fd)
            os.closerange(fd + 1, 1 << 16)
            try:
                watch = os.pidfd_open(parent)
            except (AttributeError, OSError):
                watch = None
            while os.getppid() == parent:
                if watch is not None:
                    select.select([watch], [], [])  # readable once the parent has ended
                else:
                    time.sleep(0.5)
        finally:
            os._exit(0)
    lease._f.close()
    lease._f = None


def switched_off() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("0", "false", "no", "off")


def in_worker() -> bool:
    """Is this process an executor worker (whose rights may be given up for good)?"""
    return os.environ.get(WORKER_ENV) == str(os.getpid())


def will_drop(enabled: bool = True) -> bool:
    """Would :func:`drop_privileges` change the user of this process?"""
    return bool(enabled) and not switched_off() and in_worker() and sys.platform.startswith("linux") \
        and os.geteuid() == 0 and _state is None


def _private_dir(uid: int, gid: int) -> str:
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    d = tempfile.mkdtemp(prefix="cuda-agent-job-", dir=base)
    os.chown(d, uid, gid)
    os.chmod(d, 0o700)
    return d


def _expose_paths(ws: Path) -> list[tuple[str, bool]]:
    """The workspace (as it is) and the Python installation and import path (read-only)."""
    out = [(os.path.abspath(ws), True)]
    seen = {out[0][0]}
    exe_prefix = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
    # never a scratch root or one of its ancestors (a worker started from /tmp has it on
    # sys.path): binding it back read-only would hide the private scratch space
    roots = {"/", "/tmp", "/var", "/var/tmp"}
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, exe_prefix, *sys.path, *harness_folders()):
        p = os.path.abspath(p) if p else ""
        if p and p not in roots and p not in seen and os.path.isdir(p):
            seen.add(p)
            out.append((p, False))
    return out


def harness_folders() -> list[str]:
    """The folders our own packages import from: every portion of the ``cuda_agent``
    namespace package and the folders of loaded ``cuda_agent_*`` plugins. An editable install
    maps them by a finder, not by ``sys.path``, so a checkout under ``/tmp`` would otherwise be
    hidden by the job's private ``/tmp`` and the harness's later imports would fail."""
    out = []
    for name, mod in list(sys.modules.items()):
        if name != "cuda_agent" and not (name.startswith("cuda_agent_") and "." not in name):
            continue
        paths = list(getattr(mod, "__path__", None) or [])
        if not paths and getattr(mod, "__file__", None):
            paths = [os.path.dirname(mod.__file__)]
        out.extend(str(p) for p in paths)
    return out


def closed_folder(path: str | Path) -> str:
    """The first folder on the way to ``path`` that other users may not enter, or ""."""
    parts = os.path.abspath(path).strip("/").split("/")
    for i in range(1, len(parts) + 1):
        anc = "/" + "/".join(parts[:i])
        try:
            if not os.stat(anc).st_mode & 0o001:
                return anc
        except OSError:
            return anc
    return ""


def _private_mounts(ws: Path) -> str:
    """Give this process its own mount namespace (as root, before the drop): private
    ``/tmp``, ``/var/tmp`` and ``/dev/shm``; folders the user could not enter on the way to the workspace
    or the Python installation replaced by empty ones with those paths bound in (so root's
    closed folders, such as ``/root``, stay closed while a Python installed there still
    imports). Returns "" on success, else why not (the process keeps the host's view)."""
    if os.environ.get(MOUNTS_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return f"switched off by {MOUNTS_ENV}"
    try:
        why = _unshare(_CLONE_NEWNS, "mount")
        if why:
            return why
        from .sandboxes import _launch

        # /dev/shm too: other jobs' and the host's shared-memory segments stay out of reach
        scratch = [(d, _SCRATCH_MB) for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(d) and not os.path.islink(d)]
        _launch.setup_fs({"expose": _expose_paths(ws), "scratch": scratch, "hide": []})
        if os.getpid() == 1:  # the first process of a PID namespace of its own: a /proc that shows only it
            _launch.mount("proc", "/proc", "proc", _launch.MS_NOSUID | _launch.MS_NODEV | 8)
    except Exception as exc:  # noqa: BLE001 - a half-made view is still no more than the host's
        return f"mount namespace setup failed: {exc}"
    return ""


def _cut_network() -> str:
    """Move this process into a network namespace of its own (as root, before the drop):
    no interface but a loopback that is down, so candidate code can reach no host, no local
    server and no abstract unix socket. Returns "" on success, else why not."""
    if os.environ.get(NETWORK_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return f"kept by {NETWORK_ENV}"
    return _unshare(_CLONE_NEWNET, "network")


def _unshare(flag: int, what: str) -> str:
    """unshare(2) this process's ``what`` namespace; "" on success, else why not."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(flag) != 0:
            return f"no {what} namespace: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as exc:
        return f"no {what} namespace: {exc}"
    return ""


def drop_privileges(workspace: str | Path, enabled: bool = True, uid: int | None = None,
                    extensions: list | None = None) -> tuple[Path, dict]:
    """Become an unprivileged user (see the module docstring); ``uid``: this user id (a
    job's own, :mod:`cuda_agent.sandbox.judge.identity`) instead of the workspace's or the
    device's; ``extensions``: files ``(path, mode, mtime_ns, bytes)`` of extensions built
    ahead of the job, placed in its ``TORCH_EXTENSIONS_DIR`` (only with a private ``/tmp``,
    where that folder has the path the build had; ``extensions`` in the metadata says).

    Returns ``(view, metadata)``: ``view`` is the path through which the workspace is to be
    read from now on (``/proc/self/fd/N``, or ``workspace`` when nothing was dropped), and
    ``metadata`` (``privileges``, ``uid``/``gid``) goes into the job's result."""
    global _state
    ws = Path(workspace)
    if _state is not None:
        view = _state["views"].get(str(ws))
        return (Path(view) if view else ws), dict(_state["meta"])
    why = ""
    if not enabled:
        why = "switched off by the job's options"
    elif switched_off():
        why = f"switched off by {ENV}"
    elif not in_worker():
        why = "not in an executor worker process (the caller's own process keeps its rights)"
    elif not sys.platform.startswith("linux"):
        why = f"no privilege drop on {sys.platform}"
    elif os.geteuid() != 0:
        why = "not running as root, so no other user to become"
    if why:
        return ws, {"privileges": f"kept ({why})"}
    global _tainted
    _tainted = True  # whatever happens now, this process serves no other job
    _own_uid = uid is not None
    user = None if uid is not None else workspace_user(ws)
    if uid is not None:
        gid = uid
    else:
        uid, gid = user if user else (fallback_uid(), fallback_uid())
    fd = os.open(str(ws), os.O_PATH | os.O_DIRECTORY)
    mounts = _private_mounts(ws)
    network = _cut_network()
    if mounts:  # no mount namespace: the workspace through the handle, past closed parents
        view = f"/proc/self/fd/{fd}"
        closed = closed_folder(sys.prefix) or closed_folder(sys.base_prefix)
        if closed:
            mounts += (f"; the Python installation is behind {closed}, which the job's user cannot enter: "
                       f"imports may fail (set {ENV}=0 on this host)")
    else:
        os.close(fd)
        view = str(ws)
    private = _private_dir(uid, gid)
    for var in CACHE_VARS:
        path = private if var in ("HOME", "TMPDIR") else os.path.join(private, var.lower())
        if var == "TORCH_EXTENSIONS_DIR" and not mounts:  # the same path in every job: see EXTENSIONS_DIR
            path = EXTENSIONS_DIR
        if path != private:
            os.makedirs(path, exist_ok=True)
            os.chown(path, uid, gid)
        os.environ[var] = path
    seeded = _seed_extensions(extensions, mounts, uid, gid)
    os.environ["CUDA_AGENT_WORKSPACE"] = view
    # the job's uid has no passwd entry: getpass.getuser() (torch's cache folders ask it)
    # reads these before it falls back to getpwuid(), which would raise KeyError
    for var in ("USER", "LOGNAME"):
        os.environ[var] = f"cuda-agent-job-{uid}"
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getegid() != gid:
        os._exit(70)  # never go on with rights we meant to give up
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    os.umask(0o077)
    try:
        os.chdir(view)
    except OSError:
        os.chdir(private)
    who = "workspace sandbox user" if user else ("the job's own user" if user is None and _own_uid else "fixed job user")
    meta = {"privileges": f"dropped to uid {uid} ({who})",
            "uid": uid, "gid": gid, "job_mounts": f"shared ({mounts})" if mounts else "private",
            "job_network": f"host ({network})" if network else "none"}
    if seeded:
        meta["extensions"] = seeded
    _state = {"meta": meta, "private": private, "views": {str(ws): view}}
    return Path(view), dict(meta)


def safe_relative(rel: Any) -> str | None:
    """``rel`` when it is a plain relative path inside a folder (no ``..``, not absolute), else None."""
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return rel


def write_files(files: list, dest: Path, uid: int | None = None, gid: int | None = None) -> int:
    """Write ``files`` under ``dest`` with their modes and modification times (ninja compares
    them), owned by ``uid``/``gid`` when given; returns how many were written."""
    n = 0
    for rel, mode, mtime_ns, data in files:
        rel = safe_relative(rel)
        if rel is None:
            continue
        p = dest / rel
        d = p.parent
        d.mkdir(parents=True, exist_ok=True)
        if uid is not None:
            q = d
            while q != dest.parent and q.is_relative_to(dest):
                os.chown(q, uid, gid if gid is not None else uid)
                q = q.parent
        with open(p, "wb") as fh:
            fh.write(data)
        os.chmod(p, mode | 0o600)
        if uid is not None:
            os.chown(p, uid, gid if gid is not None else uid)
        os.utime(p, ns=(mtime_ns, mtime_ns))
        n += 1
    return n


def _seed_extensions(files: list | None, mounts: str, uid: int, gid: int) -> str:
    """Write prebuilt extension files into this job's ``TORCH_EXTENSIONS_DIR`` (as root,
    before the drop); what was done, for the metadata ("" when there was nothing to do)."""
    if not files:
        return ""
    if mounts:
        return f"prebuilt unused: no private /tmp ({mounts}), so the build folder's path differs"
    try:
        n = write_files(files, Path(EXTENSIONS_DIR), uid, gid)
    except OSError as exc:
        return f"prebuilt unused: {exc}"[:300]
    return f"prebuilt ({n} files)"


def rebase(path: str | Path, workspace: str | Path, view: str | Path) -> Path:
    """``path`` seen through ``view`` when it lies inside ``workspace``."""
    p, ws = os.path.abspath(path), os.path.abspath(workspace)
    if os.path.abspath(view) == ws or not p.startswith(ws + os.sep):
        return Path(path)
    return Path(view) / os.path.relpath(p, ws)


def current_view(workspace: str | Path) -> Path:
    """Where ``workspace`` is to be read in this process: its handle once rights are dropped."""
    if _state is None:
        return Path(workspace)
    view = _state["views"].get(str(Path(workspace)))
    return Path(view) if view else Path(workspace)


def dropped() -> bool:
    return _state is not None


def after_job() -> str | None:
    """Called by the worker after each job: remove the private folder; a reason why this
    process must not run another job (it gave up its rights), or None."""
    if _state is None:
        return "a privilege drop failed half-way; a fresh worker serves the next job" if _tainted else None
    shutil.rmtree(_state["private"], ignore_errors=True)
    return "the job dropped root rights; a fresh worker serves the next job"
