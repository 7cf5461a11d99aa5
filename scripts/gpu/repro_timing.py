#!/usr/bin/env python3
"""Timing reproducibility across processes, over every KernelBench level-1 reference (eager).

Two worker processes time the same problems with three methods:

* ``default`` -- what the profiling jobs do: ``cuda_events``, a timing with a spread above
  ``ProfileOptions.max_spread`` repeated; process A chooses the problem's mode as a baseline
  measurement does (``profilers.base.time_for_task``: CUDA-graph replay for work on parallel
  streams or a timing that stays unsteady), and process B follows that mode, as a reward
  follows the mode recorded with the task's cached baseline;
* ``cuda_events`` -- the profiler alone (L2 flushed, inputs rotated, launch overhead and all
  streams counted, median over a set total time); ``--methods`` adds variants
  (``cuda_events_sync``: device synchronised around every call; ``cuda_events_noflush``;
  ``cuda_events_nosettle``: the fixed warm-up only, without waiting for the clock to level off;
  ``cuda_events_graph``);
* ``torch_profiler`` -- the paper's method (summed device time under torch.profiler).

The workers take turns problem by problem (process A times problem i, then process B, then
A times problem i+1 ...), so slow drift of clocks and temperature hits both alike; pass
``--sequential`` to run all of A before all of B instead. Precision policy: TF32 off.

Target: the two processes differ by at most 1% for kernels of 50 us or more, at most 3% below.

    python3 scripts/gpu/repro_timing.py                  # all of level 1
    python3 scripts/gpu/repro_timing.py --limit 10       # a quick look

Prints a table per method (problems, within target, misses flagged by their own spread,
median and max difference) and the worst problems; writes the full results as JSON to
$OUT/repro_timing.json when OUT is set.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for sub in ("packages/core/src", "packages/sandbox/src"):
    p = str(REPO / sub)
    if p not in sys.path:
        sys.path.insert(0, p)

# label -> (profiler, options over the defaults below)
PRESETS = {
    # what profiling jobs do: cuda_events, an unsteady timing repeated, a task with parallel
    # streams or one that stays unsteady timed by graph replay (ProfileOptions.max_spread /
    # attempts); process B follows process A's mode
    "default": ("cuda_events", {}),
    "cuda_events": ("cuda_events", {}),
    "cuda_events_sync": ("cuda_events", {"sync_each": True}),
    "cuda_events_noflush": ("cuda_events", {"flush_l2": False}),
    "cuda_events_graph": ("cuda_events", {"cuda_graph": True}),
    "cuda_events_nosettle": ("cuda_events", {"settle_ms": 0.0}),  # the fixed warm-up only (timing rule 2)
    "torch_profiler": ("torch_profiler", {}),
}
METHODS = ("default", "cuda_events", "torch_profiler")


def find_kernelbench(arg: str | None) -> Path:
    cands = [arg, os.environ.get("CUDA_AGENT_KERNELBENCH"), REPO.parent / "shared" / "kernelbench",
             REPO / "shared" / "kernelbench", REPO / ".gpu" / "kernelbench"]
    for c in cands:
        if c and (Path(c) / "level1").is_dir():
            return Path(c)
    sys.exit("KernelBench not found: pass --kernelbench DIR or set CUDA_AGENT_KERNELBENCH")


def problem_files(kb: Path, level: int, limit: int, only: str) -> list[Path]:
    files = sorted((kb / f"level{level}").glob("*.py"), key=lambda p: int(p.name.split("_")[0]))
    if only:
        keep = {x.strip() for x in only.split(",")}
        files = [f for f in files if f.name.split("_")[0] in keep or f.stem in keep]
    return files[:limit] if limit else files


# --- worker -------------------------------------------------------------------------------


def kernel_layout(fn, sets: list, dev) -> dict:
    """One call of ``fn`` under the torch profiler: its kernels, the streams they ran on, their
    summed time, the time the GPU was busy (the union of the kernels) and the span from the
    first kernel's start to the last one's end. span > busy: the GPU waited in between (host
    bound); sum > busy: kernels overlapped on several streams."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn(*sets[0])
    torch.cuda.synchronize(dev)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*sets[0])
        torch.cuda.synchronize(dev)
    spans = []
    names: dict[str, int] = {}
    streams = set()
    for evt in prof.events():
        if getattr(evt, "device_type", None) != DeviceType.CUDA:
            continue
        tr = getattr(evt, "time_range", None)
        if tr is None:
            continue
        spans.append((float(tr.start), float(tr.end)))
        streams.add(getattr(evt, "device_resource_id", None))
        names[evt.name] = names.get(evt.name, 0) + 1
    if not spans:
        return {"kernels": 0}
    spans.sort()
    busy, cur_s, cur_e = 0.0, spans[0][0], spans[0][1]
    for a, b in spans[1:]:
        if a > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    busy += cur_e - cur_s
    top = sorted(names.items(), key=lambda kv: -kv[1])[:3]
    return {"kernels": len(spans), "streams": len(streams), "sum_ms": sum(b - a for a, b in spans) / 1e3,
            "busy_ms": busy / 1e3, "span_ms": (spans[-1][1] - spans[0][0]) / 1e3 if spans else 0.0,
            "top": [f"{n[:50]} x{c}" for n, c in top]}


def per_set(options, fn, sets: list, dev) -> dict:
    """Each input set timed alone and in rotation, by events and by graph replay, with the
    GPU's clock, power and temperature: tells times that depend on the input set (where its
    memory lies) from drift over time."""
    from dataclasses import replace

    import torch

    from cuda_agent.sandbox.judge.profilers import CudaEventsProfiler

    out: dict = {}
    k = len(sets)
    for label, graph in (("events", False), ("graph", True)):
        p = CudaEventsProfiler(replace(options, cuda_graph=graph, keep_samples=1_000_000))
        rot = p.time(fn, sets, dev)
        alone = [p.time(fn, [s], dev) for s in sets]
        out[label] = {"rotation_ms": rot.median_ms, "rotation_spread": rot.spread,
                      "rotation_by_set_ms": [statistics.median(rot.samples_ms[i::k]) for i in range(k)],
                      "alone_ms": [t.median_ms for t in alone], "alone_spread": [t.spread for t in alone],
                      "first_samples_ms": [round(x, 4) for x in rot.samples_ms[:12]]}
    for key, read in (("sm_clock_mhz", torch.cuda.clock_rate), ("power_mw", torch.cuda.power_draw),
                      ("temperature_c", torch.cuda.temperature)):
        try:
            out[key] = read(dev)
        except Exception as exc:  # needs pynvml
            out[key] = f"{type(exc).__name__}"
    return out


def worker(args) -> int:
    import torch

    from cuda_agent.sandbox.judge.baselines import build_reference, rotation_sets
    from cuda_agent.sandbox.judge.jobs import ProfileOptions
    from cuda_agent.core.types import Timing
    from cuda_agent.sandbox.judge.profilers.base import profiler_for, time_for_task, time_stably
    from cuda_agent.sandbox.judge.precision import precision_context
    from cuda_agent.sandbox.judge.profilers import CudaEventsProfiler, TorchProfilerProfiler
    from cuda_agent.sandbox.judge.loading import load_module

    dev = torch.device("cuda", 0)
    torch.cuda.init()
    methods = args.methods.split(",")
    policy = ProfileOptions()
    profilers = {}
    for label in methods:
        kind, extra = PRESETS[label]
        if kind == "cuda_events":
            o = dict(warmup_ms=args.warmup_ms, target_ms=args.target_ms, min_iters=10, max_iters=1000)
            profilers[label] = CudaEventsProfiler(CudaEventsProfiler.Options(**{**o, **extra}))
        else:
            o = dict(warmup_iters=3, target_ms=args.target_ms / 4, repeats=3, max_iters=100)
            profilers[label] = TorchProfilerProfiler(TorchProfilerProfiler.Options(**{**o, **extra}))
    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        path = Path(req["file"])
        row: dict = {"problem": path.stem}
        t0 = time.perf_counter()
        model = sets = None
        try:
            with precision_context("fp32-strict"), torch.no_grad():
                mod = load_module(path, "_repro")
                model, _ = build_reference(mod, dev, 0)
                sets = rotation_sets(mod.get_inputs, dev, 0, args.input_sets)
                row["input_sets"] = len(sets)

                def fn(*a):
                    return model(*a)

                if args.diagnose:
                    try:
                        row["layout"] = kernel_layout(fn, sets, dev)
                    except Exception as exc:  # a diagnostic must not cost the timing
                        row["layout"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                    if "default" in profilers:
                        try:
                            row["per_set"] = per_set(profilers["default"].options, fn, sets, dev)
                        except Exception as exc:
                            row["per_set"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                for name in methods:
                    before = torch.cuda.memory_stats(dev)
                    if name == "default" and req.get("follow", {}).get(name):
                        # a later process, as a reward that finds the task's baseline cached:
                        # the mode the first process chose, and the candidates' rule
                        prof = profiler_for(profilers[name], Timing(median_ms=0.0, method=req["follow"][name]))
                        t = time_stably(prof, fn, sets, dev, None, policy.max_spread, policy.attempts)
                    elif name == "default":
                        t, _ = time_for_task(profilers[name], fn, sets, dev, None, policy.max_spread, policy.attempts)
                    else:
                        t = profilers[name].time(fn, sets, dev)
                    after = torch.cuda.memory_stats(dev)
                    row[name] = {"median_ms": t.median_ms, "spread": t.spread, "iterations": t.iterations, "method": t.method,
                                 # allocator events while timing (cudaMalloc calls and OOM retries stall the queue)
                                 "mode_reason": t.mode_reason, "warmup_ms": t.warmup_ms,
                                 "device_allocs": after.get("num_device_alloc", 0) - before.get("num_device_alloc", 0),
                                 "alloc_retries": after.get("num_alloc_retries", 0) - before.get("num_alloc_retries", 0)}
        except Exception as exc:  # one failing problem must not stop the benchmark
            row["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        finally:
            del model, sets
            gc.collect()
            torch.cuda.empty_cache()
        row["seconds"] = round(time.perf_counter() - t0, 2)
        print(json.dumps(row), flush=True)
    return 0


# --- driver -------------------------------------------------------------------------------


class Worker:
    def __init__(self, name: str, argv: list[str]):
        self.name = name
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"worker {name} failed to start: {line!r}")

    def run(self, f: Path, first: dict | None = None) -> dict:
        """Time problem ``f``; ``first``: the other process's row for it, whose ``default``
        mode this one follows (as a reward follows the task's cached baseline)."""
        follow = {"default": first["default"]["method"]} if first and "method" in first.get("default", {}) else {}
        self.proc.stdin.write(json.dumps({"file": str(f), "follow": follow}) + "\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            if not line:
                return {"problem": f.stem, "error": f"worker {self.name} died (exit {self.proc.poll()})"}
            if line.startswith("{"):
                return json.loads(line)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:
            self.proc.kill()


def rel_diff(a: float, b: float) -> float:
    return abs(a - b) / min(a, b) if min(a, b) > 0 else float("inf")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench")
    ap.add_argument("--level", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--only", default="", help="comma-separated problem ids or stems")
    ap.add_argument("--target-ms", type=float, default=200.0, help="timed total per measurement (cuda_events)")
    ap.add_argument("--warmup-ms", type=float, default=60.0)
    ap.add_argument("--input-sets", type=int, default=2)
    # run_all.py says how long this script may run; keep a margin for the last problem and the report
    given = float(os.environ.get("CUDA_AGENT_SCRIPT_SECONDS", 0) or 0)
    ap.add_argument("--budget-s", type=float, default=given - 45 if given > 90 else 420.0,
                    help="stop starting new problems after this (default: 420, or what run_all.py gives less 45)")
    ap.add_argument("--sequential", action="store_true", help="all problems in process A, then all in B")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, from: {', '.join(PRESETS)}")
    ap.add_argument("--diagnose", action="store_true",
                    help="also record each problem's kernel layout (kernels, streams, summed/busy/span time) "
                         "and its input sets timed one by one (per_set)")
    ap.add_argument("--shard", default="", help="i/n: every n-th problem starting at i (0-based), to split over GPUs")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="print one table from the JSON files of several shards")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.merge:
        return merge(args.merge)

    kb = find_kernelbench(args.kernelbench)
    files = problem_files(kb, args.level, args.limit, args.only)
    tag = ""
    if args.shard:
        try:
            i, n = (int(x) for x in args.shard.split("/"))
            assert 0 <= i < n
        except (ValueError, AssertionError):
            sys.exit(f"--shard wants i/n with 0 <= i < n, got {args.shard!r}")
        files = files[i::n]
        tag = f"-{i}of{n}"
    argv = [sys.executable, __file__, "--worker", "--target-ms", str(args.target_ms), "--warmup-ms",
            str(args.warmup_ms), "--input-sets", str(args.input_sets), "--methods", args.methods]
    if args.diagnose:
        argv.append("--diagnose")
    methods = args.methods.split(",")
    for m in methods:
        if m not in PRESETS:
            sys.exit(f"unknown method {m!r}; valid: {', '.join(PRESETS)}")
    t_start = time.perf_counter()
    results: dict[str, dict] = {"A": {}, "B": {}}
    skipped = []

    def over_budget() -> bool:
        return time.perf_counter() - t_start > args.budget_s

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    if args.sequential:
        for name in ("A", "B"):
            w = Worker(name, argv)
            it = tqdm(files, desc=f"process {name}", file=sys.stderr) if tqdm else files
            for f in it:
                if over_budget() or (name == "B" and f.stem not in results["A"]):
                    skipped.append(f.stem)
                    continue
                results[name][f.stem] = w.run(f, results["A"].get(f.stem) if name == "B" else None)
            w.close()
    else:
        wa, wb = Worker("A", argv), Worker("B", argv)
        it = tqdm(files, desc="problems (A then B)", file=sys.stderr) if tqdm else files
        for f in it:
            if over_budget():
                skipped.append(f.stem)
                continue
            results["A"][f.stem] = wa.run(f)
            results["B"][f.stem] = wb.run(f, results["A"][f.stem])
        wa.close()
        wb.close()

    # compare
    from cuda_agent.sandbox.judge.jobs import ProfileOptions

    max_spread = ProfileOptions().max_spread  # a timing above it says itself that it is unsteady
    rows = []
    for stem, ra in results["A"].items():
        rb = results["B"].get(stem)
        if rb is None:
            continue
        row = {"problem": stem, "error": ra.get("error") or rb.get("error")}
        for m in methods:
            if m in ra and m in rb:
                a, b = ra[m]["median_ms"], rb[m]["median_ms"]
                limit = 0.01 if min(a, b) >= 0.05 else 0.03
                d = rel_diff(a, b)
                row[m] = {"a_ms": a, "b_ms": b, "diff": d, "limit": limit, "ok": d <= limit, "max_spread": max_spread,
                          "spread_a": ra[m]["spread"], "spread_b": rb[m]["spread"], "method_a": ra[m]["method"],
                          "method_b": rb[m]["method"], "mode_reason": ra[m].get("mode_reason", ""),
                          "device_allocs": (ra[m].get("device_allocs", 0), rb[m].get("device_allocs", 0)),
                          "warmup_ms": (ra[m].get("warmup_ms", 0), rb[m].get("warmup_ms", 0))}
        rows.append(row)

    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "?"
    wall = time.perf_counter() - t_start
    out = {"gpu": gpu, "torch": torch.__version__, "level": args.level, "problems": len(files), "shard": args.shard,
           "skipped_for_budget": skipped, "wall_s": round(wall, 1), "mode": "sequential" if args.sequential else "interleaved",
           "methods": methods, "summary": summarise(rows, methods), "rows": rows, "raw": results}
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / f"repro_timing{tag}.json").write_text(json.dumps(out, indent=1))
    report(out)
    return 0


def flagged(c: dict) -> bool:
    """A miss that one of the two timings reported itself: its spread stayed above the
    profiling jobs' ``max_spread``, which a reward carries with the time."""
    return not c["ok"] and max(c["spread_a"], c["spread_b"]) > c.get("max_spread", 0.01)


def summarise(rows: list[dict], methods: list[str]) -> dict:
    summary = {}
    for m in methods:
        ds = [r[m]["diff"] for r in rows if m in r]
        ok = [r for r in rows if m in r and r[m]["ok"]]
        summary[m] = {
            "timed": len(ds),
            "within_target": len(ok),
            "misses_flagged_unsteady": sum(1 for r in rows if m in r and flagged(r[m])),
            "median_diff_pct": 100 * statistics.median(ds) if ds else None,
            "max_diff_pct": 100 * max(ds) if ds else None,
        }
    return summary


def merge(paths: list[str]) -> int:
    parts = [json.loads(Path(p).read_text()) for p in paths]
    methods = parts[0]["methods"]
    rows = [r for part in parts for r in part["rows"]]
    out = {**parts[0], "problems": sum(p["problems"] for p in parts), "shard": f"{len(parts)} shards merged",
           "skipped_for_budget": [s for p in parts for s in p["skipped_for_budget"]],
           "wall_s": max(p["wall_s"] for p in parts), "rows": rows, "summary": summarise(rows, methods)}
    report(out)
    return 0


def report(out: dict) -> None:
    rows, methods, summary = out["rows"], out["methods"], out["summary"]
    gpu, level, wall, skipped = out["gpu"], out["level"], out["wall_s"], out["skipped_for_budget"]
    errors = [r for r in rows if r.get("error")]
    print()
    print(f"Timing reproducibility, KernelBench level {level} references (eager, TF32 off), {gpu}, torch {out['torch']}")
    shard = f", {out['shard']}" if out.get("shard") else ""
    print(f"two processes, {out['mode']}{shard}; target: diff <= 1% (>= 50 us), <= 3% (< 50 us); wall {wall:.0f} s")
    if skipped:
        print(f"skipped for the time budget: {len(skipped)}")
    if errors:
        print(f"problems that failed to run: {len(errors)} ({', '.join(r['problem'] for r in errors[:5])}{'...' if len(errors) > 5 else ''})")
    print()
    # flagged: misses where a timing's own spread stayed above the jobs' limit (on record)
    print(f"{'method':<24}{'timed':>7}{'within':>8}{'flagged':>9}{'median diff':>13}{'max diff':>10}")
    for m in methods:
        s = summary[m]
        med = f"{s['median_diff_pct']:.3f}%" if s["median_diff_pct"] is not None else "-"
        mx = f"{s['max_diff_pct']:.3f}%" if s["max_diff_pct"] is not None else "-"
        print(f"{m:<24}{s['timed']:>7}{s['within_target']:>8}{s['misses_flagged_unsteady']:>9}{med:>13}{mx:>10}")
    if "default" in methods:
        switched = [r for r in rows if "+graph" in r.get("default", {}).get("method_a", "")]
        for why, label in (("parallel", "work on parallel streams"), ("unsteady", "unsteady with events")):
            some = [r["problem"] for r in switched if r["default"].get("mode_reason", "").startswith(why)
                    or (why == "unsteady" and not r["default"].get("mode_reason"))]
            if some:
                print(f"default: {len(some)} problem(s) timed by graph replay ({label}): " + ", ".join(x[:30] for x in some[:10]))
    first = methods[0]
    worst = sorted((r for r in rows if first in r), key=lambda r: -r[first]["diff"])[:8]
    if worst:
        print()
        print(f"{'worst (' + first + ')':<44}{'A ms':>10}{'B ms':>10}{'diff':>8}{'spread A/B':>12}{'profiler ms':>13}{'diff':>8}{'mallocs':>9}{'warm-up ms':>13}")
        for r in worst:
            c = r[first]
            t = r.get("torch_profiler", {})
            tp = f"{t['a_ms']:.4g}" if t else "-"
            td = f"{100 * t['diff']:.2f}%" if t else "-"
            ma = "/".join(str(x) for x in c.get("device_allocs", ()))
            wu = "/".join(f"{x:.0f}" for x in c.get("warmup_ms", ())) or "-"
            sp = f"{100 * c['spread_a']:.1f}/{100 * c['spread_b']:.1f}%"
            print(f"{r['problem'][:43]:<44}{c['a_ms']:>10.4g}{c['b_ms']:>10.4g}{100 * c['diff']:>7.2f}%{sp:>12}{tp:>13}{td:>8}{ma:>9}{wu:>13}")
    layouts = [(r["problem"], out["raw"]["A"].get(r["problem"], {}).get("layout")) for r in worst]
    if any(lay for _, lay in layouts):
        print()
        print(f"{'kernel layout, process A (one call)':<44}{'kernels':>8}{'streams':>8}{'sum ms':>10}{'busy ms':>10}{'span ms':>10}  top kernels")
        for prob, lay in layouts:
            if not lay or "error" in lay or not lay.get("kernels"):
                print(f"{prob[:43]:<44}  {(lay or {}).get('error', '-')}")
                continue
            print(f"{prob[:43]:<44}{lay['kernels']:>8}{lay['streams']:>8}{lay['sum_ms']:>10.4g}{lay['busy_ms']:>10.4g}"
                  f"{lay['span_ms']:>10.4g}  {'; '.join(lay['top'])}")
    sets = [(r["problem"], side, out["raw"][side].get(r["problem"], {}).get("per_set")) for r in worst for side in "AB"]
    if any(ps for _, _, ps in sets):
        print()
        print(f"{'input sets timed one by one':<36}{'':>3}{'mode':>7}{'rotation ms':>12}{'spread':>8}  by set in rotation / alone (ms)")
        for prob, side, ps in sets:
            if not ps or "error" in ps:
                print(f"{prob[:35]:<36}{side:>3}  {(ps or {}).get('error', '-')}")
                continue
            for mode in ("events", "graph"):
                m = ps[mode]
                by = " ".join(f"{x:.4g}" for x in m["rotation_by_set_ms"])
                alone = " ".join(f"{x:.4g}" for x in m["alone_ms"])
                print(f"{prob[:35]:<36}{side:>3}{mode:>7}{m['rotation_ms']:>12.4g}{100 * m['rotation_spread']:>7.1f}%  {by} / {alone}")
            print(f"{'':<39}clock {ps.get('sm_clock_mhz')} MHz, power {ps.get('power_mw')} mW, {ps.get('temperature_c')} C")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
