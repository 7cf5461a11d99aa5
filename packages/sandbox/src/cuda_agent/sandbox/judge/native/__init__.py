"""The judge's compiled timing loop (``timing.c``): built once per Python and source.

:func:`timing` returns the extension module, building it with the system C compiler on
first use (about a second) into a folder only its builder can write: the package's own
``_built/`` when that is writable, else ``$CUDA_AGENT_NATIVE_DIR`` or
``~/.cache/cuda-agent/native``. Builds are keyed by the source, the Python version and the
platform, and made under a lock, so concurrent workers build it once.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from cuda_agent.core.errors import CudaAgentError

SOURCE = Path(__file__).with_name("timing.c")
MODULE = "_cuda_agent_timing"
_loaded: Any = None


class NativeBuildError(CudaAgentError):
    """The compiled timing loop could not be built or loaded."""


def build_key() -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}".encode())
    return h.hexdigest()[:16]


def _writable(d: Path) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=d, prefix=".probe-", delete=True)
        probe.close()
        return True
    except OSError:
        return False


def build_dir() -> Path:
    """Where the built module lives (created, writable by this process)."""
    for d in (Path(__file__).with_name("_built"),
              Path(os.environ["CUDA_AGENT_NATIVE_DIR"]) if os.environ.get("CUDA_AGENT_NATIVE_DIR") else None,
              Path.home() / ".cache" / "cuda-agent" / "native"):
        if d is not None and _writable(d):
            return d
    raise NativeBuildError("no writable folder for the compiled timing loop; set CUDA_AGENT_NATIVE_DIR")


def library_path() -> Path:
    """The built module's path, building it if needed."""
    out_dir = build_dir()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    target = out_dir / f"{MODULE}-{build_key()}{suffix}"
    if target.is_file():
        return target
    with open(out_dir / ".build.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if target.is_file():
            return target
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if not cc:
            raise NativeBuildError("no C compiler (cc/gcc) to build the judge's timing loop")
        include = sysconfig.get_paths()["include"]
        tmp = out_dir / f".{target.name}.{os.getpid()}.tmp"
        cmd = [cc, "-O2", "-shared", "-fPIC", f"-I{include}", str(SOURCE), "-o", str(tmp), "-ldl"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            last = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise NativeBuildError(f"building the timing loop failed ({' '.join(cmd[:2])} ...): {' / '.join(last)}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    return target


def timing() -> Any:
    """The compiled timing module (``run_loop``, ``init_cuda``, ``host_ms``)."""
    global _loaded
    if _loaded is not None:
        return _loaded
    path = library_path()
    spec = importlib.util.spec_from_file_location(MODULE, str(path))
    if spec is None or spec.loader is None:
        raise NativeBuildError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _loaded = mod
    return mod


_cuda_for: str | None = None


def timing_for_cuda() -> Any:
    """The module with its CUDA functions resolved from the runtime torch has loaded."""
    global _cuda_for
    mod = timing()
    if _cuda_for is None:
        import torch

        torch.cuda.init()
        path = loaded_library("libcudart.so")
        if path is None:
            raise NativeBuildError("libcudart is not loaded in this process (a torch built with a static CUDA runtime?)")
        mod.init_cuda(path)
        _cuda_for = path
    return mod


def loaded_library(stem: str) -> str | None:
    """The path of a shared library whose file name starts with ``stem`` that this process
    has mapped, or None."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.split(maxsplit=5)[-1].strip()
                if os.path.basename(path).startswith(stem):
                    return path
    except OSError:
        pass
    return None
