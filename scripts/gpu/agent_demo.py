"""The agent loop end to end on a GPU: ``cuda-agent demo`` on the CUDA backend (a recorded
episode writes a fused CUDA kernel, which is compiled with nvcc, verified on 5 random
inputs and profiled against eager PyTorch and torch.compile), then the CPU demo.

Prints one table: backend, verified, speedups, times, wall time. Writes the run folders
under $OUT (or a temporary folder) and a summary JSON there.

Usage (from the repository root, on the GPU machine): python3 scripts/gpu/agent_demo.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_demo(backend: str, out: Path) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cuda_agent.core.cli", "demo", "--backend", backend, "--out",
                           str(out), "--quiet"], capture_output=True, text=True, timeout=450)
    wall = time.monotonic() - t0
    row = {"backend": backend, "rc": proc.returncode, "wall_s": wall}
    rep_path = out / "report.json"
    if rep_path.exists():
        rep = json.loads(rep_path.read_text())
        row.update(verified=rep["verified"], finish=rep["finish_reason"], vs_eager=rep["speedup_vs_eager"],
                   vs_compile=rep["speedup_vs_compile"], timings=rep["timings"],
                   reward=(rep.get("reward") or {}).get("value"))
    if proc.returncode != 0 or not row.get("verified"):
        row["stderr_tail"] = proc.stderr[-3000:]
        row["stdout_tail"] = proc.stdout[-2000:]
        tr = out / "transcript.md"
        if tr.exists():
            row["transcript_tail"] = tr.read_text()[-4000:]
    return row


def main() -> int:
    base = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="agent-demo-"))
    rows = [run_demo("cuda", base / "demo-cuda"), run_demo("cpu", base / "demo-cpu")]
    (base / "agent_demo.json").write_text(json.dumps(rows, indent=2, default=str))
    for r in rows:
        for k in ("stderr_tail", "stdout_tail", "transcript_tail"):
            if r.get(k):
                print(f"--- {r['backend']} {k} ---\n{r[k]}")
    print(f"{'backend':8} {'rc':>3} {'verified':>8} {'vs eager':>9} {'vs compile':>10} {'t_eager ms':>10} "
          f"{'t_compile ms':>12} {'t_yours ms':>10} {'reward':>6} {'wall s':>7}")
    for r in rows:
        t = r.get("timings") or {}
        f = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
        print(f"{r['backend']:8} {r['rc']:>3} {str(r.get('verified', '-')):>8} {f(r.get('vs_eager')):>9} "
              f"{f(r.get('vs_compile')):>10} {f(t.get('eager', {}).get('median_ms'), 4):>10} "
              f"{f(t.get('compile', {}).get('median_ms'), 4):>12} {f(t.get('candidate', {}).get('median_ms'), 4):>10} "
              f"{str(r.get('reward', '-')):>6} {r['wall_s']:>7.1f}")
    return 0 if all(r.get("verified") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
