"""Run the GPU checks and benchmarks one after another and print one summary table.

Each entry is a script of this folder with the arguments it runs with and a time limit.
A run stops starting new scripts once the next one would overrun ``--budget`` seconds,
so one call fits a time-limited GPU allocation; name scripts to run a subset:

    source scripts/gpu/setup.sh
    python3 scripts/gpu/run_all.py                       # everything that fits the budget
    python3 scripts/gpu/run_all.py bench_compile bench_reward --budget 540
    python3 scripts/gpu/run_all.py --list
    python3 scripts/gpu/run_all.py multi_gpu "repro_timing --shard 0/2" "repro_timing --shard 1/2"

An entry may carry its own arguments after the name (quote it), replacing the defaults,
and may be pinned to a lane with a leading ``@k`` ("@1 eval_references --levels 1").
``@k!`` also puts the entry in a first wave that ends before any other single-GPU script
starts (benchmarks that should not share the host with compile-heavy work).
Scripts that need several GPUs run first, alone; the single-GPU ones are then spread over
one lane per GPU (``CUDA_VISIBLE_DEVICES`` set to that GPU), longest first onto the lane
with least work, each lane running its scripts one after another within the budget.

Every script's full output goes to ``$OUT/<label>.log`` when OUT is set; its last lines
(the script's own table) are printed after it ends.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# name -> (arguments, time limit in seconds, what it proves, GPUs needed)
SCRIPTS: dict[str, tuple[list[str], int, str, int]] = {
    "bench_compile": ([], 240, "issue 3: compile time, paper method vs cached/incremental builds", 1),
    "reward_checks": ([], 330, "issue 4: pool recovery and reward verdicts on real kernels", 1),
    "privdrop_check": ([], 150, "candidate jobs run without root; CUDA and the baseline cache still work", 1),
    "judge_checks": ([], 420, "issue 17: attacks on the judge refused or timed like the honest kernel", 1),
    "fair_judge_checks": ([], 360, "issue 19: honest third-party styles pass, degenerate outputs and decoys fail", 1),
    "bench_reward": ([], 420, "issue 4: one reward end to end vs the paper's scripts", 1),
    "repro_timing": ([], 560, "issue 4: timing reproducibility over KernelBench L1", 1),
    "cpu_baselines": ([], 120, "CPU backend baselines on a many-core host", 1),
    "agent_demo": ([], 200, "issue 5: the demo episode on the CUDA and CPU backends", 1),
    "synthesis_gpu": ([], 360, "issue 6: synthesis with the paper's 1-100 ms window", 1),
    "eval_references": (["--levels", "1", "--limit", "6", "--no-progress"], 560, "issue 7: scoring references (smoke)", 1),
    "ppo_proof": ([], 480, "issue 8: PPO steps with a ~0.5B model through the agent loop", 1),
    "multi_gpu": ([], 420, "issue 9: pool, data-parallel PPO and sharing over several GPUs", 2),
    "gpu_tests": ([], 300, "the test suite's GPU-marked tests", 1),
    "ipc_probe": (["--verify"], 240, "issue 31: CUDA outputs reach the trusted process in device memory; L1/30's 6.4 GB verified", 1),
    "bench_judge_throughput": (["--n", "24", "--levels", "1,2", "--paths", "after", "--passes", "fresh",
                                "--work", "/root/bench-work"], 560,
                               "issue 31: candidates per minute per GPU, GPU busy, phase and timing-loop medians", 1),
    "graph_paths": (["--ids", "L1/71_*,L3/35_*", "--only", "eager,judged_inproc,baseline,judged"],
                    300, "issue 31: graph-mode baselines timed as candidates meet the reference judged as its own candidate", 1),
    "bench_compare": ([], 120, "issue 31: verification's compare phase on a 6.4 GB output, and where its time goes", 1),
    "bench_build_header": ([], 420, "issue 31: what a precompiled torch/extension.h saves a load_inline build", 1),
    "bench_trainer_vs_trl": ([], 240, "issue 22: our GRPO step vs TRL's GRPOTrainer, same tiny bf16 policy and batch", 1),
}


# where scripts/gpu/setup.sh installs the carried wheels (.whl/)
CARRIED_SITE = Path("/tmp/site")


def with_carried_wheels(pythonpath: str, site: Path = CARRIED_SITE) -> str:
    """``pythonpath`` with the carried wheels' folder first when setup.sh made it but its
    ``PYTHONPATH`` did not reach this process (setup.sh sourced in a pipe runs in a subshell)."""
    parts = [p for p in pythonpath.split(os.pathsep) if p]
    if site.is_dir() and str(site) not in parts:
        parts.insert(0, str(site))
    return os.pathsep.join(parts)


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
    ap.add_argument("--lanes", type=int, default=0, help="single-GPU scripts in parallel (default: one per GPU)")
    args = ap.parse_args()

    if args.list:
        for name, (extra, limit, what, gpus) in SCRIPTS.items():
            print(f"{name:16s} {limit:4d} s  {gpus} GPU(s)  {what}")
        return 0
    wanted = []
    pinned: dict[int, int] = {}  # entry index -> lane
    first_wave: set[int] = set()  # entry indices that run before the other single-GPU ones
    for entry in args.names or list(SCRIPTS):
        words = shlex.split(entry)
        if words and words[0].startswith("@") and words[0][1:].rstrip("!").isdigit():
            pinned[len(wanted)] = int(words[0][1:].rstrip("!"))
            if words[0].endswith("!"):
                first_wave.add(len(wanted))
            words = words[1:]
        name, *extra = words
        wanted.append((name, extra if extra else SCRIPTS.get(name, ([],))[0]))
    unknown = [n for n, _ in wanted if n not in SCRIPTS]
    if unknown:
        print(f"error: unknown script(s) {unknown}; known: {', '.join(SCRIPTS)}", file=sys.stderr)
        return 2

    final_out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    # scripts write into a staging folder, packed into one archive at the end: batch GPU
    # runners often return only a few files from $OUT
    out = Path(tempfile.mkdtemp(prefix="run-all-")) if final_out is not None else None
    gpus = gpu_count()
    lanes_n = max(1, min(args.lanes or gpus, gpus or 1))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0"}
    env["PYTHONPATH"] = with_carried_wheels(env.get("PYTHONPATH", ""))
    start = time.monotonic()
    rows: list[tuple[str, str, float, str]] = []
    lock = threading.Lock()

    entries = []
    for i, (name, extra) in enumerate(wanted):
        label = name if [n for n, _ in wanted].count(name) == 1 else f"{name}-{i}"
        entries.append((label, name, extra))
    lane_of = {entries[i][0]: k % lanes_n for i, k in pinned.items()}
    early = {entries[i][0] for i in first_wave}

    def run_one(label: str, name: str, extra: list[str], visible: str | None) -> None:
        _, limit, what, need = SCRIPTS[name]
        left = args.budget - (time.monotonic() - start)
        if gpus < need:
            with lock:
                rows.append((label, "skipped", 0.0, f"needs {need} GPUs, found {gpus}"))
            return
        if left < min(limit, 60):
            with lock:
                rows.append((label, "skipped", 0.0, f"only {left:.0f} s left of the budget"))
            return
        run_env = dict(env)
        run_env["CUDA_AGENT_SCRIPT_SECONDS"] = str(int(min(limit, left)))
        if visible is not None:
            run_env["CUDA_VISIBLE_DEVICES"] = visible
        if out is not None:
            run_env["OUT"] = str(out / label) if len(entries) > 1 else str(out)
            Path(run_env["OUT"]).mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, str(HERE / f"{name}.py"), *extra],
                cwd=REPO, env=run_env, capture_output=True, text=True, timeout=min(limit, left),
            )
            rc, text = str(proc.returncode), proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc = "timeout"
            raw = exc.stdout or b""
            text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        secs = time.monotonic() - t0
        if out is not None:
            (out / f"{label}.log").write_text(text)
        tail = [line for line in text.strip().splitlines() if line.strip()][-25:]
        where = f", GPU {visible}" if visible is not None else ""
        with lock:
            print(f"\n===== {label} (rc {rc}, {secs:.0f} s{where}): {what}")
            print("\n".join(tail), flush=True)
            rows.append((label, rc, secs, tail[-1][:70] if tail else ""))

    # several-GPU scripts first, alone on the machine
    for label, name, extra in entries:
        if SCRIPTS[name][3] > 1:
            run_one(label, name, extra, None)
    # single-GPU scripts: longest first onto the least loaded lane
    single = [e for e in entries if SCRIPTS[e[1]][3] <= 1]
    lanes: list[list[tuple[str, str, list[str]]]] = [[] for _ in range(lanes_n)]
    load = [0] * lanes_n
    for e in single:  # pinned entries keep their place in the order given
        if e[0] in lane_of:
            lanes[lane_of[e[0]]].append(e)
            load[lane_of[e[0]]] += SCRIPTS[e[1]][1]
    for e in sorted((e for e in single if e[0] not in lane_of), key=lambda e: -SCRIPTS[e[1]][1]):
        k = load.index(min(load))
        lanes[k].append(e)
        load[k] += SCRIPTS[e[1]][1]
    if lanes_n == 1:
        lanes = [single]  # one lane: the order given
    for first in (True, False):
        wave = [[e for e in lane if (e[0] in early) == first] for lane in lanes]
        if lanes_n == 1:
            for e in wave[0]:
                run_one(*e, None)
            continue
        threads = [threading.Thread(target=lambda k=k: [run_one(*e, str(k)) for e in wave[k]]) for k in range(lanes_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    print("\n===== summary")
    print(f"{'script':16s} {'result':8s} {'seconds':>8s}  last line")
    for name, rc, secs, last in rows:
        print(f"{name:16s} {rc:8s} {secs:8.0f}  {last}")
    if final_out is not None and out is not None:
        summary = "\n".join(f"{name:16s} {rc:8s} {secs:8.0f}  {last}" for name, rc, secs, last in rows)
        (out / "summary.txt").write_text(summary + "\n")
        final_out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(final_out / "run_all.tar.gz", "w:gz") as tar:
            tar.add(out, arcname="run_all")
        print(f"outputs: {final_out / 'run_all.tar.gz'}")
    return 0 if all(r[1] in ("0", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
