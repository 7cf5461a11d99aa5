"""Run the GPU checks and benchmarks one after another and print one summary table.

Each entry is a script of this folder with the arguments it runs with and a time limit.
A run stops starting new scripts once the next one would overrun ``--budget`` seconds,
so one call fits a machine lease; name scripts to run a subset:

    source scripts/gpu/setup.sh
    python3 scripts/gpu/run_all.py                       # everything that fits the budget
    python3 scripts/gpu/run_all.py bench_compile bench_reward --budget 540
    python3 scripts/gpu/run_all.py --list

Every script's full output goes to ``$OUT/<name>.log`` when OUT is set; its last lines
(the script's own table) are printed after it ends.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# name -> (arguments, time limit in seconds, what it proves, GPUs needed)
SCRIPTS: dict[str, tuple[list[str], int, str, int]] = {
    "bench_compile": ([], 240, "issue 3: compile time, paper method vs cached/incremental builds", 1),
    "reward_checks": ([], 330, "issue 4: pool recovery and reward verdicts on real kernels", 1),
    "privdrop_check": ([], 150, "candidate jobs run without root; CUDA and the baseline cache still work", 1),
    "bench_reward": ([], 420, "issue 4: one reward end to end vs the paper's scripts", 1),
    "repro_timing": ([], 480, "issue 4: timing reproducibility over KernelBench L1", 1),
    "cpu_baselines": ([], 120, "CPU backend baselines on a many-core host", 1),
    "agent_demo": ([], 200, "issue 5: the demo episode on the CUDA and CPU backends", 1),
    "synthesis_gpu": ([], 360, "issue 6: synthesis with the paper's 1-100 ms window", 1),
    "eval_references": (["--levels", "1", "--limit", "6", "--no-progress"], 240, "issue 7: scoring references (smoke)", 1),
    "ppo_proof": ([], 480, "issue 8: PPO steps with a ~0.5B model through the agent loop", 1),
    "multi_gpu": ([], 420, "issue 9: pool, data-parallel PPO and sharing over several GPUs", 2),
}


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="scripts to run (default: all)")
    ap.add_argument("--budget", type=float, default=560.0, help="seconds for the whole call")
    ap.add_argument("--list", action="store_true", help="list the scripts and exit")
    args = ap.parse_args()

    if args.list:
        for name, (extra, limit, what, gpus) in SCRIPTS.items():
            print(f"{name:16s} {limit:4d} s  {gpus} GPU(s)  {what}")
        return 0
    unknown = [n for n in args.names if n not in SCRIPTS]
    if unknown:
        print(f"error: unknown script(s) {unknown}; known: {', '.join(SCRIPTS)}", file=sys.stderr)
        return 2

    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    gpus = gpu_count()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0"}
    start = time.monotonic()
    rows = []
    for name in args.names or list(SCRIPTS):
        extra, limit, what, need = SCRIPTS[name]
        left = args.budget - (time.monotonic() - start)
        if gpus < need:
            rows.append((name, "skipped", 0.0, f"needs {need} GPUs, found {gpus}"))
            continue
        if left < min(limit, 60):
            rows.append((name, "skipped", 0.0, f"only {left:.0f} s left of the budget"))
            continue
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, str(HERE / f"{name}.py"), *extra],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=min(limit, left),
            )
            rc, text = str(proc.returncode), proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc = "timeout"
            text = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        secs = time.monotonic() - t0
        if out is not None:
            (out / f"{name}.log").write_text(text)
        tail = [line for line in text.strip().splitlines() if line.strip()][-25:]
        print(f"\n===== {name} (rc {rc}, {secs:.0f} s): {what}")
        print("\n".join(tail))
        last = tail[-1][:70] if tail else ""
        rows.append((name, rc, secs, last))

    print("\n===== summary")
    print(f"{'script':16s} {'result':8s} {'seconds':>8s}  last line")
    for name, rc, secs, last in rows:
        print(f"{name:16s} {rc:8s} {secs:8.0f}  {last}")
    return 0 if all(r[1] in ("0", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
