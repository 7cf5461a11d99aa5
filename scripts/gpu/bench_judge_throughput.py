"""Benchmark of the judge's throughput on single-file solutions: builds inside the GPU job
(the old path) against builds ahead in the CPU build pool (the new one), side by side.

N KernelBench single-file solutions, each building its own CUDA extension with
``load_inline`` when imported, are scored through the sandbox's judge exactly as
``cuda-agent eval --solutions`` scores them (a fresh workspace per solution, the
solution installed, one verify+profile job per candidate on the GPU executor, as many
candidates in flight as eval would run). L1 solutions are hand-written activation
kernels; L2 solutions keep the task's PyTorch layers and end in a CUDA epilogue kernel.
The baselines of every task are measured first and cached, so neither path pays for them.

Prints, per path: candidates per minute per GPU, the GPU-busy fraction (time inside GPU
jobs over wall time) and per-phase medians (build, load, verify, profile, waiting), then
whether every verdict agrees between the paths and how far the speedups moved.

    python3 scripts/gpu/bench_judge_throughput.py                 # 12 solutions, both paths
    python3 scripts/gpu/bench_judge_throughput.py --n 24 --paths new

``--paths before,after`` (the default) compares the judge's order of work and bounds: before
(every refusal inside the GPU job, baselines measured before verification, verification of a
hopeless candidate on every input set, timeouts from profiles only) and after (refusals that
need no GPU before the build, baselines only once a candidate verified, a hopeless first call
ending verification after one input set, eager times for timeouts read from the cache, worker
and candidate processes forked from processes that imported torch once). Each
runs twice, first with an empty baseline cache (fresh) and then with the one it filled
(cached); builds are shared by every run (the first one builds, and its build column shows
it). The mix holds, besides the honest solutions, one statically refused file and one
hopeless one (an L1 activation on one warp). Defaults (--n 6: three L1 activations with their
6.4 GB outputs, three L2 tasks, plus the two) fit about 8 minutes on one H200.
``old,new`` is the earlier comparison of builds inside the GPU job against builds ahead.

A pass longer than one call of a batch runner splits with ``--work DIR --passes fresh`` in
one call and ``--work DIR --passes cached`` in the next, on the same machine. Each run's line
of the table is printed, and the JSON written, as soon as that run ends.

KernelBench is found by --root or $CUDA_AGENT_KERNELBENCH. With OUT set, the solutions and a
JSON of every candidate's numbers are written there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# L1 activations: the kernel's expression of v (and the ModelNew parameter p, its default)
ACTIVATIONS = {
    "19_ReLU": ("fmaxf(v, 0.f)", 0.0),
    "20_LeakyReLU": ("v > 0.f ? v : v * p", 0.01),
    "21_Sigmoid": ("1.f / (1.f + expf(-v))", 0.0),
    "22_Tanh": ("tanhf(v)", 0.0),
    "25_Swish": ("v / (1.f + expf(-v))", 0.0),
    "26_GELU_": ("0.5f * v * (1.f + erff(v * 0.70710678118654752f))", 0.0),
    "27_SELU_": ("1.0507009873554805f * (v > 0.f ? v : 1.6732632423543772f * (expf(v) - 1.f))", 0.0),
    "28_HardSigmoid": ("fminf(fmaxf(v / 6.f + 0.5f, 0.f), 1.f)", 0.0),
    "29_Softplus": ("v > 20.f ? v : log1pf(expf(v))", 0.0),
    "30_Softsign": ("v / (1.f + fabsf(v))", 0.0),
    "31_ELU": ("v > 0.f ? v : p * (expf(v) - 1.f)", 1.0),
    "32_HardTanh": ("fminf(fmaxf(v, -1.f), 1.f)", 0.0),
}
L2_TASKS = ["12_Gemm_Multiply_LeakyReLU", "1_Conv2D_ReLU_BiasAdd", "14_Gemm_Divide_Sum_Scaling",
            "25_Conv2d_Min_Tanh_Tanh", "29_Matmul_Mish_Mish", "32_Conv2d_Scaling_Min",
            "30_Gemm_GroupNorm_Hardtanh", "31_Conv2d_Min_Add_Multiply", "33_Gemm_Scale_BatchNorm",
            "22_Matmul_Scale_ResidualAdd_Clamp_LogSumExp_Mish", "17_Conv2d_InstanceNorm_Divide",
            "21_Conv2d_Add_Scale_Sigmoid_GroupNorm"]

_KERNEL = r'''
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void {name}_kernel(const float* __restrict__ x, float* __restrict__ y, long n, float p) {{
    long stride = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {{
        float v = x[i];
        y[i] = {expr};
    }}
}}

torch::Tensor {name}(torch::Tensor x, double p) {{
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "float32 CUDA tensor expected");
    auto y = torch::empty_like(x);
    long n = x.numel();
    int threads = 256;
    long blocks = std::min<long>((n + threads - 1) / threads, 132L * 32);
    {name}_kernel<<<(int)blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n, (float)p);
    return y;
}}
'''


def _ext(name: str, expr: str) -> str:
    src = _KERNEL.format(name=name, expr=expr)
    return (f"_CUDA = r'''{src}'''\n"
            f"_ext = load_inline(name={name!r}, cpp_sources='torch::Tensor {name}(torch::Tensor x, double p);',\n"
            f"                   cuda_sources=_CUDA, functions=[{name!r}], extra_cuda_cflags=['-O3'])\n")


def l1_solution(stem: str) -> str:
    expr, default = ACTIVATIONS[stem]
    name = "kb1_" + stem.split("_", 1)[1].lower().rstrip("_")
    return ("import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n" + _ext(name, expr) +
            f"\n\nclass ModelNew(nn.Module):\n    def __init__(self, p: float = {default!r}):\n        super().__init__()\n"
            f"        self.p = float(p)\n\n    def forward(self, x):\n        return _ext.{name}(x.contiguous(), self.p)\n")


def l2_solution(stem: str, task_code: str) -> str:
    name = "kb2_" + stem.split("_", 1)[0]
    base = task_code.replace("class Model(", "class _Layers(").replace("super(Model, self)", "super(_Layers, self)")
    return (base.rstrip() + "\n\nfrom torch.utils.cpp_extension import load_inline\n\n" + _ext(name, "v") +
            f"\n\nclass ModelNew(_Layers):\n    \"\"\"The task's layers, then a CUDA epilogue kernel.\"\"\"\n\n"
            f"    def forward(self, *args):\n        out = super().forward(*args)\n"
            f"        return _ext.{name}(out.contiguous(), 0.0)\n")


def refused_solution(code: str) -> str:
    """An honest file that also imports the reference (rule static.reference-model)."""
    return "from model import Model as _Reference  # noqa: F401\n" + code


def hopeless_solution(code: str) -> str:
    """An L1 activation on one warp of one block: correct, and hundreds of times slower than
    eager on its 6.4 GB output (about a second or more per call on an H200)."""
    return code.replace("kb1_", "kb1slow_").replace("_kernel<<<(int)blocks, threads,", "_kernel<<<1, 32,")


def find_root(arg: str | None) -> Path:
    for cand in (arg, os.environ.get("CUDA_AGENT_KERNELBENCH"), REPO / "kb", REPO / "shared" / "kernelbench"):
        if cand and (Path(cand) / "level1").is_dir():
            return Path(cand).resolve()
    sys.exit("KernelBench not found: pass --root or set CUDA_AGENT_KERNELBENCH")


def tasks_matching(root_arg: str | None, ids: str) -> list:
    """KernelBench tasks (found as :func:`find_root` finds them) whose ids match one of the
    comma-separated globs in ``ids``, e.g. ``'L1/19_ReLU,L2/12_*'``."""
    import fnmatch

    from cuda_agent.core.plugins import get_plugin_manager

    root = find_root(root_arg)
    tasks = get_plugin_manager().create("dataset", {"name": "kernelbench", "options": {"root": str(root)}}).tasks()
    pats = [p.strip() for p in ids.split(",") if p.strip()]
    return [t for t in tasks if any(fnmatch.fnmatch(t.id, p) for p in pats)]


def pick(root: Path, n: int, levels: tuple[int, ...] = (1, 2)) -> list[tuple[object, str]]:
    from cuda_agent.core.plugins import get_plugin_manager

    tasks = {t.id: t for t in get_plugin_manager().create("dataset", {"name": "kernelbench", "options": {"root": str(root)}}).tasks()}
    l1 = [(tasks[f"L1/{s}"], l1_solution(s)) for s in ACTIVATIONS if f"L1/{s}" in tasks and 1 in levels]
    l2 = [(tasks[f"L2/{s}"], l2_solution(s, tasks[f"L2/{s}"].code)) for s in L2_TASKS if f"L2/{s}" in tasks and 2 in levels]
    out = []
    while len(out) < n and (l1 or l2):  # alternate the levels
        for group in (l1, l2):
            if group and len(out) < n:
                out.append(group.pop(0))
    return out


def mix(items: list) -> list:
    """``items`` plus one statically refused file and one hopeless one (an L1 activation)."""
    out = [(t, c, "honest") for t, c in items]
    if items:
        task, code = items[-1]
        out.append((task, refused_solution(code), "refused"))
    l1 = [(t, c) for t, c in items if t.level == 1]
    if l1:
        out.append((l1[0][0], hopeless_solution(l1[0][1]), "hopeless"))
    return out


def warm_baselines(executor, items, work: Path) -> float:
    """Every task's baselines measured and cached (a profiling job of the reference itself)."""
    from cuda_agent.evaluation.scoring import make_workspace
    from cuda_agent.sandbox.judge.pipeline import Judge, JudgeOptions

    t0 = time.perf_counter()
    judge = Judge(JudgeOptions(prebuild=False, verify_options={"rules": "none"}), executor, backend="cuda")
    for task, _ in items:
        root = make_workspace(task, work / "warm" / task.id.replace("/", "_"), "cuda")
        (root / "model_new.py").write_text(task.code + "\n\nclass ModelNew(Model):\n    pass\n")
        out = judge.judge(root, single_file=True)
        p = out.profile
        print(f"  baselines {task.id}: {'ok' if p is not None and p.ok else (out.verify.message if out.verify else '?')[:120]}",
              flush=True)
    return time.perf_counter() - t0


# the judge's order of work and bounds switched off (before) or on (after, the defaults)
BEFORE = {"judge": {"refusals_first": False, "timeouts_from_cache": False},
          "verify": {"hopeless_factor": 0.0}, "profile": {"defer_baselines": False}}


PARTIAL: Path | None = None  # where score() keeps the rows of the run in progress


def score(executor, items, work: Path, prebuild: bool, build_workers: int, rules: str, mode: str = "",
          cache: str = "") -> dict:
    from cuda_agent.evaluation.scoring import make_workspace, remove_workspace
    from cuda_agent.sandbox.judge.pipeline import Judge, JudgeOptions

    tag = mode or ("new" if prebuild else "old")
    off = BEFORE if mode.startswith("before") else {}
    popts = {"baseline_cache_dir": cache, **off.get("profile", {})} if cache else dict(off.get("profile", {}))
    shared = work / "prebuilt" if mode else work / f"prebuilt-{tag}"  # before/after runs share the builds
    opts = JudgeOptions(prebuild=prebuild, build_workers=build_workers, verify_timeout=300.0, profile_timeout=600.0,
                        prebuilt_cache=str(shared), verify_options={"rules": rules, **off.get("verify", {})},
                        profile_options=popts, **off.get("judge", {}))
    judge = Judge(opts, executor, backend="cuda")
    devices = max(1, len(executor.devices))
    workers = 2 * devices + (judge.build_workers() if prebuild else 0)  # as cuda-agent eval runs them
    rows, lock = [], threading.Lock()
    t_start = time.perf_counter()
    mono_start = time.monotonic()  # the executor's job records are on this clock

    def one(item) -> None:
        task, code, kind = item if len(item) == 3 else (*item, "honest")
        t0 = time.perf_counter()
        root = make_workspace(task, work / tag / f"{task.id.replace('/', '_')}-{kind}", "cuda")
        (root / "model_new.py").write_text(code)
        out = judge.judge(root, single_file=True)
        wall = time.perf_counter() - t0
        v, p = out.verify, out.profile
        info = (v.metadata or {}).get("prebuild") or {}
        phases = (v.metadata or {}).get("phase_seconds") or {}
        vm, pm = (v.metadata or {}) if v else {}, (p.metadata or {}) if p else {}
        row = {"task": task.id if kind == "honest" else f"{task.id} ({kind})", "kind": kind,
               "ok": bool(v and v.ok), "failure": v.failure.value if v else "?",
               "before_build": bool(vm.get("checked_before_build")), "verify_stopped": "verify_stopped" in vm,
               "baseline_cache": pm.get("baseline_cache", "-"),
               "baselines_after_verification": "baselines_measured" in vm,
               "baseline_s": float(pm.get("baseline_seconds") or 0.0),
               "message": (v.message if v and not v.ok else (p.message if p and not p.ok else ""))[:300],
               "profiled": bool(p and p.ok), "wall": wall, "build": float(info.get("build_seconds") or 0.0),
               "build_step": float(info.get("seconds") or 0.0), "built": info.get("built", "in the GPU job"),
               "load": float(phases.get("load") or 0.0), "verify": float(v.seconds if v else 0.0),
               "profile": float(p.seconds if p else 0.0),
               "speedup_vs_eager": p.speedup_vs_eager() if p and p.ok else None,
               "speedup_vs_compile": p.speedup_vs_compile() if p and p.ok else None,
               "prebuilt": (v.metadata or {}).get("prebuilt", ""), "extensions": (v.metadata or {}).get("extensions", ""),
               # whether the build job was offered the judge's precompiled torch/extension.h (builds only)
               "torch_header": str(info.get("torch_header", "")),
               # how the candidate's outputs came (device memory or host memory, and why) and
               # whether its candidate process was warm (made ahead of the job) or started for it
               "output_transfer": str((v.metadata or {}).get("output_transfer", "")),
               "candidate_process": str((v.metadata or {}).get("candidate_process", "")),
               "job_started": str((v.metadata or {}).get("job_started", "")),
               "compile_s": float(pm.get("compile_seconds") or 0.0), "baselines_ahead": pm.get("baselines_ahead", ""),
               "profile_phases": dict(pm.get("phase_seconds") or {}), "verify_phases": dict(phases),
               "timing_phases": dict(pm.get("timing_phase_seconds") or {}),
               "baseline_cost": dict(pm.get("baseline_cost") or {}),
               # where a timing's time goes: its loops (calls, trusted wall, reported, own work) and attempts
               "timing_loops": [{k: lp.get(k) for k in ("calls", "wall_ms", "reported_ms", "overhead_ms")}
                                for lp in pm.get("timing_loops") or [] if isinstance(lp, dict)],
               "timing_attempts": getattr(p.candidate, "attempts", None) if p and p.ok and p.candidate else None,
               "timing_stopped": bool(pm.get("timing_stopped")), "run_again": bool(pm.get("run_again_because")),
               "t_start": t0 - t_start, "t_end": t0 - t_start + wall}
        row["waiting"] = max(0.0, wall - row["build_step"] - row["verify"] - row["profile"])
        with lock:
            rows.append(row)
            if PARTIAL:  # a call cut short keeps every finished row
                PARTIAL.write_text(json.dumps({"path": tag, "rows": rows}, default=str))
        sp = "" if row["speedup_vs_eager"] is None else f"{row['speedup_vs_eager']:.2f}x eager "
        print(f"  [{tag}] {task.id}: {'correct' if row['ok'] else row['failure']} {sp}wall {wall:.1f}s "
              f"build {row['build']:.1f}s load {row['load']:.1f}s verify {row['verify']:.1f}s "
              f"profile {row['profile']:.1f}s {row['message'][:100]}", flush=True)
        if row["baseline_cache"] == "miss":  # what measuring the task's baselines in this job cost
            print(f"  [{tag}] {task.id} baselines measured in the job: {row['baseline_s']:.1f}s, compile "
                  f"{row['compile_s']:.1f}s, {json.dumps(row['baseline_cost'])}; profile phases "
                  f"{json.dumps(row['profile_phases'])}; timing {json.dumps(row['timing_phases'])}", flush=True)
        if kind != "honest":  # how the judge bounded it
            print(f"  [{tag}] {task.id} ({kind}): " + json.dumps({k: x for k, x in {
                "verify_stopped": vm.get("verify_stopped"), "timing_stopped": pm.get("timing_stopped"),
                "verified_in_full_because": vm.get("verified_in_full_because"), "phases": phases,
                "built": info.get("built"), "message": (v.message if v else "")[:300]}.items() if x}, default=str),
                  flush=True)
        remove_workspace(root)

    done = threading.Event()

    def report() -> None:  # what is still in flight, every 30 s: a long run says where it stands
        while not done.wait(30.0):
            pool_ = getattr(executor, "pool", None)
            running = [(r.label, r.kind, round(time.monotonic() - r.started)) for r in
                       (getattr(pool_, "records", None) or []) if r.started is not None and r.finished is None]
            print(f"  [{tag}] at {time.perf_counter() - t_start:.0f} s: {len(rows)} of {len(items)} finished; "
                  f"GPU jobs running {running or '-'}; queued {pool_.queued() if pool_ is not None else '?'}", flush=True)

    threading.Thread(target=report, daemon=True).start()
    try:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, items))
    finally:
        done.set()
    wall = time.perf_counter() - t_start
    judge.close()
    jobs = gpu_timeline(executor, mono_start, wall)
    busy = jobs.get("running_s")
    if busy is None:  # an executor without job records: the jobs' own seconds
        busy = sum(r["verify"] + r["profile"] for r in rows)
    return {"path": tag, "rows": rows, "wall": wall, "workers": workers, "devices": devices, "timeline": jobs,
            "per_min_per_gpu": len(rows) / wall * 60 / devices, "gpu_busy": busy / (wall * devices)}


def gpu_timeline(executor, since: float, wall: float) -> dict:
    """Where the GPUs' time went in a run, from the executor's job records: time inside jobs
    (by kind), before the first job, between jobs while one waited (dispatch) or none did
    (starved: nothing built or due yet), and after the last."""
    pool = getattr(executor, "pool", None)
    recs = [r for r in (getattr(pool, "records", None) or []) if r.submitted >= since and r.started is not None]
    if not recs:
        return {}
    out: dict = {"jobs": len(recs), "running_s": 0.0, "by_kind": {}, "dispatch_s": 0.0, "starved_s": 0.0,
                 "before_first_s": 0.0, "after_last_s": 0.0}
    by_dev: dict = {}
    for r in recs:
        by_dev.setdefault(r.device or "?", []).append(r)
    for dev, rs in by_dev.items():
        rs.sort(key=lambda r: r.started)
        out["before_first_s"] += rs[0].started - since
        end = [r.finished or (since + wall) for r in rs]
        out["after_last_s"] += max(0.0, since + wall - max(end))
        for i, r in enumerate(rs):
            ran = end[i] - r.started
            out["running_s"] += ran
            k = out["by_kind"].setdefault(r.kind, [0, 0.0])
            k[0] += 1
            k[1] += ran
            if i:
                gap = max(0.0, r.started - end[i - 1])
                starved = min(gap, max(0.0, r.submitted - end[i - 1]))
                out["starved_s"] += starved
                out["dispatch_s"] += gap - starved
    return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in out.items()}


def timeline_line(r: dict) -> str:
    t = r.get("timeline") or {}
    if not t:
        return f"{r['path']}: no job records"
    kinds = ", ".join(f"{k} {n} jobs {s:.0f} s" for k, (n, s) in sorted(t["by_kind"].items()))
    return (f"{r['path']}: GPU in jobs {t['running_s']:.0f} of {r['wall'] * r['devices']:.0f} s ({kinds}); "
            f"idle before the first job {t['before_first_s']:.0f} s, between jobs with one waiting "
            f"{t['dispatch_s']:.0f} s, with none due {t['starved_s']:.0f} s, after the last {t['after_last_s']:.0f} s")


def summary_row(r: dict) -> None:
    """One run's line of the table: candidates, wall, rate, GPU-busy fraction, phase medians."""
    rows = r["rows"]
    label = {"old": "old (build in the GPU job)", "new": "new (built ahead on CPUs)"}.get(r["path"], r["path"])
    print(f"| {label} | {len(rows)} | "
          f"{r['wall']:.0f} | {r['workers']} | {r['per_min_per_gpu']:.2f} | {r['gpu_busy']:.0%} | "
          f"{med(rows, 'build'):.1f} | {med(rows, 'load'):.1f} | {med(rows, 'verify'):.1f} | {med(rows, 'profile'):.1f} | "
          f"{med(rows, 'waiting'):.1f} |", flush=True)


def profile_phase_lines(r: dict) -> list[str]:
    """Where the honest candidates' verification and profile jobs spent their time, per
    KernelBench level: the median of each phase, and for profiles the same again over those
    that measured their task's baselines themselves."""
    out = []
    for level in sorted({row["task"].split("/", 1)[0] for row in r["rows"]}):
        honest = [x for x in r["rows"] if x["task"].startswith(level + "/") and x.get("kind", "honest") == "honest"]
        for job, label, sel in (
                ("verification", "all", [x for x in honest if x.get("verify_phases")]),
                ("profiles", "all", [x for x in honest if x.get("profile_phases")]),
                ("profiles", "measured their baselines",
                 [x for x in honest if x.get("profile_phases") and x["baseline_cache"] == "miss"])):
            if not sel:
                continue
            key = "verify_phases" if job == "verification" else "profile_phases"
            names = sorted({k for x in sel for k in x[key]},
                           key=lambda k: -statistics.median(x[key].get(k, 0.0) for x in sel))
            parts = ", ".join(f"{k} {statistics.median(x[key].get(k, 0.0) for x in sel):.2f}" for k in names)
            out.append(f"{r['path']}: {level} {job} ({label}, {len(sel)}), median s per phase: {parts}")
        timed = [x for x in honest if x.get("timing_phases")]
        if timed:  # inside the profiles' timing phase
            names = sorted({k for x in timed for k in x["timing_phases"]},
                           key=lambda k: -statistics.median(x["timing_phases"].get(k, 0.0) for x in timed))
            parts = ", ".join(f"{k} {statistics.median(x['timing_phases'].get(k, 0.0) for x in timed):.2f}" for k in names)
            out.append(f"{r['path']}: {level} timing phase ({len(timed)}), median s: {parts}")
    return out


def timing_loop_lines(r: dict) -> list[str]:
    """Per level, what the honest candidates' timings did: attempts, timed calls per loop, and
    a loop's trusted wall time against the time its calls reported (medians)."""
    out = []
    for level in sorted({row["task"].split("/", 1)[0] for row in r["rows"]}):
        sel = [x for x in r["rows"] if x["task"].startswith(level + "/") and x.get("kind", "honest") == "honest"
               and x.get("timing_loops")]
        if not sel:
            continue
        loops = [lp for x in sel for lp in x["timing_loops"]]

        def m(key: str) -> float:
            xs = [float(lp[key]) for lp in loops if isinstance(lp.get(key), (int, float))]
            return statistics.median(xs) if xs else 0.0

        attempts = [x["timing_attempts"] for x in sel if isinstance(x.get("timing_attempts"), int)]
        out.append(f"{r['path']}: {level} timings ({len(sel)}): loops per timing "
                   f"{statistics.median(len(x['timing_loops']) for x in sel):g}, attempts "
                   f"{statistics.median(attempts) if attempts else 0:g}; per loop: calls {m('calls'):g}, "
                   f"trusted wall {m('wall_ms'):.0f} ms, reported {m('reported_ms'):.0f} ms, "
                   f"own work {m('overhead_ms'):.0f} ms")
    return out


def med(rows, key) -> float:
    xs = [r[key] for r in rows]
    return statistics.median(xs) if xs else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=6, help="honest solutions (the refused and hopeless ones come on top)")
    ap.add_argument("--paths", default="before,after", help="before,after (order of work and bounds) or old,new")
    ap.add_argument("--levels", default="1,2", help="KernelBench levels to take solutions from, e.g. 2")
    ap.add_argument("--root")
    ap.add_argument("--rules", default="kernelbench")
    ap.add_argument("--build-workers", type=int, default=0)
    ap.add_argument("--no-warm", action="store_true", help="do not measure the baselines first")
    ap.add_argument("--passes", default="fresh,cached",
                    help="which passes of before/after to run: fresh (empty baseline cache), cached, or both")
    ap.add_argument("--work", help="work folder kept between calls (baseline caches, builds); a pass 'cached' "
                                   "in a later call reads what 'fresh' left there")
    args = ap.parse_args()
    root = find_root(args.root)
    levels = tuple(int(x) for x in args.levels.split(","))
    items = pick(root, args.n, levels)
    paths = [x for x in args.paths.split(",") if x]
    compare = any(x in ("before", "after") for x in paths)
    if compare:
        items = mix(items)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    if out_dir:
        sol = out_dir / "bench_judge_solutions"
        for task, code, *kind in items:
            (sol / f"level{task.level}").mkdir(parents=True, exist_ok=True)
            suffix = f"-{kind[0]}" if kind and kind[0] != "honest" else ""
            (sol / f"level{task.level}" / (task.id.split("/", 1)[1] + suffix + ".py")).write_text(code)
    from cuda_agent.sandbox.executors.local import LocalExecutor, LocalExecutorOptions

    if args.work:
        work = Path(args.work).resolve()
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="bench-judge-"))
    os.chmod(work, 0o755)
    passes = [x for x in args.passes.split(",") if x]
    if not passes or set(passes) - {"fresh", "cached"}:
        ap.error(f"--passes takes fresh, cached or both, not {args.passes!r}")
    runs = []
    json_path = out_dir / "bench_judge_throughput.json" if out_dir else None
    global PARTIAL
    PARTIAL = out_dir / "bench_judge_partial.json" if out_dir else None
    if compare:  # each path from an empty baseline cache, then with the one it filled
        warm = 0.0
        for path in (x for x in paths if x in ("before", "after")):
            # before: every worker and candidate process started from nothing; after: forked
            # from processes that imported torch once (the executor's fork server)
            executor = LocalExecutor(LocalExecutorOptions(fork_server=path == "after"))
            os.environ["CUDA_AGENT_CANDIDATE_FORK"] = "1" if path == "after" else "0"
            executor.start()
            try:
                cache = str(work / f"baselines-{path}")
                for when in passes:
                    if when == "cached" and not any(Path(cache).glob("**/*.json")):
                        print(f"-- {path}, baselines cached: no cache in {cache} (run the fresh pass first)", flush=True)
                        continue
                    if when == "fresh":  # from nothing, also in a --work folder an earlier call left
                        shutil.rmtree(cache, ignore_errors=True)
                        if path == next(x for x in paths if x in ("before", "after")):
                            shutil.rmtree(work / "prebuilt", ignore_errors=True)
                    print(f"-- {path}, baselines {when}", flush=True)
                    runs.append(score(executor, items, work, True, args.build_workers, args.rules,
                                      f"{path}, baselines {when}", cache))
                    summary_row(runs[-1])  # printed as it ends: a call cut later keeps it
                    print(timeline_line(runs[-1]), flush=True)
                    for line in profile_phase_lines(runs[-1]) + timing_loop_lines(runs[-1]):
                        print(line, flush=True)
                    if json_path:
                        json_path.write_text(json.dumps({"runs": runs}, indent=1, default=str))
            finally:
                executor.close()
    executor = LocalExecutor()
    if not compare:
        executor.start()
    try:
        if not compare:
            warm = 0.0 if args.no_warm else warm_baselines(executor, items, work)
            print(f"baselines measured and cached in {warm:.0f} s", flush=True)
            runs = [score(executor, items, work, p == "new", args.build_workers, args.rules)
                    for p in paths if p in ("old", "new")]
    finally:
        executor.close()
    print(f"\nJudge throughput, {len(items)} single-file solutions (KernelBench L1/L2), rules {args.rules}")
    print("| path | candidates | wall s | in flight | cand/min/GPU | GPU busy | build | load | verify | profile | waiting |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in runs:
        summary_row(r)
    for r in runs:  # where the GPU's time went
        print(timeline_line(r))
    for r in runs:  # the outputs' way and the candidate processes' start, per path
        ways = statistics.multimode([x["output_transfer"].split(" (")[0] or "-" for x in r["rows"]] or ["-"])
        n_warm = sum(1 for x in r["rows"] if x["candidate_process"].startswith("warm"))
        n_forked = sum(1 for x in r["rows"] if x.get("job_started", "").startswith("forked"))
        slow = [x for x in r["rows"] if x["load"] > 1.0]
        print(f"{r['path']}: outputs mostly via {', '.join(ways)}; warm candidate processes {n_warm}/{len(r['rows'])}, "
              f"forked {n_forked}; "
              f"load over 1 s: {len(slow)} ({', '.join(sorted({x['candidate_process'][:60] for x in slow})) or '-'})")
        built = [x["torch_header"] for x in r["rows"] if x.get("torch_header")]
        if built:  # the builds this run made: offered the precompiled torch header or not, and why not
            offered = sum(1 for h in built if h.startswith("offered"))
            why = sorted({h.removeprefix("not offered: ")[:80] for h in built if not h.startswith("offered")})
            print(f"{r['path']}: builds offered the precompiled torch header {offered}/{len(built)}"
                  + (f"; not offered: {'; '.join(why)}" if why else ""))
    if compare:  # what the order of work and the bounds changed, per run
        print("\n| run | refused before the build | verifications stopped | baselines measured | baseline s "
              "| refused sample s | hopeless sample s |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in runs:
            rows = r["rows"]
            kind = {x["kind"]: x for x in rows}
            print(f"| {r['path']} | {sum(x['before_build'] for x in rows)} | {sum(x['verify_stopped'] for x in rows)} | "
                  f"{sum(x['baseline_cache'] == 'miss' for x in rows)} | {sum(x['baseline_s'] for x in rows):.1f} | "
                  f"{kind['refused']['wall'] if 'refused' in kind else float('nan'):.1f} | "
                  f"{kind['hopeless']['wall'] if 'hopeless' in kind else float('nan'):.1f} |")
        by = {r["path"]: {x["task"]: x for x in r["rows"]} for r in runs}
        for when in ("fresh", "cached"):
            a, b = by.get(f"before, baselines {when}"), by.get(f"after, baselines {when}")
            if a and b:
                same = [t for t in a if t in b and (a[t]["ok"], a[t]["failure"]) == (b[t]["ok"], b[t]["failure"])]
                diff = [f"{t}: {a[t]['failure']} -> {b[t]['failure']}" for t in a if t in b and t not in same]
                ra = next(r for r in runs if r["path"] == f"before, baselines {when}")
                rb = next(r for r in runs if r["path"] == f"after, baselines {when}")
                print(f"baselines {when}: verdicts equal {len(same)}/{len(a)} ({'; '.join(diff) or 'no change'}); "
                      f"throughput after/before {rb['per_min_per_gpu'] / max(1e-9, ra['per_min_per_gpu']):.2f}x")
    if len(runs) == 2:
        a = {x["task"]: x for x in runs[0]["rows"]}
        b = {x["task"]: x for x in runs[1]["rows"]}
        same = [t for t in a if t in b and (a[t]["ok"], a[t]["failure"]) == (b[t]["ok"], b[t]["failure"])]
        ratios = [b[t]["speedup_vs_eager"] / a[t]["speedup_vs_eager"] for t in same
                  if a[t]["speedup_vs_eager"] and b[t]["speedup_vs_eager"]]
        print(f"\nverdicts equal: {len(same)}/{len(a)}; speedup vs eager new/old: median "
              f"{statistics.median(ratios) if ratios else float('nan'):.3f}, range "
              f"{min(ratios) if ratios else float('nan'):.3f}-{max(ratios) if ratios else float('nan'):.3f}; "
              f"throughput new/old {runs[1]['per_min_per_gpu'] / max(1e-9, runs[0]['per_min_per_gpu']):.2f}x")
    if out_dir:
        (out_dir / "bench_judge_throughput.json").write_text(json.dumps({"runs": runs, "warm_seconds": warm}, indent=1, default=str))


if __name__ == "__main__":
    main()
