"""A precompiled ``torch/extension.h`` for the builds of single-file solutions.

A KernelBench single file builds its extension with ``load_inline`` when imported. The
``main.cpp`` that torch writes for it starts with ``#include <torch/extension.h>``, and
parsing that header is most of the file's compile: about 21 s of a 28 s C++ build on a
2-core host. With the header precompiled, the same compile takes 9-13 s.

gcc uses a precompiled header only where the file is compiled with the flags it was made
with. Macros such as ``__OPTIMIZE__`` and ``__NO_INLINE__`` depend on ``-O``, so two
variants are made, one without optimisation and one at ``-O3`` (``-O1`` and ``-O2`` take it
too). They sit side by side in a folder named after the header
(``<folder>/torch/extension.h.gch/{plain,optimized}.gch``); gcc tries each one and uses
the first that fits. Where none fits (another ``-std``, ``-g``), gcc parses the header as
usual. A wrong guess costs time, never a different build.

The build job of a single file (:mod:`cuda_agent.sandbox.judge.prebuild`) finds the folder
through ``CPATH``. That adds a search folder without changing ninja's command line. The
dependency files of ``-MMD`` do not list the precompiled header either, so a build made with
it is up to date in a GPU job that does not have it.

The flags are taken from torch itself. A trusted subprocess builds a tiny C++ extension with
``load_inline`` and reads the ``cflags`` line of the ``build.ninja`` it wrote, less the
extension's name. Nothing a candidate wrote ever reaches these compiler flags. The files
are made once per torch, compiler and Python. Each variant is about 800 MB. They are made
as the calling user and stay readable by all: a candidate's build runs as a user of its own
and must read them.

    python3 -m cuda_agent.sandbox.compilers.torch_header [--root DIR]   # make it now, print its manifest
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

MANIFEST = "manifest.json"
VARIANTS = {"plain": [], "optimized": ["-O3"]}  # file name -> flags added to torch's
ENV = "CUDA_AGENT_TORCH_HEADER"  # "0": never offer or make one
PRIVATE_IN_JOBS = ("/tmp", "/var/tmp", "/dev/shm")  # a job with dropped rights gets empty ones

_PROBE = r"""
import json, os, shlex, sys
from torch.utils import cpp_extension
os.environ["TORCH_EXTENSIONS_DIR"] = sys.argv[1]
cpp_extension.load_inline("cuda_agent_header_probe", cpp_sources="int cuda_agent_header_probe() { return 1; }",
                          functions=["cuda_agent_header_probe"], with_cuda=False)
text = open(os.path.join(sys.argv[1], "cuda_agent_header_probe", "build.ninja")).read()
line = next(l for l in text.splitlines() if l.startswith("cflags ="))
cxx = next((l.split("=", 1)[1].strip() for l in text.splitlines() if l.startswith("cxx =")), "c++")
print(json.dumps({"cxx": cxx, "cflags": shlex.split(line.split("=", 1)[1]),
                  "header": os.path.join(cpp_extension.include_paths()[0], "torch", "extension.h")}))
"""


class TorchHeaderError(RuntimeError):
    """The header could not be made; the message says which step failed and why."""


def switched_off() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("0", "false", "no", "off")


def default_root() -> Path:
    """``/var/cache/cuda-agent/torch-header`` where this user may write there, else
    ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/cuda-agent/torch-header``."""
    system = Path("/var/cache")
    if system.is_dir() and os.access(system, os.W_OK | os.X_OK):
        return system / "cuda-agent" / "torch-header"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cuda-agent" / "torch-header"


def compiler_identity(cxx: str) -> str:
    """The compiler's ``--version`` line (the part of the key that says which gcc)."""
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return (out.stdout.splitlines() or ["?"])[0].strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def closed_folder(path: Path) -> str:
    """The first folder on the way to ``path`` that other users may not enter, or "" (folders
    not made yet are made open, see :func:`make_open`)."""
    parts = path.resolve().parts
    for i in range(2, len(parts) + 1):
        anc = Path(*parts[:i])
        try:
            if not anc.stat().st_mode & 0o001:
                return str(anc)
        except FileNotFoundError:
            return ""
        except OSError:
            return str(anc)
    return ""


def make_open(path: Path) -> None:
    """Make ``path`` and the folders missing on the way, each one open to other users."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o755)


class TorchHeader:
    """The precompiled header of this host's torch and compiler under ``root``: made once
    (:meth:`build`, or :meth:`start` in the background), offered to builds once ready
    (:meth:`offer`)."""

    def __init__(self, root: str | Path | None = None, cxx: str = ""):
        self.root = Path(root) if root else default_root()
        self.cxx = cxx or os.environ.get("CXX") or "c++"
        self._thread: threading.Thread | None = None
        self._procs: list[subprocess.Popen] = []  # the maker's compiler processes now running
        self.error = ""

    @functools.cached_property
    def key(self) -> str:
        try:
            from importlib.metadata import version

            torch = version("torch")
        except Exception:  # noqa: BLE001
            torch = "?"
        h = hashlib.sha256()
        for part in (torch, compiler_identity(self.cxx), sys.version, sysconfig.get_path("include") or "",
                     json.dumps(VARIANTS, sort_keys=True)):
            h.update(part.encode() + b"\0")
        return h.hexdigest()[:20]

    @property
    def folder(self) -> Path:
        """The folder builds search (``CPATH``): it holds ``torch/extension.h.gch/``."""
        return self.root / self.key

    def manifest(self) -> dict:
        try:
            return json.loads((self.folder / MANIFEST).read_text())
        except (OSError, ValueError):
            return {}

    def ready(self) -> bool:
        return bool(self.manifest().get("variants"))

    def offer(self) -> tuple[str, str]:
        """(the folder for ``CPATH``, "") once the header is made and other users can read it;
        else ("", why not)."""
        if switched_off():
            return "", f"switched off by {ENV}"
        if not self.ready():
            return "", self.error or ("being made" if self.building() else "not made")
        if os.geteuid() == 0:
            private = next((d for d in PRIVATE_IN_JOBS if self.folder.resolve().is_relative_to(d)), "")
            if private:
                return "", f"it is under {private}, which a build job sees as a private folder of its own"
            closed = closed_folder(self.folder)
            if closed:
                return "", f"{closed} is closed to other users, so a build's own user could not read the header"
            loose = self.writable_by_others()
            if loose:
                return "", f"{loose} could be changed by another user, so the header is not trusted"
        return str(self.folder), ""

    def writable_by_others(self) -> str:
        """The first of the header's folders and files that is not this user's alone to
        change (another owner, or writable by group or others), or ""."""
        gch = self.folder / "torch" / "extension.h.gch"
        paths = [self.root, self.folder, self.folder / "torch", gch]
        try:
            paths += sorted(gch.iterdir())
        except OSError:
            return str(gch)
        for p in paths:
            try:
                st = os.lstat(p)
            except OSError:
                return str(p)
            if st.st_uid != os.geteuid() or st.st_mode & 0o022 or os.path.islink(p):
                return str(p)
        return ""

    def building(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 1200.0) -> None:
        """Make the header in the background unless it is made, being made, or failed here."""
        if switched_off() or self.ready() or self.building() or self.error:
            return
        self._thread = threading.Thread(target=self._background, args=(timeout,), name="torch-header", daemon=True)
        self._thread.start()

    def _background(self, timeout: float) -> None:
        try:
            self.build(timeout)
        except TorchHeaderError as exc:
            self.error = f"could not be made: {exc}"[:500]
        except Exception as exc:  # noqa: BLE001 - an unwritable folder, a full disk: said, not raised in a thread
            self.error = f"could not be made: {type(exc).__name__}: {exc}"[:500]

    def stop(self) -> None:
        """Stop a background build (its half-made files are removed by it or the next one)."""
        self.error = self.error or "stopped"
        for proc in list(self._procs):
            if proc.poll() is None:
                proc.kill()

    def build(self, timeout: float = 1200.0) -> dict:
        """Make the header (or wait for another process making it) and return its manifest."""
        make_open(self.root)
        with open(self.root / f".{self.key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one maker per key on this host; the others wait, then read
            if self.ready():
                return self.manifest()
            return self._make(timeout)

    def _spawn(self, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        if self.error == "stopped":
            raise TorchHeaderError("stopped")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self._procs.append(proc)
        return proc

    def _run(self, cmd: list[str], timeout: float, what: str, env: dict | None = None) -> str:
        proc = self._spawn(cmd, env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise TorchHeaderError(f"{what} took more than {timeout:.0f} s") from None
        if self.error == "stopped":
            raise TorchHeaderError("stopped")
        if proc.returncode != 0:
            tail = (err or out).strip().splitlines()[-6:]
            raise TorchHeaderError(f"{what} failed (exit {proc.returncode}): " + " | ".join(tail)[-800:])
        return out

    def _make(self, timeout: float) -> dict:
        t0 = time.monotonic()
        final = self.folder
        for stale in self.root.glob(f".{self.key}.*"):  # left by a maker that was killed (this one holds the lock)
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".{self.key}.", dir=self.root))
        try:
            env = {**os.environ, "MAX_JOBS": "1", "CXX": self.cxx}
            out = self._run([sys.executable, "-c", _PROBE, str(work / "probe")], timeout,
                            "the probe build of torch's flags", env)
            probe = json.loads(out.strip().splitlines()[-1])
            flags = [f for f in probe["cflags"] if not f.startswith("-DTORCH_EXTENSION_NAME=")]
            gch = work / "torch" / "extension.h.gch"
            gch.mkdir(parents=True)
            left = max(60.0, timeout - (time.monotonic() - t0))
            procs = {}
            for name, extra in VARIANTS.items():  # the variants at once: one core each
                cmd = [probe["cxx"], "-x", "c++-header", *flags, *extra, probe["header"], "-o", str(gch / f"{name}.gch")]
                procs[name] = self._spawn(cmd)
            errors = []
            for name, proc in procs.items():
                try:
                    _, err = proc.communicate(timeout=left)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
                    errors.append(f"{name}: took more than {left:.0f} s")
                    continue
                if proc.returncode != 0:
                    errors.append(f"{name}: " + " | ".join(err.strip().splitlines()[-4:])[-400:])
            if self.error == "stopped":
                raise TorchHeaderError("stopped")
            if errors:
                raise TorchHeaderError("compiling the header failed: " + "; ".join(errors))
            shutil.rmtree(work / "probe", ignore_errors=True)
            sizes = {name: (gch / f"{name}.gch").stat().st_size for name in VARIANTS}
            info = {"key": self.key, "cxx": probe["cxx"], "compiler": compiler_identity(probe["cxx"]),
                    "flags": flags, "variants": {n: {"extra": VARIANTS[n], "bytes": sizes[n]} for n in VARIANTS},
                    "header": probe["header"], "seconds": round(time.monotonic() - t0, 1)}
            (work / MANIFEST).write_text(json.dumps(info, indent=1))
            for p in [work, *work.rglob("*")]:  # readable by a build's own user
                os.chmod(p, 0o755 if p.is_dir() else 0o644)
            shutil.rmtree(final, ignore_errors=True)  # a half-made or older one of the same key
            os.replace(work, final)
            return info
        finally:
            for proc in self._procs:  # none outlives the making (a failure or a stop kills the rest)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            self._procs.clear()
            shutil.rmtree(work, ignore_errors=True)


def variant_taken(build_dir: str | Path, folder: str | Path) -> str:
    """Which precompiled variant under ``folder`` gcc takes for the ``main.cpp`` of the
    ``load_inline`` build in ``build_dir``: compiled once more, with the ``cflags`` of the
    ``build.ninja`` torch wrote there, ``-H`` and ``folder`` on ``CPATH`` ("" for none)."""
    import shlex

    build_dir = Path(build_dir)
    lines = (build_dir / "build.ninja").read_text().splitlines()
    cflags = next(shlex.split(ln.split("=", 1)[1]) for ln in lines if ln.startswith("cflags ="))
    cxx = next((ln.split("=", 1)[1].strip() for ln in lines if ln.startswith("cxx =")), "c++")
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([cxx, "-H", *cflags, "-c", str(build_dir / "main.cpp"), "-o", os.path.join(tmp, "m.o")],
                             capture_output=True, text=True, env={**os.environ, "CPATH": str(folder)})
    used = [ln[2:].strip() for ln in res.stderr.splitlines() if ln.startswith("! ") and ln.rstrip().endswith(".gch")]
    return Path(used[0]).stem if used else ""


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Make the precompiled torch/extension.h builds of single files use.")
    ap.add_argument("--root", help=f"where it is kept (default: {default_root()})")
    ap.add_argument("--timeout", type=float, default=1200.0)
    args = ap.parse_args(argv)
    header = TorchHeader(args.root)
    try:
        info = header.build(args.timeout)
    except TorchHeaderError as exc:
        print(f"error: the precompiled header could not be made: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"folder": str(header.folder), **info}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
