"""Run ``cuda-agent demo`` N times and print each run's speedups and milestone reward.

A demo whose reward changes from run to run on the same machine tells a user nothing, so
this measures how steady it is, optionally with a process burning one core beside it (a
busy laptop):

    python3 scripts/demo_repeat.py -n 10 --load                      # baselines from the cache
    python3 scripts/demo_repeat.py -n 10 --load --fresh-baselines    # measured in every run (a fresh clone)

Prints one row per run (speedup against eager and torch.compile, the spread of each timing,
the reward) and a summary; exits 1 when the runs do not all earn the same reward.
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
from collections import Counter
from pathlib import Path

BURN = "while True:\n    pass\n"


def start_burner(core: int) -> subprocess.Popen:
    """A Python process spinning on ``core`` until it is killed."""
    def pin() -> None:
        os.sched_setaffinity(0, {core})

    return subprocess.Popen([sys.executable, "-c", BURN], preexec_fn=pin, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_demo(out: Path, backend: str, extra: list[str]) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cuda_agent.core.cli", "demo", "--backend", backend, "--out",
                           str(out), "--quiet", *extra], capture_output=True, text=True)
    seconds = time.monotonic() - t0
    report = out / "report.json"
    if proc.returncode != 0 or not report.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"ok": False, "seconds": seconds, "error": f"exit {proc.returncode}: {tail[0][:200]}"}
    rep = json.loads(report.read_text())
    reward = rep.get("reward") or {}
    spreads = {k: v.get("spread") for k, v in (rep.get("timings") or {}).items()}
    return {"ok": True, "seconds": seconds, "vs_eager": rep.get("speedup_vs_eager"),
            "vs_compile": rep.get("speedup_vs_compile"), "reward": reward.get("value"), "spreads": spreads}


def fmt(x: float | None, spec: str) -> str:
    return "" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--runs", type=int, default=10, help="how many demo runs (default 10)")
    ap.add_argument("--load", action="store_true", help="keep one core busy with a spinning process meanwhile")
    ap.add_argument("--load-core", type=int, default=0, help="the core the spinning process is pinned to")
    ap.add_argument("--fresh-baselines", action="store_true",
                    help="measure eager and torch.compile again in every run (an empty baseline cache per run)")
    ap.add_argument("--backend", default="cpu", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--out", type=Path, default=None, help="folder for the run folders (default: a temporary one)")
    ap.add_argument("extra", nargs="*", help="config files and key=value overrides passed to the demo")
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    base = a.out or Path(tempfile.mkdtemp(prefix="demo-repeat-"))
    base.mkdir(parents=True, exist_ok=True)
    burner = start_burner(a.load_core) if a.load else None
    rows = []
    try:
        print(f"{a.runs} runs of `cuda-agent demo --backend {a.backend}`"
              + (f", one core (#{a.load_core}) kept busy by another process" if burner else "")
              + (", baselines measured in every run" if a.fresh_baselines else ", baselines from the cache")
              + f"; run folders under {base}", flush=True)
        print(f"{'run':>3}  {'vs eager':>8}  {'vs compile':>10}  {'spread e/c/cand':>17}  {'reward':>6}  {'time':>6}")
        for i in range(a.runs):
            out = base / f"run-{i + 1:02d}"
            fresh = [f"service.profile_options.baseline_cache_dir={base / f'baselines-{i + 1:02d}'}"]
            r = run_demo(out, a.backend, a.extra + (fresh if a.fresh_baselines else []))
            rows.append(r)
            if not r["ok"]:
                print(f"{i + 1:>3}  failed: {r['error']}", flush=True)
                continue
            sp = "/".join(fmt(r["spreads"].get(k) and r["spreads"][k] * 100, ".0f") for k in
                          ("eager", "compile", "candidate")) + " %"
            print(f"{i + 1:>3}  {fmt(r['vs_eager'], '.2f') + 'x':>8}  {fmt(r['vs_compile'], '.2f') + 'x':>10}  {sp:>17}  "
                  f"{fmt(r['reward'], 'g'):>6}  {r['seconds']:5.0f}s", flush=True)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    ok = [r for r in rows if r["ok"]]
    rewards = Counter(r["reward"] for r in ok)
    print()
    if ok:
        sc = [r["vs_compile"] for r in ok if r["vs_compile"] is not None]
        if sc:
            print(f"vs torch.compile: min {min(sc):.2f}x, median {statistics.median(sc):.2f}x, max {max(sc):.2f}x")
        print("rewards: " + ", ".join(f"{v:g} x{n}" for v, n in rewards.most_common()))
    top = rewards.most_common(1)[0][1] if rewards else 0
    print(f"{top} of {a.runs} runs earned the same reward" + ("" if len(ok) == a.runs else
                                                              f"; {a.runs - len(ok)} failed"))
    return 0 if top == a.runs else 1


if __name__ == "__main__":
    sys.exit(main())
