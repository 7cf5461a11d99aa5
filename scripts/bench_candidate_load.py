"""How long a verification job's ``load`` takes (the candidate process made ready for the
job, the reference and the candidate imported and built), on the CPU backend.

N verification jobs of a small task run one after another through a real executor pool (one
worker, one warm spare), each job started once the pool's spare has had ``--gap`` seconds to
get ready (as on a GPU, where a job lasts longer than a worker's start). Prints per job the
load phase, the job's wall time and how its candidate process started, then the medians.
Run the same command on an older checkout (``--src``) to compare.

    python3 scripts/bench_candidate_load.py --n 4
    python3 scripts/bench_candidate_load.py --n 4 --src /tmp/old/packages   # packages/ of another checkout

The GPU form of the same measure is the ``load`` column of
``scripts/gpu/bench_judge_throughput.py`` (with its warm-process count).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODEL = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(256))

    def forward(self, x):
        return torch.relu(x * self.scale)


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return []
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--gap", type=float, default=25.0, help="seconds between jobs (the spare gets ready)")
    ap.add_argument("--src", help="a packages/ folder to import the judge from (an older checkout)")
    a = ap.parse_args()
    if a.src:
        for sub in ("core/src", "sandbox/src"):
            sys.path.insert(0, str(Path(a.src) / sub))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(a.src) / s) for s in ("core/src", "sandbox/src")] +
                                                   [os.environ.get("PYTHONPATH", "")])
    from cuda_agent.sandbox.executors import CpuExecutor, Job
    from cuda_agent.sandbox.executors.local import CpuExecutorOptions

    import cuda_agent.sandbox.judge.client as client_mod

    print(f"judge from {Path(client_mod.__file__).parents[3]}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    os.chmod(tmp, 0o755)
    ws = tmp / "ws"
    ws.mkdir()
    os.chmod(ws, 0o755)
    (ws / "model.py").write_text(MODEL)
    (ws / "model_new.py").write_text(MODEL.replace("class Model(", "class ModelNew("))
    ex = CpuExecutor(CpuExecutorOptions(workers=1, spares=1, timeout=600)).start()
    rows = []
    try:
        time.sleep(a.gap)
        for i in range(a.n):
            t0 = time.perf_counter()
            v = ex.run(Job(fn="cuda_agent.sandbox.judge.tasks:verify", kwargs={
                "workspace": str(ws), "options": {"seed": i + 1, "rules": "none", "extra_draws": []}}))
            wall = time.perf_counter() - t0
            meta = v.metadata or {}
            row = {"job": i, "ok": v.ok, "load_s": float((meta.get("phase_seconds") or {}).get("load") or 0.0),
                   "wall_s": wall, "candidate_process": str(meta.get("candidate_process", "(not recorded)")),
                   "message": v.message[:120]}
            rows.append(row)
            print(f"  job {i}: {'ok' if v.ok else 'FAILED ' + row['message']}  load {row['load_s']:.2f} s  "
                  f"wall {wall:.2f} s  candidate process: {row['candidate_process'][:70]}", flush=True)
            if i + 1 < a.n:
                time.sleep(a.gap)
    finally:
        ex.close()
    print(f"\n| jobs | load median s | load max s | job wall median s |\n| --- | --- | --- | --- |\n"
          f"| {len(rows)} | {statistics.median(r['load_s'] for r in rows):.2f} | {max(r['load_s'] for r in rows):.2f} | "
          f"{statistics.median(r['wall_s'] for r in rows):.2f} |")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "bench_candidate_load.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
