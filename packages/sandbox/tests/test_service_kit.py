"""Helpers of test_service.py: a tiny real g++ compiler and CPU verify/profile jobs.

A module of its own (on sys.path) so that executor workers can import these by name.
No tests here.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.core.interfaces import Compiler
from cuda_agent.core.types import (
    CheckResult,
    CompileResult,
    FailureCategory,
    ProfileResult,
    Timing,
    VerifyResult,
)

# --- a tiny real compiler and real jobs ----------------------------------------------------


@dataclass
class TinyGxxOptions:
    flags: str = "-O2"


class TinyGxx(Compiler):
    """g++ -shared of kernels/*.cpp into .cuda_agent/build/kernels.so."""

    name = "tiny_gxx"
    backend = "cpu"
    Options = TinyGxxOptions

    def build(self, workspace: Path, build_dir: Path | None = None) -> CompileResult:
        t0 = time.monotonic()
        workspace = Path(workspace)
        out = Path(build_dir or workspace / ".cuda_agent" / "build")
        out.mkdir(parents=True, exist_ok=True)
        srcs = sorted(str(p) for p in (workspace / "kernels").glob("*.cpp"))
        if not srcs:
            return CompileResult(ok=False, errors=["no kernels/*.cpp to build"])
        lib = out / "kernels.so"
        if "SLEEP_FOREVER_IN_COMPILER" in "".join(Path(s).read_text() for s in srcs):
            time.sleep(3600)
        proc = subprocess.run(["g++", *self.options.flags.split(), "-shared", "-fPIC", "-o", str(lib), *srcs],
                              capture_output=True, text=True, cwd=workspace)
        if proc.returncode != 0:
            errors = [ln.replace(str(workspace) + "/", "") for ln in proc.stderr.splitlines() if ": error:" in ln]
            return CompileResult(ok=False, errors=errors or ["g++ failed"], log=proc.stderr[-4000:],
                                 seconds=time.monotonic() - t0)
        return CompileResult(ok=True, artifact=str(lib), seconds=time.monotonic() - t0,
                             rebuilt_units=[os.path.relpath(s, workspace) for s in srcs])


def _load(ws: Path):
    spec = importlib.util.spec_from_file_location("task_model", ws / "model.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    lib = ctypes.CDLL(str(ws / ".cuda_agent" / "build" / "kernels.so"))
    lib.axpb.restype = ctypes.c_double
    lib.axpb.argtypes = [ctypes.c_double]
    return ref, lib


def verify_job(workspace: str, device: str, options: dict) -> VerifyResult:
    import random

    ws = Path(workspace)
    ref, lib = _load(ws)
    checks = []
    for i in range(int(options.get("inputs", 5))):
        x = random.uniform(-10, 10)
        want, got = ref.Model().forward(x), lib.axpb(x)
        err = abs(want - got)
        ok = err <= 1e-2 + 1e-2 * abs(want)
        checks.append(CheckResult(name=f"input {i + 1}", passed=ok, max_abs_err=err, where="output[0]"))
        if not ok:
            return VerifyResult(ok=False, failure=FailureCategory.WRONG_RESULT, checks=checks,
                                message=f"input {i + 1} of 5, output[0] max abs err {err:.1e} (atol=rtol=1e-02)")
    return VerifyResult(ok=True, checks=checks, message="5/5 random inputs match", metadata={"atol": 0.01, "rtol": 0.01})


def profile_job(workspace: str, device: str, options: dict) -> ProfileResult:
    ws = Path(workspace)
    ref, lib = _load(ws)

    def t(fn):
        t0 = time.perf_counter()
        for _ in range(2000):
            fn(1.5)
        return Timing(median_ms=(time.perf_counter() - t0) / 2000 * 1e3, iterations=2000, method="wallclock")

    eager = t(ref.Model().forward)
    return ProfileResult(ok=True, candidate=t(lib.axpb), eager=eager,
                         compile=Timing(median_ms=eager.median_ms * 0.9, method="wallclock"),
                         metadata={"device": device})


def evaluate_job(workspace: str, device: str, verify_options: dict, profile_options: dict):
    v = verify_job(workspace, device, verify_options)
    return v, (profile_job(workspace, device, profile_options) if v.ok else None)
