"""Steady timings: the host's quiet lock and spares making their context under the device
lock (real worker processes, real file locks); the retry of noisy timings and the switch of
an unsteady task to the profiler's steadier mode."""

from __future__ import annotations

import time

import pytest

from cuda_agent.core.types import Timing
from cuda_agent.sandbox.executors import CpuExecutor, Job
from cuda_agent.sandbox.executors.local import CpuExecutorOptions
from cuda_agent.sandbox.executors.pool import DeviceSpec, WorkerPool
from cuda_agent.sandbox.judge.profilers.base import profiler_for, time_for_task, time_stably

S = "cuda_agent.sandbox.executors.selftest:"


def pool3(tmp_path, **kw) -> CpuExecutor:
    kw.setdefault("preload", [])
    kw.setdefault("warm_plugins", False)
    kw.setdefault("timeout", 30.0)
    kw.setdefault("prestart", False)  # self-test jobs only
    ex = CpuExecutor(CpuExecutorOptions(devices="a,b,c", lock_dir=str(tmp_path / "locks"), **kw))
    ex.start()
    time.sleep(1.0)  # workers up
    return ex


def section(ex, label: str, kind: str, seconds: float):
    return ex.submit(Job(S + "quiet_section", {"kind": kind, "seconds": seconds}, label=label))


def test_compiling_waits_for_timing_and_timings_share(tmp_path):
    ex = pool3(tmp_path)
    try:
        t1 = section(ex, "a", "timing", 1.0)
        t2 = section(ex, "b", "timing", 1.0)
        time.sleep(0.3)
        heavy = section(ex, "c", "cpu_heavy", 0.5)
        r1, r2, rh = (f.result(timeout=60) for f in (t1, t2, heavy))
        assert r1["active"] and rh["active"]
        # the two timed sections ran together; the compilation began after both had ended
        assert min(r1["end"], r2["end"]) > max(r1["start"], r2["start"])
        assert rh["start"] >= max(r1["end"], r2["end"]) - 0.01
        assert rh["waited"] > 0.3
        # and a timed section asked for during a compilation waits for its end
        heavy = section(ex, "a", "cpu_heavy", 1.0)
        time.sleep(0.3)
        timed = section(ex, "b", "timing", 0.1)
        rh, rt = heavy.result(timeout=60), timed.result(timeout=60)
        assert rt["start"] >= rh["end"] - 0.01 and rt["waited"] > 0.3
    finally:
        ex.close()


def test_a_waiting_compilation_goes_before_later_timings(tmp_path):
    """Writer preference: timings arriving after a waiting compilation queue behind it,
    so a steady stream of timed sections cannot starve it."""
    ex = pool3(tmp_path)
    try:
        first = section(ex, "a", "timing", 1.2)
        time.sleep(0.3)
        heavy = section(ex, "b", "cpu_heavy", 0.6)
        time.sleep(0.3)
        later = section(ex, "c", "timing", 0.1)
        rf, rh, rl = (f.result(timeout=60) for f in (first, heavy, later))
        assert rh["start"] >= rf["end"] - 0.01
        assert rl["start"] >= rh["end"] - 0.01
    finally:
        ex.close()


def test_quiet_timing_off_means_no_lock(tmp_path):
    ex = pool3(tmp_path, quiet_timing=False)
    try:
        heavy = section(ex, "a", "cpu_heavy", 0.8)
        time.sleep(0.2)
        timed = section(ex, "b", "timing", 0.1)
        rh, rt = heavy.result(timeout=60), timed.result(timeout=60)
        assert not rh["active"] and rt["end"] < rh["end"]
    finally:
        ex.close()


def test_a_timed_section_inside_a_cpu_heavy_one_still_holds_its_device(tmp_path, monkeypatch):
    """A compiled baseline timed as a candidate compiles and times in one job, under the host's
    lock held exclusively: its timed sections take no host lock again (they would wait for
    themselves) but still hold the device's quiet lock, so no spare makes a context meanwhile."""
    import fcntl
    import os

    from cuda_agent.sandbox.isolation import hostlock

    host, device = tmp_path / "quiet", tmp_path / "device"
    monkeypatch.setenv(hostlock.ENV, str(host))
    monkeypatch.setenv(hostlock.DEVICE_ENV, str(device))
    monkeypatch.setattr(hostlock, "_fds", None)
    monkeypatch.setattr(hostlock, "_opened_for", None)
    monkeypatch.setattr(hostlock, "_device_fd", None)

    def spare_could_start() -> bool:  # what device_quiet tries, from another descriptor
        fd = os.open(device, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    assert hostlock.active()
    with hostlock.cpu_heavy():
        assert spare_could_start()  # compiling alone leaves spares free to start
        with hostlock.timing() as waited:
            assert waited == 0.0 and not spare_could_start()
            with hostlock.timing():
                assert not spare_could_start()
            assert not spare_could_start()  # the inner section left the outer one's lock
        assert spare_could_start()
    with hostlock.timing():
        assert not spare_could_start()
    assert spare_could_start()


def test_spare_makes_its_context_outside_timed_sections(tmp_path, monkeypatch):
    """A spare started while a job times on its device makes its context (its init steps)
    after the timed section; beside a job that does not time (verification) it starts at once."""
    log = tmp_path / "init.log"
    monkeypatch.setenv("CUDA_AGENT_TEST_INIT_LOG", str(log))
    pool = WorkerPool([DeviceSpec(label="gpu5", device="cpu")], name="t", spares=1, recycle="always",
                      init=[S + "mark_init"], lock_dir=str(tmp_path / "locks"), default_timeout=30)

    def inits() -> list[float]:
        return [float(line.split()[1]) for line in log.read_text().split("\n") if line.strip()]

    try:
        time.sleep(1.0)  # the first two workers are up
        # back to back: after the quick job its worker is replaced, and the new spare starts
        # while the long job runs on the promoted one
        pool.submit(Job(S + "echo"))
        timed = pool.submit(Job(S + "quiet_section", {"kind": "timing", "seconds": 1.5})).result(timeout=60)
        time.sleep(1.0)
        assert len(inits()) == 4, inits()  # 2 at the start, one after each job
        inside = [t for t in inits() if timed["start"] + 0.02 < t < timed["end"] - 0.02]
        assert not inside, (inits(), timed)

        pool.submit(Job(S + "echo"))
        plain = pool.submit(Job(S + "sleep", {"seconds": 3.0})).result(timeout=60)
        time.sleep(1.0)
        assert any(plain["start"] < t < plain["end"] for t in inits()), (inits(), plain)
    finally:
        pool.close()


def test_a_spares_lock_free_start_does_not_hold_up_a_timing(tmp_path, monkeypatch):
    """A spare whose start spends seconds before its context (imports, its candidate
    process) holds the device's quiet lock only for the context: a timed section submitted
    while the spare is still importing starts before the spare has made its context."""
    log = tmp_path / "init.log"
    monkeypatch.setenv("CUDA_AGENT_TEST_INIT_LOG", str(log))
    monkeypatch.setenv("CUDA_AGENT_TEST_INIT_SECONDS", "4")
    pool = WorkerPool([DeviceSpec(label="gpu6", device="cpu")], name="t", spares=1, recycle="always",
                      init=[S + "mark_init"], lock_dir=str(tmp_path / "locks"), default_timeout=60)
    try:
        pool.submit(Job(S + "echo")).result(timeout=60)  # its worker is replaced: a new spare starts
        timed = pool.submit(Job(S + "quiet_section", {"kind": "timing", "seconds": 0.5})).result(timeout=60)
        time.sleep(5.0)
        stamps = [float(line.split()[1]) for line in log.read_text().split("\n") if line.strip()]
        later = [t for t in stamps if t > timed["end"]]
        # the new spare's context came after the timed section, which did not wait 4 s for it
        assert later and timed["start"] < min(later), (stamps, timed)
    finally:
        pool.close()


class ScriptedProfiler:
    """A profiler whose measurements have the spreads given, in turn (the retry rule's
    input); ``steady`` is its steadier mode's spread (None: it has none, or capture fails
    when "fail"); ``reason``: what its up-front check says ("raise": the check fails);
    ``drift``: how far its per-call time moves after the fixed warm-up."""

    name = "scripted"

    def __init__(self, spreads, steady=None, graph=False, reason="", drift=0.0):
        self.spreads = list(spreads)
        self.steady = steady
        self.graph = graph
        self.reason = reason
        self.drift = drift
        self.checked = 0

    def warmup_drift(self, fn, input_sets, device=None):
        return self.drift

    def steadier_reason(self, fn, input_sets, device=None):
        self.checked += 1
        if self.reason == "raise":
            raise RuntimeError("capture failed")
        return self.reason

    def method_name(self):
        return "scripted+graph" if self.graph else "scripted"

    def steadier(self):
        if self.graph or self.steady is None:
            return None
        return ScriptedProfiler([self.steady], graph=True)

    def time(self, fn, input_sets, device=None, prepare=None):
        for j in range(6):  # six timed calls, sets in rotation
            if prepare is not None:
                prepare(j, input_sets[j % len(input_sets)])
            fn(*input_sets[j % len(input_sets)])
        s = self.spreads.pop(0)
        if s == "fail":
            raise RuntimeError("capture failed")
        return Timing(median_ms=1.0 + s, spread=s, iterations=6, method=self.method_name())


def test_noisy_timings_are_repeated_and_the_steadiest_kept():
    sets = [[1], [2], [3]]
    prof = ScriptedProfiler([0.30, 0.02, 0.20])
    seen: list[tuple[int, int]] = []
    t = time_stably(prof, lambda x: x, sets, "cpu", lambda step, args: seen.append((step, args[0])),
                    max_spread=0.05, attempts=3)
    assert t.attempts == 2 and t.spread == 0.02  # the second one was steady: no third
    # prepare's steps ran on across the two measurements: set i saw steps i, i+3, i+6, i+9
    assert [s for s, v in seen if v == 1] == [0, 3, 6, 9]
    assert [s for s, v in seen if v == 3] == [2, 5, 8, 11]

    t = time_stably(ScriptedProfiler([0.3, 0.2, 0.25]), lambda x: x, sets, "cpu", max_spread=0.05, attempts=3)
    assert t.attempts == 3 and t.spread == 0.2  # never steady: the steadiest of three
    t = time_stably(ScriptedProfiler([0.3]), lambda x: x, sets, "cpu", max_spread=0.0, attempts=3)
    assert t.attempts == 1  # no threshold: measured once


@pytest.mark.parametrize("bad", [0, -2])
def test_attempts_below_one_still_measure_once(bad):
    t = time_stably(ScriptedProfiler([0.5]), lambda x: x, [[1]], "cpu", max_spread=0.05, attempts=bad)
    assert t.attempts == 1


def test_an_unsteady_task_switches_to_the_steadier_mode_throughout():
    sets = [[1], [2]]
    prof = ScriptedProfiler([0.3, 0.2], steady=0.001)
    seen: list[int] = []
    t, used = time_for_task(prof, lambda x: x, sets, "cpu", lambda step, args: seen.append(step),
                            max_spread=0.05, attempts=2)
    assert used is not prof and used.graph and t.method == "scripted+graph" and t.attempts == 3
    assert t.mode_reason == "unsteady: spread 20.0% after 2 attempt(s)" and prof.checked == 1
    assert seen == list(range(18))  # three timings of six calls: the steps ran on
    # the task's other timings (compiled baseline, candidates) follow the eager one's mode
    assert profiler_for(prof, t).graph
    plain = Timing(median_ms=1.0, spread=0.01, method="scripted")
    assert profiler_for(prof, plain) is prof and profiler_for(prof, None) is prof

    # steady in the configured mode: no switch; no steadier mode or a failed capture: keep
    t, used = time_for_task(ScriptedProfiler([0.01], steady=0.001), lambda x: x, sets, "cpu", max_spread=0.05, attempts=2)
    assert not used.graph and t.attempts == 1
    t, used = time_for_task(ScriptedProfiler([0.3, 0.2]), lambda x: x, sets, "cpu", max_spread=0.05, attempts=2)
    assert not used.graph and t.spread == 0.2
    t, used = time_for_task(ScriptedProfiler([0.3, 0.2], steady="fail"), lambda x: x, sets, "cpu",
                            max_spread=0.05, attempts=2)
    assert not used.graph and t.spread == 0.2 and t.method == "scripted"


def test_a_task_with_a_reason_up_front_is_timed_in_the_steadier_mode_only():
    """Work on parallel streams (the profiler's check) decides the mode before any timing:
    no measurement in the configured mode is made or kept, however steady it would be."""
    sets = [[1], [2]]
    prof = ScriptedProfiler([0.001], steady=0.002, reason="work on 3 parallel branches (several streams)")
    t, used = time_for_task(prof, lambda x: x, sets, "cpu", max_spread=0.05, attempts=2)
    assert used.graph and t.method == "scripted+graph" and t.attempts == 1
    assert t.mode_reason.startswith("work on 3 parallel branches") and prof.spreads == [0.001]  # never used
    # a check that fails decides nothing; a profiler without a steadier mode is not asked
    t, used = time_for_task(ScriptedProfiler([0.01], steady=0.002, reason="raise"), lambda x: x, sets, "cpu",
                            max_spread=0.05, attempts=2)
    assert not used.graph and t.mode_reason == ""
    plain = ScriptedProfiler([0.01], reason="streams")
    t, used = time_for_task(plain, lambda x: x, sets, "cpu", max_spread=0.05, attempts=2)
    assert used is plain and plain.checked == 0
    # the steadier mode cannot capture the call: a normal timing after all
    t, used = time_for_task(ScriptedProfiler([0.01], steady="fail", reason="streams"), lambda x: x, sets, "cpu",
                            max_spread=0.05, attempts=2)
    assert not used.graph and t.method == "scripted" and t.spread == 0.01


def test_baselines_record_the_switch():
    torch = pytest.importorskip("torch")
    from cuda_agent.sandbox.judge.baselines import measure_model

    sets = [[torch.randn(8)], [torch.randn(8)]]
    eager, comp, info = measure_model(torch.nn.ReLU(), sets, "cpu", ScriptedProfiler([0.3, 0.2], steady=0.001),
                                      do_compile=False, max_spread=0.05, attempts=2, perturb_inputs=True)
    assert eager.method == "scripted+graph" and comp is None
    assert info["timing_mode"].startswith("scripted+graph (unsteady: spread 20.0%")


def test_a_forked_process_opens_the_quiet_locks_anew(tmp_path, monkeypatch):
    # a candidate process forked from its worker must not take the worker's descriptor
    # numbers for the locks: it closes them, and their numbers go to the next files it opens
    import os

    from cuda_agent.sandbox.isolation import hostlock
    from cuda_agent.sandbox.isolation.forked_child import ForkedChild

    lock = tmp_path / "host.lock"
    monkeypatch.setenv(hostlock.ENV, str(lock))
    for name in ("_fds", "_opened_for", "_device_fd"):
        monkeypatch.setattr(hostlock, name, None)
    assert hostlock.open_from_env()
    parents = hostlock._fds
    out = tmp_path / "child.txt"

    def child() -> int:
        before = hostlock._fds
        hostlock.open_from_env()
        same = os.path.samestat(os.fstat(hostlock._fds[1]), os.stat(lock))
        out.write_text(f"{before} {same}")
        return 0

    with open(tmp_path / "child.log", "wb") as log:
        proc = ForkedChild.start(child, output_fd=log.fileno())
    assert proc.wait(30) == 0, (tmp_path / "child.log").read_text()
    assert out.read_text() == "None True"
    for fd in parents:
        os.close(fd)
