"""CUDA outputs shared between the candidate process and the trusted process, through the
CUDA driver torch loaded (ctypes). Two ways, tried in this order (the trusted side drops a way
that fails to map for the rest of the job):

* ``cuda_ipc``: a legacy CUDA IPC handle (``cudaIpcGetMemHandle``, 64 bytes) of the
  allocation that holds the output, with the offset; the trusted side maps it, checks the
  mapped allocation's size (``cuMemGetAddressRange``) and
  that it lies on the job's device before reading from it. No copy in the candidate process.
* ``cuda_fd``: the candidate process copies an output into a buffer of its own made with
  the driver's virtual memory API (``cuMemCreate``, exportable as a POSIX file descriptor),
  exports it (``cuMemExportToShareableHandle``) and passes the descriptor beside the reply
  on the job's Unix socket (``SCM_RIGHTS``). The trusted process imports it
  (``cuMemImportFromShareableHandle``), checks that the memory lies on its own device, maps
  exactly the output's size rounded up to the driver's granularity (the driver refuses a
  mapping past the end of the allocation), copies the bytes into its own memory and unmaps
  it. Nothing crosses but a descriptor of memory the candidate process owns: it works across
  PID namespaces and user ids, where a legacy handle may not open.

Neither way lets the candidate make the trusted side read past the output: sizes are the
trusted side's own (from the output's shape and dtype) and the driver checks them against
the memory that was shared. Host memory (a sealed memory file, :mod:`.tensors`) is the
fallback; the result names the way its outputs came.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from .native import loaded_library

HANDLE_BYTES = 64
IPC_LAZY_ENABLE_PEER_ACCESS = 1

# driver API constants (cuda.h)
_ALLOCATION_TYPE_PINNED = 0x1
_HANDLE_TYPE_POSIX_FD = 0x1
_LOCATION_TYPE_DEVICE = 0x1
_ACCESS_READ = 0x1
_ACCESS_READWRITE = 0x3
_GRANULARITY_MINIMUM = 0x0
_ATTR_VMM_SUPPORTED = 102  # CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
_ATTR_POSIX_FD_SUPPORTED = 103  # CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
_POINTER_DEVICE_ORDINAL = 9  # CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


def handle_bytes(h: _Handle) -> bytes:
    """All ``HANDLE_BYTES`` bytes of a handle. (Reading the ``c_char`` array field gives a
    bytes object cut at its first zero byte: a real handle has zeros in it, and the cut one
    could never be opened.)"""
    return bytes(h)


def handle_from_bytes(handle: bytes) -> _Handle:
    if len(handle) != HANDLE_BYTES:
        raise IpcError(f"an IPC handle of {len(handle)} bytes (expected {HANDLE_BYTES})")
    h = _Handle()
    ctypes.memmove(ctypes.addressof(h), handle, HANDLE_BYTES)
    return h


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_rt: Any = None
_drv: Any = None
_lock = threading.Lock()


class IpcError(RuntimeError):
    pass


def _libs() -> tuple[Any, Any]:
    global _rt, _drv
    with _lock:
        if _rt is None:
            import torch

            torch.cuda.init()
            path = loaded_library("libcudart.so")
            if path is None:
                raise IpcError("libcudart is not loaded in this process")
            rt = ctypes.CDLL(path)
            rt.cudaIpcGetMemHandle.argtypes = [ctypes.POINTER(_Handle), ctypes.c_void_p]
            rt.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), _Handle, ctypes.c_uint]
            rt.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
            rt.cudaGetErrorString.restype = ctypes.c_char_p
            drv = ctypes.CDLL("libcuda.so.1")
            u64, sz, p = ctypes.c_uint64, ctypes.c_size_t, ctypes.POINTER
            drv.cuMemGetAddressRange_v2.argtypes = [p(u64), p(sz), u64]
            drv.cuGetErrorString.argtypes = [ctypes.c_int, p(ctypes.c_char_p)]
            drv.cuDeviceGetAttribute.argtypes = [p(ctypes.c_int), ctypes.c_int, ctypes.c_int]
            drv.cuMemGetAllocationGranularity.argtypes = [p(sz), p(_AllocProp), ctypes.c_int]
            drv.cuMemCreate.argtypes = [p(u64), sz, p(_AllocProp), u64]
            drv.cuMemRelease.argtypes = [u64]
            drv.cuMemAddressReserve.argtypes = [p(u64), sz, sz, u64, u64]
            drv.cuMemAddressFree.argtypes = [u64, sz]
            drv.cuMemMap.argtypes = [u64, sz, sz, u64, u64]
            drv.cuMemUnmap.argtypes = [u64, sz]
            drv.cuMemSetAccess.argtypes = [u64, sz, p(_AccessDesc), sz]
            drv.cuMemExportToShareableHandle.argtypes = [ctypes.c_void_p, u64, ctypes.c_int, u64]
            drv.cuMemImportFromShareableHandle.argtypes = [p(u64), ctypes.c_void_p, ctypes.c_int]
            drv.cuMemGetAllocationPropertiesFromHandle.argtypes = [p(_AllocProp), u64]
            drv.cuMemcpyDtoD_v2.argtypes = [u64, u64, sz]
            drv.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, u64]
            drv.cuCtxSynchronize.argtypes = []
            _rt, _drv = rt, drv
    return _rt, _drv


def _check(rc: int, what: str) -> None:
    if rc != 0:
        rt, _ = _libs()
        raise IpcError(f"{what}: {rt.cudaGetErrorString(rc).decode(errors='replace')} ({rc})")


def _drv_check(rc: int, what: str) -> None:
    if rc != 0:
        _, drv = _libs()
        s = ctypes.c_char_p()
        drv.cuGetErrorString(rc, ctypes.byref(s))
        raise IpcError(f"{what}: {(s.value or b'CUDA driver error').decode(errors='replace')} ({rc})")


def _current(device: int) -> None:
    """Make ``device``'s primary context (torch's) current on this thread."""
    import torch

    torch.cuda.set_device(device)
    torch.cuda.current_stream(device)


def allocation_of(ptr: int) -> tuple[int, int]:
    """(base, size) of the device allocation that holds ``ptr``."""
    _, drv = _libs()
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    rc = drv.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    if rc != 0:
        raise IpcError(f"cuMemGetAddressRange: CUDA driver error {rc}")
    return int(base.value), int(size.value)


def copy(dst: int, src: int, nbytes: int) -> None:
    """Copy ``nbytes`` between device addresses and wait for it (after this thread's work so far)."""
    _, drv = _libs()
    _drv_check(drv.cuCtxSynchronize(), "cuCtxSynchronize")
    _drv_check(drv.cuMemcpyDtoD_v2(ctypes.c_uint64(dst), ctypes.c_uint64(src), ctypes.c_size_t(nbytes)),
               "cuMemcpyDtoD")
    _drv_check(drv.cuCtxSynchronize(), "cuCtxSynchronize")


# --- legacy CUDA IPC handles ------------------------------------------------------------------


def export(ptr: int) -> tuple[bytes, int, int]:
    """(handle, offset of ``ptr`` in its allocation, allocation size)."""
    rt, _ = _libs()
    base, size = allocation_of(ptr)
    h = _Handle()
    _check(rt.cudaIpcGetMemHandle(ctypes.byref(h), ctypes.c_void_p(base)), "cudaIpcGetMemHandle")
    return handle_bytes(h), ptr - base, size


def device_of(ptr: int) -> int:
    """The ordinal of the device whose memory ``ptr`` is."""
    _, drv = _libs()
    v = ctypes.c_int(-1)
    _drv_check(drv.cuPointerGetAttribute(ctypes.byref(v), _POINTER_DEVICE_ORDINAL, ctypes.c_uint64(ptr)),
               "cuPointerGetAttribute")
    return int(v.value)


def open_handle(handle: bytes, device: int | None = None) -> tuple[int, int]:
    """Map another process's allocation: (base pointer here, its size); with ``device``,
    only memory of that device (a handle of a peer GPU's memory is refused)."""
    h = handle_from_bytes(handle)
    rt, _ = _libs()
    p = ctypes.c_void_p(0)
    _check(rt.cudaIpcOpenMemHandle(ctypes.byref(p), h, IPC_LAZY_ENABLE_PEER_ACCESS), "cudaIpcOpenMemHandle")
    base = int(p.value or 0)
    try:
        got_base, size = allocation_of(base)
    except IpcError:
        close_handle(base)
        raise
    if got_base != base:
        close_handle(base)
        raise IpcError("the mapped allocation does not start where it was mapped")
    if device is not None:
        try:
            where = device_of(base)
        except IpcError:
            close_handle(base)
            raise
        if where != device:
            close_handle(base)
            raise IpcError(f"the shared memory is on device {where}, not {device}")
    return base, size


def close_handle(base: int) -> None:
    rt, _ = _libs()
    rt.cudaIpcCloseMemHandle(ctypes.c_void_p(base))


# --- shareable handles (POSIX file descriptors) ---------------------------------------------------


def _prop(device: int) -> _AllocProp:
    prop = _AllocProp()
    prop.type = _ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = _HANDLE_TYPE_POSIX_FD
    prop.location.type = _LOCATION_TYPE_DEVICE
    prop.location.id = device
    return prop


_granularity: dict[int, int] = {}


def granularity(device: int) -> int:
    if device not in _granularity:
        _, drv = _libs()
        g = ctypes.c_size_t(0)
        _drv_check(drv.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(_prop(device)),
                                                     _GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity")
        _granularity[device] = max(int(g.value), 1)
    return _granularity[device]


def _rounded(nbytes: int, device: int) -> int:
    g = granularity(device)
    return (max(nbytes, 1) + g - 1) // g * g


def fd_supported(device: int) -> str | None:
    """Why this device cannot share memory as file descriptors, or None when it can."""
    _, drv = _libs()
    for attr, what in ((_ATTR_VMM_SUPPORTED, "virtual memory management"),
                       (_ATTR_POSIX_FD_SUPPORTED, "POSIX file descriptor handles")):
        v = ctypes.c_int(0)
        rc = drv.cuDeviceGetAttribute(ctypes.byref(v), attr, device)
        if rc != 0 or not v.value:
            return f"the device does not support {what}" + (f" (CUDA driver error {rc})" if rc else "")
    return None


def _map(handle: int, size: int, device: int, access: int) -> int:
    _, drv = _libs()
    va = ctypes.c_uint64(0)
    _drv_check(drv.cuMemAddressReserve(ctypes.byref(va), size, 0, 0, 0), "cuMemAddressReserve")
    try:
        rc = drv.cuMemMap(va, size, 0, handle, 0)
        if rc != 0:
            _drv_check(rc, f"cuMemMap of {size} bytes")
        desc = _AccessDesc()
        desc.location.type, desc.location.id, desc.flags = _LOCATION_TYPE_DEVICE, device, access
        rc = drv.cuMemSetAccess(va, size, ctypes.byref(desc), 1)
        if rc != 0 and access == _ACCESS_READ:  # read-only mappings are not offered everywhere
            desc.flags = _ACCESS_READWRITE
            rc = drv.cuMemSetAccess(va, size, ctypes.byref(desc), 1)
        if rc != 0:
            drv.cuMemUnmap(va, size)
            _drv_check(rc, "cuMemSetAccess")
    except BaseException:
        drv.cuMemAddressFree(va, size)
        raise
    return int(va.value)


def _unmap(ptr: int, size: int) -> None:
    _, drv = _libs()
    drv.cuMemUnmap(ctypes.c_uint64(ptr), size)
    drv.cuMemAddressFree(ctypes.c_uint64(ptr), size)


class SharedBuffer:
    """Device memory of the candidate process that can be handed over as a file descriptor."""

    def __init__(self, nbytes: int, device: int):
        _, drv = _libs()
        _current(device)
        self.device = device
        self.size = _rounded(nbytes, device)
        h = ctypes.c_uint64(0)
        _drv_check(drv.cuMemCreate(ctypes.byref(h), self.size, ctypes.byref(_prop(device)), 0), "cuMemCreate")
        self.handle = int(h.value)
        try:
            self.ptr = _map(self.handle, self.size, device, _ACCESS_READWRITE)
        except BaseException:
            drv.cuMemRelease(self.handle)
            raise

    def export_fd(self) -> int:
        """A new descriptor of this memory (the caller closes it)."""
        _, drv = _libs()
        fd = ctypes.c_int(-1)
        _drv_check(drv.cuMemExportToShareableHandle(ctypes.byref(fd), self.handle, _HANDLE_TYPE_POSIX_FD, 0),
                   "cuMemExportToShareableHandle")
        return int(fd.value)

    def free(self) -> None:
        if self.handle:
            _, drv = _libs()
            _unmap(self.ptr, self.size)
            drv.cuMemRelease(self.handle)
            self.handle = 0


class BufferPool:
    """The candidate process's shared buffers, reused from one reply to the next (the trusted
    side has copied a reply's outputs before the next command arrives)."""

    def __init__(self) -> None:
        self.free: list[SharedBuffer] = []
        self.used: list[SharedBuffer] = []

    def take(self, nbytes: int, device: int) -> SharedBuffer:
        size = _rounded(nbytes, device)
        for i, b in enumerate(self.free):
            if b.device == device and size <= b.size <= 2 * size:
                buf = self.free.pop(i)
                break
        else:
            buf = SharedBuffer(nbytes, device)
        self.used.append(buf)
        return buf

    def release(self) -> None:
        """The last reply's buffers become free for the next; those the last reply did not
        need are given back to the driver."""
        for b in self.free:
            b.free()
        self.free, self.used = self.used, []

    def clear(self) -> None:
        self.release()
        self.release()


def import_fd(fd: int, nbytes: int, device: int) -> tuple[int, int]:
    """Map the memory behind a descriptor from the candidate process: (pointer here, mapped
    size), at least ``nbytes`` of memory on ``device``. Unmap with :func:`unmap_fd`."""
    _, drv = _libs()
    _current(device)
    h = ctypes.c_uint64(0)
    _drv_check(drv.cuMemImportFromShareableHandle(ctypes.byref(h), ctypes.c_void_p(fd), _HANDLE_TYPE_POSIX_FD),
               "cuMemImportFromShareableHandle")
    try:
        prop = _AllocProp()
        _drv_check(drv.cuMemGetAllocationPropertiesFromHandle(ctypes.byref(prop), h.value),
                   "cuMemGetAllocationPropertiesFromHandle")
        if prop.location.type != _LOCATION_TYPE_DEVICE or prop.location.id != device:
            raise IpcError(f"the shared memory is not on device {device}")
        size = _rounded(nbytes, device)
        try:
            ptr = _map(int(h.value), size, device, _ACCESS_READ)
        except IpcError as exc:
            raise IpcError(f"the shared memory does not hold {nbytes} bytes ({exc})") from None
    finally:
        drv.cuMemRelease(h.value)  # the mapping keeps the memory until it is unmapped
    return ptr, size


def unmap_fd(ptr: int, size: int) -> None:
    _unmap(ptr, size)


class DeviceBytes:
    """``nbytes`` bytes at a device address, for ``torch.as_tensor`` (zero copy)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2}
