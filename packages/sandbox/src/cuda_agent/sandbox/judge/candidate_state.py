"""What the candidate process (:mod:`.candidate`) keeps between commands, and the helpers
its commands share: the state, error replies, outputs handed back over the socket, input
draws and the parent-death signal.

Imported before any candidate code runs (the integrity snapshot covers it).
"""

from __future__ import annotations

from typing import Any

from .draws import extra_draw_inputs
from .inputs import draw_inputs
from .loading import short_exc
from .tensors import Exporter


class CandidateState:
    """The loaded models, the candidate's namespaces and extensions, the harness snapshot,
    the timing in progress and what the process reports about itself."""

    def __init__(self) -> None:
        self.device = "cpu"
        self.loaded: Any = None
        self.ref_mod: Any = None
        self.namespaces: set = set()
        self.harness: dict | None = None
        self.harness_modules: set[str] = set()  # loaded when the snapshot was taken
        self.exporter: Any = None
        self.timing: dict = {}
        self.meta: dict = {}
        self.threads: Any = None
        self.extensions: list = []
        self.cand_name = "model_new.py"
        self.strict = True
        self.held_inputs: list | None = None  # the last run's input tensors, refilled by the next draw
        self.ways: Any = True  # how the trusted side takes CUDA outputs (the command's "ipc")
        self.pool: Any = None  # the shared device buffers outputs are handed back in (cuda_ipc.BufferPool)


def error_reply(exc: BaseException, files: tuple[str, ...] = ()) -> dict:
    """``exc`` as the ``error`` of a reply (one line, whether it is a CUDA error)."""
    msg = str(exc)
    return {"type": type(exc).__name__, "message": short_exc(exc, files=files),
            "cuda": "CUDA error" in msg or "illegal memory access" in msg or "cudaError" in msg}


def refused(message: str) -> dict:
    """The reply to a command that cannot run in the process's present state."""
    return {"ok": False, "error": {"type": "RuntimeError", "message": message}}


def release(st: CandidateState) -> None:
    """Free what the last reply handed over (the trusted side has copied it)."""
    if st.exporter is not None:
        st.exporter.release()
        st.exporter = None
    if st.pool is not None:
        st.pool.release()


def export(st: CandidateState, values: Any, allow_ipc: bool) -> tuple[Any, list[int]]:
    """``values`` described for the wire, and the descriptors that carry their data: CUDA
    tensors the ways the command accepts (its ``ipc``), else through host memory."""
    if st.pool is None and str(st.device).startswith("cuda"):
        from .cuda_ipc import BufferPool

        st.pool = BufferPool()
    st.exporter = Exporter(allow_ipc=st.ways if allow_ipc else False, pool=st.pool)
    return st.exporter.describe(values), list(st.exporter.fds)


def inputs_for(st: CandidateState, seed: int, extra: str | None) -> list:
    """The reference's input set for ``seed`` (an extra draw of it when ``extra`` is given)."""
    values = draw_inputs(st.ref_mod.get_inputs, seed, st.device).values
    if extra:
        values, _ = extra_draw_inputs(values, extra, seed, st.device)
    return values


def refilled(st: CandidateState, values: list) -> list:
    """``values`` in the tensors the last run was given, where every tensor matches in shape,
    dtype, strides and device: each input set then sits at the addresses of the one before,
    so a result kept by input address (``x.data_ptr()``) answers the next set with the last
    one's output, whatever the allocator would have done."""
    import torch

    held, st.held_inputs = st.held_inputs, values
    if held is None or len(held) != len(values):
        return values

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return (a.shape, a.dtype, a.stride(), a.device) == (b.shape, b.dtype, b.stride(), b.device)
        return not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor)

    if not all(same(h, v) for h, v in zip(held, values)):
        return values
    out = []
    try:
        with torch.no_grad():
            for h, v in zip(held, values):
                out.append(h.copy_(v) if isinstance(h, torch.Tensor) else v)
    except RuntimeError:  # a tensor whose elements share memory (an expanded view): fresh ones then
        return values
    st.held_inputs = out
    return out


def die_with_parent() -> None:
    """Have the kernel kill this process when its parent dies (PR_SET_PDEATHSIG)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

