"""Timed calls of honest solutions whose outputs the checksums and the spot check once
misread: random ops (dropout in training mode), elements whose float32 squares overflow, and
outputs that are not float32 (indices widened to float64)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cuda_agent.sandbox.executors import CpuExecutor, Job  # noqa: E402
from cuda_agent.sandbox.executors.local import CpuExecutorOptions  # noqa: E402
from cuda_agent.sandbox.judge import rotation  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_verify_support import make_workspace, relu_new  # noqa: E402

T = "cuda_agent.sandbox.judge.tasks:"
TIMING = {"target_ms": 60, "warmup_ms": 10, "min_iters": 20, "max_iters": 400}


def _task(expr: str) -> str:
    return textwrap.dedent(f'''
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self):
                super().__init__()

            def forward(self, x):
                return {expr}

        def get_inputs():
            return [torch.randn(256, 256)]

        def get_init_inputs():
            return []
    ''')


@pytest.fixture(scope="module")
def executor():
    ex = CpuExecutor(CpuExecutorOptions(timeout=180.0, spares=1))
    yield ex
    ex.close()


def _profile(executor, tmp: Path, task_expr: str, ret: str, **timing):
    ws = Path(make_workspace(tmp, task_code=_task(task_expr), model_new=relu_new(ret=ret)).root)
    options = {"seed": 5, "profiler_options": {**TIMING, **timing}, "compile_baseline": False, "attempts": 1,
               "hopeless_factor": 0, "baseline_cache_dir": str(tmp / "cache")}
    return executor.run(Job(T + "profile", {"workspace": str(ws), "options": options}, kind="profile"))


def test_a_model_with_dropout_is_timed_and_its_timed_outputs_pass(executor, tmp_path):
    # dropout in training mode (KernelBench's L2/66): each timed call draws its own mask; the
    # trusted side draws the same one for the calls it checks
    p = _profile(executor, tmp_path, "torch.nn.functional.dropout(torch.relu(x), p=0.5, training=self.training)",
                 "torch.nn.functional.dropout(y, p=0.5, training=self.training)")
    assert p.ok, p.message
    assert p.metadata.get("spot_check") == "passed" and p.metadata.get("checksums_checked"), p.metadata
    # and the result says how each timing's loop ran (the CPU backend: wall-clock calls)
    assert p.metadata["timing_methods"] == {"candidate": "wallclock", "eager": "wallclock"}, p.metadata


def test_outputs_past_float32_squares_are_summed_wide(executor, tmp_path):
    # elements of about 1e20 (KernelBench's L3/49 Mamba2 state reaches 1e22): their float32
    # squares overflow, so the judge sums them in float64 and the honest output passes
    p = _profile(executor, tmp_path, "torch.relu(x) * 1e20", "y * 1e20")
    assert p.ok, p.message
    assert p.metadata["checksum_statistics"][0] == "sum of squares (float64)", p.metadata


def test_the_same_mask_on_both_sides_of_a_timed_call():
    sets = [[torch.randn(32, 32)] for _ in range(2)]
    rot = rotation.Rotation(11, sets)
    work = [[t.clone() for t in s] for s in sets]
    for j in range(4):
        rot.fill(j, work[j % 2])
        candidate = torch.nn.functional.dropout(work[j % 2][0], 0.5, training=True)
        x = rot.inputs(j)
        rot.seed_call(j)
        reference = torch.nn.functional.dropout(x[0], 0.5, training=True)
        assert torch.equal(candidate, reference)
    rot.seed_call(0)
    first = torch.rand(8)
    rot.seed_call(1)
    assert not torch.equal(first, torch.rand(8))  # every call its own draw


def test_wide_sums_of_squares_match_the_reference():
    ref = torch.randn(300, 200).double() * 1e20
    out = ref.float()
    narrow, wide = rotation.Checksums(3), rotation.Checksums(3, wide=True)
    want = wide.expected(ref, 1e-2, 1e-2)
    assert want["largest"] > rotation.WIDE_ABOVE and rotation.largest_finite(out) > rotation.WIDE_ABOVE
    assert rotation.largest_finite(torch.tensor([1.0, float("nan"), -2.0, float("inf")])) == 2.0  # finite ones
    assert rotation.largest_finite([torch.tensor([3, -9]), torch.zeros(0)]) == 9.0

    def stats(c):
        row = c.slots(1)[0]
        c.into(out, row)
        return row.tolist()

    assert "is inf" in narrow.mismatch(stats(narrow), want)  # float32 squares overflow
    assert wide.mismatch(stats(wide), want) == ""
    assert "sum of squares" in wide.mismatch([x * 1.1 for x in stats(wide)], want)  # still a check


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.bool])
def test_checksums_of_outputs_that_are_not_float32(dtype):
    # argmax/argmin return int64, widened to float64: the GPU path's per-chunk norms follow it
    src = torch.randint(0, 1000, (64, 50))
    out = (src > 500) if dtype == torch.bool else src.to(dtype)
    checks = rotation.Checksums(5)
    want = checks.expected(out, 0.0, 0.0)
    flat = rotation._flat(out)
    row = checks.slots(1)[0]
    checks._into_cuda(flat, checks._weights_as(flat.numel(), flat.dtype), row)  # the GPU path's arithmetic, here
    assert checks.mismatch(row.tolist(), want) == ""
    row = checks.slots(1)[0]
    checks.into(out, row)
    assert checks.mismatch(row.tolist(), want) == ""


def test_input_sets_count_the_output_each_set_keeps(executor, tmp_path):
    # a 256 KB input whose output is 44x larger (176 MB of float32, as a convolution's output
    # outgrows its input): the CPU's 512 MB budget holds 2 such sets, not the 4 the inputs
    # alone would allow
    p = _profile(executor, tmp_path, "torch.relu(x).repeat(44, 16)", "y.repeat(44, 16)",
                 target_ms=10, min_iters=4, max_iters=8)
    assert p.ok, p.message
    assert p.metadata["input_sets"] == 2, p.metadata.get("input_sets")
