"""Verification and profiling on a CUDA GPU with a load_inline single-file solution."""

from __future__ import annotations

import textwrap

import pytest

torch = pytest.importorskip("torch")

from cuda_agent.core.types import FailureCategory  # noqa: E402
from cuda_agent.sandbox.judge.jobs import ProfileOptions, VerifyOptions, profile_file, verify_file  # noqa: E402

REF = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, x):
            return torch.relu(x)

    def get_inputs():
        return [torch.randn(1024, 4096)]

    def get_init_inputs():
        return []
''')

SOLUTION = textwrap.dedent(r'''
    import torch
    import torch.nn as nn
    from torch.utils.cpp_extension import load_inline

    cuda_src = """
    #include <torch/extension.h>
    #include <ATen/cuda/CUDAContext.h>
    __global__ void relu_k(const float* x, float* y, long n) {
        long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
        if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
    }
    __global__ void half_k(const float* x, float* y, long n) {
        long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
        if (i < n / 2) y[i] = x[i] > 0.f ? x[i] : 0.f;
    }
    torch::Tensor relu(torch::Tensor x) {
        auto y = torch::empty_like(x);
        long n = x.numel();
        relu_k<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
        return y;
    }
    torch::Tensor relu_half(torch::Tensor x) {
        auto y = torch::empty_like(x);
        long n = x.numel();
        half_k<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
        return y;
    }
    EXTRA_CUDA
    """
    cpp_src = "torch::Tensor relu(torch::Tensor x); torch::Tensor relu_half(torch::Tensor x); EXTRA_DECL"
    ext = load_inline("b2_relu_extNAME", cpp_sources=cpp_src, cuda_sources=cuda_src,
                      functions=["relu", "relu_half"EXTRA_FN], verbose=False)

    class ModelNew(nn.Module):
        def forward(self, x):
            return ext.FN(x)
''')


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("kb")
    (d / "ref.py").write_text(REF)
    return d


def solution(d, fn: str):
    p = d / f"sol_{fn}.py"
    text = SOLUTION
    if fn == "relu_aten":  # a binding that computes with ATen: refused statically and at run time
        text = text.replace("EXTRA_CUDA", "torch::Tensor relu_aten(torch::Tensor x) { return at::relu(x); }")
        text = text.replace("EXTRA_DECL", "torch::Tensor relu_aten(torch::Tensor x);").replace("EXTRA_FN", ', "relu_aten"')
        text = text.replace("NAME", "_aten")
    text = text.replace("EXTRA_CUDA", "").replace("EXTRA_DECL", "").replace("EXTRA_FN", "").replace("NAME", "")
    p.write_text(text.replace("FN", fn))
    return str(p)


@pytest.mark.gpu
def test_cuda_single_file_verify_and_profile(files, tmp_path):
    ref = str(files / "ref.py")
    ok = verify_file(solution(files, "relu"), ref, "cuda", VerifyOptions(seed=1))
    assert ok.ok, ok.message
    half = verify_file(solution(files, "relu_half"), ref, "cuda", VerifyOptions(seed=1))
    assert not half.ok and half.failure is FailureCategory.WRONG_RESULT and "nan" in half.message
    # static check first; with it off the run-time guard sees the ATen call from compiled code
    aten = verify_file(solution(files, "relu_aten"), ref, "cuda", VerifyOptions(seed=1))
    assert aten.failure is FailureCategory.FORBIDDEN_OP and "static.kernel-torch-op" in aten.message
    aten_rt = verify_file(solution(files, "relu_aten"), ref, "cuda", VerifyOptions(seed=1, static_checks=[]))
    assert aten_rt.failure is FailureCategory.FORBIDDEN_OP and "runtime.compiled-code-op" in aten_rt.message

    opts = ProfileOptions(baseline_cache_dir=str(tmp_path / "cache"), report_tf32_baselines=True,
                          profiler_options={"target_ms": 50})
    r1 = profile_file(solution(files, "relu"), ref, "cuda", opts)
    assert r1.ok, r1.message
    assert r1.eager and r1.compile and r1.candidate and r1.metadata["baseline_cache"] == "miss"
    assert r1.metadata["precision_flags"]["matmul_allow_tf32"] is False
    assert "tf32_baselines" in r1.metadata
    r2 = profile_file(solution(files, "relu"), ref, "cuda", opts)
    assert r2.metadata["baseline_cache"] == "hit" and r2.eager.median_ms == r1.eager.median_ms
    tp = profile_file(solution(files, "relu"), ref, "cuda", ProfileOptions(baseline_cache_dir=str(tmp_path / "cache"),
                                                                         profiler="torch_profiler"))
    assert tp.ok and tp.candidate.method == "torch_profiler"


CAPTURE_CHEAT = SOLUTION.replace(
    "        return ext.FN(x)",
    "        if torch.cuda.is_current_stream_capturing():  # no work while a graph is captured\n"
    "            return torch.empty_like(x)\n"
    "        return ext.relu(x)",
)
assert CAPTURE_CHEAT != SOLUTION
# a graph that does run something, but not the kernel: zeros where the ReLU was
CAPTURE_STUB = CAPTURE_CHEAT.replace("return torch.empty_like(x)", "return torch.zeros_like(x)")
assert CAPTURE_STUB != CAPTURE_CHEAT


def cheat_file(d, text: str, name: str) -> str:
    p = d / f"sol_{name}.py"
    p.write_text(text.replace("EXTRA_CUDA", "").replace("EXTRA_DECL", "").replace("EXTRA_FN", "")
                 .replace("NAME", f"_{name}").replace("FN", "relu"))
    return str(p)


@pytest.mark.gpu
def test_graph_mode_checks_what_the_graph_replays(files, tmp_path):
    """A task switched to CUDA-graph timing (its eager reference stayed unsteady: here forced
    by a zero spread limit) times baselines and candidate alike by graph replay, and the
    spot check runs the replayed graph. A candidate whose captured graph runs something else
    than its eager call fails; one whose graph is empty (nothing launched while captured) cannot
    be timed by replay and is timed in the configured mode, by its eager calls: at their cost."""
    ref = str(files / "ref.py")
    opts = ProfileOptions(baseline_cache_dir=str(tmp_path / "cache"), profiler_options={"target_ms": 50},
                          max_spread=1e-12, attempts=1)
    honest = profile_file(solution(files, "relu"), ref, "cuda", opts)
    assert honest.ok, honest.message
    assert honest.eager.method.startswith("cuda_events+graph") and honest.compile.method.startswith("cuda_events+graph")
    assert honest.candidate.method.startswith("cuda_events+graph") and honest.metadata["timing_mode"] == "cuda_events+graph"
    meta = honest.metadata or {}
    # a task timed by graph replay has its baselines timed as candidates, each in a candidate's process
    assert meta["baseline_timed_in"] == "a candidate's process", meta.get("baseline_as_candidate_error")
    assert "baseline_compile_as_candidate_error" not in meta, meta["baseline_compile_as_candidate_error"]
    assert 0.5 < honest.speedup_vs_eager() < 2.0, (
        honest.candidate.method, honest.eager.method, honest.candidate.median_ms, honest.eager.median_ms,
        {k: meta.get(k) for k in ("timing_loops", "loop_overhead_ms", "timing_charged", "timing_stopped")})
    stub = cheat_file(files, CAPTURE_STUB, "cs")
    assert verify_file(stub, ref, "cuda", VerifyOptions(seed=1)).ok  # eagerly it is correct
    cheat = profile_file(stub, ref, "cuda", opts)
    assert not cheat.ok and cheat.failure is FailureCategory.WRONG_RESULT, cheat.message
    empty = cheat_file(files, CAPTURE_CHEAT, "cc")
    assert verify_file(empty, ref, "cuda", VerifyOptions(seed=1)).ok
    plain = profile_file(empty, ref, "cuda", opts)
    mode = (plain.metadata or {}).get("timing_mode", "")
    if plain.ok:  # timed by its eager calls, unlike its baselines, and the result says so
        assert "+graph" not in plain.candidate.method and "baselines: cuda_events+graph" in mode, (plain.candidate.method, mode)
        assert plain.speedup_vs_eager() < 1.25, plain.message
    else:
        assert plain.failure is FailureCategory.WRONG_RESULT, plain.message


BIG_REF = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, x):
            return torch.nn.functional.avg_pool2d(x, 11)

    def get_inputs():
        return [torch.rand(ROWS, 2048, 2048)]

    def get_init_inputs():
        return []
''')


@pytest.mark.gpu
def test_a_candidate_process_gives_its_cache_back_after_each_run(tmp_path):
    """An input of a fifth of the GPU's memory (KernelBench L1/45's 16 GiB on an 80 GB card):
    the candidate's process poisons up to half the free memory before each run, and if it kept
    those blocks cached the trusted side could not draw the next input set (L1/45 ran out of
    memory so on an H100). Verification passes and says what the candidate's process released."""
    total = torch.cuda.get_device_properties(0).total_memory
    rows = max(1, total // 5 // (2048 * 2048 * 4))
    ref = tmp_path / "ref.py"
    ref.write_text(BIG_REF.replace("ROWS", str(rows)))
    sol = tmp_path / "sol.py"
    sol.write_text(BIG_REF.replace("ROWS", str(rows)) + "\n\nclass ModelNew(Model):\n    pass\n")
    r = verify_file(str(sol), str(ref), "cuda", VerifyOptions(seed=1, rules="none"))
    held = {k: r.metadata.get(k) for k in ("poisoned_bytes", "candidate_cache_released_bytes", "inputs")}
    assert r.ok, (r.message, held)
    # the poison is handed back but for the block the small output was carved out of
    assert r.metadata["candidate_cache_released_bytes"] >= rows * 2048 * 2048 * 4, held
    assert r.metadata["candidate_cache_released_bytes"] >= r.metadata["poisoned_bytes"] - (2 << 30), held
