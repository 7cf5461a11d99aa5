"""Outputs from the candidate process to the trusted process, described in JSON.

A value is a nested description: ``{"t": "tensor", ...}``, ``{"t": "list"|"tuple",
"items": [...]}``, ``{"t": "dict", "items": [[key, value], ...]}`` (text keys) or
``{"t": "value", "v": ...}`` (a number, bool, text or None). A tensor's bytes travel as

* ``"via": "memfd"``: a sealed memory file (its descriptor beside the message; the
  candidate can no longer change it once sealed), for tensors on the CPU and as the
  fallback for CUDA tensors;
* ``"via": "cuda_ipc"``: a CUDA IPC handle of the allocation that holds it, with the
  offset; the trusted side maps it, checks the allocation is large enough, copies the bytes
  into its own memory and unmaps it;
* ``"via": "cuda_fd"``: a buffer of device memory the candidate process copied the tensor
  into, its POSIX descriptor beside the message (:mod:`.cuda_ipc`); the trusted side maps
  exactly the tensor's size of it (the driver refuses more than the buffer holds), copies
  the bytes into its own memory and unmaps it.

The trusted side names the ways it accepts for CUDA tensors (``DEVICE_WAYS``, the first
that works is taken); a tensor that none of them could carry says why (``ipc_error``).

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
DEVICE_WAYS = ("cuda_ipc", "cuda_fd")  # CUDA tensors that stay in device memory, best first
WAY_NAMES = {"cuda_fd": "device memory (shared as a file descriptor)", "cuda_ipc": "device memory (CUDA IPC handle)",
             "memfd": "host memory"}


def _torch() -> Any:
    import torch

    return torch


# --- the candidate's side ---------------------------------------------------------------------


class Exporter:
    """Describes values for :func:`send`; keeps what the receiver maps alive until
    :meth:`release` (after the trusted side has copied it)."""

    def __init__(self, allow_ipc: Any = True, pool: Any = None):
        # allow_ipc: True (every way of DEVICE_WAYS), False (host memory only) or the names
        # of the ways the trusted side accepts
        if allow_ipc is True:
            self.ways = list(DEVICE_WAYS)
        elif isinstance(allow_ipc, (list, tuple)):
            self.ways = [w for w in DEVICE_WAYS if w in allow_ipc]
        else:
            self.ways = []
        self.allow_ipc = bool(self.ways)
        self.pool = pool  # cuda_ipc.BufferPool of the candidate process (shared buffers reused)
        self._own_pool: Any = None
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
        errors = []
        for way in self.ways if c.is_cuda else ():
            try:
                self._on_device(way, c, spec)
                return spec
            except Exception as exc:  # noqa: BLE001 - the next way, or host memory
                errors.append(f"{way}: {str(exc)[:200]}")
        if errors:
            spec["ipc_error"] = "; ".join(errors)[:400]
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

    def _on_device(self, way: str, c: Any, spec: dict) -> None:
        torch = _torch()
        from . import cuda_ipc

        torch.cuda.synchronize(c.device)
        if way == "cuda_fd":
            dev = c.device.index if c.device.index is not None else torch.cuda.current_device()
            why = cuda_ipc.fd_supported(dev)
            if why:
                raise cuda_ipc.IpcError(why)
            if self.pool is None:
                self.pool = self._own_pool = cuda_ipc.BufferPool()
            buf = self.pool.take(spec["nbytes"], dev)
            cuda_ipc.copy(buf.ptr, c.data_ptr(), spec["nbytes"])
            fd = buf.export_fd()
            spec.update(via="cuda_fd", fd=len(self.fds))
            self.fds.append(fd)
        else:
            handle, offset, size = cuda_ipc.export(c.data_ptr())
            self.keep.append(c)
            spec.update(via="cuda_ipc", handle=handle.hex(), offset=offset, alloc=size)

    def release(self) -> None:
        if self._own_pool is not None:  # buffers of this reply alone
            self._own_pool.clear()
            self._own_pool = self.pool = None
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
    elif via == "cuda_fd" and dev.type == "cuda":
        raw = _from_fd(spec, fds, nbytes, dev)
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


class TransferError(WireError):
    """A way of carrying device memory that does not work between these two processes
    (``way``: its name); the next output goes another way."""

    def __init__(self, message: str, way: str):
        super().__init__(message, "ipc")
        self.way = way


def _from_fd(spec: dict, fds: list[int], nbytes: int, dev: Any) -> Any:
    torch = _torch()
    from . import cuda_ipc

    i = spec.get("fd")
    if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(fds):
        raise WireError("output names no descriptor that came with it")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):
        try:
            ptr, size = cuda_ipc.import_fd(fds[i], nbytes, index)
        except cuda_ipc.IpcError as exc:
            raise TransferError(f"cannot map the candidate's output: {exc}", "cuda_fd") from None
        try:
            out = torch.empty(nbytes, dtype=torch.uint8, device=dev)
            cuda_ipc.copy(out.data_ptr(), ptr, nbytes)
        finally:
            cuda_ipc.unmap_fd(ptr, size)
    return out


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
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    with torch.cuda.device(dev):
        try:
            base, size = cuda_ipc.open_handle(handle, index)
        except cuda_ipc.IpcError as exc:
            raise TransferError(f"cannot map the candidate's output: {exc}", "cuda_ipc") from None
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


def ways_used(spec: Any, depth: int = 0) -> dict[str, int]:
    """How many tensors of an output description came each way (``via``), and the candidate
    side's reasons for host memory (``ipc_error``) under ``"why"``."""
    out: dict[str, Any] = {}
    if depth > MAX_DEPTH or not isinstance(spec, dict):
        return out
    if spec.get("t") == "tensor":
        via = str(spec.get("via"))[:20]
        out[via] = 1
        if spec.get("ipc_error"):
            out["why"] = str(spec["ipc_error"])[:300]
        return out
    items = spec.get("items") if isinstance(spec.get("items"), list) else []
    for item in items[:MAX_ITEMS]:
        sub = ways_used(item[1] if spec.get("t") == "dict" and isinstance(item, list) and len(item) == 2 else item,
                        depth + 1)
        for k, v in sub.items():
            out[k] = v if k == "why" else out.get(k, 0) + v
    return out


def close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
