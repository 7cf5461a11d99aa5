"""How a candidate's outputs reach the trusted process: the ways the trusted side accepts,
host memory for CPU tensors, refusals of ways that cannot apply, the record of the way
outputs came, and the driver structures' layout (the GPU side of the transfer runs in
scripts/gpu/ipc_probe.py)."""

from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")

from cuda_agent.sandbox.judge import cuda_ipc, tensors  # noqa: E402
from cuda_agent.sandbox.judge.session import JudgeSession  # noqa: E402


def test_the_trusted_side_names_the_ways_it_accepts():
    assert tensors.Exporter(True).ways == ["cuda_ipc", "cuda_fd"]
    assert tensors.Exporter(["cuda_fd", "pickle"]).ways == ["cuda_fd"]  # unknown ways are never taken
    assert tensors.Exporter([]).ways == [] and tensors.Exporter(False).ways == []
    assert not tensors.Exporter([]).allow_ipc


@pytest.mark.parametrize("ways", [True, ["cuda_fd"], False])
def test_cpu_outputs_travel_in_sealed_host_memory_whatever_is_accepted(ways):
    out = [torch.arange(6.0).reshape(2, 3), (torch.ones(2, dtype=torch.int64),)]
    ex = tensors.Exporter(ways)
    spec = ex.describe(out)
    try:
        assert tensors.ways_used(spec) == {"memfd": 2}  # no reason to give: nothing was tried
        got = tensors.rebuild(spec, ex.fds, "cpu")
        assert torch.equal(got[0], out[0]) and torch.equal(got[1][0], out[1][0])
    finally:
        ex.release()


def test_device_memory_ways_are_refused_where_they_cannot_apply():
    t = {"t": "tensor", "dtype": "float32", "shape": [4], "device": "cuda", "nbytes": 16}
    for via in ("cuda_fd", "cuda_ipc"):
        with pytest.raises(tensors.WireError, match="not possible here"):
            tensors.rebuild({**t, "via": via, "fd": 0, "handle": "00" * 64, "offset": 0}, [], "cpu")
    with pytest.raises(tensors.WireError, match="size does not match"):  # sizes are the trusted side's own
        tensors.rebuild({**t, "via": "cuda_fd", "fd": 0, "nbytes": 1 << 40}, [], "cpu")


def test_the_way_outputs_came_is_counted_through_nested_outputs():
    spec = {"t": "tuple", "items": [
        {"t": "tensor", "via": "cuda_fd"},
        {"t": "dict", "items": [["a", {"t": "tensor", "via": "memfd", "ipc_error": "cuda_fd: no VMM"}],
                                ["b", {"t": "value", "v": 1}]]},
        {"t": "list", "items": [{"t": "tensor", "via": "cuda_fd"}]}]}
    assert tensors.ways_used(spec) == {"cuda_fd": 2, "memfd": 1, "why": "cuda_fd: no VMM"}
    assert tensors.ways_used({"t": "tensor", "via": "x" * 500}) == {"x" * 20: 1}  # bounded


def _recorder(device: str) -> JudgeSession:
    s = JudgeSession.__new__(JudgeSession)
    s.device, s.meta, s.ipc = device, {}, list(tensors.DEVICE_WAYS)
    return s


def test_the_result_names_the_way_and_why_host_memory_was_used():
    s = _recorder("cuda:0")
    s._transfer({"t": "tensor", "via": "cuda_fd"}, [])
    assert s.meta["output_transfer"] == "device memory (shared as a file descriptor) (cuda_fd)"
    s = _recorder("cuda:0")
    s.ipc = []
    s._transfer({"t": "tensor", "via": "memfd"}, ["cuda_ipc: cannot map", "cuda_fd: cannot map"])
    assert s.meta["output_transfer"] == "host memory (cuda_ipc: cannot map; cuda_fd: cannot map)"
    s = _recorder("cuda:0")
    s._transfer({"t": "tensor", "via": "cuda_fd"}, ["cuda_ipc: cannot map"])
    assert s.meta["output_transfer"] == ("device memory (shared as a file descriptor) (cuda_fd) "
                                         "(after cuda_ipc: cannot map)")
    s = _recorder("cuda:0")
    s._transfer({"t": "tensor", "via": "memfd", "ipc_error": "cuda_fd: no VMM; cuda_ipc: refused"}, [])
    assert s.meta["output_transfer"] == "host memory (the candidate process: cuda_fd: no VMM; cuda_ipc: refused)"
    s = _recorder("cuda:0")
    s._transfer({"t": "value", "v": 3}, [])  # nothing carried: nothing to say
    assert "output_transfer" not in s.meta


def test_driver_structures_have_the_layout_of_cuda_h():
    # CUmemAllocationProp, CUmemAccessDesc, cudaIpcMemHandle_t (x86-64 and aarch64 alike)
    assert ctypes.sizeof(cuda_ipc._AllocProp) == 32 and cuda_ipc._AllocProp.win32HandleMetaData.offset == 16
    assert cuda_ipc._AllocProp.allocFlags.offset == 24 and cuda_ipc._AllocProp.location.offset == 8
    assert ctypes.sizeof(cuda_ipc._AccessDesc) == 12
    assert ctypes.sizeof(cuda_ipc._Handle) == cuda_ipc.HANDLE_BYTES == 64
