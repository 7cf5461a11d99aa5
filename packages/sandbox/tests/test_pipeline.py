"""The judge's pipeline (judge.pipeline): job timeouts that scale with the task's eager time."""

from __future__ import annotations

from pathlib import Path

from cuda_agent.core.types import ProfileResult, Timing
from cuda_agent.sandbox.judge.pipeline import DEFAULT_COMPILER, Judge, JudgeOptions, default_compiler


def test_timeouts_scale_with_the_tasks_eager_time_once_known(tmp_path: Path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d, code in ((a, "# task a\n"), (b, "# task b\n")):
        d.mkdir()
        (d / "model.py").write_text(code)
    judge = Judge(JudgeOptions(verify_timeout=300.0, profile_timeout=600.0, timeout_floor=90.0, timeout_calls=60,
                               hopeless_factor=20.0), executor=object(), backend="cpu")
    assert judge.timeout(a, 300.0) == 300.0  # nothing known of the task yet: the configured one
    judge._learn(a, ProfileResult(ok=True, eager=Timing(median_ms=10.0, spread=0.0)))
    assert judge.timeout(a, 300.0) == 90.0 + 60 * 0.010 * 20  # 102 s
    assert judge.timeout(a, None) == 102.0
    assert judge.timeout(a, 300.0, prebuilt=False) == 300.0  # a build inside the job keeps the full time
    assert judge.timeout(b, 600.0) == 600.0  # another task
    judge._learn(b, ProfileResult(ok=True, eager=Timing(median_ms=1000.0, spread=0.0)))
    assert judge.timeout(b, 600.0) == 600.0  # never above the configured timeout
    judge._learn(b, ProfileResult(ok=False, eager=Timing(median_ms=1.0, spread=0.0)))
    assert judge.timeout(b, 600.0) == 600.0  # a failed profile teaches nothing
    off = Judge(JudgeOptions(scale_timeouts=False), executor=object(), backend="cpu")
    off._learn(a, ProfileResult(ok=True, eager=Timing(median_ms=10.0, spread=0.0)))
    assert off.timeout(a, 300.0) == 300.0


def test_one_place_names_each_backends_default_compiler():
    assert default_compiler("cpu") == DEFAULT_COMPILER["cpu"] == "gxx"
    assert default_compiler("cuda") == default_compiler("auto") == "cpp_extension"


# --- cheap refusals first, baselines only when needed, hopeless candidates bounded -----------

import sys  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))
from test_verify_support import KERNELS_CPP, hooked_relu_new, make_workspace, relu_new  # noqa: E402

from cuda_agent.core.types import FailureCategory  # noqa: E402
from cuda_agent.sandbox.judge import jobs  # noqa: E402
from cuda_agent.sandbox.judge.baselines import BaselineCache  # noqa: E402

FAST = {"target_ms": 5, "warmup_ms": 0, "min_iters": 3, "max_iters": 50}
# a loop of real work in forward: about `ms` milliseconds of float sums on the first `calls` calls
SLOW = ("import time as _time\n_calls = [0]\n\ndef _busy(ms):\n    _t, _acc = _time.perf_counter(), 0.0\n"
        "    while (_time.perf_counter() - _t) * 1e3 < ms:\n        _acc += sum(float(i) for i in range(200))\n"
        "    return _acc\n")
OFF = "\ndef _off(x):\n    y = torch.empty_like(x)\n    kernels.relu_off(x, y, x.numel())\n    return y\n"
SIX = "\ndef _six(x):\n    y = torch.empty_like(x)\n    kernels.relu_six(x, y, x.numel())\n    return y\n"


def slow_relu(ms: float, calls: int = 10 ** 9, wrong_after: int = 0) -> str:
    """The g++ ReLU that spends ``ms`` of real work on each of its first ``calls`` calls and,
    with ``wrong_after``, returns a wrong output from that call on."""
    ret = "y" if not wrong_after else f"(y if _calls[0] <= {wrong_after} else _off(x))"
    return hooked_relu_new(SLOW + OFF, f"_calls[0] += 1\n        _busy({ms}) if _calls[0] <= {calls} else None", ret)


def _profile_options(cache: Path, **kw) -> dict:
    return {"baseline_cache_dir": str(cache), "profiler_options": dict(FAST), "compile_baseline": False, "attempts": 1,
            **kw}


def test_a_static_refusal_comes_before_the_build_and_the_baselines(tmp_path: Path):
    from cuda_agent.sandbox.executors import CpuExecutor

    # computes through the reference (rule static.reference-model)
    ws = make_workspace(tmp_path, build=False, model_new=hooked_relu_new("from model import Model"))
    root, cache = Path(ws.root), tmp_path / "cache"
    ex = CpuExecutor()
    judge = Judge(JudgeOptions(profile_options=_profile_options(cache), compile_in="inline"), ex, backend="cpu")
    try:
        out = judge.judge(root)
        assert out.compile is None  # nothing was built
        v = out.verify
        assert not v.ok and v.failure is FailureCategory.FORBIDDEN_OP and "rule static.reference-model" in v.message, \
            v.message
        assert v.metadata["checked_before_build"] is True and set(v.metadata["phase_seconds"]) == {"static_checks"}
        assert not (root / ".cuda_agent" / "build").exists() or not any((root / ".cuda_agent" / "build").rglob("*.so"))
        assert len(BaselineCache(cache)) == 0 and out.profile is None
        # the same candidate with the check left to the job: built, then refused there
        late = Judge(JudgeOptions(profile_options=_profile_options(cache), compile_in="inline", refusals_first=False),
                     ex, backend="cpu")
        out2 = late.judge(root)
        assert out2.compile is not None and out2.compile.ok
        assert out2.verify.failure is FailureCategory.FORBIDDEN_OP and "checked_before_build" not in out2.verify.metadata
        assert out2.verify.message == v.message
    finally:
        judge.close()
        ex.close()


def test_baselines_are_measured_only_for_a_candidate_that_verified(tmp_path: Path):
    ws = make_workspace(tmp_path)
    root, cache = Path(ws.root), tmp_path / "cache"
    vopts = jobs.VerifyOptions(seed=5)
    (root / "model_new.py").write_text(relu_new("relu_off"))  # wrong
    v, p = jobs.evaluate_workspace(str(root), "cpu", vopts, jobs.ProfileOptions(**_profile_options(cache)))
    assert not v.ok and v.failure is FailureCategory.WRONG_RESULT and p is None
    assert len(BaselineCache(cache)) == 0  # no baseline for a candidate that failed
    (root / "model_new.py").write_text(relu_new("relu"))
    v, p = jobs.evaluate_workspace(str(root), "cpu", vopts, jobs.ProfileOptions(**_profile_options(cache)))
    assert v.ok and p.ok, (v.message, p.message if p else None)
    assert "after verification" in v.metadata["baselines_measured"] and p.metadata["baseline_cache"] == "miss"
    assert len(BaselineCache(cache)) == 1 and p.metadata["spot_check"] == "passed"
    # the old order: baselines first, whatever the verdict
    old = tmp_path / "old-cache"
    (root / "model_new.py").write_text(relu_new("relu_off"))
    v, p = jobs.evaluate_workspace(str(root), "cpu", vopts,
                                   jobs.ProfileOptions(**_profile_options(old, defer_baselines=False)))
    assert not v.ok and len(BaselineCache(old)) == 1


def test_a_hopeless_first_call_ends_verification_after_one_input_set(tmp_path: Path):
    ws = make_workspace(tmp_path)
    root = Path(ws.root)
    (root / "model_new.py").write_text(slow_relu(700))
    v = jobs.verify_workspace(str(root), "cpu", jobs.VerifyOptions(seed=7))
    assert v.ok, v.message
    stopped = v.metadata["verify_stopped"]
    assert stopped["inputs_checked"] == 1 and stopped["ratio_vs_reference"] > 20 and stopped["candidate_ms"] >= 700
    assert "rule verify.hopeless" in stopped["why"] and "first input set" in v.message
    # one input set of the task's own distribution; the draws of other distributions still run
    assert [c.name for c in v.checks if c.name.startswith("input[")] == [c.name for c in v.checks
                                                                         if c.name.startswith("input[0]")]
    assert [e["status"] for e in v.metadata["extra_draws"]] == ["passed", "passed"]
    # slow, and wrong only on values past 6 (ReLU6 for ReLU: the task's randn inputs hardly
    # reach them, the extra draws do): being slow skips no such check
    six = make_workspace(tmp_path / "six", kernels=KERNELS_CPP + (
        'extern "C" void relu_six(const float* x, float* y, int64_t n) {\n'
        '    for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? (x[i] < 6.f ? x[i] : 6.f) : 0.f;\n}\n'),
        model_new=hooked_relu_new(SLOW + SIX, "_busy(700)", "_six(x)"))
    v = jobs.verify_workspace(str(six.root), "cpu", jobs.VerifyOptions(seed=7))
    assert not v.ok and v.failure is FailureCategory.WRONG_RESULT and "extra input draw" in v.message, v.message
    assert v.metadata["verify_stopped"]["inputs_checked"] == 1
    # honest: every input set and the extra draws
    (root / "model_new.py").write_text(relu_new("relu"))
    v = jobs.verify_workspace(str(root), "cpu", jobs.VerifyOptions(seed=7))
    assert v.ok and "verify_stopped" not in v.metadata and len([c for c in v.checks if c.name.startswith("input[")]) == 5
    assert v.metadata["extra_draws"] and "first input set" not in v.message


def test_a_candidate_slow_only_on_its_first_call_is_verified_in_full(tmp_path: Path):
    """Slow once (a warm-up, or a candidate hoping to skip the checks): its timed calls are not
    hopeless, so the job verifies it again on every input set, and a wrong result there is
    its verdict."""
    ws = make_workspace(tmp_path)
    root, cache = Path(ws.root), tmp_path / "cache"
    popts = jobs.ProfileOptions(**_profile_options(cache))
    assert "error" not in jobs.prepare_baselines(str(root), "cpu", popts)  # cached: one candidate process a job
    (root / "model_new.py").write_text(slow_relu(700, calls=1))
    v, p = jobs.evaluate_workspace(str(root), "cpu", jobs.VerifyOptions(seed=9), popts)
    assert v.ok and p is not None and p.ok, (v.message, p and p.message)
    assert "verify_stopped" not in v.metadata and "its first call was hopeless" in v.metadata["verified_in_full_because"]
    assert len([c for c in v.checks if c.name.startswith("input[")]) == 5 and "timing_stopped" not in p.metadata
    (root / "model_new.py").write_text(slow_relu(700, calls=1, wrong_after=1))  # right once, then wrong
    v, p = jobs.evaluate_workspace(str(root), "cpu", jobs.VerifyOptions(seed=9), popts)
    assert not v.ok and v.failure is FailureCategory.WRONG_RESULT and p is None, v.message
    assert "extra input draw" in v.message  # caught already by the checks its slow first call does not skip
    # slow on every call: stopped in verification and in the timing, at about its real cost
    (root / "model_new.py").write_text(slow_relu(700))
    v, p = jobs.evaluate_workspace(str(root), "cpu", jobs.VerifyOptions(seed=9), popts)
    assert v.ok and v.metadata["verify_stopped"]["inputs_checked"] == 1
    assert p.ok and "timed no further" in p.metadata["timing_stopped"]["why"] and p.candidate.median_ms >= 700
    # its calls in verification (the first, the extra draws') were past the bound already: no
    # candidate call in the profile (no load, no warm-up), never judged from one call
    assert p.metadata["timing_stopped"]["from"] == "verification" and len(v.metadata["verify_stopped"]["later_calls_ms"]) == 2
    assert not {"load", "timing", "overhead"} & set(p.metadata["phase_seconds"]) and p.candidate.iterations == 2


def test_the_eager_time_for_timeouts_is_read_from_the_baseline_cache(tmp_path: Path):
    ws = make_workspace(tmp_path, build=False)
    root, cache = Path(ws.root), tmp_path / "cache"
    p = jobs.prepare_baselines(str(root), "cpu", jobs.ProfileOptions(**_profile_options(cache)))
    assert p["meta"]["baseline_cache"] == "miss"
    judge = Judge(JudgeOptions(profile_options=_profile_options(cache), verify_timeout=300.0, timeout_floor=90.0),
                  executor=object(), backend="cpu")
    assert judge.eager_ms(root) == pytest.approx(p["eager"].median_ms)
    assert 90.0 < judge.timeout(root, 300.0) < 300.0  # known before this Judge ran any job
    other = Judge(JudgeOptions(profile_options=_profile_options(cache, precision="tf32")), executor=object(), backend="cpu")
    assert other.eager_ms(root) is None  # recorded under another precision policy
    off = Judge(JudgeOptions(profile_options=_profile_options(cache), timeouts_from_cache=False), executor=object(),
                backend="cpu")
    assert off.eager_ms(root) is None and off.timeout(root, 300.0) == 300.0


def test_a_tasks_baselines_are_measured_ahead_in_gpu_time_no_candidate_asks_for(tmp_path: Path):
    """The job ahead reads the reference alone, caches its baselines, and the candidate's own
    job then finds them (one candidate process, no measurement after verification)."""
    from cuda_agent.sandbox.executors import CpuExecutor

    ws = make_workspace(tmp_path)
    root, cache = Path(ws.root), tmp_path / "cache"
    ex = CpuExecutor()
    judge = Judge(JudgeOptions(profile_options=_profile_options(cache), compile_in="inline"), ex, backend="cpu")
    try:
        assert judge.eager_ms(root) is None
        fut = judge.measure_ahead(root)
        assert fut is not None and fut.job.kind == "baseline" and fut.job.priority > 1  # after every candidate job
        assert judge.measure_ahead(root) is None  # one job per task
        got = fut.result(timeout=120)
        assert got["meta"]["baseline_cache"] == "miss" and len(BaselineCache(cache)) == 1
        assert judge.eager_ms(root) == pytest.approx(got["eager"].median_ms)
        assert judge.measure_ahead(root) is None  # known now: nothing to measure
        v, p = judge.evaluate(root, {"seed": 3}, _profile_options(cache), split=False)
        assert v.ok and p.ok, (v.message, p.message)
        assert p.metadata["baseline_cache"] == "hit" and p.metadata["baselines_ahead"] == "measured ahead"
        assert "baselines_measured" not in v.metadata  # read before verification, not measured after it
        v, p = judge.evaluate(root, {"seed": 4}, _profile_options(cache), split=False)
        assert "baselines_ahead" not in p.metadata  # said once, to the first candidate after it
    finally:
        judge.close()
        ex.close()


def test_baselines_measured_ahead_in_a_worker_can_be_timed_as_candidates(tmp_path: Path):
    """``baselines_as_candidate="always"`` (by default only tasks timed by graph replay): the
    baseline job ahead, in an executor's worker, times the reference again in a candidate's
    process of its own; the candidate's profile then reads that record and says where its
    baselines were timed."""
    from cuda_agent.sandbox.executors import CpuExecutor

    ws = make_workspace(tmp_path)
    root, cache = Path(ws.root), tmp_path / "cache"
    popts = _profile_options(cache, baselines_as_candidate="always")
    ex = CpuExecutor()
    judge = Judge(JudgeOptions(profile_options=popts, compile_in="inline"), ex, backend="cpu")
    try:
        fut = judge.measure_ahead(root)
        assert fut is not None
        got = fut.result(timeout=240)
        assert got["meta"]["baseline_timed_in"] == "a candidate's process", got["meta"].get("baseline_as_candidate_error")
        v, p = judge.evaluate(root, {"seed": 3}, popts, split=False)
        assert v.ok and p.ok, (v.message, p.message)
        assert p.metadata["baseline_cache"] == "hit" and p.metadata["baseline_timed_in"] == "a candidate's process"
        assert p.eager.median_ms == pytest.approx(got["eager"].median_ms)
    finally:
        judge.close()
        ex.close()


def test_a_candidate_due_before_its_baselines_job_started_takes_it_over(tmp_path: Path):
    from cuda_agent.sandbox.executors import CpuExecutor, Job

    ws = make_workspace(tmp_path)
    root, cache = Path(ws.root), tmp_path / "cache"
    ex = CpuExecutor()
    judge = Judge(JudgeOptions(profile_options=_profile_options(cache), compile_in="inline"), ex, backend="cpu")
    try:
        busy = ex.submit(Job("cuda_agent.sandbox.executors.selftest:sleep", {"seconds": 3.0}, kind="verify"))
        deadline = time.monotonic() + 60
        while ex.pool.queued() and time.monotonic() < deadline:  # the one worker has taken it (a slow
            time.sleep(0.05)  # host starts its worker late)
        assert ex.pool.queued() == 0 and not busy.done()
        fut = judge.measure_ahead(root)
        assert fut is not None and not fut.done()  # behind the job that holds the one worker
        assert judge._ahead_settled(root) == "taken over from the job ahead, which had not started"
        assert fut.cancelled() and ex.pool.queued() == 0  # a withdrawn job is not counted as waiting
        assert judge.measure_ahead(root) is not None  # withdrawn: a later candidate may ask again
        assert judge._ahead_settled(root).startswith("taken over")
        busy.result(timeout=60)
        v, p = judge.evaluate(root, {"seed": 3}, _profile_options(cache), split=False)
        assert v.ok and p.ok and p.metadata["baseline_cache"] == "miss", (v.message, p and p.message)
        assert "after verification" in v.metadata["baselines_measured"] and len(BaselineCache(cache)) == 1
        # with the option off, judging asks for no job ahead
        off = Judge(JudgeOptions(profile_options=_profile_options(tmp_path / "c2"), compile_in="inline",
                                 baselines_ahead=False), ex, backend="cpu")
        (root / "model_new.py").write_text(hooked_relu_new("from model import Model"))  # refused before the build
        assert off.judge(root).verify.failure is FailureCategory.FORBIDDEN_OP and not off._ahead
        (root / "model_new.py").write_text(relu_new("relu"))
        out = off.judge(root)
        assert out.profile is not None and out.profile.ok and not off._ahead and "baselines_ahead" not in out.profile.metadata
        off.close()
    finally:
        judge.close()
        ex.close()


# --- a candidate process killed from outside the judge -------------------------------------


class _Killer:
    """SIGKILLs, from outside the judge, the candidate processes that hold a file named
    ``marker`` open (``times``: how many of them, one after the other)."""

    def __init__(self, marker: str, times: int):
        import threading

        self.marker, self.left, self.killed = marker, times, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _holds_marker(self, pid: str) -> bool:
        import os

        try:
            return any(self.marker in os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            return False

    def _run(self) -> None:
        import os
        import signal
        import time

        while self.left > 0 and not self._stop.is_set():
            for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
                if int(pid) not in self.killed and self._holds_marker(pid):
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except OSError:
                        continue
                    self.killed.append(int(pid))
                    self.left -= 1
                    break
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _marked_relu(marker: str) -> str:
    # holds a file open (how the killer finds its process) and takes a while per call
    return hooked_relu_new(f"_mark = open('/tmp/{marker}', 'w')", "time.sleep(0.02)")


def test_a_candidate_process_killed_from_outside_is_judged_again_once(tmp_path: Path):
    import uuid

    from cuda_agent.sandbox.executors import CpuExecutor
    from cuda_agent.sandbox.judge.client import KILLED_OUTSIDE

    marker = f"killme-{uuid.uuid4().hex}"
    ws = make_workspace(tmp_path, model_new=_marked_relu(marker))
    root, cache = Path(ws.root), tmp_path / "cache"
    ex = CpuExecutor()
    judge = Judge(JudgeOptions(profile_options=_profile_options(cache), compile_in="inline"), ex, backend="cpu")
    try:
        killer = _Killer(marker, times=1)
        try:
            p = judge.profile(root)
        finally:
            killer.stop()
        assert len(killer.killed) == 1
        # the first run lost its process to a SIGKILL the judge did not send: not a verdict
        assert p.ok, p.message
        assert "killed" in p.metadata["run_again_because"] and "did not send" in p.metadata["run_again_because"]
        assert KILLED_OUTSIDE not in p.metadata
        # killed every time: the second run's crash stands (one run again, never more)
        killer = _Killer(marker, times=10)
        try:
            v, p = judge.evaluate(root, {"seed": 3}, _profile_options(cache), split=False)
        finally:
            killer.stop()
        assert len(killer.killed) == 2
        failed = p if v.ok else v
        assert failed is not None and not failed.ok and failed.failure is FailureCategory.CRASH, failed
        assert "did not send" in failed.message and failed.metadata[KILLED_OUTSIDE]
        assert "run_again_because" in failed.metadata
    finally:
        judge.close()
        ex.close()
