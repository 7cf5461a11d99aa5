"""Outputs from the candidate process to the trusted process, described in JSON.

A value is a nested description: ``{"t": "tensor", ...}``, ``{"t": "list"|"tuple",
"items": [...]}``, ``{"t": "dict", "items": [[key, value], ...]}`` (text keys) or
``{"t": "value", "v": ...}`` (a number, bool, text or None). A tensor's bytes travel as

* ``"via": "memfd"``: a sealed memory file (its descriptor beside the message; the
  candidate can no longer change it once sealed), for tensors on the CPU and as the
  fallback for CUDA tensors;
* ``"via": "cuda_ipc"``: a CUDA IPC handle of the allocation that holds it, with the
  offset; the trusted side maps it, checks the allocation is large enough, copies the bytes
  into its own memory and unmaps it.

Only contiguous bytes travel (the trusted side compares values, not layouts). Every field
is checked on receipt: known dtype, sizes that agree, offsets inside the allocation.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import warnings
from typing import Any

from .wire import WireError

DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128", "int8", "uint8",
          "int16", "int32", "int64", "bool", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2")
MAX_DEPTH = 8
MAX_ITEMS = 4096
MAX_DIMS = 16
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def _torch() -> Any:
    import torch

    return torch


# --- the candidate's side ---------------------------------------------------------------------


class Exporter:
    """Describes values for :func:`send`; keeps what the receiver maps alive until
    :meth:`release` (after the trusted side has copied it)."""

    def __init__(self, allow_ipc: bool = True):
        self.allow_ipc = allow_ipc
        self.fds: list[int] = []
        self.keep: list[Any] = []

    def describe(self, obj: Any, depth: int = 0) -> dict:
        torch = _torch()
        if depth > MAX_DEPTH:
            raise ValueError("output nested too deeply")
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj)
        if isinstance(obj, (list, tuple)):
            return {"t": "tuple" if isinstance(obj, tuple) else "list",
                    "items": [self.describe(v, depth + 1) for v in obj]}
        if isinstance(obj, dict):
            return {"t": "dict", "items": [[str(k), self.describe(v, depth + 1)] for k, v in obj.items()]}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return {"t": "value", "v": obj}
        return {"t": "value", "v": f"<{type(obj).__name__}>"}

    def _tensor(self, t: Any) -> dict:
        torch = _torch()
        dtype = str(t.dtype).replace("torch.", "")
        t = t.detach()
        spec = {"t": "tensor", "dtype": dtype, "shape": list(t.shape), "device": t.device.type,
                "nbytes": t.numel() * t.element_size()}
        if spec["nbytes"] == 0:
            spec["via"] = "none"
            return spec
        c = t.contiguous()
        if c.is_cuda and self.allow_ipc:
            try:
                from . import cuda_ipc

                torch.cuda.synchronize(c.device)
                handle, offset, size = cuda_ipc.export(c.data_ptr())
                self.keep.append(c)
                spec.update(via="cuda_ipc", handle=handle.hex(), offset=offset, alloc=size)
                return spec
            except Exception as exc:  # noqa: BLE001 - the bytes go through host memory instead
                spec["ipc_error"] = str(exc)[:200]
        fd = os.memfd_create("cuda-agent-output", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, spec["nbytes"])
            with mmap.mmap(fd, spec["nbytes"]) as mm:
                dst = torch.frombuffer(mm, dtype=torch.uint8)
                dst.copy_(c.reshape(-1).view(torch.uint8).cpu())
                del dst
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        except BaseException:
            os.close(fd)
            raise
        spec.update(via="memfd", fd=len(self.fds))
        self.fds.append(fd)
        return spec

    def release(self) -> None:
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds, self.keep = [], []


# --- the trusted side -----------------------------------------------------------------------


def rebuild(spec: Any, fds: list[int], device: Any, depth: int = 0) -> Any:
    """The value ``spec`` describes, every tensor copied into this process's memory on
    ``device``. Raises :class:`WireError` for anything malformed."""
    if depth > MAX_DEPTH or not isinstance(spec, dict):
        raise WireError("malformed output description")
    kind = spec.get("t")
    if kind == "tensor":
        return _rebuild_tensor(spec, fds, device)
    if kind in ("list", "tuple"):
        items = spec.get("items")
        if not isinstance(items, list) or len(items) > MAX_ITEMS:
            raise WireError("malformed output list")
        vals = [rebuild(v, fds, device, depth + 1) for v in items]
        return tuple(vals) if kind == "tuple" else vals
    if kind == "dict":
        items = spec.get("items")
        if not isinstance(items, list) or len(items) > MAX_ITEMS:
            raise WireError("malformed output dict")
        out = {}
        for pair in items:
            if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
                raise WireError("malformed output dict entry")
            out[pair[0]] = rebuild(pair[1], fds, device, depth + 1)
        return out
    if kind == "value":
        v = spec.get("v")
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
    raise WireError(f"unknown output kind {str(kind)[:20]!r}")


def _rebuild_tensor(spec: dict, fds: list[int], device: Any) -> Any:
    torch = _torch()
    dtype_name = spec.get("dtype")
    if dtype_name not in DTYPES or not hasattr(torch, str(dtype_name)):
        raise WireError(f"output dtype {str(dtype_name)[:20]!r} is not supported")
    dtype = getattr(torch, dtype_name)
    shape = spec.get("shape")
    if not (isinstance(shape, list) and len(shape) <= MAX_DIMS
            and all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 1 << 40 for s in shape)):
        raise WireError("malformed output shape")
    numel = 1
    for s in shape:
        numel *= s
    itemsize = torch.empty(0, dtype=dtype).element_size()
    nbytes = numel * itemsize
    if spec.get("nbytes") != nbytes:
        raise WireError("output size does not match its shape and dtype")
    dev = torch.device(device)
    # the candidate's device type decides where the values are compared: an output on the
    # wrong device must still fail as one
    out_dev = torch.device("cpu") if spec.get("device") == "cpu" else dev
    via = spec.get("via")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=out_dev)
    if via == "memfd":
        raw = _from_memfd(spec, fds, nbytes)
    elif via == "cuda_ipc" and dev.type == "cuda":
        raw = _from_ipc(spec, nbytes, dev)
    else:
        raise WireError(f"output transfer {str(via)[:20]!r} is not possible here")
    return raw.to(out_dev).view(dtype).reshape(shape)


def _from_memfd(spec: dict, fds: list[int], nbytes: int) -> Any:
    torch = _torch()
    i = spec.get("fd")
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(fds):
        raise WireError("output names no descriptor that came with it")
    fd = fds[i]
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    if seals & (fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK) != (fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK):
        raise WireError("an output buffer that is not sealed against writes")
    if os.fstat(fd).st_size < nbytes:
        raise WireError("an output buffer smaller than its tensor")
    with mmap.mmap(fd, nbytes, prot=mmap.PROT_READ) as mm, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a read-only buffer: copied at once
        return torch.frombuffer(mm, dtype=torch.uint8, count=nbytes).clone()


def _from_ipc(spec: dict, nbytes: int, dev: Any) -> Any:
    torch = _torch()
    from . import cuda_ipc

    try:
        handle = bytes.fromhex(str(spec.get("handle", "")))
    except ValueError:
        raise WireError("malformed IPC handle") from None
    offset = spec.get("offset")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise WireError("malformed IPC offset")
    with torch.cuda.device(dev):
        try:
            base, size = cuda_ipc.open_handle(handle)
        except cuda_ipc.IpcError as exc:
            raise WireError(f"cannot map the candidate's output: {exc}", "ipc") from None
        try:
            if offset + nbytes > size:
                raise WireError("an output that reaches past the end of its allocation")
            view = torch.as_tensor(cuda_ipc.DeviceBytes(base + offset, nbytes), device=dev)
            copy = view.clone()
            torch.cuda.synchronize(dev)
            del view
        finally:
            cuda_ipc.close_handle(base)
    return copy


def close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
