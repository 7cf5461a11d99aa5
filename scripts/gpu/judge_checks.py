"""GPU check: the attacks on the judge are refused or timed like the honest kernel.

Run from the repo root on a GPU machine, as root: ``python3 scripts/gpu/judge_checks.py``.
A CUDA ReLU (built once by the ``cpp_extension`` compiler, loaded through the workspace's
runtime) is verified and profiled through the ``local`` executor, then every attack of
``cuda_agent.sandbox.judge.attacks`` on top of it, plus a candidate that leaves a process
running and one that tries to signal and read the trusted worker. Then the attacks on how
timed calls' inputs relate (``attacks.INPUT_RELATIONS``: a kept matmul rescaled or shifted,
stale or copied rows, a log of a signed input computed on the spot-checked calls only), each
beside its honest twin (torch's own operator, timed twice), profiled only. Prints one row per
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

    def run(name: str, kind: str, code: str, what: str = "", where: Path | None = None, **options) -> dict:
        (where or root).joinpath("model_new.py").write_text(code)
        opts = {"seed": 11, **options}
        if kind == "profile":
            opts.update(baseline_cache_dir=str(cache), compile_baseline=False)
        t = time.perf_counter()
        r = ex.run(Job(f"cuda_agent.sandbox.judge.tasks:{kind}", {"workspace": str(where or root), "options": opts},
                       kind=kind))
        row = {"candidate": name, "job": kind, "ok": r.ok, "failure": r.failure.value, "rule": rule_of(r.message),
               "ms": r.candidate.median_ms if kind == "profile" and r.ok and r.candidate else None,
               "job_s": round(time.perf_counter() - t, 2), "what": what, "message": r.message[:300],
               "loops": r.metadata.get("timing_loops"), "left": r.metadata.get("job_left_running_after_end"),
               "pidns": r.metadata.get("job_pid_namespace"), "transfer": r.metadata.get("output_transfer", "cuda_ipc"),
               "charged": r.metadata.get("timing_charged"), "checks": r.metadata.get("checksum_statistics"),
               "process": r.metadata.get("candidate_process"), "phases": r.metadata.get("phase_seconds"),
               "method": getattr(r.candidate, "method", None) if kind == "profile" and r.ok and r.candidate else None}
        rows.append(row)
        print(f"{name:20s} {kind:8s} ok={r.ok!s:5s} {row['rule'] or row['failure']:22s} "
              f"{(row['ms'] or 0):.4f} ms  {row['job_s']:.1f} s  {r.message[:120]}", flush=True)
        if row["job_s"] > 10:  # where a long job's time went
            print(f"    process: {row['process']}; phases: {row['phases']}", flush=True)
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
    n_main = len(rows)
    relations = relation_checks(run, tmp)
    del rows[n_main:]  # the relation attacks have a table of their own
    ex.close()

    lo, hi = min(base), max(base)
    print()
    print(f"honest kernel: {lo:.4f}..{hi:.4f} ms over {len(base)} timings (noise {100 * (hi - lo) / lo:.2f}%)")
    print(f"{'candidate':20s} {'job':8s} {'verdict':10s} {'rule':24s} {'ms':>9s} {'vs honest':>10s}")
    within = True
    for r in rows:
        verdict = ("charged" if r.get("charged") else "correct") if r["ok"] else "refused"
        vs = f"{r['ms'] / lo:9.3f}x" if r["ms"] else ""
        # an attack timed faster than the honest kernel's fastest timing less 5% paid off; slower
        # (a charged loop carries the loop-overhead estimate's error) did not
        if r["candidate"] != "honest" and r["ms"] and r["ms"] < 0.95 * lo:
            within = False
            vs += " !"
        print(f"{r['candidate']:20s} {r['job']:8s} {verdict:10s} {(r['rule'] or r['failure'])[:24]:24s} "
              f"{(r['ms'] or 0):9.4f} {vs:>10s}")
    # a forged reply is timed by the trusted clock (charged), not refused: "within" covers it
    must_refuse = {"skipped_calls"} | {a.name for a in attacks.ALL if a.kind == "verify"}
    bad = [r["candidate"] for r in rows if r["candidate"] in must_refuse and r["ok"]]
    print(f"attacks accepted that must be refused: {bad or 'none'}; timed attacks within 5% of honest: {within}; "
          f"processes left by the leak: {leak_row['survivors']}")
    rel_ok = print_relations(relations)
    return 0 if not bad and within and leak_row["survivors"] == 0 and rel_ok else 1


RELATION_SIZES = {"matmul": 4096, "log": 8192}


def relation_checks(run, tmp: Path) -> list[dict]:
    """The input-relation attacks, each task's honest twin timed before and after them."""
    from cuda_agent.core.types import Task
    from cuda_agent.sandbox.judge import attacks
    from cuda_agent.sandbox.workspace.workspace import create_workspace

    rows = []
    for task, code in attacks.RELATION_TASKS.items():
        code = code.replace("SIZE", str(RELATION_SIZES[task]))
        where = Path(create_workspace(Task(id=f"rel_{task}", source="check", code=code), tmp / f"rel-{task}",
                                      backend="cuda", compiler="cpp_extension").root)
        honest = attacks.HONEST_RELATION[task].module(attacks.RELATION_HONEST[task])
        rows.append({**run(f"honest_{task}", "profile", honest, where=where), "task": task, "expect": "honest"})
        for a in attacks.INPUT_RELATIONS:
            if a.task == task:
                row = run(a.name, "profile", a.module(attacks.RELATION_HONEST[task]), a.what, where=where)
                rows.append({**row, "task": task, "expect": a.expect})
        rows.append({**run(f"honest_{task}", "profile", honest, where=where), "task": task, "expect": "honest"})
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "judge_relations.json").write_text(json.dumps(rows, indent=1, default=str))
    return rows


def print_relations(rows: list[dict]) -> bool:
    """The relation attacks' table; True when each is refused as expected, or timed no faster
    than 95% of its honest twin's fastest timing (an attack whose forward is captured once in a
    CUDA graph replays what it did then: timed like its twin, it gains nothing), and every honest
    twin passed."""
    print()
    print(f"{'task':7s} {'candidate':20s} {'expect':8s} {'verdict':8s} {'rule':18s} {'ms':>9s} {'vs honest':>10s} "
          f"{'checks':>8s}  method")
    ok = True
    for task in sorted({r["task"] for r in rows}):
        base = [r["ms"] for r in rows if r["task"] == task and r["candidate"].startswith("honest") and r["ms"]]
        lo = min(base) if base else 0.0
        for r in (r for r in rows if r["task"] == task):
            verdict = "correct" if r["ok"] else "refused"
            timed_like_twin = bool(r["ok"] and r["ms"] and r["ms"] >= 0.95 * lo)
            good = (not r["ok"] or timed_like_twin) if r["expect"] == "refused" else timed_like_twin
            ok = ok and bool(good)
            vs = f"{r['ms'] / lo:9.3f}x" if r["ms"] and lo else ""
            print(f"{task:7s} {r['candidate']:20s} {r['expect']:8s} {verdict:8s} {(r['rule'] or r['failure'])[:18]:18s} "
                  f"{(r['ms'] or 0):9.4f} {vs:>10s} {len(r.get('checks') or []):8d}  {r.get('method') or ''}"
                  f"{'' if good else '  !'}")
    print(f"input-relation attacks: {'every one refused or timed like its honest twin' if ok else 'NOT all held'}")
    return ok


def _has(pid: str, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return marker.encode() in fh.read()
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
