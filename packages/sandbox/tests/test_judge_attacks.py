"""Attacks on the judge itself, as an adversarial policy would try them (CPU backend).

Each runs in real executor workers, as root, the way the RL reward runs. With the static
checks on, the attack is refused before it runs; with them off (``static_checks: []``),
what is left must still refuse it or time it honestly: the verdict and the comparison live
in the trusted process, timing runs in compiled code and is checked against the trusted
wall clock and sampled checksums, and every job's candidate runs as a user of its own
whose processes end with the job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cuda_agent.core.types import FailureCategory  # noqa: E402
from cuda_agent.sandbox.executors import CpuExecutor, Job  # noqa: E402
from cuda_agent.sandbox.judge import attacks  # noqa: E402
from cuda_agent.sandbox.executors.local import CpuExecutorOptions  # noqa: E402
from cuda_agent.sandbox.judge.identity import JOB_UID_BASE, JOB_UID_COUNT  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_verify_support import hooked_relu_new, make_workspace, relu_new  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                                reason="job users and namespaces need root on Linux")

T = "cuda_agent.sandbox.judge.tasks:"
# a ReLU big enough that its timed loops (at least 100 calls) take well over 100 ms
BIG_RELU_TASK = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.relu(x)

    def get_inputs():
        return [torch.randn(1024, 1024)]

    def get_init_inputs():
        return []
''')
TIMING = {"target_ms": 150, "warmup_ms": 10, "min_iters": 100, "max_iters": 2000}
NO_STATIC = {"static_checks": []}

@pytest.fixture(scope="module")
def executor():
    ex = CpuExecutor(CpuExecutorOptions(timeout=180.0, spares=1))
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return Path(make_workspace(tmp_path_factory.mktemp("attacks"), task_code=BIG_RELU_TASK).root)


def job(executor, ws: Path, kind: str, code: str, **options):
    (ws / "model_new.py").write_text(code)
    if kind == "profile":
        options = {"profiler_options": dict(TIMING), "compile_baseline": False, "attempts": 1,
                   "baseline_cache_dir": str(ws.parent / "cache"), **options}
    return executor.run(Job(T + kind, {"workspace": str(ws), "options": {"seed": 5, **options}}, kind=kind))


@pytest.fixture(scope="module")
def honest_ms(executor, ws):
    p = job(executor, ws, "profile", relu_new())
    assert p.ok, p.message
    assert p.metadata["timing_loops"] and p.metadata["spot_check"] == "passed"
    return p.candidate.median_ms


def honest_or_refused(executor, ws, p, honest_ms: float) -> str:
    """'refused', or 'honest' when timed no faster than half the honest kernel (the attacks
    claim 8x; CPU timings on a busy test machine move by tens of percent, so the honest
    kernel is timed again beside the attack when the first comparison misses)."""
    if not p.ok:
        return "refused"
    if p.candidate.median_ms < 0.5 * honest_ms:
        again = job(executor, ws, "profile", relu_new())
        assert again.ok, again.message
        honest_ms = min(honest_ms, again.candidate.median_ms)
    assert p.candidate.median_ms >= 0.5 * honest_ms, (p.candidate.median_ms, honest_ms, p.message)
    return "honest"


# --- 1. replacing harness functions and timers, forging replies, stealing the verdict -------


def candidate(attack: attacks.Attack) -> str:
    return hooked_relu_new(at_import=attack.at_import, in_forward=attack.in_forward, ret=attack.ret)


def test_computed_getattr_is_refused_statically(executor, ws):
    code = hooked_relu_new(at_import="_n = 'perf' + '_counter'\n_f = getattr(time, _n)")
    v = job(executor, ws, "verify", code)
    assert not v.ok and "computed attribute name" in v.message, v.message


@pytest.mark.parametrize("attack", attacks.TIMER_PATCHES, ids=lambda a: a.name)
def test_timer_patching_at_every_level(executor, ws, honest_ms, attack):
    p = job(executor, ws, attack.kind, candidate(attack), **attack.options())
    assert honest_or_refused(executor, ws, p, honest_ms) in ("honest", "refused")
    if not p.ok:
        assert "rule timing." in p.message or "no-tampering" in p.message, p.message


def test_a_forged_reply_of_the_timing_loop_is_refused_by_the_clocks(executor, ws):
    attack = next(a for a in attacks.FORGED_REPLIES if a.name == "forged_reply")
    p = job(executor, ws, attack.kind, candidate(attack), **attack.options())
    assert not p.ok and p.failure is FailureCategory.FORBIDDEN_OP and "rule timing.wall-clock" in p.message, p.message


def test_a_loop_that_skips_its_calls_is_refused_by_the_checksums(executor, ws):
    attack = next(a for a in attacks.FORGED_REPLIES if a.name == "skipped_calls")
    p = job(executor, ws, attack.kind, candidate(attack), **attack.options())
    assert not p.ok and "rule timing.checksum" in p.message, p.message
    assert p.failure is FailureCategory.WRONG_RESULT


@pytest.mark.parametrize("attack", attacks.VERDICT_ATTACKS, ids=lambda a: a.name)
def test_the_verdict_is_out_of_the_candidates_reach(executor, ws, attack):
    v = job(executor, ws, attack.kind, candidate(attack), **attack.options())
    assert not v.ok, v.message
    if attack.static:
        assert v.failure is FailureCategory.FORBIDDEN_OP and "rule static.guard-tampering" in v.message
    else:  # a wrong output is compared where the candidate cannot reach (its patch may be named too)
        assert v.failure in (FailureCategory.WRONG_RESULT, FailureCategory.FORBIDDEN_OP), v.message


def test_the_integrity_check_sees_in_place_code_swaps(executor, ws):
    swap = "import cuda_agent.sandbox.judge.inputs as _i\n_i.describe.__code__ = (lambda obj: obj).__code__"
    v = job(executor, ws, "verify", hooked_relu_new(at_import=swap), **NO_STATIC)
    assert not v.ok and v.failure is FailureCategory.FORBIDDEN_OP and "rewritten in place" in v.message, v.message


# --- 2. what other processes the candidate can reach ------------------------------------------


def _with_marker(marker: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    out.append(int(name))
        except (OSError, ValueError):
            continue
    return out


def test_processes_a_candidate_starts_end_with_its_job(executor, ws):
    # a child in a new session (double fork) that would sleep for ten minutes
    marker = f"{uuid.uuid4().hex}"
    leak = textwrap.dedent(f'''
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    time.sleep(600)",
                          "{marker}"], start_new_session=True)
    ''')
    v = job(executor, ws, "verify", hooked_relu_new(at_import=leak), **NO_STATIC)
    assert v.ok, v.message
    assert v.metadata["job_left_running_after_end"] == 0
    time.sleep(0.5)
    assert _with_marker(marker) == []


def test_a_candidate_cannot_signal_or_read_other_processes(executor, ws, tmp_path):
    # a process of another job's user, and the trusted worker (root)
    other = subprocess.Popen(["sleep", "120"],
                             user=JOB_UID_BASE - 10, group=JOB_UID_BASE - 10)  # another identity than this job's
    trusted = next(iter(executor.pool.worker_pids().values()))[0]
    probe = textwrap.dedent(f'''
        import os
        _seen = []
        for _pid in ({other.pid}, {trusted}):
            try:
                os.kill(_pid, 9)
                _seen.append(f"killed {{_pid}}")
            except OSError as _e:
                _seen.append(type(_e).__name__)
            try:
                open(f"/proc/{{_pid}}/mem", "rb").read(1)
                _seen.append(f"read {{_pid}}")
            except OSError as _e:
                _seen.append(type(_e).__name__)
        if any(s.startswith(("killed", "read")) for s in _seen):
            raise RuntimeError("reached: " + ", ".join(_seen))
    ''')
    try:
        v = job(executor, ws, "verify", hooked_relu_new(at_import=probe), **NO_STATIC)
        assert v.ok, v.message  # every attempt failed (no such process in its namespace, or not permitted)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_an_honest_candidate_still_passes_every_check(executor, ws, honest_ms):
    v = job(executor, ws, "verify", relu_new())
    assert v.ok, v.message
    assert v.metadata["job_pid_namespace"] == "own PID namespace"
    assert JOB_UID_BASE <= v.metadata["uid"] < JOB_UID_BASE + JOB_UID_COUNT
    p = job(executor, ws, "profile", relu_new())
    assert p.ok and p.metadata["spot_check"] == "passed" and p.metadata["checksums_checked"], p.message


def test_the_harness_is_imported_before_the_candidate(executor, ws):
    """No harness module is first imported after candidate code ran (it would be outside the
    integrity snapshot, and unreadable where the job's view hides the checkout)."""
    for kind in ("verify", "profile"):
        r = job(executor, ws, kind, relu_new())
        assert r.ok, r.message
        assert "harness_late_imports" not in r.metadata, r.metadata["harness_late_imports"]


def test_a_late_harness_import_is_reported():
    from cuda_agent.sandbox.judge import integrity, rules  # noqa: F401 - loaded, as in a candidate process
    from cuda_agent.sandbox.judge.candidate_load import do_integrity
    from cuda_agent.sandbox.judge.candidate_state import CandidateState

    st = CandidateState()
    st.harness = integrity.snapshot()
    st.harness_modules = integrity.harness_modules() - {"cuda_agent.sandbox.judge.rules"}
    reply = do_integrity(st, {})
    assert reply["tampered"] == [] and reply["late"] == ["cuda_agent.sandbox.judge.rules"]
