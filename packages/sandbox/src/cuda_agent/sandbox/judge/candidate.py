"""The candidate process: the only process a candidate's code ever runs in.

``python -m cuda_agent.sandbox.judge.candidate FD`` is started by the trusted side of a job
(:mod:`.client`) as root, imports torch and the harness and makes its CUDA context, then
waits. On ``drop`` it becomes the job's own user (:mod:`..privdrop`), and only then imports
the candidate. It answers the trusted side's commands over the socket ``FD``
(:mod:`.wire`, JSON only):

* ``load``: import the reference (for its weights and inputs) and the candidate, build both
  models after the same seed, load ``Model``'s state_dict into ``ModelNew``;
* ``run``: draw one input set from a seed, run ``ModelNew`` on it (run-time guard and
  poisoned memory on), hand the output back (:mod:`.tensors`);
* ``warm`` / ``loop`` / ``outputs``: time the candidate with a profiler plugin in two halves
  (warm-up, then ``n`` calls in the compiled loop with inputs rotated by :mod:`.rotation`
  and a checksum of every call's output), and hand back the last outputs;
* ``integrity``: what the candidate replaced of the harness (defence in depth);
* ``exit``.

Nothing this process reports is believed by itself: the trusted side draws the same inputs,
runs the reference, compares every output, checks sampled checksums of timed calls and
bounds the reported times by its own wall clock. The guard and the integrity check here
only add refusals.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import traceback
from typing import Any

from . import wire


class _State:
    def __init__(self) -> None:
        self.device = "cpu"
        self.loaded: Any = None
        self.ref_mod: Any = None
        self.namespaces: set = set()
        self.harness: dict | None = None
        self.exporter: Any = None
        self.timing: dict = {}
        self.meta: dict = {}
        self.threads: Any = None
        self.extensions: list = []
        self.cand_name = "model_new.py"
        self.strict = True


def _error(exc: BaseException, files: tuple[str, ...] = ()) -> dict:
    from .loading import short_exc

    msg = str(exc)
    return {"type": type(exc).__name__, "message": short_exc(exc, files=files),
            "cuda": "CUDA error" in msg or "illegal memory access" in msg or "cudaError" in msg}


def _release(st: _State) -> None:
    if st.exporter is not None:
        st.exporter.release()
        st.exporter = None


def _export(st: _State, values: Any, allow_ipc: bool) -> tuple[Any, list[int]]:
    from .tensors import Exporter

    st.exporter = Exporter(allow_ipc=allow_ipc)
    return st.exporter.describe(values), list(st.exporter.fds)


# --- commands ---------------------------------------------------------------------------------


def do_drop(st: _State, msg: dict) -> dict:
    from ..isolation import privdrop

    uid = msg.get("uid")
    view, meta = privdrop.drop_privileges(msg["workspace"], bool(msg.get("enabled", True)),
                                          uid=int(uid) if uid is not None else None)
    _die_with_parent()  # a change of user clears the parent-death signal
    st.meta.update(meta)
    st.meta["view"] = str(view)
    return {"ok": True, "meta": meta, "view": str(view)}


def _die_with_parent() -> None:
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def do_load(st: _State, msg: dict) -> dict:
    import torch

    from . import integrity
    from .inputs import describe
    from .precision import apply_policy, policy_from
    from .loading import LoadFailure, build_candidate, build_models, load_candidate, load_reference

    apply_policy(policy_from(msg.get("precision", "fp32-strict")))
    sys.path.insert(0, msg["workspace"])
    st.harness = integrity.snapshot()
    seed, cand = int(msg["seed"]), msg["candidate"]
    name = os.path.basename(cand)
    st.cand_name, st.strict = name, bool(msg.get("strict_state_dict", True))
    try:
        with torch.no_grad():
            st.ref_mod = load_reference(msg["reference"])
            loaded = build_models(st.ref_mod, None, st.device, seed, True, name)
            before = set(sys.modules)
            cand_mod, st.namespaces = load_candidate(cand)
            st.extensions = _extensions(before, cand_mod)
            build_candidate(loaded, cand_mod, st.device, seed, st.strict, name, weights=msg.get("weights", "state_dict"))
    except LoadFailure as exc:
        return {"ok": False, "category": exc.category.value, "message": exc.message,
                "tampered": integrity.tampered(st.harness)}
    loaded.ref_model = None  # only its weights were needed here
    st.loaded = loaded
    return {"ok": True, "namespaces": sorted(st.namespaces), "init_inputs": describe(loaded.init_inputs),
            "weights": loaded.weights, "tampered": integrity.tampered(st.harness)}


def do_reseed(st: _State, msg: dict) -> dict:
    """Both models built again after another seed, weights by that seed alone (the second
    construction of KernelBench's protocol)."""
    import torch

    from .loading import LoadFailure, build_candidate, build_models

    if st.loaded is None:
        return {"ok": False, "error": {"type": "RuntimeError", "message": "no candidate loaded"}}
    try:
        with torch.no_grad():
            loaded = build_models(st.ref_mod, None, st.device, int(msg["seed"]), True, st.cand_name)
            build_candidate(loaded, st.loaded.candidate, st.device, int(msg["seed"]), st.strict, st.cand_name,
                            weights="seeded")
    except LoadFailure as exc:
        return {"ok": False, "category": exc.category.value, "message": exc.message}
    loaded.ref_model = None
    st.loaded = loaded
    return {"ok": True}


def _extensions(before: set, cand_mod: Any) -> list:
    """The compiled modules and kernel libraries the candidate's import loaded: extension
    modules, ctypes libraries it holds, the workspace runtime's kernel libraries."""
    import ctypes
    import importlib.machinery
    import types

    def compiled(obj: Any) -> bool:
        if isinstance(obj, types.ModuleType):
            return str(getattr(obj, "__file__", "") or "").endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
        return isinstance(obj, ctypes.CDLL) or hasattr(obj, "_functions")

    found: list = []
    for obj in [sys.modules.get(n) for n in set(sys.modules) - before] + list(vars(cand_mod).values()):
        if compiled(obj) and not any(obj is f for f in found):
            found.append(obj)
    runtime = sys.modules.get("cuda_agent_runtime")
    for v in (getattr(runtime, "_loaded", {}) or {}).values():
        if not any(v is f for f in found):
            found.append(v)
    return found


def _kernel_names(ext: Any) -> list[str]:
    import ctypes

    if isinstance(ext, ctypes.CDLL):  # the functions it was asked for so far (argtypes set at import)
        return [k for k, v in vars(ext).items() if isinstance(v, ctypes._CFuncPtr)]
    return list(getattr(ext, "_functions", {}) or []) or [n for n in dir(ext) if not n.startswith("_")]


def _poison(obj: Any) -> None:
    import torch

    from . import rotation

    for t in rotation._tensors(obj):
        if t.is_floating_point() or t.is_complex():
            t.fill_(float("nan"))
        elif t.dtype == torch.bool:
            t.logical_not_()
        else:
            t.fill_(torch.iinfo(t.dtype).max)


@contextlib.contextmanager
def _custom_outputs_poisoned(st: _State) -> Any:
    """While active, every output of the candidate's own kernels is overwritten with NaN (or
    an extreme value) as soon as a kernel returns -- returned tensors, or the tensors passed
    to a kernel that returns nothing; yields the count of kernel calls."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = [0]
    patched: list[tuple] = []

    def wrap(fn: Any) -> Any:
        def poisoned(*a: Any, **k: Any) -> Any:
            given = list(a) + list(k.values())
            seen = [x for x in given if isinstance(x, torch.Tensor)]
            ptrs = {x for x in given if isinstance(x, int) and not isinstance(x, bool) and x > 4096}
            if ptrs:  # tensors handed over as raw data pointers (ctypes kernels)
                caller = sys._getframe(1).f_locals
                seen += [t for t in caller.values() if isinstance(t, torch.Tensor) and t.data_ptr() in ptrs]
            before = [t.clone() for t in seen]
            res = fn(*a, **k)
            calls[0] += 1
            # the kernel's outputs: what it returned, and what it wrote of what it was given
            # (its inputs, weights among them, are left alone)
            _poison([res] + [t for t, b in zip(seen, before) if not torch.equal(t, b)])
            return res

        return poisoned

    for ext in st.extensions:
        for n in _kernel_names(ext):
            fn = getattr(ext, n, None)
            if callable(fn) and not isinstance(fn, type):
                try:
                    setattr(ext, n, wrap(fn))
                    patched.append((ext, n, fn))
                except (AttributeError, TypeError):
                    continue

    class _Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if getattr(func, "namespace", "aten") in st.namespaces:
                calls[0] += 1
                _poison(out)
            return out

    try:
        with _Mode():
            yield calls
    finally:
        for ext, n, fn in patched:
            try:
                setattr(ext, n, fn)
            except (AttributeError, TypeError):
                pass


def _inputs(st: _State, seed: int, extra: str | None) -> list:
    from .inputs import draw_inputs
    from .draws import extra_draw_inputs

    values = draw_inputs(st.ref_mod.get_inputs, seed, st.device).values
    if extra:
        values, _ = extra_draw_inputs(values, extra, seed, st.device)
    return values


def do_run(st: _State, msg: dict) -> tuple[dict, list[int]]:
    import torch

    from .op_guard import ForbiddenOpError, GuardOptions, forward_guard
    from .inputs import nbytes
    from .poisoning import fill_uninitialized, poison_allocator
    from .watchdog import VerifyTimeout, deadline, synchronize

    if st.loaded is None:
        return {"ok": False, "error": {"type": "RuntimeError", "message": "no candidate loaded"}}, []
    inputs = _inputs(st, int(msg["seed"]), msg.get("extra"))
    guard_opts = GuardOptions(**(msg.get("guard") or {}))
    poison = bool(msg.get("poison", True))
    reply: dict[str, Any] = {"ok": True}
    if poison:
        reply["poisoned_bytes"] = poison_allocator(st.device, int(msg.get("poison_hint", 0)) + nbytes(inputs))
    guard = None
    out = None
    err: BaseException | None = None
    custom = _custom_outputs_poisoned(st) if msg.get("poison_custom") else contextlib.nullcontext([0])
    try:
        with torch.no_grad(), deadline(float(msg.get("timeout_s") or 0.0)):
            with (fill_uninitialized() if poison else contextlib.nullcontext()), custom as custom_calls:
                with forward_guard(guard_opts, st.namespaces) as guard:
                    out = st.loaded.cand_model(*inputs)
                synchronize(st.device)
        reply["custom_kernel_calls"] = custom_calls[0]
    except BaseException as exc:  # noqa: BLE001 - candidate code may raise anything
        if isinstance(exc, KeyboardInterrupt):
            raise
        err = exc
    if guard is not None:
        reply["guard"] = {"allowed_calls": dict(guard.allowed_calls), "custom_calls": dict(guard.custom_calls),
                          "violations": [v.message for v in guard.violations]}
    if isinstance(err, ForbiddenOpError):
        reply.update(ok=False, forbidden=str(err))
    elif isinstance(err, VerifyTimeout):
        reply.update(ok=False, timeout=str(err))
    elif err is not None:
        reply.update(ok=False, error=_error(err, (os.path.basename(str(msg.get("candidate", "model_new.py"))),
                                                  "cuda_agent_runtime.py")))
    if not reply["ok"]:
        return reply, []
    del inputs
    try:
        spec, fds = _export(st, out, bool(msg.get("ipc", True)))
    except Exception as exc:  # noqa: BLE001 - an output that cannot be handed back
        return {"ok": False, "error": _error(exc)}, []
    reply["output"] = spec
    return reply, fds


def do_warm(st: _State, msg: dict) -> dict:
    import torch

    from .baselines import timing_threads
    from .profilers import get_profiler
    from .profilers.base import ProfilerError

    if st.loaded is None:
        return {"ok": False, "error": {"type": "RuntimeError", "message": "no candidate loaded"}}
    st.timing = {}
    try:
        prof = get_profiler(msg["profiler"], msg.get("options") or {})
        if msg.get("graph"):
            alt = prof.steadier() if hasattr(prof, "steadier") else None
            prof = alt or prof
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": _error(exc)}
    if st.threads is None:  # kept for the process's remaining timings (held on the state: a
        st.threads = timing_threads(st.device, msg.get("cpu_threads"))  # context left to the
        st.meta["cpu_threads"] = st.threads.__enter__()  # collector would restore on collection
    n_threads = st.meta.get("cpu_threads")
    pristine = [_inputs(st, int(s), None) for s in msg["sets"]]
    work = [[v.clone() if isinstance(v, torch.Tensor) else v for v in p] for p in pristine]
    model = st.loaded.cand_model

    def fn(*args: Any) -> Any:
        return model(*args)

    two_phase = all(hasattr(prof, a) for a in ("begin", "loop", "finish", "iterations"))
    st.timing = {"prof": prof, "pristine": pristine, "work": work, "fn": fn, "two_phase": two_phase}
    if not two_phase:
        return {"ok": True, "two_phase": False, "method": prof.method_name(), "cpu_threads": n_threads}
    try:
        with torch.no_grad():
            run = prof.begin(fn, work, st.device)
    except ProfilerError as exc:
        return {"ok": False, "profiler_error": str(exc)[:600]}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": _error(exc)}
    st.timing["run"] = run
    try:  # the first calls of the rotation and checksum paths, before any loop is timed
        from . import rotation

        with torch.no_grad():
            out = fn(*work[0])
            rotation.checksum_into(out, torch.zeros((), dtype=torch.float64, device=st.device))
            rotation.apply(pristine[0], work[0], 1.0)
            del out
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": _error(exc)}
    return {"ok": True, "two_phase": True, "estimate_ms": run.estimate_ms, "warmup_ms": run.warmup_ms,
            "method": run.method, "cpu_threads": n_threads}


def do_loop(st: _State, msg: dict) -> dict:
    import torch

    from . import rotation

    t = st.timing
    if not t.get("two_phase") or "run" not in t:
        return {"ok": False, "error": {"type": "RuntimeError", "message": "no timing begun"}}
    n, seed = int(msg["n"]), int(msg["seed"])
    pristine, work, k = t["pristine"], t["work"], len(t["work"])
    prof, run = t["prof"], t["run"]
    graph_outputs = getattr(prof, "_graph_outputs", None) if run.method.endswith("+graph") else None
    slots = torch.zeros(n, dtype=torch.float64, device=st.device)
    last: list[Any] = [None] * k
    last_call = [-1] * k

    def prepare(j: int, _args: Any) -> None:
        rotation.apply(pristine[j % k], work[j % k], rotation.factor(seed, j, k))

    def after(j: int, out: Any) -> None:
        if out is None and graph_outputs is not None:
            out = graph_outputs[j % k]
        rotation.checksum_into(out, slots[j])
        last[j % k], last_call[j % k] = out, j

    try:
        with torch.no_grad():
            samples, info = prof.loop(run, n, prepare, after)
            sums = slots.tolist()
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": _error(exc)}
    t["last"], t["last_call"] = last, last_call
    return {"ok": True, "samples": samples, "info": info, "checksums": sums}


def do_whole(st: _State, msg: dict) -> dict:
    """A profiler without the two halves: its own ``time()`` (inputs rotated the same way)."""
    import torch

    from . import rotation

    t = st.timing
    pristine, work, k = t["pristine"], t["work"], len(t["work"])
    seed = int(msg["seed"])

    def prepare(j: int, _args: Any) -> None:
        rotation.apply(pristine[j % k], work[j % k], rotation.factor(seed, j, k))

    try:
        with torch.no_grad():
            timing = t["prof"].time(t["fn"], work, st.device, prepare)
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": _error(exc)}
    return {"ok": True, "timing": timing.to_dict() if hasattr(timing, "to_dict") else vars(timing)}


def do_outputs(st: _State, msg: dict) -> tuple[dict, list[int]]:
    t = st.timing
    if "last" not in t:
        return {"ok": False, "error": {"type": "RuntimeError", "message": "no timed loop ran"}}, []
    try:
        spec, fds = _export(st, list(t["last"]), bool(msg.get("ipc", True)))
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": _error(exc)}, []
    return {"ok": True, "outputs": spec, "last_call": t["last_call"]}, fds


def do_integrity(st: _State, msg: dict) -> dict:
    from . import integrity

    return {"ok": True, "tampered": integrity.tampered(st.harness) if st.harness is not None else []}


_COMMANDS = {"drop": do_drop, "load": do_load, "reseed": do_reseed, "run": do_run, "warm": do_warm, "loop": do_loop,
             "whole": do_whole, "outputs": do_outputs, "integrity": do_integrity}


def serve(sock: socket.socket, st: _State) -> int:
    while True:
        try:
            msg, fds = wire.recv(sock)
        except wire.WireError:
            return 0
        for fd in fds:
            os.close(fd)
        op = msg.get("op")
        if op == "exit":
            return 0
        _release(st)  # the trusted side has copied what it was sent last
        fn = _COMMANDS.get(op)
        out_fds: list[int] = []
        try:
            if fn is None:
                reply: dict = {"ok": False, "error": {"type": "ValueError", "message": f"unknown command {op!r}"}}
            else:
                res = fn(st, msg)
                reply, out_fds = res if isinstance(res, tuple) else (res, [])
        except Exception as exc:  # noqa: BLE001 - reported, never raised
            reply = {"ok": False, "error": _error(exc), "traceback": traceback.format_exc(limit=8)[-3000:]}
        wire.send(sock, reply, out_fds)


def main(argv: list[str] | None = None) -> int:
    import json

    argv = sys.argv[1:] if argv is None else argv
    cfg = json.loads(argv[0])
    os.environ["CUDA_AGENT_JOB_PROCESS"] = str(os.getpid())  # this process may give up its rights
    _die_with_parent()
    sock = socket.socket(fileno=int(cfg["fd"]))
    st = _State()
    st.device = cfg.get("device", "cpu")
    ready: dict[str, Any] = {"op": "ready", "pid": os.getpid()}
    try:
        import torch

        # the harness, before any candidate code (so that the integrity snapshot covers it)
        from . import comparison, draws, inputs, integrity, loading, options, poisoning, verify, watchdog  # noqa: F401
        from .profilers import cuda_events, wallclock  # noqa: F401
        from . import native, rotation, tensors  # noqa: F401

        native.timing()
        dev = torch.device(st.device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev.index if dev.index is not None else 0)
            torch.zeros(1, device=dev)
            native.timing_for_cuda()
    except Exception as exc:  # noqa: BLE001 - reported to the trusted side
        ready = {"op": "failed", "error": {**_error(exc), "cuda_init": "cuda" in str(exc).lower()}}
    wire.send(sock, ready)
    if ready["op"] != "ready":
        return 1
    return serve(sock, st)


if __name__ == "__main__":
    sys.exit(main())
