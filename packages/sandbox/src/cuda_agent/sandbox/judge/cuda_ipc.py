"""CUDA IPC through the CUDA runtime torch loaded (ctypes): a candidate process shares its
output buffers, the trusted process maps them, copies them into its own memory and
unmaps them. Only raw memory handles cross; the trusted side checks the mapped
allocation's size (driver API) before reading from it."""

from __future__ import annotations

import ctypes
from typing import Any

from .native import loaded_library

HANDLE_BYTES = 64
IPC_LAZY_ENABLE_PEER_ACCESS = 1


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


_rt: Any = None
_drv: Any = None


class IpcError(RuntimeError):
    pass


def _libs() -> tuple[Any, Any]:
    global _rt, _drv
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
        drv.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        _rt, _drv = rt, drv
    return _rt, _drv


def _check(rc: int, what: str) -> None:
    if rc != 0:
        rt, _ = _libs()
        raise IpcError(f"{what}: {rt.cudaGetErrorString(rc).decode(errors='replace')} ({rc})")


def allocation_of(ptr: int) -> tuple[int, int]:
    """(base, size) of the device allocation that holds ``ptr``."""
    _, drv = _libs()
    base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    rc = drv.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    if rc != 0:
        raise IpcError(f"cuMemGetAddressRange: CUDA driver error {rc}")
    return int(base.value), int(size.value)


def export(ptr: int) -> tuple[bytes, int, int]:
    """(handle, offset of ``ptr`` in its allocation, allocation size)."""
    rt, _ = _libs()
    base, size = allocation_of(ptr)
    h = _Handle()
    _check(rt.cudaIpcGetMemHandle(ctypes.byref(h), ctypes.c_void_p(base)), "cudaIpcGetMemHandle")
    return handle_bytes(h), ptr - base, size


def open_handle(handle: bytes) -> tuple[int, int]:
    """Map another process's allocation: (base pointer here, its size)."""
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
    return base, size


def close_handle(base: int) -> None:
    rt, _ = _libs()
    rt.cudaIpcCloseMemHandle(ctypes.c_void_p(base))


class DeviceBytes:
    """``nbytes`` bytes at a device address, for ``torch.as_tensor`` (zero copy)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2}
