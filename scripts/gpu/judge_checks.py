"""GPU check: the attacks on the judge are refused or timed like the honest kernel.

Run from the repo root on a GPU machine, as root: ``python3 scripts/gpu/judge_checks.py``.
A CUDA ReLU (built once by the ``cpp_extension`` compiler, loaded through the workspace's
runtime) is verified and profiled through the ``local`` executor, then every attack of
``cuda_agent.sandbox.judge.attacks`` on top of it, plus a candidate that leaves a process
running and one that tries to signal and read the trusted worker. Prints one row per
candidate: verdict, the rule that refused it, its time against the honest kernel's (the
honest kernel is timed three times; their spread is the noise); writes JSON under ``$OUT``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
for p in ("core", "sandbox"):
    sys.path.insert(0, str(ROOT / "packages" / p / "src"))

from bench_reward import RELU_BINDING, RELU_KERNEL  # noqa: E402

TASK = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.relu(x)

    def get_inputs():
        return [torch.randn(8192, 8192)]

    def get_init_inputs():
        return []
''')

TEMPLATE = '''import time
import torch
import torch.nn as nn
from cuda_agent_runtime import load_kernels

kernels = load_kernels()
{at_import}

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        {in_forward}
        y = kernels.relu_forward(x)
        return {ret}
'''


def candidate(at_import: str = "", in_forward: str = "pass", ret: str = "y") -> str:
    return TEMPLATE.format(at_import=at_import, in_forward=in_forward, ret=ret)


def rule_of(message: str) -> str:
    import re

    m = re.search(r"rule ([\w.\-]+)[:)]", message or "")
    return m.group(1) if m else ""


def main() -> int:
    import torch

    from cuda_agent.core.types import Task
    from cuda_agent.sandbox.compilers.cpp_extension import CppExtensionCompiler
    from cuda_agent.sandbox.executors import Job, LocalExecutor
    from cuda_agent.sandbox.executors.local import LocalExecutorOptions
    from cuda_agent.sandbox.judge import attacks
    from cuda_agent.sandbox.workspace.workspace import create_workspace

    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    from cuda_agent.sandbox.judge import identity

    for pidns in (True, False):
        import subprocess

        proc, how = identity.spawn([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                                   pidns=pidns, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = proc.communicate(timeout=120)[0].strip().splitlines()
        print(f"probe: CUDA in {how}: {out[-1][:200] if out else '?'}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="judge-checks-"))
    ws = create_workspace(Task(id="relu_8k", source="check", code=TASK), tmp / "ws", backend="cuda",
                          compiler="cpp_extension")
    root = Path(ws.root)
    (root / "kernels" / "relu_kernel.cu").write_text(RELU_KERNEL)
    (root / "kernels" / "relu_binding.cpp").write_text(RELU_BINDING)
    t0 = time.perf_counter()
    built = CppExtensionCompiler(CppExtensionCompiler.Options()).build(root)
    print(f"build: ok={built.ok} in {time.perf_counter() - t0:.1f} s", flush=True)
    if not built.ok:
        print("\n".join(built.errors or [])[:2000])
        return 1
    cache = tmp / "cache"
    ex = LocalExecutor(LocalExecutorOptions(device_count=1, timeout=600)).start()
    rows: list[dict] = []

    def run(name: str, kind: str, code: str, what: str = "", **options) -> dict:
        (root / "model_new.py").write_text(code)
        opts = {"seed": 11, **options}
        if kind == "profile":
            opts.update(baseline_cache_dir=str(cache), compile_baseline=False)
        t = time.perf_counter()
        r = ex.run(Job(f"cuda_agent.sandbox.judge.tasks:{kind}", {"workspace": str(root), "options": opts}, kind=kind))
        row = {"candidate": name, "job": kind, "ok": r.ok, "failure": r.failure.value, "rule": rule_of(r.message),
               "ms": r.candidate.median_ms if kind == "profile" and r.ok and r.candidate else None,
               "job_s": round(time.perf_counter() - t, 2), "what": what, "message": r.message[:300],
               "loops": r.metadata.get("timing_loops"), "left": r.metadata.get("job_left_running_after_end"),
               "pidns": r.metadata.get("job_pid_namespace"), "transfer": r.metadata.get("output_transfer", "cuda_ipc")}
        rows.append(row)
        print(f"{name:20s} {kind:8s} ok={r.ok!s:5s} {row['rule'] or row['failure']:22s} "
              f"{(row['ms'] or 0):.4f} ms  {row['job_s']:.1f} s  {r.message[:120]}", flush=True)
        for loop in row["loops"] or []:  # the trusted side's clock against what was reported
            print(f"    loop: {loop}", flush=True)
        if r.metadata.get("loop_overhead_ms"):
            print(f"    loop's own work: {r.metadata['loop_overhead_ms']}", flush=True)
        if os.environ.get("OUT"):  # after every row: a run cut short keeps what it measured
            Path(os.environ["OUT"], "judge_checks.json").write_text(json.dumps(rows, indent=1, default=str))
        return row

    honest = [run("honest", "verify", candidate())]
    honest += [run("honest", "profile", candidate()) for _ in range(2)]
    base = [r["ms"] for r in honest if r["ms"]]
    for a in attacks.ALL:
        run(a.name, a.kind, candidate(a.at_import, a.in_forward, a.ret), a.what,
            **a.options())
    marker = uuid.uuid4().hex
    leak = textwrap.dedent(f'''
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    time.sleep(600)",
                          "{marker}"], start_new_session=True)
    ''')
    leak_row = run("leaked_process", "verify", candidate(leak), "a double-forked child in a new session",
                   static_checks=[])
    leak_row["survivors"] = sum(1 for pid in os.listdir("/proc") if pid.isdigit() and _has(pid, marker))
    trusted = next(iter(ex.pool.worker_pids().values()))[0]
    probe = textwrap.dedent(f'''
        import os
        for _pid in ({trusted}, 1):
            for _how in ("kill", "mem"):
                try:
                    os.kill(_pid, 9) if _how == "kill" else open(f"/proc/{{_pid}}/mem", "rb").read(1)
                    if _pid != 1:
                        raise SystemExit(f"reached the trusted worker ({{_how}})")
                except OSError:
                    pass
    ''')
    run("signal_trusted", "verify", candidate(probe), "signals and reads the trusted worker", static_checks=[])
    ex.close()

    lo, hi = min(base), max(base)
    print()
    print(f"honest kernel: {lo:.4f}..{hi:.4f} ms over {len(base)} timings (noise {100 * (hi - lo) / lo:.2f}%)")
    print(f"{'candidate':20s} {'job':8s} {'verdict':10s} {'rule':24s} {'ms':>9s} {'vs honest':>10s}")
    within = True
    for r in rows:
        verdict = "correct" if r["ok"] else "refused"
        vs = f"{r['ms'] / lo:9.3f}x" if r["ms"] else ""
        if r["candidate"] != "honest" and r["ms"] and not (0.95 * lo <= r["ms"] <= 1.05 * hi):
            within = False
            vs += " !"
        print(f"{r['candidate']:20s} {r['job']:8s} {verdict:10s} {(r['rule'] or r['failure'])[:24]:24s} "
              f"{(r['ms'] or 0):9.4f} {vs:>10s}")
    bad = [r["candidate"] for r in rows if r["candidate"] in ("forged_reply", "skipped_calls", "compare_code_swap",
                                                             "steal_reference", "harness_import") and r["ok"]]
    print(f"attacks accepted that must be refused: {bad or 'none'}; timed attacks within 5% of honest: {within}; "
          f"processes left by the leak: {leak_row['survivors']}")
    return 0 if not bad and within and leak_row["survivors"] == 0 else 1


def _has(pid: str, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return marker.encode() in fh.read()
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
