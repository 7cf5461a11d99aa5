"""The default GPU profiler: CUDA events around each call.

Per timed iteration, outside the timed region: the next input set of the rotation is
chosen (and, if the caller asks, changed in place so that cached results are stale) and the
L2 cache is flushed by writing a buffer twice its size. A start event is recorded on the
current stream, ``fn(*inputs)`` is called and an end event is recorded.

* Calls are queued back to back (``sync_each=False``, the default): the start event fires
  when the flush has finished, so a sample is the time from the GPU being free for the
  call to the end of its last kernel. Host-side launch overhead and Python work count
  whenever they keep the GPU waiting (the torch profiler's summed kernel time hides them).
  Synchronising around every call (``sync_each=True``) adds host wake-up jitter
  (measurements: ``docs/timing.md``).
* Work on every stream counts: the warm-up's calls are synchronised one by one, and the
  host time of its last few (just after the start event to the return of a device-wide
  synchronize) is compared with their event time. If it exceeds the event time by more than
  the synchronisation latency measured at start-up (by ``escape_slack_ms`` and 5%), work
  escaped to another stream: every timed call is then synchronised and timed on the host,
  less that latency (``method`` gets ``+host``). The decision is made before the timed
  loops, so a loop holds only its timed calls and their untimed work: a judge that bounds a
  loop by its own clock sees no calls the samples leave out.
* Warm-up runs until ``warmup_ms`` of calls and ``warmup_iters`` calls have passed (clocks
  up, caches and lazy initialisation done), and then, for at most ``settle_ms`` more, until
  the per-call times level off (:func:`settled`: two windows of ``warmup_ms / 2`` agree
  within ``settle_tol``): kernels that hold a GPU at its power limit are fast at first and
  slower once the clock falls, and a median taken in that transition depends on where the
  window falls (``docs/timing.md``). ``Timing.warmup_ms`` says how long the warm-up took.
  With ``give_up_ms`` set (the judge sets it to its bound for a hopeless candidate), the
  warm-up ends as soon as two calls in a row each took longer: nothing more is timed.
* The number of timed calls is chosen so that they add up to ``target_ms`` (between
  ``min_iters`` and ``max_iters``). The result is the median, with the interquartile range
  over the median as spread.
* ``cuda_graph``: each input set's call is captured once into a CUDA graph and the
  replays are timed -- for microsecond kernels whose launch overhead would dominate.
* :meth:`CudaEventsProfiler.steadier_reason`: a call whose captured graph has parallel
  branches (work forked onto several streams, as in cuDNN's FFT convolutions) overlaps them
  as far as the host's launches run ahead, so its event times differ between processes
  even when each process's samples agree; such a task is timed by graph replay throughout.
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable

from cuda_agent.core.types import Timing

from .. import native
from .base import (After, Prepare, ProfilerError, TimingRun, TwoPhaseProfiler, no_gc, past_give_up, settled,
                   window_calls)


def _device(device: Any):
    import torch

    if not torch.cuda.is_available():
        raise ProfilerError("cuda_events needs a CUDA GPU; use the wallclock profiler on the CPU backend")
    dev = torch.device(device if device is not None else "cuda")
    if dev.type != "cuda":
        raise ProfilerError(f"cuda_events times CUDA work, got device {dev}; use wallclock for the CPU")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


# the warm-up's last synchronised calls that decide whether work escapes to other streams
ESCAPE_PROBE = 5
_DOT_ID = r'(?:"([^"]+)"|([A-Za-z_][\w.]*))'  # a quoted or a plain DOT identifier
_DOT_EDGE = re.compile(rf"^\s*{_DOT_ID}\s*->\s*{_DOT_ID}")
_DOT_NODE = re.compile(rf"^\s*{_DOT_ID}\s*\[")
_DOT_KEYWORDS = {"graph", "node", "edge", "subgraph", "digraph"}


def parallel_branches(dot: str) -> int:
    """How many branches of a CUDA graph (as ``cudaGraphDebugDotPrint`` writes it) can run at
    once, as far as it shows in one place: the largest number of roots, of successors of a
    node or of predecessors of a node. 1 for a chain (one stream), 0 for an empty graph."""
    nodes: set[str] = set()
    succ: dict[str, int] = {}
    pred: dict[str, int] = {}
    for line in dot.splitlines():
        m = _DOT_EDGE.match(line)
        if m:
            a, b = m.group(1) or m.group(2), m.group(3) or m.group(4)
            nodes.update((a, b))
            succ[a] = succ.get(a, 0) + 1
            pred[b] = pred.get(b, 0) + 1
            continue
        m = _DOT_NODE.match(line)
        if m:
            quoted, plain = m.groups()
            if quoted or plain not in _DOT_KEYWORDS:  # graph[...] and node[...] set attributes
                nodes.add(quoted or plain)
    if not nodes:
        return 0
    roots = sum(1 for n in nodes if n not in pred)
    return max(roots, max(succ.values(), default=1), max(pred.values(), default=1))


def l2_flush_buffer(dev: Any, nbytes: int = 0):
    import torch

    if nbytes <= 0:
        l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or (64 << 20))
        nbytes = max(2 * l2, 32 << 20)
    return torch.empty(nbytes // 4, dtype=torch.int32, device=dev)


class CudaEventsProfiler(TwoPhaseProfiler):
    name = "cuda_events"
    backend = "cuda"
    description = (
        "CUDA events per call: warm-up, L2 flushed and inputs rotated between calls, all streams "
        "counted, median/spread over a set total time; optional CUDA-graph replay"
    )

    @dataclass
    class Options:
        warmup_ms: float = 100.0
        warmup_iters: int = 3
        target_ms: float = 400.0  # total timed time the iterations should add up to
        min_iters: int = 10
        max_iters: int = 2000
        flush_l2: bool = True
        flush_bytes: int = 0  # 0: twice the L2 size
        cuda_graph: bool = False
        all_streams: bool = True
        sync_each: bool = False  # True: synchronise the device around every call
        escape_slack_ms: float = 0.05
        keep_samples: int = 200
        settle_ms: float = 1500.0  # longest extra warm-up waiting for per-call times to level off
        settle_tol: float = 0.005
        give_up_ms: float = 0.0  # >0: the warm-up stops once two calls in a row each take longer

    # -- the two halves of a timing (a judge drives them separately) ------------------

    def begin(self, fn: Any, input_sets: list, device: Any = None) -> TimingRun:
        """Everything before the timed calls: the calls (captured graphs in graph mode),
        the warm-up and the synchronisation latency."""
        import torch

        o = self.options
        dev = _device(device)
        if not input_sets:
            raise ProfilerError("cuda_events: no input sets")
        with torch.cuda.device(dev):
            native.timing_for_cuda()
            flush = l2_flush_buffer(dev, o.flush_bytes) if o.flush_l2 else None
            stream = torch.cuda.current_stream(dev)
            calls, graphs, outputs = self._calls(fn, input_sets, dev)
            if graphs is not None:
                self._graphs, self._graph_outputs = graphs, outputs
            pairs: list[tuple[float, float]] = []
            est, warmup_ms, _ = self._warm_up(calls, self._measure(stream, dev, pairs))
            latency = self._sync_latency(dev, stream) if o.all_streams else 0.0
            sync_each = o.sync_each or (o.all_streams and self.escapes(pairs[-ESCAPE_PROBE:], latency))
        return TimingRun(calls=calls, input_sets=input_sets, estimate_ms=est, warmup_ms=warmup_ms,
                         method=self.name + ("+graph" if graphs is not None else ""),
                         state={"dev": dev, "stream": stream, "flush": flush, "latency": latency,
                                "sync_each": bool(sync_each)})

    def escapes(self, pairs: list[tuple[float, float]], latency: float) -> bool:
        """Whether synchronised calls' ``(event ms, host ms)`` show work left on other streams:
        a host time past the event time by more than the synchronisation ``latency`` and
        ``escape_slack_ms`` (or 5%)."""
        o = self.options
        return any(h - ev > max(o.escape_slack_ms, 0.05 * ev) + latency for ev, h in pairs)

    def loop(self, run: TimingRun, n: int, prepare: Prepare | None = None,
             after: After | None = None) -> tuple[list[float], dict]:
        """The ``n`` timed calls (compiled loop: events, L2 flush, input rotation); returns
        the per-call samples (ms) and what the loop decided (``sync_each``, ``escaped``)."""
        import torch

        o = self.options
        st = run.state
        dev, stream, flush, latency = st["dev"], st["stream"], st["flush"], st["latency"]
        calls, sets, k = run.calls, run.input_sets, len(run.calls)
        mod = native.timing_for_cuda()
        flush_args = {"flush_ptr": flush.data_ptr(), "flush_bytes": flush.numel() * flush.element_size()} if flush is not None else {}
        sync_each = bool(st.get("sync_each", o.sync_each))  # decided by the warm-up (begin)
        with torch.cuda.device(dev):
            prep = (lambda j: prepare(j, sets[j % k])) if prepare is not None else None
            with no_gc():
                dev_ms, host_ms = mod.run_loop(calls, n, prepare=prep, after=after, stream=stream.cuda_stream,
                                               sync_each=sync_each, **flush_args)
        samples, escaped = [], 0
        for ev, h in zip(dev_ms, host_ms):
            if sync_each and o.all_streams and self.escapes([(ev, h)], latency):
                escaped += 1
                samples.append(h - latency)
            else:
                samples.append(ev)
        return samples, {"sync_each": bool(sync_each), "escaped": escaped}

    def finish(self, samples: list[float], method: str, warmup_ms: float, info: dict | None = None) -> Timing:
        """The samples summarised; the method says how the loop ran: ``+sync`` when every call
        was synchronised (a synchronised call's events also hold its own launch: for a graph
        of thousands of nodes, a share of the time that calls queued back to back hide), and
        ``+host`` when most calls were then timed on the host."""
        timing = super().finish(samples, method, warmup_ms, info)
        if (info or {}).get("sync_each"):
            timing.method += "+sync"
        if (info or {}).get("escaped", 0) > len(samples) // 2:
            timing.method += "+host"  # most calls left work on other streams: host-timed
        return timing

    @staticmethod
    def _measure(stream: Any, dev: Any, pairs: list | None = None) -> Callable[[list, int], list[float]]:
        """Per-call device times of ``m`` synchronised calls (the warm-up's measurement);
        ``pairs``: where each call's ``(event ms, host ms)`` is appended."""
        mod = native.timing_for_cuda()

        def measure(calls: list, m: int) -> list[float]:
            dev_ms, host_ms = mod.run_loop(calls, m, stream=stream.cuda_stream, sync_each=True)
            if pairs is not None:
                pairs.extend(zip(dev_ms, host_ms))
            return dev_ms

        return measure

    def _warm_up(self, calls: list, measure: Callable[[list, int], list[float]],
                 clock: Callable[[], float] | None = None) -> tuple[float, float, float]:
        """Warm up (see the module's notes) calling ``calls`` in turn, ``measure(calls, m)``
        timing ``m`` of them at a time. Returns the estimate of one call, the warm-up's
        length in ms (``clock``: ms, the compiled loop's host clock by default), and its
        drift: how far the per-call time moved (relative) from the end of the fixed warm-up
        to the end of settling."""
        o = self.options
        k = len(calls)
        clock = clock or native.timing().host_ms
        t_start = clock()
        warm: list[float] = []
        first = None
        next_check = 0  # settling is checked once per window of calls, not after every call
        while True:
            # a few calls at a time: about a fiftieth of the warm-up, one call at first
            recent = statistics.median(warm[-3:]) if warm else 0.0
            m = 1 if recent <= 0 else max(1, min(64, int(o.warmup_ms / 50 / recent)))
            off = len(warm) % k
            warm.extend(measure(calls[off:] + calls[:off], m))
            elapsed = clock() - t_start
            if past_give_up(warm, o.give_up_ms):  # hopeless: timed no further
                first = None
                break
            if len(warm) >= max(o.warmup_iters, 1000):  # very fast calls: enough
                break
            if len(warm) < o.warmup_iters or elapsed < o.warmup_ms:
                continue
            if first is None:
                first = statistics.median(warm[-window_calls(warm, o.warmup_ms / 2):])
            if elapsed >= o.warmup_ms + o.settle_ms:
                break
            if len(warm) >= next_check:
                if settled(warm, o.warmup_ms / 2, o.settle_tol):
                    break
                next_check = len(warm) + window_calls(warm, o.warmup_ms / 2)
        last = statistics.median(warm[-window_calls(warm, o.warmup_ms / 2):])
        drift = abs(last - first) / first if first else 0.0
        return statistics.median(warm[-3:]), clock() - t_start, drift

    def _calls(self, fn: Any, input_sets: list, dev: Any) -> tuple[list, list | None, list | None]:
        """What a timing calls, one per input set: ``fn`` on the set, or in graph mode the
        replay of the set's captured graph (then also the graphs and their outputs)."""
        if not self.options.cuda_graph:
            return [lambda a=args: fn(*a) for args in input_sets], None, None
        graphs, outputs = self._capture(fn, input_sets, dev)
        return [_replay_of(g) for g in graphs], graphs, outputs

    def warmup_drift(self, fn: Any, input_sets: list, device: Any = None) -> float:
        """How far ``fn``'s per-call time moves while it runs on (relative): 0 when it is
        level once the fixed warm-up is over. A timing rule before settling timed such a
        call while it was still changing. Measured on what a timing in this mode calls
        (graph replays in graph mode)."""
        import torch

        dev = _device(device)
        with torch.cuda.device(dev):
            calls, graphs, outputs = self._calls(fn, input_sets, dev)
            try:
                return self._warm_up(calls, self._measure(torch.cuda.current_stream(dev), dev))[2]
            finally:
                del calls, outputs
                for g in graphs or ():
                    g.reset()

    def steadier(self) -> "CudaEventsProfiler | None":
        """CUDA-graph replay: launch timing and the interleaving of work over several streams
        (cuDNN's FFT convolutions run on three) fixed once at capture."""
        if self.options.cuda_graph:
            return None
        return CudaEventsProfiler(replace(self.options, cuda_graph=True))

    def steadier_reason(self, fn: Any, input_sets: list, device: Any = None) -> str:
        """Non-empty when one call, captured into a CUDA graph, has parallel branches."""
        import torch

        if self.options.cuda_graph or not input_sets:
            return ""
        dev = _device(device)
        with torch.cuda.device(dev):
            dot = self._graph_dot(fn, input_sets[0], dev)
        n = parallel_branches(dot)
        return f"work on {n} parallel branches (several streams)" if n > 1 else ""

    def method_name(self) -> str:
        return self.name + ("+graph" if self.options.cuda_graph else "")

    @staticmethod
    def _graph_dot(fn: Any, args: list, dev: Any) -> str:
        """The DOT text of one call captured into a CUDA graph (after a warm-up call).

        The graph is kept after capture (``keep_graph``) so that its topology can be
        printed, not through torch's debug mode where ``keep_graph`` exists: that mode is
        the process's, not the graph's, and the trusted side's timings should capture as
        the candidate's process does. torch's ``debug_dump`` is tried first, then the CUDA
        runtime's ``cudaGraphDebugDotPrint`` on the raw graph. Raises :class:`ProfilerError` naming
        what was tried when neither writes the file."""
        import torch

        CudaEventsProfiler._warm_up_for_capture(fn, [args], dev)
        try:
            g = torch.cuda.CUDAGraph(keep_graph=True)
        except TypeError:  # torch before keep_graph: only its debug mode keeps the graph, and
            g = torch.cuda.CUDAGraph()  # that mode is the whole process's (every later capture
            g.enable_debug_mode()  # keeps its graph too), so it is used only where it must be
        out = None
        try:
            with torch.cuda.graph(g):
                out = fn(*args)
            torch.cuda.synchronize(dev)
            with tempfile.TemporaryDirectory(prefix="cuda-graph-") as tmp, warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")  # torch announces every dump; kept out of the logs
                path = os.path.join(tmp, "graph.dot")
                tried = ["torch debug_dump"]
                g.debug_dump(path)
                if not os.path.exists(path):
                    tried.append(_dot_print(g, path))
                if not os.path.exists(path):
                    told = "; ".join(dict.fromkeys(" ".join(str(w.message).split()) for w in said))
                    raise ProfilerError(f"cuda_events: the captured graph could not be printed as DOT "
                                        f"(tried {', '.join(tried)}){'; torch said: ' + told if told else ''}")
                with open(path, errors="replace") as fh:
                    return fh.read()
        finally:
            del out
            try:
                g.reset()
            except Exception:  # a failed capture leaves nothing to free
                pass

    @staticmethod
    def _sync_latency(dev: Any, stream: Any) -> float:
        """Median of (host time - event time) for a tiny kernel: the cost of seeing the end."""
        import torch

        x = torch.empty(1, device=dev)
        dev_ms, host_ms = native.timing_for_cuda().run_loop([x.zero_], 25, stream=stream.cuda_stream, sync_each=True)
        return statistics.median(max(0.0, h - e) for e, h in zip(dev_ms, host_ms))

    def replay_output(self, index: int = 0) -> Any:
        """In graph mode, after :meth:`time`: replay the graph of input set ``index`` on its
        inputs as they are now and return what it wrote (its static outputs), so that a
        caller can check what was timed (a call that ran different work while being
        captured is caught); None when nothing was captured."""
        import torch

        graphs = getattr(self, "_graphs", None)
        if not graphs:
            return None
        graphs[index].replay()
        torch.cuda.synchronize()
        return self._graph_outputs[index]

    @staticmethod
    def _warm_up_for_capture(fn: Any, input_sets: list, dev: Any) -> None:
        """One call per input set on a side stream, outside any capture: lazy initialisation
        and workspace allocations (cuBLAS, cuDNN) must not happen while capturing."""
        import torch

        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for args in input_sets:
                fn(*args)
        torch.cuda.current_stream(dev).wait_stream(side)
        torch.cuda.synchronize(dev)

    @staticmethod
    def _capture(fn: Any, input_sets: list, dev: Any) -> tuple[list, list]:
        import torch

        graphs, outputs = [], []
        CudaEventsProfiler._warm_up_for_capture(fn, input_sets, dev)
        for args in input_sets:
            g = torch.cuda.CUDAGraph()
            try:
                with warnings.catch_warnings(record=True) as said:
                    warnings.simplefilter("always")
                    with torch.cuda.graph(g):
                        outputs.append(fn(*args))
            except Exception as exc:
                raise ProfilerError(f"cuda_events: CUDA-graph capture failed ({type(exc).__name__}: {exc}); time without cuda_graph") from exc
            if any("graph is empty" in str(w.message).lower() for w in said):
                # the call's kernels went to another stream (the legacy default one): replays
                # would run nothing; such a call is timed without graphs
                raise ProfilerError("cuda_events: the captured CUDA graph is empty (the call launches its kernels on "
                                    "another stream than torch's current one); timed without cuda_graph")
            graphs.append(g)
        torch.cuda.synchronize(dev)
        return graphs, outputs


def _replay_of(graph: Any) -> Any:
    """The graph's replay as torch's compiled method (not the Python wrapper a module
    attribute could replace)."""
    import torch

    base = getattr(getattr(torch, "_C", None), "_CUDAGraph", None)
    replay = getattr(base, "replay", None)
    return replay.__get__(graph) if replay is not None else graph.replay


def _dot_print(graph: Any, path: str) -> str:
    """Print a kept CUDA graph (``raw_cuda_graph``) as DOT through the CUDA runtime loaded
    in this process; returns what was tried, with its outcome when it failed."""
    import ctypes

    what = "cudaGraphDebugDotPrint"
    try:
        raw = graph.raw_cuda_graph()
    except Exception as exc:
        return f"{what} (no raw graph: {exc})"
    lib_path = native.loaded_library("libcudart.so")
    if lib_path is None:
        return f"{what} (libcudart is not loaded in this process)"
    try:
        fn = ctypes.CDLL(lib_path).cudaGraphDebugDotPrint
    except (OSError, AttributeError) as exc:
        return f"{what} ({exc})"
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(ctypes.c_void_p(int(raw)), path.encode(), 1)  # 1: cudaGraphDebugDotFlagsVerbose
    return what if rc == 0 else f"{what} (CUDA error {rc})"
