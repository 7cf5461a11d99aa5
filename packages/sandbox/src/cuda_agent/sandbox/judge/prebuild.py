"""Building a single-file solution's own extensions before its GPU job.

A KernelBench single-file solution builds its kernels when it is imported (``load_inline``).
Inside a verification job that build held the GPU for 20-60 s while it idled. Here the file
is imported once ahead of time, in a CPU job with no GPU visible, under the isolation of any
candidate code (a candidate process as the job's own user, no network, a private ``/tmp``):
what ``torch.utils.cpp_extension`` builds lands in ``TORCH_EXTENSIONS_DIR``
(:data:`..isolation.privdrop.EXTENSIONS_DIR`, the same path in every job with a private
``/tmp``), and the job sends those files back.

The trusted caller keeps them in a :class:`PrebuiltStore` under a key of the file's bytes,
the target GPU's architecture and the torch and Python versions, and places them in the
workspace's state folder (``.cuda_agent/prebuilt/``). The GPU job's trusted side finds them
there when the key matches what it judges; its candidate process then starts with them in
its ``TORCH_EXTENSIONS_DIR`` and ``TORCH_CUDA_ARCH_LIST`` set as for the build, so the same
flags on the same paths make the build in the job ninja finding everything up to date.

Nothing about the verdict changes: the candidate is imported in its GPU job as before.
A file that cannot be imported without a GPU still hands over what it built before it
failed; the job builds the rest and its metadata says so (``prebuilt``).

The build job's compiler also searches a folder holding a precompiled ``torch/extension.h``
when the judge has one (``CPATH``, :mod:`cuda_agent.sandbox.compilers.torch_header`): the same
build, with most of its ``main.cpp`` compile skipped.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..isolation.privdrop import safe_relative, write_files

STATE = "prebuilt"  # <workspace>/.cuda_agent/prebuilt/{manifest.json, files/}
MANIFEST = "manifest.json"
MAX_BYTES = 40 << 20  # what one build may hand back (the reply travels as JSON)
MAX_FILES = 2000


@dataclass
class PrebuildResult:
    """What the build job found: the files built (``(path, mode, mtime_ns, bytes)``), whether
    the import succeeded, and why not."""

    key: str = ""
    arch: str = ""
    ext_dir: str = ""
    files: list = field(default_factory=list)
    imported: bool = False
    message: str = ""
    seconds: float = 0.0

    @property
    def nbytes(self) -> int:
        return sum(len(f[3]) for f in self.files)


def torch_version() -> str:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # noqa: BLE001
        return "?"


def source_key(data: bytes, arch: str) -> str:
    """The key of a build: the file's bytes, the architecture list, torch and Python."""
    h = hashlib.sha256()
    for part in (data, arch.encode(), torch_version().encode(), sys.version.encode()):
        h.update(part + b"\0")
    return h.hexdigest()[:24]


def arch_for(device: str) -> str:
    """``TORCH_CUDA_ARCH_LIST`` for builds that run on ``device``: its compute capability
    with PTX (what torch picks by itself for one visible GPU); "" on the CPU."""
    if not str(device).startswith("cuda"):
        return ""
    import torch

    major, minor = torch.cuda.get_device_capability(torch.device(device))
    return f"{major}.{minor}+PTX"


def host_arch() -> str:
    """The architecture of this host's first GPU (``nvidia-smi``), "" when there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    caps = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return f"{caps[0]}+PTX" if out.returncode == 0 and caps else ""


# --- files on the wire and on disk -----------------------------------------------------


def pack(root: str | Path, limit: int = MAX_BYTES) -> tuple[list[dict], str]:
    """The regular files under ``root`` as JSON-safe records, and why some were left out."""
    out: list[dict] = []
    total, why = 0, ""
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            st = os.lstat(p)
            if not stat.S_ISREG(st.st_mode):
                continue
            if name == "lock":  # torch's build lock: never carried
                continue
            total += st.st_size
            if total > limit or len(out) >= MAX_FILES:
                return [], f"the build produced more than {limit >> 20} MB or {MAX_FILES} files"
            out.append({"path": str(p.relative_to(root)), "mode": st.st_mode & 0o777, "mtime_ns": st.st_mtime_ns,
                        "data": base64.b64encode(p.read_bytes()).decode()})
    return out, why


def decode(records: Any) -> list[tuple[str, int, int, bytes]]:
    """Records from :func:`pack` (sent by candidate code: checked, never trusted)."""
    files, total = [], 0
    if not isinstance(records, list) or len(records) > MAX_FILES:
        return []
    for r in records:
        if not isinstance(r, dict):
            continue
        rel = safe_relative(r.get("path"))
        try:
            data = base64.b64decode(str(r.get("data", "")), validate=True)
            mode, mtime = int(r.get("mode", 0o644)) & 0o755, int(r.get("mtime_ns", 0))
        except (ValueError, TypeError):
            continue
        total += len(data)
        if rel is None or total > MAX_BYTES:
            continue
        files.append((rel, mode, mtime, data))
    return files


def read_files(folder: Path) -> list[tuple[str, int, int, bytes]]:
    """The files under ``folder`` (regular files only, links never followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        for name in filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                out.append((str(p.relative_to(folder)), st.st_mode & 0o755, st.st_mtime_ns, p.read_bytes()))
    return out


# --- where builds are kept -------------------------------------------------------------


class PrebuiltStore:
    """Builds by key under ``root`` (``<key>/manifest.json`` and ``<key>/files/``): a source
    built once is not built again, whichever workspace it comes from."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def has(self, key: str) -> bool:
        return (self.root / key / MANIFEST).is_file()

    def manifest(self, key: str) -> dict:
        try:
            return json.loads((self.root / key / MANIFEST).read_text())
        except (OSError, ValueError):
            return {}

    def put(self, res: PrebuildResult) -> None:
        dest = self.root / res.key
        tmp = self.root / f".{res.key}.{os.getpid()}.{time.monotonic_ns()}"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "files").mkdir(parents=True)
        write_files(res.files, tmp / "files")
        info = {"key": res.key, "arch": res.arch, "ext_dir": res.ext_dir, "imported": res.imported,
                "message": res.message, "seconds": round(res.seconds, 3), "files": len(res.files),
                "bytes": res.nbytes}
        (tmp / MANIFEST).write_text(json.dumps(info, indent=1))
        if dest.exists():
            shutil.rmtree(tmp, ignore_errors=True)
            return
        try:
            os.replace(tmp, dest)
        except OSError:  # another caller stored the same build meanwhile
            shutil.rmtree(tmp, ignore_errors=True)

    def install(self, key: str, workspace: str | Path) -> bool:
        """Place the build ``key`` in ``workspace``'s state folder (replacing an earlier one)."""
        src = self.root / key
        if not (src / MANIFEST).is_file():
            return False
        dest = Path(workspace) / ".cuda_agent" / STATE
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dest, symlinks=False, copy_function=shutil.copy2)
        return True


def workspace_build(workspace: str | Path, key: str) -> tuple[Path | None, dict, str]:
    """The prebuilt folder in ``workspace`` for ``key``: (files folder or None, manifest, why
    not). Only a state folder other users cannot write is believed when running as root."""
    state = Path(workspace) / ".cuda_agent"
    folder = state / STATE
    try:
        info = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None, {}, "none in the workspace"
    if os.geteuid() == 0:
        for p in (state, folder):
            st = os.lstat(p)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
                return None, info, f"{p.name} is writable by other users"
    if info.get("key") != key:
        return None, info, "built from other sources or for another GPU"
    return folder / "files", info, ""


# --- the job ---------------------------------------------------------------------------


def prebuild_workspace(workspace: str, device: str = "cpu", candidate: str = "model_new.py",
                       reference: str = "model.py", arch: str = "", jobs: int = 2,
                       timeout: float = 600.0, torch_header: str = "") -> PrebuildResult:
    """Import ``candidate`` in a candidate process of this (CPU) job and collect what it
    built (see the module docstring). ``torch_header``: a folder holding a precompiled
    ``torch/extension.h`` that the build's compiler searches (``CPATH``), "" for none."""
    from .client import CandidateProcessError
    from .session import JudgeSession, job_files

    t0 = time.perf_counter()
    ws, cand, ref = job_files(workspace, candidate, reference)
    res = PrebuildResult(arch=arch)
    try:
        res.key = source_key(cand.read_bytes(), arch)
    except OSError as exc:
        res.message = f"{cand.name} unreadable: {exc}"
        return res
    session = JudgeSession(ws, cand, ref, device)
    try:
        if session.refused_files():
            res.message = session.refused_files()
            return res
        session.start()
        reply = session._request({"op": "prebuild", "workspace": str(session.snap.root),
                                  "candidate": str(session.candidate), "arch": arch, "jobs": int(jobs),
                                  "torch_header": torch_header}, timeout)
        res.files = decode(reply.get("files"))
        res.ext_dir = str(reply.get("ext_dir") or "")[:300]
        res.imported = bool(reply.get("imported"))
        res.message = str(reply.get("message") or "")[:1000]
    except CandidateProcessError as exc:
        res.message = f"the build's candidate process failed: {exc}"[:1000]
    finally:
        session.close()
        res.seconds = time.perf_counter() - t0
    return res


def build_in_candidate(msg: dict) -> dict:
    """The candidate process's side of :func:`prebuild_workspace` (command ``prebuild``)."""
    from .loading import LoadFailure, load_candidate

    arch = str(msg.get("arch") or "")
    if arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    os.environ["MAX_JOBS"] = str(max(1, int(msg.get("jobs") or 1)))
    header = str(msg.get("torch_header") or "")
    if header and os.path.isdir(header):  # the compiler finds torch/extension.h.gch there first
        os.environ["CPATH"] = header + (os.pathsep + os.environ["CPATH"] if os.environ.get("CPATH") else "")
    sys.path.insert(0, str(msg["workspace"]))
    imported, message = True, ""
    try:
        load_candidate(msg["candidate"])
    except LoadFailure as exc:
        imported, message = False, exc.message
    ext = os.environ.get("TORCH_EXTENSIONS_DIR", "")
    files, why = pack(ext) if ext and os.path.isdir(ext) else ([], "")
    return {"ok": True, "imported": imported, "message": (message or why)[:2000], "ext_dir": ext, "files": files}
