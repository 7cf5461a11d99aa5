"""Candidate code that replaces a timer, a torch function or the harness's own comparison is
refused naming what it replaced. Jobs run in real executor worker processes (the patches
must not leak into the test process)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cuda_agent.core.types import FailureCategory  # noqa: E402
from cuda_agent.sandbox.judge import integrity  # noqa: E402
from cuda_agent.sandbox.executors import CpuExecutor, Job  # noqa: E402
from cuda_agent.sandbox.executors.local import CpuExecutorOptions  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_verify_support import hooked_relu_new, make_workspace, relu_new  # noqa: E402

T = "cuda_agent.sandbox.judge.tasks:"
FAST = {"target_ms": 5, "warmup_ms": 0, "min_iters": 3, "max_iters": 30}

@pytest.fixture(scope="module")
def executor():
    ex = CpuExecutor(CpuExecutorOptions(timeout=120.0, spares=1))
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return Path(make_workspace(tmp_path_factory.mktemp("integrity")).root)


def job(executor, ws: Path, kind: str, code: str, **options):
    (ws / "model_new.py").write_text(code)
    if kind == "profile":
        options = {"profiler_options": dict(FAST), "compile_baseline": False, "attempts": 1,
                   "baseline_cache_dir": str(ws.parent / "cache"), **options}
    return executor.run(Job(T + kind, {"workspace": str(ws), "options": {"seed": 2, **options}}, kind=kind))


def test_honest_candidate_passes_both_jobs(executor, ws):
    v = job(executor, ws, "verify", relu_new())
    assert v.ok, v.message
    p = job(executor, ws, "profile", relu_new())
    assert p.ok, p.message


def test_replaced_timer_is_refused(executor, ws):
    code = hooked_relu_new(at_import="_real = time.perf_counter\ntime.perf_counter = lambda: _real() / 1000.0")
    p = job(executor, ws, "profile", code)
    assert not p.ok and p.failure is FailureCategory.FORBIDDEN_OP, p.message
    assert "time.perf_counter" in p.message and "no-tampering" in p.message


def test_replaced_comparison_cannot_pass_a_wrong_result(executor, ws):
    # a wrong kernel (returns the input) that makes the harness's comparison always agree
    code = hooked_relu_new(at_import=(
        "import cuda_agent.sandbox.judge.comparison as _c\n"
        "_c.compare_outputs = lambda *a, **k: _c.Comparison(ok=True)"), ret="x")
    v = job(executor, ws, "verify", code)  # the static checks refuse importing the harness
    assert not v.ok and v.failure is FailureCategory.FORBIDDEN_OP and "static.guard-tampering" in v.message, v.message
    # without them the comparison in the candidate's process is not the one that judges it:
    # the wrong kernel fails (the replacement is also named by the integrity check)
    v = job(executor, ws, "verify", code, static_checks=[])
    assert not v.ok and v.failure in (FailureCategory.WRONG_RESULT, FailureCategory.FORBIDDEN_OP), v.message


def test_replaced_profiler_method_is_refused(executor, ws):
    # the harness's own classes count: a profiler whose time() reports what the candidate likes
    code = hooked_relu_new(at_import=(
        "from cuda_agent.sandbox.judge.profilers import wallclock as _w\n"
        "_real = _w.WallclockProfiler.time\n"
        "def _fast(self, *a, **k):\n"
        "    t = _real(self, *a, **k)\n"
        "    t.median_ms /= 100\n"
        "    return t\n"
        "_w.WallclockProfiler.time = _fast"))
    p = job(executor, ws, "profile", code)
    assert not p.ok and p.failure is FailureCategory.FORBIDDEN_OP, p.message
    assert "WallclockProfiler.time" in p.message


def test_patch_inside_forward_is_caught_after_the_run(executor, ws):
    code = hooked_relu_new(in_forward="torch.Tensor.allclose = lambda self, other, *a, **k: True")
    v = job(executor, ws, "verify", code)
    assert not v.ok and v.failure is FailureCategory.FORBIDDEN_OP, v.message
    assert "torch.Tensor.allclose" in v.message


def test_snapshot_ignores_additions_and_state_flags():
    snap = integrity.snapshot()
    assert ("time", "perf_counter") in snap and ("torch.cuda", "synchronize") in snap
    import types

    mod = types.ModuleType("late_extension")
    sys.modules["late_extension"] = mod
    torch._integrity_probe_added = lambda: None  # an added attribute, as a lazy import makes
    try:
        assert integrity.tampered(snap) == []
    finally:
        del torch._integrity_probe_added
        del sys.modules["late_extension"]
    original = time_perf = __import__("time").perf_counter
    import time

    time.perf_counter = lambda: 0.0
    try:
        assert integrity.tampered(snap) == ["time.perf_counter"]
    finally:
        time.perf_counter = original
    assert time.perf_counter is time_perf and integrity.tampered(snap) == []
