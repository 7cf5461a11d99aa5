"""The candidate process's ``run`` command: ``ModelNew`` on one input set drawn from a
seed, under the run-time op guard, a deadline and poisoned memory (freed allocator blocks
and uninitialised tensors filled, and on request every output of the candidate's own
kernels overwritten as soon as a kernel returns), its output handed back.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from . import rotation
from .candidate_state import CandidateState, error_reply, export, inputs_for, refilled, refused
from .inputs import nbytes
from .op_guard import ForbiddenOpError, GuardOptions, forward_guard
from .poisoning import fill_uninitialized, poison_allocator, release_cached
from .watchdog import VerifyTimeout, deadline, synchronize


def do_run(st: CandidateState, msg: dict) -> tuple[dict, list[int]]:
    import torch

    if st.loaded is None:
        return refused("no candidate loaded"), []
    inputs = refilled(st, inputs_for(st, int(msg["seed"]), msg.get("extra")))
    guard_opts = GuardOptions(**(msg.get("guard") or {}))
    poison = bool(msg.get("poison", True))
    reply: dict[str, Any] = {"ok": True}
    if poison:
        out_hint = int(msg.get("poison_hint", 0))  # the reference's output on this set
        reply["poisoned_bytes"] = poison_allocator(st.device, out_hint + nbytes(inputs), out_hint)
    guard = None
    out = None
    err: BaseException | None = None
    custom = custom_outputs_poisoned(st) if msg.get("poison_custom") else contextlib.nullcontext([0])
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
        reply.update(ok=False, error=error_reply(err, (os.path.basename(str(msg.get("candidate", "model_new.py"))),
                                                       "cuda_agent_runtime.py")))
    if not reply["ok"]:
        return reply, []
    del inputs
    try:
        spec, fds = export(st, out, bool(msg.get("ipc", True)))
    except Exception as exc:  # noqa: BLE001 - an output that cannot be handed back
        return {"ok": False, "error": error_reply(exc)}, []
    reply["output"] = spec
    # the freed blocks (the poisoned ones, the draw's temporaries) back to the driver before the
    # trusted side draws the next input set; the output and the held input set stay allocated
    reply["cache_released_bytes"] = release_cached(st.device)
    return reply, fds


# --- the candidate's own kernels' outputs, poisoned ----------------------------------------


def _kernel_names(ext: Any) -> list[str]:
    import ctypes

    if isinstance(ext, ctypes.CDLL):  # the functions it was asked for so far (argtypes set at import)
        return [k for k, v in vars(ext).items() if isinstance(v, ctypes._CFuncPtr)]
    return list(getattr(ext, "_functions", {}) or []) or [n for n in dir(ext) if not n.startswith("_")]


def _poison(obj: Any) -> None:
    import torch

    for t in rotation._tensors(obj):
        if t.is_floating_point() or t.is_complex():
            t.fill_(float("nan"))
        elif t.dtype == torch.bool:
            t.logical_not_()
        else:
            t.fill_(torch.iinfo(t.dtype).max)


@contextlib.contextmanager
def custom_outputs_poisoned(st: CandidateState) -> Any:
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
