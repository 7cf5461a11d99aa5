"""Known attacks on the judge, written as candidate code.

Each :class:`Attack` is a fragment for an otherwise honest candidate module: code run when it
is imported (``at_import``), a line at the top of ``forward`` (``in_forward``) and what
``forward`` returns (``ret``; ``y`` is the honest result, ``x`` the input). The test suite
(``packages/sandbox/tests/test_judge_attacks.py``) runs them on the CPU backend and
``scripts/gpu/judge_checks.py`` on a GPU; each must be refused or timed like the honest kernel.
``static``: whether the static checks stay on (most attacks switch them off, to test what is
behind them).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

# the candidate switches off the harness's own integrity check first
BLIND = "import cuda_agent.sandbox.judge.integrity as _I\n_I.tampered = lambda *a, **k: []\n"


@dataclass(frozen=True)
class Attack:
    name: str
    kind: str  # verify | profile
    at_import: str = ""
    in_forward: str = "pass"
    ret: str = "y"
    static: bool = False
    what: str = ""

    def options(self) -> dict:
        """The job's options (the static checks belong to verification; profiling has none)."""
        return {} if self.static or self.kind != "verify" else {"static_checks": []}


def _dedent(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n"


TIMER_PATCHES = (
    Attack("perf_counter", "profile", BLIND + "import time\n_real = time.perf_counter\ntime.perf_counter = lambda: _real() / 8",
           what="Python's clock runs 8x slow"),
    Attack("cuda_event", "profile", BLIND + _dedent('''
        import torch
        _real = torch.cuda.Event.elapsed_time
        torch.cuda.Event.elapsed_time = lambda self, end: _real(self, end) / 8
    '''), what="torch.cuda.Event reports an eighth"),
    Attack("profiler_loop", "profile", BLIND + _dedent('''
        from cuda_agent.sandbox.judge.profilers import cuda_events as _e, wallclock as _w
        for _cls in (_e.CudaEventsProfiler, _w.WallclockProfiler):
            def _fast(self, *a, _real=_cls.loop, **k):
                s, i = _real(self, *a, **k)
                return [x / 8 for x in s], i
            _cls.loop = _fast
    '''), what="the profiler's loop divides its samples by 8"),
    Attack("native_module", "profile", BLIND + _dedent('''
        from cuda_agent.sandbox.judge import native as _n
        _real = _n.timing()
        class _Fake:
            host_ms = staticmethod(_real.host_ms)
            init_cuda = staticmethod(_real.init_cuda)
            @staticmethod
            def run_loop(*a, **k):
                d, h = _real.run_loop(*a, **k)
                return ([x / 8 for x in d] if d is not None else None), [x / 8 for x in h]
        _n._loaded = _Fake
    '''), what="the compiled loop is swapped for one that divides by 8"),
)

FORGED_REPLIES = (
    Attack("forged_reply", "profile", BLIND + _dedent('''
        import sys
        _C = sys.modules["__main__"]  # the candidate process's own command table
        _real = _C._COMMANDS["loop"]
        def _forged(st, msg):
            r = _real(st, msg)
            r["samples"] = [x / 8 for x in r["samples"]]
            return r
        _C._COMMANDS["loop"] = _forged
    '''), what="the reply to the trusted side reports an eighth of the measured times"),
    Attack("skipped_calls", "profile", BLIND + _dedent('''
        import sys
        _C = sys.modules["__main__"]
        _real = _C._COMMANDS["loop"]
        def _lazy(st, msg):
            n = msg["n"]
            r = _real(st, {**msg, "n": 1})
            r["samples"] = [r["samples"][0] / n] * n  # as long as the one call took: fits the clock
            r["checksums"] = r["checksums"] * n
            return r
        _C._COMMANDS["loop"] = _lazy
    '''), what="one call is run and reported as n"),
)

VERDICT_ATTACKS = (
    Attack("compare_code_swap", "verify", BLIND + _dedent('''
        import cuda_agent.sandbox.judge.comparison as _c
        def _always(*a, **k):
            return _c.Comparison(ok=True)
        _c.compare_outputs.__code__ = _always.__code__
        _c.compare_tensors.__code__ = _always.__code__
    '''), ret="x", what="a wrong kernel (returns its input) rewrites the comparison in place"),
    Attack("steal_reference", "verify", BLIND + _dedent('''
        import gc
        import torch
        def _stolen(x):
            for o in gc.get_objects():
                if isinstance(o, torch.Tensor) and o.shape == x.shape and o.data_ptr() != x.data_ptr():
                    return o
            return torch.zeros_like(x)
    '''), in_forward="return _stolen(x)", what="looks for the reference's output in its own process"),
    Attack("harness_import", "verify", BLIND, static=True, what="imports the harness (static checks on)"),
)

ALL = TIMER_PATCHES + FORGED_REPLIES + VERDICT_ATTACKS
