"""The ``ray`` executor on a GPU: a one-node Ray cluster with this machine's GPU(s) runs the
GPU checks' jobs through ``ray`` and through ``local`` and compares them.

Part 1 (failures): the pool probes of ``reward_checks.py`` part 1 (illegal memory access,
device-side assert, out of GPU memory, a kernel that never ends, a segfault, an abort)
through ``ray``: each ends with the reason ``local`` gives, and the next job succeeds.

Part 2 (jobs): the correct ReLU candidate of ``reward_checks.py`` (cpp_extension), built
once here and once as a Ray build task, then verification and profiling jobs (baselines
on) alternately through ``local`` and ``ray``, ``--jobs`` of each kind per executor:
results must agree (verdicts; candidate medians within ``--tolerance``) and the table
gives the time per job from submit to result and the overhead of ``ray`` over ``local``
(target: under 0.3 s per job).

Needs the ``ray`` package: Ray's wheel for CPython 3.12 is over the carry limit, so carry
a slim copy (``scripts/gpu/slim_wheel.py``; see scripts/gpu/README.md). Usage:

    source scripts/gpu/setup.sh
    python3 scripts/gpu/ray_pool.py [--jobs 4] [--part 1|2|all]
    python3 scripts/gpu/ray_pool.py --cpu     # no GPU: the same on a CPU slot (a smoke test of this script)

The cluster's processes are ended by PID at the end. Writes ray_pool.json under $OUT.
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "plugins" / "ray" / "src"))

from reward_checks import BINDING, GOOD_BODY, MODEL, kernel, model_new, table  # noqa: E402

S = "cuda_agent.sandbox.executors.selftest:"
TASKS = "cuda_agent.sandbox.judge.tasks:"
CPU_PROBES = [
    ("ok", "echo", None, "ok"),
    ("exception", "fail", None, "exception"),
    ("kernel never ends", "hang", 10.0, "timeout"),
    ("segfault", "segfault", None, "crash"),
    ("abort", "abort", None, "crash"),
]
CPU_MODEL = MODEL.replace("batch_size = 2048", "batch_size = 64").replace("dim = 16384", "dim = 4096")
CPU_MODEL_NEW = model_new("        x = x.contiguous()\n        y = torch.empty_like(x)\n"
                          "        kernels.relu(x, y, x.numel())\n        return y")
CPU_KERNEL = """#include <cstdint>
extern "C" void relu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
"""
PROBES = [
    ("ok", "cuda_ok", None, "ok"),
    ("illegal memory access", "cuda_illegal_access", None, "cuda_error"),
    ("device-side assert", "cuda_device_assert", None, "cuda_error"),
    ("out of GPU memory", "cuda_oom", None, "oom"),
    ("kernel never ends", "cuda_hang", 10.0, "timeout"),
    ("segfault", "segfault", None, "crash"),
    ("abort", "abort", None, "crash"),
]


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def run_job(ex, job) -> tuple[str, object, float]:
    from cuda_agent.sandbox.executors import JobError

    t0 = time.monotonic()
    try:
        out = ex.submit(job).result()
        return "ok", out, time.monotonic() - t0
    except JobError as exc:
        return exc.reason, exc, time.monotonic() - t0


def part1(ray_ex, local_ex, cpu: bool) -> list[dict]:
    from cuda_agent.sandbox.executors import Job

    rows = []
    for name, fn, timeout, want in CPU_PROBES if cpu else PROBES:
        got = {}
        for label, ex in (("local", local_ex), ("ray", ray_ex)):
            reason, out, seconds = run_job(ex, Job(S + fn, timeout=timeout))
            after, _, _ = run_job(ex, Job(S + ("echo" if cpu else "cuda_ok")))
            got[label] = (reason, str(out) if reason != "ok" else "", seconds, after)
        same = got["ray"][0] == got["local"][0] == want and got["ray"][1] == got["local"][1]
        ok = same and got["ray"][3] == "ok"
        rows.append({"probe": name, "expected": want, "local": got["local"][0], "ray": got["ray"][0],
                     "same message": "yes" if got["ray"][1] == got["local"][1] else "NO",
                     "ray_s": f"{got['ray'][2]:.2f}", "local_s": f"{got['local'][2]:.2f}", "next job (ray)": got["ray"][3],
                     "result": "PASS" if ok else "FAIL", "message": got["ray"][1][:60]})
        print(f"  {name}: local {got['local'][0]} ray {got['ray'][0]}", flush=True)
    return rows


def make_workspace(root: Path, cpu: bool):
    from cuda_agent.core.types import Task
    from cuda_agent.sandbox.workspace.workspace import create_workspace

    if cpu:
        ws = create_workspace(Task(id="relu_ray", source="check", code=CPU_MODEL), root, backend="cpu", compiler="gxx")
        ws.restore({"model_new.py": CPU_MODEL_NEW, "kernels/relu.cpp": CPU_KERNEL})
        return ws
    ws = create_workspace(Task(id="relu_ray", source="check", code=MODEL), root, backend="cuda", compiler="cpp_extension")
    ws.restore({"model_new.py": model_new(), "kernels/relu_binding.cpp": BINDING,
                "kernels/relu_kernel.cu": kernel(GOOD_BODY)})
    return ws


def part2(ray_ex, local_ex, n: int, tolerance: float, cpu: bool) -> tuple[list[dict], list[dict]]:
    from cuda_agent.core.plugins import get_plugin_manager
    from cuda_agent.sandbox.executors import Job

    tmp = Path(tempfile.mkdtemp(prefix="ray-pool-"))
    ws = make_workspace(tmp / "ws", cpu)
    compiler = get_plugin_manager().create("compiler", {"name": ws.compiler})
    builds = []
    t0 = time.monotonic()
    c_local = compiler.build(ws.root)
    builds.append({"build": f"{ws.compiler} here", "ok": c_local.ok, "seconds": f"{time.monotonic() - t0:.1f}"})
    print(f"  built here: ok={c_local.ok} in {time.monotonic() - t0:.1f} s", flush=True)
    (ws.root / ".cuda_agent" / "build" / "manifest.json").unlink()  # the Ray task builds it again
    remote = ray_ex.build_executor()
    job = Job("cuda_agent.sandbox.judge.pipeline:compile_job", {"compiler": compiler, "workspace": str(ws.root)},
              kind="compile", pass_device=False, timeout=600)
    reason, c_ray, seconds = run_job(remote, job)
    builds.append({"build": f"Ray task on {remote.built_on[-1] if remote.built_on else '?'}",
                   "ok": reason == "ok" and c_ray.ok, "seconds": f"{seconds:.1f}"})
    print(f"  built as a Ray task: {reason} in {seconds:.1f} s", flush=True)
    if reason != "ok" or not c_ray.ok:
        print(f"  the Ray build failed: {c_ray}", flush=True)
        compiler.build(ws.root)
    popts = {"baselines": True, "compile_baseline": not cpu}
    per = {(label, kind): [] for label in ("local", "ray") for kind in ("verify", "profile")}
    medians = {"local": [], "ray": []}
    verdicts = {"local": set(), "ray": set()}
    for i in range(n):
        for label, ex in (("local", local_ex), ("ray", ray_ex)) if i % 2 == 0 else (("ray", ray_ex), ("local", local_ex)):
            for kind, fn, opts in (("verify", "verify", {}), ("profile", "profile", popts)):
                reason, out, seconds = run_job(ex, Job(TASKS + fn, {"workspace": str(ws.root), "options": opts},
                                                       kind=kind, timeout=600))
                per[(label, kind)].append(seconds)
                ok = reason == "ok" and getattr(out, "ok", False)
                verdicts[label].add(f"{kind}:{'ok' if ok else reason + ':' + str(getattr(out, 'message', out))[:80]}")
                if kind == "profile" and ok:
                    medians[label].append(out.candidate.median_ms)
                print(f"  {label} {kind} #{i}: {reason} {seconds:.2f} s", flush=True)
    rows = []
    for kind in ("verify", "profile"):
        lo, ra = statistics.median(per[("local", kind)][1:] or per[("local", kind)]), \
            statistics.median(per[("ray", kind)][1:] or per[("ray", kind)])
        rows.append({"job": kind, "n": n, "local_s (median)": f"{lo:.3f}", "ray_s (median)": f"{ra:.3f}",
                     "overhead_s": f"{ra - lo:+.3f}", "target": "< 0.3 s", "result": "PASS" if ra - lo < 0.3 else "OVER"})
    m_lo = statistics.median(medians["local"]) if medians["local"] else float("nan")
    m_ra = statistics.median(medians["ray"]) if medians["ray"] else float("nan")
    agree = verdicts["local"] == verdicts["ray"] == {"verify:ok", "profile:ok"}
    close = abs(m_ra - m_lo) <= tolerance * m_lo
    rows.append({"job": "candidate median", "n": len(medians["ray"]), "local_s (median)": f"{m_lo:.4f} ms",
                 "ray_s (median)": f"{m_ra:.4f} ms", "overhead_s": f"{(m_ra / m_lo - 1) * 100:+.2f}%",
                 "target": f"within {tolerance:.0%}", "result": "PASS" if close else "FAIL"})
    rows.append({"job": "verdicts", "n": n, "local_s (median)": ",".join(sorted(verdicts["local"]))[:40],
                 "ray_s (median)": ",".join(sorted(verdicts["ray"]))[:40], "overhead_s": "", "target": "equal, all ok",
                 "result": "PASS" if agree else "FAIL"})
    return rows, builds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=["1", "2", "all"], default="all")
    ap.add_argument("--jobs", type=int, default=4, help="verify and profile jobs per executor (part 2)")
    ap.add_argument("--tolerance", type=float, default=0.03, help="candidate medians ray vs local (part 2)")
    ap.add_argument("--cpu", action="store_true", help="no GPU: a CPU slot, CPU probes and a g++ candidate")
    args = ap.parse_args()
    try:
        import ray  # noqa: F401
    except ImportError:
        print("ray is not installed here: carry the slim wheel (scripts/gpu/README.md, 'Ray')")
        return 2
    from cuda_agent.sandbox.executors.local import LocalExecutor, LocalExecutorOptions
    from cuda_agent_ray.executor import RayExecutor, RayExecutorOptions
    from cuda_agent_ray.localcluster import LocalCluster

    if not args.cpu and gpu_count() < 1:
        print("no GPU: run this on the GPU machine (or with --cpu)")
        return 2
    t0 = time.monotonic()
    if args.cpu:
        from cuda_agent.sandbox.executors.local import CpuExecutor, CpuExecutorOptions

        cluster = LocalCluster(head_resources={"cuda_agent_slot": 1}, head_cpus=1, fast_failure_detection=False)
    else:
        cluster = LocalCluster(head_cpus=4, head_gpus=1, fast_failure_detection=False)
    results: dict[str, list] = {}
    fails = 0
    try:
        cluster.start()
        started = time.monotonic() - t0
        ray_ex = RayExecutor(RayExecutorOptions(address=cluster.address, node_ip_address=cluster.head_ip,
                                                namespace="gpu-check", builds="ray", detached=False, timeout=120,
                                                backend="cpu" if args.cpu else "cuda"))
        if args.cpu:
            local_ex = CpuExecutor(CpuExecutorOptions(timeout=120))
        else:
            local_ex = LocalExecutor(LocalExecutorOptions(timeout=120, device_count=1))
        try:
            t1 = time.monotonic()
            ray_ex.start()
            local_ex.start()
            print(f"cluster up in {started:.1f} s; ray slots {ray_ex.devices} after {time.monotonic() - t1:.1f} s",
                  flush=True)
            from cuda_agent.sandbox.executors import Job

            for ex in (local_ex, ray_ex):  # first job of each pool: not counted
                run_job(ex, Job(S + ("echo" if args.cpu else "cuda_ok")))
            if args.part in ("1", "all"):
                print("part 1: failures through ray and local", flush=True)
                results["failures"] = part1(ray_ex, local_ex, args.cpu)
            if args.part in ("2", "all"):
                print("part 2: verify/profile jobs through ray and local", flush=True)
                results["jobs"], results["builds"] = part2(ray_ex, local_ex, args.jobs, args.tolerance, args.cpu)
        finally:
            ray_ex.close()
            local_ex.close()
    finally:
        cluster.stop()
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "ray_pool.json").write_text(json.dumps(results, indent=1, default=str))
    if "failures" in results:
        print("\nfailures: ray vs local")
        print(table(results["failures"], ["probe", "expected", "local", "ray", "same message", "local_s", "ray_s",
                                          "next job (ray)", "result", "message"]))
        fails += sum(r["result"] != "PASS" for r in results["failures"])
    if "builds" in results:
        print("\nbuilds")
        print(table(results["builds"], ["build", "ok", "seconds"]))
        fails += sum(not r["ok"] for r in results["builds"])
    if "jobs" in results:
        print("\njobs: time from submit to result, ray vs local (first job of each kind left out of the medians)")
        print(table(results["jobs"], ["job", "n", "local_s (median)", "ray_s (median)", "overhead_s", "target", "result"]))
        fails += sum(r["result"] == "FAIL" for r in results["jobs"])
    print(f"\n{fails} check(s) failed" if fails else "\nall checks passed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
