"""Benchmark: synthesise tasks on the CPU and report throughput and the op-count mix.

Runs the real pipeline (rule composer with shape inference, every filter in worker
processes, AST decontamination against KernelBench when it is found) with small shapes
and a CPU time window, then prints the filter table and the op-count mix next to
CUDA-Agent-Ops-6K's.

torch.compile's inductor backend costs seconds of C++ compilation per model on the
CPU, so the compile filter uses the ``aot_eager`` backend here by default (dynamo
capture and AOT tracing, no code generation); ``--compile-backend inductor`` runs the
full check. The output folder is resumable: rerun the same command to continue.

Usage (repository root): python3 scripts/bench_synthesis.py [-n 1000] [--workers 2]
    [--shapes small] [--out runs/bench_synthesis] [--fresh] [--compile-backend aot_eager]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def kernelbench_root() -> str | None:
    env = os.environ.get("CUDA_AGENT_KERNELBENCH")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "kernelbench"]:
        if (cand / "level1").is_dir():
            return str(cand)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--num-tasks", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shapes", default="small", choices=["tiny", "small", "medium", "large"])
    ap.add_argument("--min-ms", type=float, default=0.005)
    ap.add_argument("--max-ms", type=float, default=50.0)
    ap.add_argument("--compile-backend", default="aot_eager")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "runs" / "bench_synthesis"))
    ap.add_argument("--fresh", action="store_true", help="start over instead of resuming")
    args = ap.parse_args()

    from cuda_agent.datasets.synthesis.pipeline import SynthesisOptions, Synthesizer, format_report

    kb = kernelbench_root()
    opts = SynthesisOptions.from_mapping(
        {
            "output_dir": args.out,
            "num_tasks": args.num_tasks,
            "seed": args.seed,
            "workers": args.workers,
            "device": "cpu",
            "shapes": args.shapes,
            "timeout_s": 120.0,
            "filters": {
                "min_ms": args.min_ms,
                "max_ms": args.max_ms,
                "compile": not args.no_compile,
                "compile_backend": args.compile_backend,
            },
            "decontamination": {"enabled": kb is not None, "kernelbench_root": kb},
        }
    )
    if kb is None:
        print("note: KernelBench not found; decontamination is off", file=sys.stderr)
    t0 = time.monotonic()
    rep = Synthesizer(opts).run(fresh=args.fresh, progress=True)
    wall = time.monotonic() - t0
    print()
    print(f"== synthesis benchmark: {args.num_tasks} tasks, CPU, {args.workers} workers, shapes={args.shapes}, "
          f"window {args.min_ms:g}-{args.max_ms:g} ms, compile={'off' if args.no_compile else args.compile_backend}, "
          f"decontamination={'on (250 KernelBench problems)' if kb else 'off'}")
    print(format_report(rep))
    s = rep["session"]
    print()
    print(f"{'metric':<28} {'value':>12}")
    print(f"{'wall time (s)':<28} {wall:>12.1f}")
    print(f"{'tasks accepted (session)':<28} {s['accepted']:>12}")
    print(f"{'candidates judged (session)':<28} {s['candidates']:>12}")
    print(f"{'tasks / s':<28} {s['tasks_per_s'] or 0:>12.3f}")
    print(f"{'candidates / s':<28} {s['candidates_per_s'] or 0:>12.3f}")
    print(f"{'tasks / hour':<28} {3600 * (s['tasks_per_s'] or 0):>12.0f}")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "bench_synthesis.json").write_text(json.dumps(rep | {"wall_s": wall}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
