"""What verification's output comparison costs on outputs of KernelBench's sizes, and where
that time goes.

On an H200 the ``compare`` phase of an L1 verification took 1.2 s (median) for its seven
6.4 GB outputs compared in device memory: far more than the few passes over 12.8 GB each that
the rule needs (tens of milliseconds at this GPU's bandwidth). This times
:func:`cuda_agent.sandbox.judge.comparison.compare_tensors` on a reference and a correct
output of a given shape (a fraction of them nudged within the tolerance), ``--repeat``
times, then lists the operators that took the time (``torch.profiler``, one more run):

    python3 scripts/gpu/bench_compare.py --shape 4096,393216
    python3 scripts/gpu/bench_compare.py --device cpu --shape 1024,4096   # the script itself, anywhere

With OUT set, the rows are written to ``$OUT/bench_compare.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096,393216", help="the output's shape (default: L1 activations', 6.4 GB fp32)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--atol", type=float, default=1e-2)
    ap.add_argument("--rtol", type=float, default=1e-2)
    ap.add_argument("--top", type=int, default=12, help="operators listed from the profiled run")
    args = ap.parse_args()

    import torch

    from cuda_agent.sandbox.judge.comparison import compare_outputs, compare_tensors

    shape = tuple(int(x) for x in args.shape.split(","))
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device=args.device).manual_seed(0)
    ref = torch.randn(shape, generator=gen, device=args.device, dtype=dtype)
    out = ref.clone()
    out.view(-1)[::97].add_(args.atol / 4)  # correct, but not bit for bit
    sync(args.device)
    gb = ref.numel() * ref.element_size() / 1e9
    print(f"output {list(shape)} {args.dtype} on {args.device}: {gb:.2f} GB each", flush=True)

    rows = []
    for label, fn in (("compare_tensors", lambda: compare_tensors(ref, out, args.atol, args.rtol, "output")),
                      ("compare_outputs (as verification calls it)",
                       lambda: compare_outputs(ref, out, args.atol, args.rtol, "output"))):
        times = []
        for _ in range(max(1, args.repeat)):
            sync(args.device)
            t = time.perf_counter()
            cmp = fn()
            sync(args.device)
            times.append(time.perf_counter() - t)
        assert cmp.ok, cmp.message
        rows.append({"what": label, "seconds": [round(x, 4) for x in times], "median_s": statistics.median(times),
                     "gb_per_s": 2 * gb / statistics.median(times)})
    print(f"| what | median s | runs s | GB/s over both tensors |\n| --- | ---: | --- | ---: |")
    for r in rows:
        print(f"| {r['what']} | {r['median_s']:.4f} | {', '.join(f'{x:.3f}' for x in r['seconds'])} | {r['gb_per_s']:.1f} |")

    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
    with profile(activities=acts) as prof:
        compare_tensors(ref, out, args.atol, args.rtol, "output")
        sync(args.device)
    key = "self_cuda_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=args.top)
    print(table)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_compare.json").write_text(json.dumps({"shape": shape, "rows": rows,
                                                                             "profile": table}, indent=1))


if __name__ == "__main__":
    main()
