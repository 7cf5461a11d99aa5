"""Why a reference timed by CUDA-graph replay can come out faster as its own candidate than as
its eager baseline: the graph-mode timing taken apart, factor by factor, on the same task.

In graph mode (tasks whose eager call runs on parallel streams, or stays unsteady) the
candidate's judged time has been 2-11% below the eager baseline's for the reference itself,
while in the plain mode the two agree within 1%. The two timings differ in three ways: the
loop around the replays (the baseline perturbs inputs in place; the candidate's loop rotates
inputs, seeds the generators and checksums every output), the process (the baseline is timed
in the trusted process, the candidate in a process of its own), and what that process did
before (the trusted side's parallel-branch check prints a captured graph, which in torch
switches CUDA-graph debug mode on for the whole process). Per task, by graph replay (plain
calls with ``--mode plain``, for a plain-mode task off by a few percent, like L1/11):

* ``eager``       the baseline's loop (inputs perturbed), in this process, before anything else
* ``replay``      the same replays with nothing between them but the L2 flush
* ``rotate``      inputs rotated and generators seeded before every replay (the candidate's prepare)
* ``checksum``    every output checksummed after its replay (the candidate's after)
* ``candidate``   rotation and checksums together: the candidate's loop, in this process
* ``eager_sync``  the baseline's loop with every call synchronised (what the warm-up decides
                  when its last calls' host time runs past their events: work escaping to
                  other streams, or a host that was late, e.g. waiting for the GIL)
* ``eager_busy``  the baseline's loop while another Python thread of this process keeps busy,
                  as a pool worker's threads may while a baseline is measured
* ``eager_fresh`` the baseline's loop in a new process that has done nothing else
* ``eager_k1``    the baseline's loop on its first input set only (one graph replayed back to back)
* ``eager_thread`` the baseline's loop from a new thread of this process
* ``eager_harness`` the baseline's loop in a new process that first imports what a candidate's
                  process imports (the judge's harness, torch._dynamo) and sets the precision
                  policy as a candidate's load does
* ``eager_poisoned`` the baseline's loop after one call as a verification runs it in a
                  candidate's process (free memory poisoned, uninitialised tensors filled,
                  deterministic algorithms on for that call)
* ``eager_debug`` the baseline's loop once CUDA-graph debug mode is on in this process
* ``judged_inproc`` the candidate's process's own commands (``load``, ``warm``, ``loop``: the
                  reference loaded as its own candidate, its input sets drawn from seeds, its
                  loop with rotation and checksums) run in this process: fast here puts the
                  cause in what those commands do, at ``eager`` in the process they run in
* ``baseline``    the baseline path itself (``measure_baselines_record``, a cache of its own): in
                  graph mode timed as a candidate, in a candidate's process (``baselines.as_candidate``),
                  the trusted process's own timing beside it (``trusted_ms``)
* ``judged``      the reference judged as its own candidate (``evaluate_workspace``)
* ``profiled``    the reference timed as its own candidate without a verification before
                  (``profile_workspace``: a candidate's process that ran nothing else)
* ``judged_open`` ``judged`` with the candidate's process left unisolated (no privilege drop,
                  PID, mount or network namespace)

Reading it: ``candidate`` below ``eager`` puts the cause in the loop; ``judged`` below
``candidate`` and ``eager_fresh`` at ``judged`` puts it in the process; ``eager_debug`` or
``baseline`` above ``eager`` puts it in the debug mode; ``judged_inproc`` splits the
process from the commands run in it; ``eager_sync`` at the slow baseline
(and ``eager_busy`` synchronised, ``sync`` in its cell) puts it in the escape decision: a
synchronised replay waits for its own launch, which is long for a graph of thousands of nodes.
Each in-process cell says whether its loop synchronised every call (``sync``). ``eager`` and
``judged_inproc`` also count the kernels of their first input set's captured graph and give a
digest of their names (``kernels``): two digests that differ mean two graphs of other kernels.

    python3 scripts/gpu/graph_paths.py --ids 'L3/39_*,L1/71_*,L3/35_*,L3/19_*'
    python3 scripts/gpu/graph_paths.py --mode plain --ids 'L1/11_*'   # the same factors, plain calls

KernelBench is found by --root or $CUDA_AGENT_KERNELBENCH. With OUT set, the rows go to
``$OUT/graph_paths.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IN_PROCESS = ("eager", "replay", "rotate", "checksum", "candidate", "eager_sync", "eager_busy", "eager_k1",
              "eager_thread")
COLUMNS = IN_PROCESS + ("judged_inproc", "eager_fresh", "eager_harness", "eager_poisoned", "eager_debug", "baseline",
                        "judged", "profiled", "judged_open")
EAGER_LOOPS = ("eager", "eager_fresh", "eager_harness", "eager_poisoned", "eager_debug", "eager_sync", "eager_busy",
               "eager_k1", "eager_thread")
OPEN_ENV = {"CUDA_AGENT_DROP_PRIVILEGES": "0", "CUDA_AGENT_JOB_PIDNS": "0", "CUDA_AGENT_JOB_MOUNTS": "0",
            "CUDA_AGENT_JOB_NETWORK": "1"}


MODE = {"graph": True}  # --mode: the in-process variants by graph replay, or as plain calls


def graph_profiler(device: str):
    """The judge's default profiler in its steadier mode (CUDA-graph replay; as it is with
    ``--mode plain``); on the CPU (a smoke run of this script) the wall-clock profiler."""
    from cuda_agent.sandbox.judge.profilers import get_profiler

    prof = get_profiler("wallclock" if device == "cpu" else "cuda_events", {})
    if not MODE["graph"]:
        return prof
    return (prof.steadier() if hasattr(prof, "steadier") else None) or prof


def reference(code: str, work: Path, device: str):
    """The task's reference model and its timing input sets, built as the baselines build them."""
    from cuda_agent.sandbox.judge.baselines.reference import build_reference, load_code, rotation_sets

    ref_mod = load_code(code, work)
    model, _init = build_reference(ref_mod, device, 0)
    return ref_mod, model, rotation_sets(ref_mod.get_inputs, device, 0, 0)


def time_variant(name: str, ref_mod, model, sets: list, device: str) -> dict:
    """One graph-mode timing of ``model`` with the loop ``name`` names (see the module notes)."""
    import threading

    import torch

    from cuda_agent.sandbox.judge import rotation
    from cuda_agent.sandbox.judge.inputs import perturb_
    from cuda_agent.sandbox.judge.precision import precision_context
    from cuda_agent.sandbox.judge.profilers.base import continuous_steps

    prof = graph_profiler(device)
    if name == "eager_k1":
        sets = sets[:1]
    k = len(sets)
    work = [[v.clone() if isinstance(v, torch.Tensor) else v for v in s] for s in sets]
    prepare = after = None
    if name in EAGER_LOOPS:
        prepare = continuous_steps(work, lambda step, args: perturb_(args, step // k))
    seed = 12345
    if name in ("rotate", "candidate"):
        rot = rotation.Rotation(seed, sets, ref_mod.get_inputs, device)
        rot.prepare()
        prepare = lambda j, _args: rot.fill(j, work[j % k])  # noqa: E731
    stop = threading.Event()

    def busy() -> None:  # pure-Python work: it holds the GIL whenever the timing loop lets go of it
        while not stop.is_set():
            sum(i * i for i in range(20000))

    spinner = threading.Thread(target=busy, daemon=True) if name == "eager_busy" else None
    if spinner is not None:
        spinner.start()
    def timed() -> tuple:
        with precision_context("fp32-strict"), torch.no_grad():
            run = prof.begin(model, work, device)
            decided = bool(run.state.get("sync_each")) if isinstance(run.state, dict) else None
            if name == "eager_sync" and isinstance(run.state, dict):
                run.state["sync_each"] = True
            return (decided,) + _loop(name, prof, run, prepare, after, seed, device, k)

    try:
        if name == "eager_thread":  # torch's current stream and grad mode are per thread
            box: dict = {}

            def in_thread() -> None:
                try:
                    box["r"] = timed()
                except BaseException as exc:  # noqa: BLE001 - raised again in the caller
                    box["e"] = exc

            th = threading.Thread(target=in_thread)
            th.start()
            th.join()
            if "e" in box:
                raise box["e"]
            decided, t, n, info = box["r"]
        else:
            decided, t, n, info = timed()
    finally:
        stop.set()
        if spinner is not None:
            spinner.join()
    row = {"ms": t.median_ms, "spread": round(t.spread, 4), "calls": n, "sets": k, "sync_decided": decided,
           "sync_each": info.get("sync_each"), "escaped": info.get("escaped")}
    if name == "eager" and MODE["graph"] and device != "cpu":
        with precision_context("fp32-strict"), torch.no_grad():
            row["kernels"] = graph_kernels(model, work[0], device)
    del work
    return row


def graph_kernels(fn, args: list, device: str) -> str:
    """``fn(*args)`` captured into a CUDA graph: how many kernel nodes it has and a digest of
    their (mangled) names, as ``"N kernels, digest D"`` (or why there is none)."""
    import hashlib
    import re

    from cuda_agent.sandbox.judge.profilers.cuda_events import CudaEventsProfiler

    try:
        dot = CudaEventsProfiler._graph_dot(fn, args, device)
    except Exception as exc:  # noqa: BLE001 - a column note, not a timing
        return f"no graph ({type(exc).__name__}: {exc})"[:120]
    names = sorted(re.findall(r"_Z\w+", dot))
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:10]
    return f"{len(names)} kernels, digest {digest}"


def judged_inproc(t, work: Path, device: str) -> dict:
    """The candidate's process's commands ``load``, ``warm`` and ``loop`` run in this process
    on the reference as its own candidate (the seeds and input sets a profile job gives them)."""
    import torch

    from cuda_agent.evaluation.scoring import make_workspace
    from cuda_agent.sandbox.judge.candidate_load import do_load
    from cuda_agent.sandbox.judge.candidate_state import CandidateState
    from cuda_agent.sandbox.judge.candidate_timing import do_loop, do_warm

    ws = make_workspace(t, work / "ws-inproc", device)
    (ws / "model_new.py").write_text(t.code + "\n\nclass ModelNew(Model):\n    pass\n")
    st = CandidateState()
    st.device = device
    seed = 0
    r = do_load(st, {"workspace": str(ws), "reference": str(ws / "model.py"), "candidate": str(ws / "model_new.py"),
                     "seed": seed, "precision": "fp32-strict", "weights": "auto"})
    if not r.get("ok"):
        return {"error": f"load: {r.get('message') or r.get('error')}"[:200]}
    k = 4
    sets = [seed + 7 * (i + 1) for i in range(k)]
    name = "wallclock" if device == "cpu" else "cuda_events"
    w = do_warm(st, {"profiler": name, "options": {}, "graph": MODE["graph"], "sets": sets, "cpu_threads": None})
    if not w.get("ok"):
        return {"error": f"warm: {w.get('error') or w.get('profiler_error')}"[:200]}
    prof, run = st.timing["prof"], st.timing["run"]
    n = prof.iterations(float(w["estimate_ms"]))
    lp = do_loop(st, {"n": n, "seed": 12345, "full": False, "wide": False})
    if not lp.get("ok"):
        return {"error": f"loop: {lp.get('error')}"[:200]}
    tm = prof.finish(lp["samples"], run.method, run.warmup_ms, lp["info"])
    row = {"ms": tm.median_ms, "spread": round(tm.spread, 4), "calls": n, "sets": k,
           "sync_each": lp["info"].get("sync_each"), "escaped": lp["info"].get("escaped")}
    if MODE["graph"] and device != "cpu":
        model = st.loaded.cand_model
        with torch.no_grad():
            row["kernels"] = graph_kernels(model, st.timing["work"][0], device)
    st.timing.clear()
    st.loaded = None
    return row


def as_in_verification(model, sets: list, device: str) -> None:
    """One call of ``model`` as a verification runs a candidate in its process: free memory
    poisoned, uninitialised tensors filled, deterministic algorithms on for the call."""
    import torch

    from cuda_agent.sandbox.judge.inputs import nbytes
    from cuda_agent.sandbox.judge.poisoning import fill_uninitialized, poison_allocator, release_cached

    poison_allocator(device, nbytes(sets[0]))
    with torch.no_grad(), fill_uninitialized():
        out = model(*sets[0])
    torch.cuda.synchronize()
    del out
    release_cached(device)


def as_candidate_process() -> None:
    """What a candidate's process does before its job: the harness imported, torch settled,
    the precision policy set as its load sets it."""
    from cuda_agent.sandbox.judge import candidate
    from cuda_agent.sandbox.judge.precision import apply_policy, policy_from

    candidate.import_harness()
    candidate.settle_torch()
    apply_policy(policy_from("fp32-strict"))


def _loop(name: str, prof, run, prepare, after, seed: int, device: str, k: int):
    """The timed loop of :func:`time_variant` (every output checksummed where ``name`` asks)."""
    from cuda_agent.sandbox.judge import rotation

    n = prof.iterations(run.estimate_ms)
    if name in ("checksum", "candidate"):
        outs = getattr(prof, "_graph_outputs", None) or []
        checks = rotation.Checksums(rotation.derived(seed, 5), device)
        checks.prepare(max((t.numel() for o in outs for t in rotation._tensors(o)), default=1))
        slots = checks.slots(n)

        def after(j, out):  # the candidate's after (graph replays return None: their static outputs)
            checks.into(out if out is not None else outs[j % k], slots[j])

    samples, info = prof.loop(run, n, prepare, after)
    return prof.finish(samples, run.method, run.warmup_ms, info), n, info


def fresh_process(task_id: str, root: str | None, device: str, harness: bool = False) -> dict:
    """``eager`` timed by a new Python process that does nothing else (``harness``: that first
    does what a candidate's process does before its job)."""
    cmd = [sys.executable, __file__, "--ids", task_id, "--device", device, "--only", "eager",
           "--mode", "graph" if MODE["graph"] else "plain"] + (["--harness"] if harness else [])
    if root:
        cmd += ["--root", root]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=240).stdout
        row = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
        return row.get("eager", {"error": "no timing"})
    except Exception as exc:  # noqa: BLE001 - one missing column must not stop the others
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


def judged(t, work: Path, device: str, how: str = "judged") -> dict:
    """The reference as its own candidate: verified then timed (``judged``), timed only
    (``profiled``), or verified and timed with the candidate's process unisolated (``judged_open``)."""
    from cuda_agent.evaluation.scoring import make_workspace
    from cuda_agent.sandbox.judge import jobs

    ws = make_workspace(t, work / f"ws-{how}", device)
    (ws / "model_new.py").write_text(t.code + "\n\nclass ModelNew(Model):\n    pass\n")
    cache = work / "judged-cache"
    popts = jobs.ProfileOptions(baseline_cache_dir=str(cache), weights="auto", compile_baseline=False)
    saved = {k: os.environ.get(k) for k in OPEN_ENV}
    if how == "judged_open":
        os.environ.update(OPEN_ENV)
    try:
        if how == "profiled":
            v, p = None, jobs.profile_workspace(str(ws), device, popts)
        else:
            v, p = jobs.evaluate_workspace(str(ws), device, jobs.VerifyOptions(weights="auto", rules="none"), popts)
    finally:
        for k, val in saved.items():
            if val is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = val
    if p is None or not p.ok:
        return {"error": (p.message if p else v.message)[:200]}
    meta = p.metadata or {}
    loops = meta.get("timing_loops") or []
    return {"ms": p.candidate.median_ms, "spread": round(p.candidate.spread, 4), "eager_ms": p.eager.median_ms if p.eager else None,
            "timing_mode": meta.get("timing_mode", ""), "method": p.candidate.method, "sets": meta.get("input_sets"),
            "eager_method": p.eager.method if p.eager else None, "calls": [lp.get("calls") for lp in loops],
            "settings_differ": meta.get("timing_flags_differ", {}),
            "isolation": {k: meta.get(k) for k in ("job_user", "pid_namespace", "job_network") if k in meta}}


def baseline(t, work: Path, device: str) -> dict:
    from cuda_agent.sandbox.judge.baselines import BaselineOptions, measure_baselines_record
    from cuda_agent.sandbox.judge.baselines.cache import BaselineCache

    cache = work / "baseline-cache"
    e, _c, rec = measure_baselines_record(t.code, device, BaselineOptions(cache_dir=str(cache), compile=False),
                                          BaselineCache(cache))
    row = {"ms": e.median_ms, "spread": round(e.spread, 4), "timing_mode": rec.get("timing_mode", ""),
           "timed_in": rec.get("timed_in", "the trusted process"),
           "trusted_ms": (rec.get("eager_trusted") or {}).get("median_ms")}
    if rec.get("as_candidate_error"):
        row["as_candidate_error"] = rec["as_candidate_error"][:200]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", default="L3/39_*,L1/71_*,L3/35_*,L3/19_*")
    ap.add_argument("--root")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--only", help="comma-separated columns of this process (the rest are skipped)")
    ap.add_argument("--mode", choices=("graph", "plain"), default="graph",
                    help="the in-process columns by CUDA-graph replay (default) or as plain calls")
    ap.add_argument("--harness", action="store_true",
                    help="first do what a candidate's process does before its job (see eager_harness)")
    args = ap.parse_args()
    MODE["graph"] = args.mode == "graph"
    sys.path.insert(0, str(REPO / "scripts" / "gpu"))
    import torch

    if args.harness:
        as_candidate_process()
    from bench_judge_throughput import tasks_matching
    from cuda_agent.sandbox.judge.baselines.measure import free_device_memory

    only = set(args.only.split(",")) if args.only else set(COLUMNS)
    rows = []
    for t in tasks_matching(args.root, args.ids):
        row: dict = {"task": t.id}
        work = Path(tempfile.mkdtemp(prefix="graph-paths-"))
        os.chmod(work, 0o755)
        try:
            ref_mod, model, sets = reference(t.code, work, args.device)
            for name in IN_PROCESS:
                if name in only:
                    try:
                        row[name] = time_variant(name, ref_mod, model, sets, args.device)
                    except Exception as exc:  # noqa: BLE001
                        row[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            if "judged_inproc" in only:
                try:
                    row["judged_inproc"] = judged_inproc(t, work, args.device)
                except Exception as exc:  # noqa: BLE001
                    row["judged_inproc"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                free_device_memory(args.device)
            if "eager_fresh" in only:
                row["eager_fresh"] = fresh_process(t.id, args.root, args.device)
            if "eager_harness" in only:
                row["eager_harness"] = fresh_process(t.id, args.root, args.device, harness=True)
            if "eager_poisoned" in only:
                try:
                    if args.device != "cpu":
                        as_in_verification(model, sets, args.device)
                    row["eager_poisoned"] = time_variant("eager_poisoned", ref_mod, model, sets, args.device)
                except Exception as exc:  # noqa: BLE001
                    row["eager_poisoned"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            if "eager_debug" in only:
                if args.device != "cpu":
                    torch.cuda.CUDAGraph().enable_debug_mode()  # process-wide in torch
                row["eager_debug"] = time_variant("eager_debug", ref_mod, model, sets, args.device)
            del model, sets
            free_device_memory(args.device)
            if "baseline" in only:
                row["baseline"] = baseline(t, work, args.device)
                free_device_memory(args.device)
            for how in ("judged", "profiled", "judged_open"):
                if how in only:
                    try:
                        row[how] = judged(t, work, args.device, how)
                    except Exception as exc:  # noqa: BLE001
                        row[how] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                    free_device_memory(args.device)
        except Exception as exc:  # noqa: BLE001 - one broken task must not stop the others
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        shutil.rmtree(work, ignore_errors=True)
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    if len(only) == 1:  # a column asked for by another run of this script (eager_fresh)
        return
    shown = [c for c in COLUMNS if c in only]
    print(f"\nms per call ({'graph replay' if MODE['graph'] else 'plain calls'} in this process; `baseline` and "
          f"`judged` in the task's own mode); in brackets: relative to `eager`")
    print("| task | " + " | ".join(shown) + " |")
    print("| --- |" + " ---: |" * len(shown))
    for r in rows:
        base = (r.get("eager") or {}).get("ms")
        cells = []
        for c in shown:
            d = r.get(c) or {}
            if "ms" not in d:
                cells.append(str(d.get("error", r.get("error", "-")))[:40])
            else:
                cells.append(f"{d['ms']:.4g}" + (f" ({d['ms'] / base:.3f})" if base else "")
                             + (" sync" if d.get("sync_each") else "")
                             + (f" [{d['ms'] / d['eager_ms']:.3f} of its own eager]" if d.get("eager_ms") else ""))
        print(f"| {r['task']} | " + " | ".join(cells) + " |")
    for r in rows:  # which kernels each side's captured graph holds
        kernels = {c: (r.get(c) or {}).get("kernels") for c in shown if (r.get(c) or {}).get("kernels")}
        if kernels:
            print(f"{r['task']} graph kernels: " + "; ".join(f"{c}: {v}" for c, v in kernels.items()))
    for r in rows:  # what the candidate's process said it was timed under, where the baseline's differed
        for how in ("judged", "profiled", "judged_open"):
            differ = (r.get(how) or {}).get("settings_differ")
            if differ:
                print(f"{r['task']} {how}: settings differ (baseline -> candidate's process): "
                      + ", ".join(f"{k} {v[0]!r} -> {v[1]!r}" for k, v in differ.items()))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "graph_paths.json").write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
