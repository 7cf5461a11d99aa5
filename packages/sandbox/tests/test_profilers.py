"""Profiler plugins: wallclock for real on the CPU; cuda_events / torch_profiler / ncu on a GPU."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cuda_agent.core.plugins import get_plugin_manager  # noqa: E402
from cuda_agent.sandbox.judge.profilers import (
    CudaEventsProfiler,
    NsightComputeProfiler,
    ProfilerError,
    TorchProfilerProfiler,
    WallclockProfiler,
    get_profiler,
    parse_ncu_csv,
    summarize,
)

sys.path.insert(0, str(Path(__file__).parent))


def test_profilers_are_registered_plugins():
    names = set(get_plugin_manager().components("profiler"))
    assert {"cuda_events", "torch_profiler", "nsight_compute", "wallclock"} <= names
    p = get_profiler("wallclock", {"target_ms": 5})
    assert isinstance(p, WallclockProfiler) and p.options.target_ms == 5


def test_wallclock_measures_and_rotates_inputs():
    seen = []
    prepared = []

    def fn(tag):
        seen.append(tag)
        time.sleep(0.002)

    p = WallclockProfiler(WallclockProfiler.Options(warmup_iters=1, warmup_ms=0, target_ms=30, min_iters=6, max_iters=50))
    t = p.time(fn, [["a"], ["b"], ["c"]], "cpu", prepare=lambda i, args: prepared.append((i, args[0])))
    assert t.method == "wallclock"
    assert 1.9 <= t.median_ms < 20
    assert t.iterations >= 6 and len(t.samples_ms) == t.iterations
    timed = seen[-t.iterations:]
    assert set(timed) == {"a", "b", "c"}  # rotation
    assert prepared[:3] == [(0, "a"), (1, "b"), (2, "c")]  # prepare sees the set about to be timed


def test_wallclock_iterations_follow_the_target():
    p = WallclockProfiler(WallclockProfiler.Options(warmup_iters=1, warmup_ms=0, target_ms=20, min_iters=3, max_iters=1000))
    t = p.time(lambda: time.sleep(0.004), [[]], "cpu")
    assert 3 <= t.iterations <= 8


def test_wallclock_warm_up_stops_after_two_calls_past_the_give_up_bound():
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.012)

    o = dict(warmup_iters=6, warmup_ms=0, target_ms=20, min_iters=3, max_iters=10)
    run = WallclockProfiler(WallclockProfiler.Options(give_up_ms=5.0, **o)).begin(slow, [[]], "cpu")
    assert len(calls) == 2 and run.estimate_ms > 5.0
    calls.clear()
    run = WallclockProfiler(WallclockProfiler.Options(**o)).begin(slow, [[]], "cpu")  # no bound: the full warm-up
    assert len(calls) == 6
    calls.clear()
    run = WallclockProfiler(WallclockProfiler.Options(give_up_ms=1000.0, **o)).begin(slow, [[]], "cpu")
    assert len(calls) == 6 and run.estimate_ms < 1000.0  # under the bound: the full warm-up


def test_summarize_median_and_spread():
    t = summarize([1.0, 2.0, 3.0, 4.0, 100.0], "x")
    assert t.median_ms == 3.0 and t.iterations == 5
    assert 0 < t.spread < 1.5


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_gpu_profilers_refuse_without_cuda():
    for cls in (CudaEventsProfiler, TorchProfilerProfiler):
        with pytest.raises(ProfilerError):
            cls().time(lambda: None, [[]], "cpu")
    with pytest.raises(ProfilerError):
        NsightComputeProfiler().time(lambda: None, [[]])


def test_nsight_compute_needs_ncu(tmp_path):
    from cuda_agent.sandbox.judge.profilers.nsight_compute import analyze

    with pytest.raises(ProfilerError, match="ncu not found"):
        analyze(tmp_path, "cuda", options=NsightComputeProfiler.Options(ncu=str(tmp_path / "no-ncu")))


def test_parse_ncu_csv():
    text = textwrap.dedent('''\
        ==PROF== Connected to process 1234
        "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum","launch__registers_per_thread","sm__throughput.avg.pct_of_peak_sustained_elapsed"
        "","","","","","","","","","","","usecond","register/thread","%"
        "0","1234","python","h","relu_kernel(const float *, float *, long)","1","7","(256, 1, 1)","(1024, 1, 1)","0","9.0","12.35","16","45.1"
        "1","1234","python","h","gemm_kernel","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","1,250.00","128","88.0"
        ==PROF== Disconnected
    ''')
    rows = parse_ncu_csv(text)
    assert len(rows) == 2
    assert rows[0]["kernel"].startswith("relu_kernel") and rows[0]["block_size"] == "(256, 1, 1)"
    assert rows[0]["duration_ms"] == pytest.approx(0.01235)
    assert rows[1]["duration_ms"] == pytest.approx(1.25)
    assert rows[1]["registers_per_thread"] == 128 and rows[1]["sm_throughput_pct"] == 88.0


# --- GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_events_times_a_matmul():
    a = torch.randn(2048, 2048, device="cuda")
    sets = [[a, torch.randn(2048, 2048, device="cuda")] for _ in range(2)]
    p = CudaEventsProfiler(CudaEventsProfiler.Options(target_ms=100))
    t = p.time(torch.matmul, sets, "cuda")
    assert t.median_ms > 0.01 and t.iterations >= 10 and t.spread < 0.2
    # warmed up for at least the fixed warm-up, at most that plus the settling allowance
    o = p.options
    assert o.warmup_ms <= t.warmup_ms <= o.warmup_ms + o.settle_ms + 100
    assert 0.0 <= p.warmup_drift(torch.matmul, sets, "cuda") < 0.5
    gp = CudaEventsProfiler(CudaEventsProfiler.Options(target_ms=100, cuda_graph=True))
    g = gp.time(torch.matmul, sets, "cuda")
    assert g.method.startswith("cuda_events+graph") and 0.5 < g.median_ms / t.median_ms < 1.5
    assert 0.0 <= gp.warmup_drift(torch.matmul, sets, "cuda") < 0.5  # on graph replays
    tp = TorchProfilerProfiler(TorchProfilerProfiler.Options(target_ms=50, repeats=3)).time(torch.matmul, sets, "cuda")
    assert 0.5 < tp.median_ms / t.median_ms < 1.5


@pytest.mark.gpu
def test_cuda_events_counts_work_on_other_streams():
    side = torch.cuda.Stream()
    x = torch.randn(4096, 4096, device="cuda")

    def on_current(x):
        return x @ x

    def escaping(x):  # launches on a side stream and returns without joining it
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x @ x
        return y

    base = CudaEventsProfiler(CudaEventsProfiler.Options(target_ms=100)).time(on_current, [[x]], "cuda")
    seen = CudaEventsProfiler(CudaEventsProfiler.Options(target_ms=100)).time(escaping, [[x]], "cuda")
    blind = CudaEventsProfiler(CudaEventsProfiler.Options(target_ms=100, all_streams=False)).time(escaping, [[x]], "cuda")
    assert seen.median_ms > 0.7 * base.median_ms
    assert blind.median_ms < 0.5 * base.median_ms


# cudaGraphDebugDotPrint's shape: a cluster per graph, nodes with attributes, then edges
CHAIN_DOT = """digraph dot {
subgraph cluster_1 {
label="graph_1" graph[style="dashed"];
"graph_1_node_0"[style="solid" shape="rectangle" label="0
KERNEL
vectorized_elementwise_kernel"];
"graph_1_node_1"[style="solid" shape="rectangle" label="1
MEMSET"];
"graph_1_node_0" -> "graph_1_node_1" [headlabel=0];
"graph_1_node_2"[style="solid" shape="rectangle" label="2
KERNEL"];
"graph_1_node_1" -> "graph_1_node_2" [headlabel=0];
}
}
"""

FORK_DOT = CHAIN_DOT.replace(
    '"graph_1_node_1" -> "graph_1_node_2" [headlabel=0];',
    '"graph_1_node_0" -> "graph_1_node_2" [headlabel=0];\n"graph_1_node_3"[label="3"];\n'
    '"graph_1_node_1" -> "graph_1_node_3";\n"graph_1_node_2" -> "graph_1_node_3";',
)


def test_parallel_branches_of_a_graph():
    from cuda_agent.sandbox.judge.profilers.cuda_events import parallel_branches

    assert parallel_branches(CHAIN_DOT) == 1
    assert parallel_branches(FORK_DOT) == 2  # node 0 forks to 1 and 2, which join at 3
    two_roots = 'digraph dot {\n"a"[label="x"];\n"b"[label="y"];\n"c"[label="z"];\n"a" -> "c";\n"b" -> "c";\n}'
    assert parallel_branches(two_roots) == 2
    lone = 'digraph dot {\n"a"[label="x"];\n"b"[label="y"];\n}'
    assert parallel_branches(lone) == 2  # two nodes with nothing between them run at once
    assert parallel_branches("digraph dot {\n}\n") == 0
    # plain identifiers, attribute statements that are not nodes
    plain = "digraph g {\ngraph[style=dashed];\nnode[shape=box];\nn0[label=a];\nn1[label=b];\nn2[label=c];\nn0 -> n1;\nn1 -> n2;\n}"
    assert parallel_branches(plain) == 1
    assert parallel_branches(plain.replace("n1 -> n2;", "n0 -> n2;")) == 2


def test_only_cuda_events_has_a_reason_up_front():
    assert WallclockProfiler().steadier_reason(torch.relu, [[torch.randn(4)]], "cpu") == ""
    graph = CudaEventsProfiler(CudaEventsProfiler.Options(cuda_graph=True))
    assert graph.steadier() is None and graph.steadier_reason(torch.relu, [[torch.randn(4)]], "cuda") == ""


@pytest.mark.gpu
def test_work_forked_onto_a_second_stream_is_timed_by_graph_replay():
    from cuda_agent.sandbox.judge.profilers.base import time_for_task

    side = torch.cuda.Stream()
    x = torch.randn(2048, 2048, device="cuda")

    def chain(x):
        return (x @ x).relu_()

    def forked(x):  # half the work on a side stream, joined before returning
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x @ x
        z = x.sin()
        torch.cuda.current_stream().wait_stream(side)
        return y + z

    prof = CudaEventsProfiler(CudaEventsProfiler.Options(target_ms=50))
    assert prof.steadier_reason(chain, [[x]], "cuda") == ""
    assert prof.steadier_reason(forked, [[x]], "cuda").startswith("work on 2 parallel branches")
    t, used = time_for_task(prof, forked, [[x]], "cuda", None, 0.01, 3)
    assert used.options.cuda_graph and t.method == "cuda_events+graph" and "parallel" in t.mode_reason
    t, used = time_for_task(prof, chain, [[x]], "cuda", None, 0.01, 3)
    assert not used.options.cuda_graph and t.method == "cuda_events"
    # the check printed its graph without torch's debug mode, which is the whole process's
    # (the trusted side's baselines would capture otherwise than the candidate's process):
    # a later graph, captured plainly, still cannot be dumped
    import os
    import tempfile
    import warnings

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        chain(x)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        g.debug_dump(os.path.join(tmp, "g.dot"))
        dumped = os.path.exists(os.path.join(tmp, "g.dot"))
    told = [str(w.message) for w in said]
    assert not dumped and any("not enabled" in m for m in told), told


def test_settled_waits_for_per_call_times_to_level_off():
    from cuda_agent.sandbox.judge.profilers.base import settled, window_calls

    # 1 ms calls, 10 ms windows: ten calls each
    assert window_calls([1.0] * 5, 10.0) == 10 and window_calls([50.0] * 3, 10.0) == 2
    assert not settled([1.0] * 19, 10.0, 0.005)  # not yet two windows
    assert settled([1.0] * 20, 10.0, 0.005)
    falling_clock = [1.0] * 10 + [1.06] * 10  # faster at first, then throttled
    assert not settled(falling_clock, 10.0, 0.005)
    assert settled(falling_clock + [1.06] * 10, 10.0, 0.005)
    noisy_but_level = [0.98, 1.02] * 10
    assert settled(noisy_but_level, 10.0, 0.005)
    # long host-bound calls that scatter by 3%: two windows of two calls cannot resolve 0.5%
    assert settled([90.0, 93.0, 92.0, 89.5], 100.0, 0.005)
    assert not settled([90.0, 90.2, 96.0, 96.1], 100.0, 0.005)  # tight calls, clearly slower


class _FakeGpuClock:
    """Stands in for the GPU in cuda_events' warm-up loop: each call takes the next scripted
    time on a fake clock that the warm-up's measurement and its host clock both read (the
    loop's logic is what is tested here; the GPU test times a real matmul)."""

    def __init__(self, call_ms):
        self.call_ms = call_ms
        self.now = 0.0
        self.calls = 0

    def measure(self, calls, m):
        out = []
        for _ in range(m):
            ms = self.call_ms(self.calls)
            self.now += ms
            self.calls += 1
            out.append(ms)
        return out

    def clock(self):
        return self.now


def _warm_up_on(call_ms, monkeypatch, **options):
    gpu = _FakeGpuClock(call_ms)
    p = CudaEventsProfiler(CudaEventsProfiler.Options(warmup_ms=20.0, settle_tol=0.005, **options))
    est, warmup_ms, drift = p._warm_up([lambda: None], gpu.measure, gpu.clock)
    return est, warmup_ms, drift, gpu.calls


def test_warm_up_waits_for_a_falling_clock_and_reports_the_drift(monkeypatch):
    # 1 ms per call at first; from the 15th call on the clock falls and calls take 1.06 ms
    est, warmup_ms, drift, calls = _warm_up_on(lambda i: 1.0 if i < 15 else 1.06, monkeypatch, settle_ms=500.0)
    assert est == pytest.approx(1.06)
    assert 0.02 < drift < 0.07  # measured from the fixed warm-up's end (mid-fall) to level
    assert 20.0 < warmup_ms < 60.0 and calls > 20


def test_warm_up_of_a_level_call_ends_with_the_fixed_warm_up(monkeypatch):
    est, warmup_ms, drift, calls = _warm_up_on(lambda i: 1.0, monkeypatch, settle_ms=500.0)
    assert est == pytest.approx(1.0) and drift == 0.0
    assert warmup_ms == pytest.approx(20.0, abs=1.01)


def test_warm_up_of_a_hopeless_call_stops_after_two_calls_past_the_bound(monkeypatch):
    est, warmup_ms, drift, calls = _warm_up_on(lambda i: 50.0, monkeypatch, give_up_ms=10.0)
    assert calls == 2 and est == pytest.approx(50.0) and warmup_ms == pytest.approx(100.0)
    # without the bound the same call is warmed up in full (three calls, then settling)
    assert _warm_up_on(lambda i: 50.0, monkeypatch)[3] >= 4
    # one slow first call (a compile, lazy initialisation) never decides it
    est, warmup_ms, drift, calls = _warm_up_on(lambda i: 50.0 if i == 0 else 1.0, monkeypatch, give_up_ms=10.0)
    assert calls > 3 and est == pytest.approx(1.0)
    # nor do calls under the bound, however slow
    assert _warm_up_on(lambda i: 9.0, monkeypatch, give_up_ms=10.0)[3] >= 4


def test_warm_up_gives_up_settling_after_settle_ms(monkeypatch):
    # a call that keeps getting slower never levels off: warm-up stops at warmup_ms + settle_ms
    est, warmup_ms, drift, calls = _warm_up_on(lambda i: 1.0 + 0.01 * i, monkeypatch, settle_ms=100.0)
    assert 120.0 <= warmup_ms < 125.0 and drift > 0.5


class _FakeTimingLoop:
    """Stands in for the compiled timing loop on a GPU: records every run and reports
    each call at 1 ms on the device and 1.02 ms on the host (what is tested here is which
    calls a timed loop makes; the GPU tests time real kernels)."""

    def __init__(self):
        self.runs = []

    def run_loop(self, calls, n, prepare=None, after=None, stream=None, sync_each=False, **_flush):
        self.runs.append((n, sync_each))
        for j in range(n):
            if prepare is not None:
                prepare(j)
            if after is not None:
                after(j, None)
        return [1.0] * n, [1.02] * n


def test_a_timed_loop_makes_only_its_timed_calls(monkeypatch):
    """A loop's calls are the ones it reports: whether work escapes to other streams is decided
    by the warm-up (begin), not by untimed calls inside the loop, which a judge bounding the
    loop by its own clock would charge to the candidate (5 calls' worth a loop on an H100)."""
    from types import SimpleNamespace

    from cuda_agent.sandbox.judge.profilers import cuda_events
    from cuda_agent.sandbox.judge.profilers.base import TimingRun

    fake = _FakeTimingLoop()
    monkeypatch.setattr(cuda_events.native, "timing_for_cuda", lambda: fake)
    p = CudaEventsProfiler(CudaEventsProfiler.Options(flush_l2=False))
    for decided in (False, True):
        state = {"dev": -1, "stream": SimpleNamespace(cuda_stream=0), "flush": None, "latency": 0.01,
                 "sync_each": decided}
        run = TimingRun(calls=[lambda: None], input_sets=[[]], estimate_ms=1.0, warmup_ms=10.0,
                        method="cuda_events", state=state)
        fake.runs.clear()
        samples, info = p.loop(run, 7, prepare=lambda j, s: None, after=lambda j, out: None)
        assert fake.runs == [(7, decided)] and len(samples) == 7 and info["sync_each"] is decided
    # what the warm-up's synchronised calls decide: host time past events and latency escapes
    assert not p.escapes([(1.0, 1.02)] * 5, latency=0.01)
    assert p.escapes([(1.0, 1.02)] * 4 + [(1.0, 1.5)], latency=0.01)
    # and a timing says how its loop ran
    assert p.finish([1.0] * 7, "cuda_events+graph", 10.0, {"sync_each": False, "escaped": 0}).method == "cuda_events+graph"
    assert p.finish([1.0] * 7, "cuda_events", 10.0, {"sync_each": True, "escaped": 3}).method == "cuda_events+sync"
    assert p.finish([1.0] * 7, "cuda_events", 10.0, {"sync_each": True, "escaped": 4}).method == "cuda_events+sync+host"
