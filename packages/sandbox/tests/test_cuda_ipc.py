"""The CUDA IPC handle's bytes survive the trip between the two processes whole."""

import ctypes

import pytest

from cuda_agent.sandbox.judge import cuda_ipc


def test_a_handle_with_zero_bytes_is_kept_whole():
    # a real cudaIpcMemHandle_t holds zero bytes; the c_char field reads only up to the first
    raw = bytes([7, 1, 2, 3, 0, 0, 9]) + bytes(range(1, 58))
    h = cuda_ipc._Handle()
    ctypes.memmove(ctypes.addressof(h), raw, cuda_ipc.HANDLE_BYTES)
    assert len(h.reserved) == 4  # the trap itself
    got = cuda_ipc.handle_bytes(h)
    assert got == raw and len(got) == cuda_ipc.HANDLE_BYTES
    back = cuda_ipc.handle_from_bytes(got)
    assert bytes(back) == raw


def test_a_short_handle_is_refused_by_size():
    with pytest.raises(cuda_ipc.IpcError, match="4 bytes"):
        cuda_ipc.handle_from_bytes(b"\x01\x02\x03\x04")
