"""What measuring one task's baselines costs, phase by phase, each task in a fresh process (as
a judge job measures them), under inductor's compile settings side by side.

For every task: the process start (imports), building the reference and drawing its input
sets, the eager timing, ``torch.compile`` (code generation and the warm-up calls) and the
compiled timing, with the baseline cache empty and inductor's own on-disk caches empty (each
task and variant gets a cache folder of its own). ``--threads default,1`` compares inductor's
parallel compile workers (a pool of processes started at the first compile) with compiling in
the job's own process (``TORCHINDUCTOR_COMPILE_THREADS=1``); ``preload`` imports inductor's
modules before the measurement starts (as a fork server that preloads them would); ``warm`` measures the
task a second time with inductor's caches left by a first measurement (what a job would pay
if the code generation had been done beforehand, in another process).

    python3 scripts/gpu/bench_baseline_cost.py --ids 'L1/19_ReLU,L2/12_*' --threads default,1

KernelBench is found by --root or $CUDA_AGENT_KERNELBENCH. With OUT set, the rows are written
to ``$OUT/bench_baseline_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CHILD = r'''
import json, sys, time
t0 = time.perf_counter()
import torch
from cuda_agent.sandbox.judge.baselines import BaselineOptions, measure_baselines_record
from cuda_agent.sandbox.judge.baselines.cache import BaselineCache
from cuda_agent.sandbox.judge.baselines import reference as ref
code, cache, variant, device = sys.argv[1:5]
if device != "cpu":
    torch.cuda.init()
imported = time.perf_counter() - t0
phases = {}
if variant == "preload":  # inductor's modules imported before the measurement
    t = time.perf_counter()
    import torch._inductor.compile_fx, torch._inductor.codegen.triton, torch._inductor.runtime.triton_heuristics
    phases["inductor_imports"] = round(time.perf_counter() - t, 2)
orig_sets = ref.rotation_sets
def timed_sets(*a, **k):
    t = time.perf_counter()
    out = orig_sets(*a, **k)
    if device != "cpu":
        torch.cuda.synchronize()
    phases["inputs"] = round(time.perf_counter() - t, 2)
    return out
ref.rotation_sets = timed_sets
import cuda_agent.sandbox.judge.baselines.measure as m
m.rotation_sets = timed_sets
t1 = time.perf_counter()
eager, comp, rec = measure_baselines_record(open(code).read(), device, BaselineOptions(cache_dir=cache), BaselineCache(cache))
total = time.perf_counter() - t1
print(json.dumps({"imports": round(imported, 2), "measure": round(total, 2), "record_seconds": rec.get("seconds"),
                  "compile_seconds": rec.get("compile_seconds"), "eager_ms": eager.median_ms,
                  "compile_ms": comp.median_ms if comp else None, "eager_attempts": eager.attempts,
                  "compile_attempts": comp.attempts if comp else None, "eager_spread": eager.spread,
                  "input_sets": rec.get("input_sets"), "timing_mode": rec.get("timing_mode"), **phases}))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", default="L1/19_ReLU,L1/23_Softmax,L2/12_*,L2/1_*", help="task ids (globs), comma-separated")
    ap.add_argument("--threads", default="default,1,preload,warm",
                    help="variants: inductor compile threads ('default': torch's), 'preload' (inductor imported "
                         "first) or 'warm' (inductor's caches filled)")
    ap.add_argument("--root")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to try the script where no GPU is")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per task and variant")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "scripts" / "gpu"))
    from bench_judge_throughput import tasks_matching

    chosen = tasks_matching(args.root, args.ids)
    rows = []
    work = Path(tempfile.mkdtemp(prefix="baseline-cost-"))
    for variant in [v.strip() for v in args.threads.split(",") if v.strip()]:
        env = dict(os.environ)
        if variant not in ("default", "warm", "preload"):
            env["TORCHINDUCTOR_COMPILE_THREADS"] = variant
        for t in chosen:
            name = t.id.replace('/', '_')
            code = work / f"{name}.py"
            code.write_text(t.code)
            env["TORCHINDUCTOR_CACHE_DIR"] = str(work / f"inductor-{variant}-{name}")
            runs = ["fill", "warm"] if variant == "warm" else [variant]
            for run in runs:
                cache = work / f"cache-{run}-{name}"
                t0 = time.perf_counter()
                try:
                    p = subprocess.run([sys.executable, "-c", _CHILD, str(code), str(cache), variant, args.device], env=env, text=True,
                                       capture_output=True, timeout=args.timeout)
                    line = (p.stdout.strip().splitlines() or [""])[-1]
                    row = json.loads(line) if line.startswith("{") else {"error": (p.stderr or p.stdout)[-300:]}
                except subprocess.TimeoutExpired:
                    row = {"error": f"over {args.timeout:.0f} s"}
                row.update(task=t.id, threads=variant if run == variant or run == "warm" else run,
                           process=round(time.perf_counter() - t0, 2))
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| task | compile threads | process s | imports | inputs | measure | compile | eager ms | compile ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "error" in r:
            print(f"| {r['task']} | {r['threads']} | {r['process']} | error: {r['error'][-80:]} | | | | | |")
            continue
        print(f"| {r['task']} | {r['threads']} | {r['process']:.1f} | {r['imports'] + r.get('inductor_imports', 0):.1f} | {r.get('inputs', 0):.1f} | "
              f"{r['measure']:.1f} | {r['compile_seconds'] or 0:.1f} | {r['eager_ms']:.4g} | "
              f"{r['compile_ms'] or float('nan'):.4g} |")
    for variant in sorted({r["threads"] for r in rows}):
        ok = [r for r in rows if r["threads"] == variant and "error" not in r]
        if ok:
            print(f"threads {variant}: median measure {statistics.median(r['measure'] for r in ok):.1f} s, "
                  f"compile {statistics.median(r['compile_seconds'] or 0 for r in ok):.1f} s, "
                  f"process {statistics.median(r['process'] for r in ok):.1f} s")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_baseline_cost.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
