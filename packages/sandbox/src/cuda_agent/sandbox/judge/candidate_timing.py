"""The candidate process's timing commands, with a profiler plugin in two halves:
``warm`` (the profiler's warm-up and first calls of the rotation and checksum paths),
``loop`` (``n`` calls in the profiler's compiled loop, every call's inputs made new by
:mod:`.rotation` and every call's output checksummed), ``whole`` (a profiler without the two halves, its
own ``time()``) and ``outputs`` (the last output of each input set, handed back).
"""

from __future__ import annotations

import math
from typing import Any

from . import rotation
from .baselines import timing_threads
from .candidate_state import CandidateState, error_reply, export, inputs_for, refused
from .process_flags import process_flags
from .profilers import get_profiler
from .profilers.base import ProfilerError


def do_warm(st: CandidateState, msg: dict) -> dict:
    import torch

    if st.loaded is None:
        return refused("no candidate loaded")
    st.timing = {}
    try:
        prof = get_profiler(msg["profiler"], msg.get("options") or {})
        if msg.get("graph"):
            alt = prof.steadier() if hasattr(prof, "steadier") else None
            prof = alt or prof
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": error_reply(exc)}
    if st.threads is None:  # kept for the process's remaining timings (held on the state: a
        st.threads = timing_threads(st.device, msg.get("cpu_threads"))  # context left to the
        st.meta["cpu_threads"] = st.threads.__enter__()  # collector would restore on collection
    n_threads = st.meta.get("cpu_threads")
    pristine = [inputs_for(st, int(s), None) for s in msg["sets"]]
    work = [[v.clone() if isinstance(v, torch.Tensor) else v for v in p] for p in pristine]
    model = st.loaded.cand_model

    def fn(*args: Any) -> Any:
        return model(*args)

    two_phase = all(hasattr(prof, a) for a in ("begin", "loop", "finish", "iterations"))
    st.timing = {"prof": prof, "pristine": pristine, "work": work, "fn": fn, "two_phase": two_phase}
    with torch.no_grad():  # the settings the calls are timed under (recorded beside the baseline's)
        flags = process_flags(st.device)
    if not two_phase:
        return {"ok": True, "two_phase": False, "method": prof.method_name(), "cpu_threads": n_threads, "flags": flags}
    try:
        with torch.no_grad():
            run = prof.begin(fn, work, st.device)
    except ProfilerError as exc:
        return {"ok": False, "profiler_error": str(exc)[:600]}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": error_reply(exc)}
    st.timing["run"] = run
    give_up_ms = float(getattr(getattr(prof, "options", None), "give_up_ms", 0.0) or 0.0)
    if 0 < give_up_ms < run.estimate_ms:  # hopeless: no loop follows (see timing.CandidateTimer.time)
        return {"ok": True, "two_phase": True, "estimate_ms": run.estimate_ms, "warmup_ms": run.warmup_ms,
                "method": run.method, "cpu_threads": n_threads, "stopped": True, "flags": flags}
    try:  # the first calls of the rotation and checksum paths, before any loop is timed
        with torch.no_grad():
            out = fn(*work[0])
            sums = rotation.Checksums(0, st.device, full=True)
            sums.into(out, sums.slots(1)[0])
            st.timing["outputs_like"] = [tuple(t.shape) for t in rotation._tensors(out)]
            rotation.Rotation(0, pristine, st.ref_mod.get_inputs, st.device).fill(0, work[0])
            del out
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": error_reply(exc)}
    return {"ok": True, "two_phase": True, "estimate_ms": run.estimate_ms, "warmup_ms": run.warmup_ms,
            "method": run.method, "cpu_threads": n_threads, "flags": flags}


def _rotating(st: CandidateState, t: dict, seed: int) -> Any:
    """The untimed step before call ``j``: its input set rewritten with call ``j``'s inputs."""
    work, k = t["work"], len(t["work"])
    rot = rotation.Rotation(seed, t["pristine"], st.ref_mod.get_inputs, st.device)
    rot.prepare()

    def prepare(j: int, _args: Any) -> None:
        rot.fill(j, work[j % k])

    return prepare


def do_loop(st: CandidateState, msg: dict) -> dict:
    import torch

    t = st.timing
    if not t.get("two_phase") or "run" not in t:
        return refused("no timing begun")
    n, seed = int(msg["n"]), int(msg["seed"])
    k = len(t["work"])
    prof, run = t["prof"], t["run"]
    graph_outputs = getattr(prof, "_graph_outputs", None) if run.method.endswith("+graph") else None
    last: list[Any] = [None] * k
    last_call = [-1] * k
    try:
        prepare = _rotating(st, t, seed)
        checks = rotation.Checksums(rotation.derived(seed, 5), st.device, full=bool(msg.get("full")),
                                    wide=bool(msg.get("wide")))
        checks.prepare(max((math.prod(s) for s in t.get("outputs_like") or []), default=1))
        slots = checks.slots(n)
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": error_reply(exc)}

    def after(j: int, out: Any) -> None:
        if out is None and graph_outputs is not None:
            out = graph_outputs[j % k]
        checks.into(out, slots[j])
        last[j % k], last_call[j % k] = out, j

    try:
        with torch.no_grad():
            samples, info = prof.loop(run, n, prepare, after)
            sums = slots.reshape(-1).tolist()
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": error_reply(exc)}
    t["last"], t["last_call"] = last, last_call
    return {"ok": True, "samples": samples, "info": info, "checksums": sums}


def do_whole(st: CandidateState, msg: dict) -> dict:
    """A profiler without the two halves: its own ``time()`` (inputs rotated the same way)."""
    import torch

    t = st.timing
    try:
        prepare = _rotating(st, t, int(msg["seed"]))
        with torch.no_grad():
            timing = t["prof"].time(t["fn"], t["work"], st.device, prepare)
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": error_reply(exc)}
    return {"ok": True, "timing": timing.to_dict() if hasattr(timing, "to_dict") else vars(timing)}


def do_outputs(st: CandidateState, msg: dict) -> tuple[dict, list[int]]:
    t = st.timing
    if "last" not in t:
        return refused("no timed loop ran"), []
    try:
        spec, fds = export(st, list(t["last"]), bool(msg.get("ipc", True)))
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": error_reply(exc)}, []
    return {"ok": True, "outputs": spec, "last_call": t["last_call"]}, fds

