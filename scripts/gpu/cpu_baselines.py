#!/usr/bin/env python3
"""Eager against torch.compile on the CPU backend, under different thread counts.

The CPU backend's baselines are timed under one explicit thread count (``cpu_threads``,
default 1; see ``cuda_agent/sandbox/judge/baselines/cpu_threads.py``). This script shows why on a many-core
host: for a few small element-wise models it times eager and compiled with the wall-clock
profiler (the same code as the baselines: ``measure_model``) at torch's default thread count
and at one thread, idle and with ``--busy N`` processes spinning beside it (another job, a
worker starting), and prints the compile/eager ratio of each. The ratio should not depend
on the thread setting by orders of magnitude; at the default thread count it does once the
cores are shared.

    python3 scripts/gpu/cpu_baselines.py              # idle, then with 2 busy processes
    python3 scripts/gpu/cpu_baselines.py --busy 0     # idle only

Prints one table; writes the rows as JSON to $OUT/cpu_baselines.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for sub in ("packages/core/src", "packages/sandbox/src"):
    p = str(REPO / sub)
    if p not in sys.path:
        sys.path.insert(0, p)


def models():
    import torch

    class Add(torch.nn.Module):
        def forward(self, a, b):
            return a + b

    class HardSwishAffine(torch.nn.Module):  # the bundled demo's model
        def forward(self, x):
            y = torch.clamp(x + 3.0, 0.0, 6.0)
            y = x * y / 6.0
            return y * 1.5 + 0.25

    return [
        ("add 4096", Add(), lambda: [torch.rand(4096), torch.rand(4096)]),
        ("add 1M", Add(), lambda: [torch.rand(1 << 20), torch.rand(1 << 20)]),
        ("hardswish+affine 2048x2048", HardSwishAffine(), lambda: [torch.randn(2048, 2048)]),
    ]


def spin(n: int) -> list[subprocess.Popen]:
    code = "import time\nt=time.time()\nwhile time.time()-t<600: pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, default=2, help="also measure with this many spinning processes (0: idle only)")
    ap.add_argument("--target-ms", type=float, default=300.0)
    args = ap.parse_args()

    import torch

    from cuda_agent.sandbox.judge.baselines import measure_model
    from cuda_agent.sandbox.judge.profilers import get_profiler

    prof = get_profiler("wallclock", {"target_ms": args.target_ms, "warmup_ms": 50, "max_iters": 2000})
    default_threads = torch.get_num_threads()
    rows = []
    loads = [0] + ([args.busy] if args.busy > 0 else [])
    for busy in loads:
        procs = spin(busy)
        try:
            time.sleep(0.5 if busy else 0)
            for name, model, make in models():
                sets = [make() for _ in range(4)]
                for threads in (0, 1):
                    torch._dynamo.reset()
                    t0 = time.perf_counter()
                    eager, comp, info = measure_model(model, sets, "cpu", prof, True, "default", threads)
                    rows.append({
                        "model": name, "busy": busy, "threads": info.get("cpu_threads"),
                        "eager_ms": eager.median_ms, "eager_spread": eager.spread,
                        "compile_ms": comp.median_ms if comp else None, "compile_spread": comp.spread if comp else None,
                        "ratio": (comp.median_ms / eager.median_ms) if comp and eager.median_ms else None,
                        "recompiles_during_timing": info.get("compile_recompiles_during_timing"),
                        "seconds": round(time.perf_counter() - t0, 1), "error": info.get("compile_error"),
                    })
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            for p in procs:
                p.kill()
    out = os.environ.get("OUT")
    if out:
        Path(out, "cpu_baselines.json").write_text(json.dumps({"cores": os.cpu_count(), "default_threads": default_threads,
                                                               "torch": torch.__version__, "rows": rows}, indent=1))
    print(f"\nCPU baselines, torch {torch.__version__}, {os.cpu_count()} cores, default threads {default_threads}")
    print(f"{'model':<28} {'busy':>4} {'threads':>7} {'eager ms':>10} {'compile ms':>11} {'compile/eager':>14} {'recompiles':>10}")
    for r in rows:
        comp = f"{r['compile_ms']:.4g}" if r["compile_ms"] is not None else "-"
        ratio = f"{r['ratio']:.3g}" if r["ratio"] is not None else "-"
        print(f"{r['model']:<28} {r['busy']:>4} {r['threads']:>7} {r['eager_ms']:>10.4g} {comp:>11} {ratio:>14} "
              f"{r['recompiles_during_timing'] if r['recompiles_during_timing'] is not None else '-':>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
