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
        # hopeless_factor 0: an attack is timed in full however slow its first calls look on a busy host
        options = {"profiler_options": dict(TIMING), "compile_baseline": False, "attempts": 1, "hopeless_factor": 0,
                   "baseline_cache_dir": str(ws.parent / "cache"), **options}
    return executor.run(Job(T + kind, {"workspace": str(ws), "options": {"seed": 5, **options}}, kind=kind))


@pytest.fixture(scope="module")
def honest_ms(executor, ws):
    p = job(executor, ws, "profile", relu_new())
    assert p.ok, p.message
    assert p.metadata.get("timing_loops") and p.metadata.get("spot_check") == "passed", (p.message, p.metadata)
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


def test_a_forged_reply_of_the_timing_loop_is_timed_by_the_trusted_clock(executor, ws, honest_ms):
    """Reported times an eighth of the real ones: the trusted clock (on the CPU backend the
    job's CPU time) sees the rest, which is charged to the calls; the result says why."""
    attack = next(a for a in attacks.FORGED_REPLIES if a.name == "forged_reply")
    p = job(executor, ws, attack.kind, candidate(attack), **attack.options())
    assert p.ok, p.message
    charged = p.metadata.get("timing_charged")
    seen = {k: p.metadata.get(k) for k in ("timing_loops", "loop_overhead_ms", "cpu_threads", "timing_attempts")}
    assert charged and charged["rule"] == "timing.wall-clock" and charged["charged_ms_per_call"] > 0, (p.message, seen)
    assert "timed by the trusted clock" in p.message and "rule timing.wall-clock" in p.message, p.message
    assert honest_or_refused(executor, ws, p, honest_ms) == "honest"


def test_reported_times_reshaped_around_their_sum_have_their_median_raised():
    """(On a GPU, scripts/gpu/judge_checks.py runs the attack itself: median_forged.)"""
    from cuda_agent.sandbox.judge.timing import SKEW, skew_bounded

    honest = [1.0, 1.01, 0.99, 1.02, 1.0]
    assert skew_bounded(honest) == (honest, {})
    forged = [1 / 8] * 6 + [(5 - 6 / 8) / 4] * 4  # the same sum as five 1 ms calls, twice over
    raised, why = skew_bounded(forged)
    assert why and sorted(raised)[len(raised) // 2] >= sum(forged) / len(forged) / (1 + SKEW) - 1e-9


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


# --- relations between timed calls' inputs: every call's inputs are new ----------------------
# (a homogeneous matmul, whose kept result a scalar factor would rescale; a log of a signed
# input, whose reference holds NaN)

RELATION_SIZES = {"matmul": 256, "log": 512}


@pytest.fixture(scope="module")
def relation_ws(tmp_path_factory):
    out = {}
    for task, code in attacks.RELATION_TASKS.items():
        code = code.replace("SIZE", str(RELATION_SIZES[task]))
        out[task] = Path(make_workspace(tmp_path_factory.mktemp(f"rel-{task}"), task_code=code, build=False).root)
    return out


def relation_job(executor, relation_ws, attack: attacks.RelationAttack):
    return job(executor, relation_ws[attack.task], "profile", attack.module(attacks.RELATION_HONEST[attack.task]))


@pytest.fixture(scope="module")
def relation_honest_ms(executor, relation_ws):
    out = {}
    for task, honest in attacks.HONEST_RELATION.items():
        p = relation_job(executor, relation_ws, honest)
        assert p.ok, p.message
        assert p.metadata.get("spot_check") == "passed" and p.metadata.get("checksums_checked"), (p.message, p.metadata)
        out[task] = p
    return out


def test_honest_twins_of_the_relation_attacks_pass(relation_honest_ms):
    """The honest matmul and log are timed and checked; the log's checksums compare where
    its NaNs are (the reference holds NaN wherever the input is negative)."""
    mm, log = relation_honest_ms["matmul"], relation_honest_ms["log"]
    assert mm.metadata["checksum_statistics"] == ["sum of squares", "weighted sum"], mm.metadata
    assert log.metadata["checksum_statistics"] == ["sum of squares", "weighted sum", "non-finite positions and count"], \
        log.metadata


@pytest.mark.parametrize("attack", attacks.INPUT_RELATIONS, ids=lambda a: a.name)
def test_no_relation_between_timed_calls_pays(executor, relation_ws, relation_honest_ms, attack):
    p = relation_job(executor, relation_ws, attack)
    honest = relation_honest_ms[attack.task]
    if attack.expect == "refused" or (attack.expect == "either" and not p.ok):
        assert not p.ok, (f"{attack.name} accepted at {p.candidate.median_ms:.4g} ms, honest "
                          f"{honest.candidate.median_ms:.4g} ms: {p.message}")
        assert p.failure is FailureCategory.WRONG_RESULT, p.message
        assert "rule timing.checksum" in p.message or "wrong result on a timed call" in p.message, p.message
        return
    assert p.ok, p.message
    ratio = p.candidate.median_ms / honest.candidate.median_ms
    if ratio < 0.5:  # a busy host: the honest twin timed again beside it
        again = relation_job(executor, relation_ws, attacks.HONEST_RELATION[attack.task])
        assert again.ok, again.message
        ratio = p.candidate.median_ms / min(honest.candidate.median_ms, again.candidate.median_ms)
    assert ratio >= 0.5, (attack.name, ratio, p.message)


def test_timed_inputs_are_new_for_every_call_and_reproducible():
    """Call j's inputs, made in place by the candidate side and afresh by the trusted side, are
    the same; no two calls of a set are related by a scalar factor or a shift; zeros, signs
    of one-signed inputs and magnitudes' bounds are kept; a task with an index input draws anew."""
    from cuda_agent.sandbox.judge import rotation

    sets = [[torch.randn(64, 48), torch.rand(100), torch.tril(torch.randn(8, 8))] for _ in range(2)]
    rot = rotation.Rotation(99, sets)
    work = [[t.clone() for t in s] for s in sets]
    seen = []
    for j in range(6):
        rot.fill(j, work[j % 2])
        fresh = rot.inputs(j)
        assert all(torch.equal(a, b) for a, b in zip(work[j % 2], fresh))
        seen.append(fresh)
    for a, b in ((seen[0], seen[2]), (seen[1], seen[3]), (seen[2], seen[4])):  # the same set, two visits
        ratio, shift = a[0] / b[0], a[0] - b[0]
        assert float(ratio.std()) > 0.2 and float(shift.std()) > 0.2
    x = seen[0]
    assert bool((x[1] >= 0).all()) and bool((x[1] <= sets[0][1]).all())  # one sign, never larger
    assert bool((x[2].triu(1) == 0).all())  # zeros stay zeros
    assert bool((x[0].abs() <= sets[0][0].abs()).all())
    assert not torch.equal(rotation.Rotation(100, sets).inputs(0)[0], x[0])  # another loop, other inputs

    def get_inputs():
        return [torch.randn(4, 4), torch.randint(0, 10, (6,))]

    from cuda_agent.sandbox.judge.inputs import draw_inputs

    first = [draw_inputs(get_inputs, 1).values]
    drawn = rotation.Rotation(7, first, get_inputs)
    assert drawn.fresh and not torch.equal(drawn.inputs(0)[1], drawn.inputs(2)[1])
    w = [t.clone() for t in first[0]]
    drawn.fill(4, w)
    assert all(torch.equal(a, b) for a, b in zip(w, drawn.inputs(4)))


def test_checksums_see_stale_partial_and_misplaced_outputs():
    """Within the tolerance an output passes; a quarter of it stale, half of it copied, zeros,
    or NaN where the reference has none (or elsewhere) fails. Only the checks that ran count."""
    from cuda_agent.sandbox.judge import rotation

    # one call's statistics: a stale output's weighted sum lands inside the slack in a few per
    # cent of draws (a timed loop checks every call, so it never passes a loop); seeded here
    torch.manual_seed(0)
    checks = rotation.Checksums(3)
    ref = torch.randn(300, 400) @ torch.randn(400, 200)
    other = torch.randn(300, 400) @ torch.randn(400, 200)
    want = checks.expected(ref, 1e-2, 1e-2)

    def stats(out, c=checks):
        row = c.slots(1)[0]
        c.into(out, row)
        return row.tolist()

    near = ref + (1e-2 + 1e-2 * ref.abs()) * (torch.rand_like(ref) * 2 - 1)
    assert checks.mismatch(stats(near), want) == ""
    stale = other.clone()
    stale[:75] = ref[:75]
    mirrored = torch.cat([ref[:150], ref[:150]])
    for wrong in (stale, mirrored, torch.zeros_like(ref), ref * 1.05):
        assert checks.mismatch(stats(wrong), want), wrong
    nan_out = ref.clone()
    nan_out[0, 0] = float("nan")
    assert "is nan" in checks.mismatch(stats(nan_out), want)

    x = torch.randn(200, 300)
    ref = torch.log(x)
    full = rotation.Checksums(4, full=True)
    want = full.expected(ref, 1e-2, 1e-2)
    assert not want["finite"] and want["nonfinite"] == float((x < 0).sum() + (x == 0).sum())
    assert full.mismatch(stats(ref.clone(), full), want) == ""
    moved = ref.clone()
    i = int((x < 0).reshape(-1).nonzero()[0])
    j = int((x > 0).reshape(-1).nonzero()[0])
    moved.view(-1)[i], moved.view(-1)[j] = moved.view(-1)[j].clone(), float("nan")
    assert "NaN/Inf" in full.mismatch(stats(moved, full), want)
    garbage = torch.where(x < 0, float("nan"), x)  # NaN in place, the rest not computed
    assert "sum of squares" in full.mismatch(stats(garbage, full), want)
    # summed without the fingerprint, a reference with NaN is reported not finite: the judge
    # then times the loop again with it rather than skip the check
    assert not checks.expected(ref, 1e-2, 1e-2)["finite"]


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
    assert v.metadata.get("job_left_running_after_end") == 0, v.metadata
    time.sleep(0.5)
    assert _with_marker(marker) == []


def test_a_candidate_cannot_signal_or_read_other_processes(executor, ws, tmp_path):
    # a process of another job's user, and the trusted worker (root)
    other = subprocess.Popen(["sleep", "120"],
                             user=58990, group=58990)  # another identity than this job's (no build's or job's)
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
    assert v.metadata.get("job_pid_namespace") == "own PID namespace", v.metadata
    assert JOB_UID_BASE <= v.metadata.get("uid", -1) < JOB_UID_BASE + JOB_UID_COUNT, v.metadata
    p = job(executor, ws, "profile", relu_new())
    assert p.ok, p.message
    assert p.metadata.get("spot_check") == "passed" and p.metadata.get("checksums_checked"), (p.message, p.metadata)
    assert p.metadata.get("checksum_statistics") == ["sum of squares", "weighted sum"], p.metadata


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
