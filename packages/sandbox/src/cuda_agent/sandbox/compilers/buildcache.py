"""Content-addressed build cache, build job slots and resource-limited tool runs.

* Objects are stored under ``<cache>/objects/<key>.o`` where the key hashes everything
  that decides the object: the compiler, its version, the flags, the target arch, the
  source text and the text of the workspace headers. Same inputs, no rebuild, in any
  workspace and any process.
* Linked libraries are stored under ``<cache>/libs/<key>`` keyed by the object keys and
  link flags: an unchanged workspace is served without running any tool.
* Job slots: at most ``os.cpu_count()`` compiler processes run at once on the machine,
  across threads and processes (file locks under ``<cache>/slots``), so builds of
  different workspaces run in parallel without oversubscribing the cores.

The cache location is ``$CUDA_AGENT_BUILD_CACHE`` or ``~/.cache/cuda-agent/build``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

ENV_CACHE = "CUDA_AGENT_BUILD_CACHE"


def default_cache_dir() -> Path:
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env)
    return Path(os.path.expanduser("~")) / ".cache" / "cuda-agent" / "build"


def sha256(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        b = p.encode() if isinstance(p, str) else p
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


_tool_versions: dict[tuple, str] = {}
_tool_lock = threading.Lock()


def tool_version(argv: Sequence[str]) -> str:
    """``<tool> --version`` output (cached per process): part of every cache key."""
    key = tuple(argv)
    with _tool_lock:
        if key in _tool_versions:
            return _tool_versions[key]
    try:
        out = subprocess.run(list(argv) + ["--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = "unknown"
    exe = shutil.which(argv[0]) or argv[0]
    out = f"{exe}\n{out.strip()}"
    with _tool_lock:
        _tool_versions[key] = out
    return out


def atomic_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=".tmp-", suffix=dst.suffix)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write(dst: Path, text: str) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=".tmp-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dst)


class BuildCache:
    """The on-disk object and library store."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root else default_cache_dir()
        for sub in ("objects", "libs", "tmp", "slots", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def object_path(self, key: str) -> Path:
        return self.root / "objects" / key[:2] / f"{key}.o"

    def lib_path(self, key: str, suffix: str = ".so") -> Path:
        return self.root / "libs" / key[:2] / f"{key}{suffix}"

    def tmp_path(self, suffix: str) -> Path:
        fd, tmp = tempfile.mkstemp(dir=self.root / "tmp", suffix=suffix)
        os.close(fd)
        return Path(tmp)

    @contextlib.contextmanager
    def run_dir(self, prefix: str = "run-") -> Iterator[Path]:
        """A private folder (root's, mode 0700) for one build or tool run, removed afterwards."""
        d = Path(tempfile.mkdtemp(prefix=prefix, dir=self.root / "tmp"))
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def touch(self, path: Path) -> None:
        """Mark a cache entry as used now (pruning removes the least recently used first)."""
        with contextlib.suppress(OSError):
            os.utime(path)

    def size(self) -> int:
        total = 0
        for sub in ("objects", "libs", "pch"):
            for p in (self.root / sub).rglob("*"):
                with contextlib.suppress(OSError):
                    if p.is_file():
                        total += p.stat().st_size
        return total

    def prune(self, max_bytes: int) -> tuple[int, int]:
        """Delete least recently used objects and libraries until the cache holds at most
        ``max_bytes``; returns (files removed, bytes freed). Precompiled headers stay."""
        entries = []
        keep = 0
        for sub in ("objects", "libs", "pch"):
            for p in (self.root / sub).rglob("*"):
                try:
                    st = p.stat()
                except OSError:
                    continue
                if not p.is_file():
                    continue
                if sub == "pch":
                    keep += st.st_size
                else:
                    entries.append((st.st_mtime, st.st_size, p))
        total = keep + sum(e[1] for e in entries)
        removed = freed = 0
        for _mtime, size, p in sorted(entries):
            if total <= max_bytes:
                break
            with contextlib.suppress(OSError):
                p.unlink()
                total -= size
                freed += size
                removed += 1
        return removed, freed

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """An exclusive lock across processes (e.g. while building a shared header)."""
        path = self.root / "locks" / f"{name}.lock"
        with open(path, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


class JobSlots:
    """At most ``n`` tool processes at once, across threads and processes."""

    def __init__(self, directory: Path, n: int | None = None):
        self.n = max(1, n or os.cpu_count() or 1)
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def slot(self) -> Iterator[int]:
        delay = 0.005
        while True:
            for i in range(self.n):
                f = open(self.dir / f"{i}.lock", "a")
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    continue
                try:
                    yield i
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
                    f.close()
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


@dataclass
class ToolLimits:
    """Resource limits of one compiler process (0 = unlimited)."""

    timeout_s: float = 300.0
    cpu_s: int = 600
    memory_mb: int = 0  # address-space limit; compilers reserve a lot of it, so off by default
    file_size_mb: int = 2048
    nproc: int = 256  # processes of the build user (in the jail, where the user is the run's own)
    scratch_mb: int = 2048  # the jail's private /tmp (memory-backed, used on demand)


@dataclass
class ToolRun:
    argv: list[str]
    exit_code: int
    output: str
    seconds: float
    timed_out: bool
    jailed: str = ""  # "" when the tool ran in the build jail, else why not


def _read_bounded(proc: subprocess.Popen, timeout: float | None) -> tuple[bytes, bool, bool]:
    """The tool's output (its first OUTPUT_KEEP bytes and its last 64 KiB), whether it timed
    out and whether it printed more than OUTPUT_KILL bytes (and was killed for it)."""
    import selectors

    from .jail import OUTPUT_KEEP, OUTPUT_KILL

    head, tail, total = bytearray(), bytearray(), 0
    deadline = time.monotonic() + timeout if timeout else None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    timed_out = flooded = False
    fd = proc.stdout.fileno()
    try:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                timed_out = True
                break
            if not sel.select(timeout=left if left is not None else 1.0):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            total += len(chunk)
            if len(head) < OUTPUT_KEEP:
                take = OUTPUT_KEEP - len(head)
                head += chunk[:take]
                chunk = chunk[take:]
            if chunk:
                tail += chunk
                del tail[: max(0, len(tail) - (64 << 10))]
            if total > OUTPUT_KILL:
                flooded = True
                break
    finally:
        sel.close()
    out = bytes(head)
    if total > len(head) + len(tail):
        out += f"\n[... {total - len(head) - len(tail)} bytes of output left out ...]\n".encode()
    return out + bytes(tail), timed_out, flooded


def run_tool(argv: Sequence[str], cwd: Path, limits: ToolLimits | None = None,
             env: dict | None = None, slots: JobSlots | None = None, view=None) -> ToolRun:
    """Run a compiler/linker in its own process group under resource limits, its output
    bounded. With ``view`` (a :class:`.jail.ToolView`), as root, in the build jail (see
    :mod:`.jail`); the tool's environment is the toolchain's variables only either way."""
    from ..isolation.sandboxes.limits import rlimit_preexec
    from .jail import OUTPUT_KILL, JailError, Lease, launcher_argv, prepared, tool_env, why_not_jailed

    limits = limits or ToolLimits()
    why = why_not_jailed() if view is not None else "no view of the file system given"
    ctx = slots.slot() if slots is not None else contextlib.nullcontext()
    with contextlib.ExitStack() as stack:
        if view is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="tool-"))
        else:
            tmp = os.path.join(os.path.dirname(os.path.abspath(view.output)), "tmp")
            os.makedirs(tmp, exist_ok=True)
        cmd, run_env, run_cwd = list(argv), dict(env) if env is not None else tool_env(tmp), str(cwd)
        preexec = rlimit_preexec(cpu_s=limits.cpu_s, memory_mb=limits.memory_mb,
                                 file_size_mb=limits.file_size_mb, nproc=0, new_session=True)
        if not why:
            lease = Lease()
            stack.callback(lease.release)
            jail_root = stack.enter_context(prepared(view, lease))
            mb = 1 << 20
            rl = {"RLIMIT_CPU": int(limits.cpu_s or 0), "RLIMIT_AS": int(limits.memory_mb or 0) * mb,
                  "RLIMIT_FSIZE": int(limits.file_size_mb or 0) * mb, "RLIMIT_NPROC": int(limits.nproc or 0)}
            view.scratch_mb = limits.scratch_mb or view.scratch_mb
            cmd, run_env = launcher_argv(view, list(argv), lease, jail_root, rl)
            run_cwd = "/"
            preexec = os.setsid
        with ctx:
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd, cwd=run_cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=run_env, preexec_fn=preexec)
            try:
                out, timed_out, flooded = _read_bounded(proc, limits.timeout_s or None)
            finally:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                proc.stdout.close()
            seconds = time.monotonic() - t0
    text = out.decode("utf-8", "replace")
    code = proc.returncode
    if not why and code == 125 and text.startswith("build jail:"):
        raise JailError(f"{text.strip()[:300]} (set CUDA_AGENT_BUILD_JAIL=0 on hosts without namespaces: "
                        "builds then read with this process's rights)")
    if timed_out:
        text += f"\n{argv[0]}: error: timed out after {limits.timeout_s:.0f} s and was killed\n"
    if flooded:
        text += f"\n{argv[0]}: error: printed more than {OUTPUT_KILL >> 20} MB and was killed\n"
    failed = timed_out or flooded
    return ToolRun(list(argv), code if not failed else -9, text, seconds, timed_out, jailed=why)

