"""Why a reference scored as its own candidate can time slower than its eager baseline: the
baseline path and the candidate path side by side on the same task, with the GPU's clocks.

For each task, one job-like sequence in this process: the eager baseline measured (trusted
process, inputs perturbed in place), the reference timed as a candidate by the judge (its own
process, inputs rotated, outputs checksummed), then the eager baseline measured again. A
sampler reads the SM clock, power and temperature (``nvidia-smi``) every 0.2 s of each phase.
A candidate slower than the first baseline but level with the second points at the GPU's
state (clocks falling under sustained load); one slower than both, at the candidate's path.

    python3 scripts/gpu/timing_paths.py --ids 'L1/61_*,L1/97_*,L1/19_ReLU'

KernelBench is found by --root or $CUDA_AGENT_KERNELBENCH. With OUT set, the rows go to
``$OUT/timing_paths.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class ClockSampler:
    """SM clock (MHz), power (W), temperature (C) and throttle reasons, sampled in a thread."""

    QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"

    def __init__(self, gpu: str = "0", every: float = 0.2):
        self.gpu, self.every = gpu, every
        self.samples: list[tuple[float, float, float, str]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "-i", self.gpu, f"--query-gpu={self.QUERY}",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5).stdout
                f = [x.strip() for x in out.strip().split(",")]
                self.samples.append((float(f[0]), float(f[1]), float(f[2]), f[3]))
            except Exception:  # noqa: BLE001 - no sample this time
                pass
            self._stop.wait(self.every)

    def __enter__(self) -> "ClockSampler":
        self.samples.clear()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> dict:
        if not self.samples:
            return {}
        return {"sm_mhz": statistics.median(s[0] for s in self.samples),
                "sm_mhz_min": min(s[0] for s in self.samples),
                "watts": statistics.median(s[1] for s in self.samples),
                "temp_c": max(s[2] for s in self.samples),
                "throttle": sorted({s[3] for s in self.samples})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", default="L1/61_*,L1/73_*,L1/97_*,L2/93_*,L1/19_ReLU")
    ap.add_argument("--root")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "scripts" / "gpu"))
    from bench_judge_throughput import tasks_matching
    from cuda_agent.evaluation.scoring import make_workspace
    from cuda_agent.sandbox.judge import jobs
    from cuda_agent.sandbox.judge.baselines import BaselineOptions, measure_baselines_record
    from cuda_agent.sandbox.judge.baselines.cache import BaselineCache
    from cuda_agent.sandbox.judge.baselines.measure import free_device_memory

    chosen = tasks_matching(args.root, args.ids)
    work = Path(tempfile.mkdtemp(prefix="timing-paths-"))
    os.chmod(work, 0o755)
    gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    rows = []
    for t in chosen:
        row: dict = {"task": t.id}
        clocks = ClockSampler(gpu)
        try:
            first_cache = work / f"first-{len(rows)}"
            with clocks:
                e1, _c, rec = measure_baselines_record(t.code, args.device, BaselineOptions(cache_dir=str(first_cache)),
                                                       BaselineCache(first_cache))
            free_device_memory(args.device)
            row["eager_first"] = {"ms": e1.median_ms, "spread": e1.spread, **clocks.summary()}
            ws = make_workspace(t, work / f"ws-{len(rows)}", "cpu" if args.device == "cpu" else "cuda")
            (ws / "model_new.py").write_text(t.code + "\n\nclass ModelNew(Model):\n    pass\n")
            popts = jobs.ProfileOptions(baseline_cache_dir=str(first_cache), weights="auto")
            with clocks:
                v, p = jobs.evaluate_workspace(str(ws), args.device, jobs.VerifyOptions(weights="auto", rules="none"), popts)
            if p is None or not p.ok:
                row["candidate"] = {"error": (p.message if p else v.message)[:300]}
            else:
                row["candidate"] = {"ms": p.candidate.median_ms, "spread": p.candidate.spread,
                                    "timing_mode": (p.metadata or {}).get("timing_mode", ""),
                                    "input_sets": (p.metadata or {}).get("input_sets"), **clocks.summary()}
            free_device_memory(args.device)
            again = work / f"again-{len(rows)}"
            with clocks:
                e2, _c, _ = measure_baselines_record(t.code, args.device, BaselineOptions(cache_dir=str(again)),
                                                     BaselineCache(again))
            free_device_memory(args.device)
            row["eager_again"] = {"ms": e2.median_ms, "spread": e2.spread, "timing_mode": rec.get("timing_mode", ""),
                                  **clocks.summary()}
            shutil.rmtree(ws, ignore_errors=True)
        except Exception as exc:  # noqa: BLE001 - one broken task must not stop the others
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)

    def cell(d: dict | None) -> str:
        if not d or "ms" not in d:
            return (d or {}).get("error", "-")[:60]
        return f"{d['ms']:.4g} ms @ {d.get('sm_mhz', float('nan')):.0f} MHz {d.get('watts', float('nan')):.0f} W"

    print("\n| task | eager first | candidate (the reference) | eager again | candidate / first | candidate / again |")
    print("| --- | --- | --- | --- | ---: | ---: |")
    for r in rows:
        a, c, b = r.get("eager_first"), r.get("candidate"), r.get("eager_again")
        q1 = c["ms"] / a["ms"] if a and c and "ms" in c and "ms" in a else float("nan")
        q2 = c["ms"] / b["ms"] if b and c and "ms" in c and "ms" in b else float("nan")
        print(f"| {r['task']} | {cell(a)} | {cell(c)} | {cell(b)} | {q1:.3f} | {q2:.3f} |")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "timing_paths.json").write_text(json.dumps(rows, indent=1, default=str))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
