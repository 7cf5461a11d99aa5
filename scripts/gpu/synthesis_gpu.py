"""Synthesis on the GPU with the paper's filters: eager time 1-100 ms, torch.compile (inductor).

Runs the real pipeline with ``device=cuda`` and large shapes for a fixed wall-clock
budget (default 300 s; no new candidates after it, in-flight ones finish), then prints
the filter table, the op-count mix and the eager-time spread of the accepted tasks.
Filter workers share the GPU (their eager timings contend a little; the window is wide).
KernelBench for decontamination: $CUDA_AGENT_KERNELBENCH or ../shared/kernelbench; without
it decontamination is off (said in the table).

Usage (repository root): python3 scripts/gpu/synthesis_gpu.py [--budget 300] [--workers 6] [-n 200]
Writes synthesis_gpu.json and the accepted rows (tasks.jsonl) under $OUT when set.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def kernelbench_root() -> str | None:
    env = os.environ.get("CUDA_AGENT_KERNELBENCH")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "kernelbench", REPO / "shared" / "kernelbench"]:
        if (cand / "level1").is_dir():
            return str(cand)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--num-tasks", type=int, default=200)
    ap.add_argument("--budget", type=float, default=300.0, help="seconds before no new candidate starts")
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--shapes", default="large", choices=["small", "medium", "large"])
    ap.add_argument("--min-ms", type=float, default=1.0)
    ap.add_argument("--max-ms", type=float, default=100.0)
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    from cuda_agent.datasets.synthesis.pipeline import SynthesisOptions, Synthesizer, format_report

    out_env = os.environ.get("OUT")
    work = Path(tempfile.mkdtemp(prefix="synthesis_gpu_"))
    kb = kernelbench_root()
    opts = SynthesisOptions.from_mapping(
        {
            "output_dir": str(work / "out"),
            "num_tasks": args.num_tasks,
            "seed": args.seed,
            "workers": args.workers,
            "device": "cuda",
            "shapes": args.shapes,
            "timeout_s": args.timeout,
            "threads_per_worker": 2,
            "memory_limit_gb": None,
            "filters": {
                "min_ms": args.min_ms,
                "max_ms": args.max_ms,
                "warmup": 3,
                "iters": 10,
                "compile": True,
                "compile_backend": args.compile_backend,
            },
            "decontamination": {"enabled": kb is not None, "kernelbench_root": kb},
        }
    )
    t0 = time.monotonic()
    rep = Synthesizer(opts).run(fresh=True, progress=True, deadline_s=args.budget)
    wall = time.monotonic() - t0
    print()
    print(f"== GPU synthesis ({torch.cuda.get_device_name(0)}, torch {torch.__version__}): shapes={args.shapes}, "
          f"window {args.min_ms:g}-{args.max_ms:g} ms, compile={args.compile_backend}, {args.workers} workers, "
          f"budget {args.budget:g} s, decontamination={'on' if kb else 'off (KernelBench not found)'}")
    print(format_report(rep))
    print(f"\nwall {wall:.1f} s; {rep['session']['tasks_per_s']} tasks/s; {rep['session']['candidates_per_s']} candidates/s")
    if out_env:
        out = Path(out_env)
        out.mkdir(parents=True, exist_ok=True)
        (out / "synthesis_gpu.json").write_text(json.dumps(rep | {"wall_s": wall}, indent=2))
        for name in ("tasks.jsonl", "candidates.jsonl"):
            src = work / "out" / name
            if src.exists():
                shutil.copy(src, out / name)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
