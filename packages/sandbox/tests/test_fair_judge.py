"""A fair judge: honest kernels written the way other systems write them pass; degenerate
outputs and decoys fail, under every rule profile that applies (CPU backend, C++ kernels).

Single files build their own kernel as public KernelBench solutions do (``load_inline``, or
a compiler run in the file and a library loaded with ctypes), in the job's private folder."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cuda_agent.core.types import FailureCategory  # noqa: E402
from cuda_agent.sandbox.executors import CpuExecutor, Job  # noqa: E402
from cuda_agent.sandbox.executors.local import CpuExecutorOptions  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_verify_support import make_workspace  # noqa: E402

T = "cuda_agent.sandbox.judge.tasks:"

GEMM_TASK = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, in_features, out_features):
            super().__init__()
            self.gemm = nn.Linear(in_features, out_features)

        def forward(self, x):
            return torch.relu(self.gemm(x))

    def get_inputs():
        return [torch.randn(8, 16)]

    def get_init_inputs():
        return [16, 12]
''')

# a wide softmax: every output is far below atol = 1e-2
WIDE_SOFTMAX_TASK = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.softmax(x, dim=1)

    def get_inputs():
        return [torch.randn(4, 20000)]

    def get_init_inputs():
        return []
''')

# builds a C++ kernel with g++ inside the job and loads it with ctypes
BUILD_CTYPES = textwrap.dedent('''
    import ctypes, os, subprocess, tempfile
    _SRC = r"""
    #include <cstdint>
    #include <cmath>
    extern "C" void linear_relu(const float* x, const float* w, const float* b, float* y, int64_t m, int64_t k, int64_t n) {
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                float acc = b[j];
                for (int64_t t = 0; t < k; ++t) acc += x[i * k + t] * w[j * k + t];
                y[i * n + j] = acc > 0.f ? acc : 0.f;
            }
    }
    extern "C" void softmax_rows(const float* x, float* y, int64_t m, int64_t n) {
        for (int64_t i = 0; i < m; ++i) {
            float mx = x[i * n];
            for (int64_t j = 1; j < n; ++j) mx = fmaxf(mx, x[i * n + j]);
            double s = 0.0;
            for (int64_t j = 0; j < n; ++j) s += std::exp(x[i * n + j] - mx);
            for (int64_t j = 0; j < n; ++j) y[i * n + j] = (float)(std::exp(x[i * n + j] - mx) / s);
        }
    }
    """
    _dir = tempfile.mkdtemp()
    with open(os.path.join(_dir, "k.cpp"), "w") as _f:
        _f.write(_SRC)
    try:
        subprocess.run(["g++", "-O2", "-shared", "-fPIC", os.path.join(_dir, "k.cpp"), "-o", os.path.join(_dir, "k.so")],
                       check=True, capture_output=True)
    except subprocess.CalledProcessError as e:  # say why, and fail
        raise RuntimeError("building the kernel failed: " + e.stderr.decode()[-400:]) from e
    custom_op = ctypes.CDLL(os.path.join(_dir, "k.so"))
    custom_op.linear_relu.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
    custom_op.softmax_rows.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2
''')

OTHER_NAMES = BUILD_CTYPES + textwrap.dedent('''
    import torch
    import torch.nn as nn

    class _Kernel(nn.Module):  # an nn.Module wrapper around the kernel
        def forward(self, x, w, b):
            y = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
            custom_op.linear_relu(x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], w.shape[0])
            return y

    class ModelNew(nn.Module):
        def __init__(self, in_features, out_features):
            super().__init__()
            lin = nn.Linear(in_features, out_features)  # built like Model's, under other names
            self.weight = nn.Parameter(lin.weight.detach().clone())
            self.bias = nn.Parameter(lin.bias.detach().clone())
            self.kernel = _Kernel()

        def forward(self, x):
            return self.kernel(x.contiguous(), self.weight, self.bias)
''')

TORCH_LIBRARY = BUILD_CTYPES + textwrap.dedent('''
    import torch
    import torch.nn as nn

    @torch.library.custom_op("faircheck::linear_relu", mutates_args=())
    def linear_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
        custom_op.linear_relu(x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], w.shape[0])
        return y

    class ModelNew(nn.Module):
        def __init__(self, in_features, out_features):
            super().__init__()
            self.gemm = nn.Linear(in_features, out_features)

        def forward(self, x):
            return torch.ops.faircheck.linear_relu(x, self.gemm.weight, self.gemm.bias)
''')

# a plain load_inline solution: the module held in a variable called custom_op, a try/except
# that only says what failed, and a binding that converts its input with .to() / .contiguous()
LOAD_INLINE = textwrap.dedent('''
    import torch
    import torch.nn as nn
    from torch.utils.cpp_extension import load_inline

    cpp_source = r"""
    #include <torch/extension.h>
    torch::Tensor linear_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
        x = x.to(torch::kFloat32).contiguous();
        auto y = torch::empty({x.size(0), w.size(0)}, x.options());
        const float* xp = x.data_ptr<float>();
        const float* wp = w.data_ptr<float>();
        const float* bp = b.data_ptr<float>();
        float* yp = y.data_ptr<float>();
        int64_t m = x.size(0), k = x.size(1), n = w.size(0);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                float acc = bp[j];
                for (int64_t t = 0; t < k; ++t) acc += xp[i * k + t] * wp[j * k + t];
                yp[i * n + j] = acc > 0.f ? acc : 0.f;
            }
        return y;
    }
    """
    try:
        custom_op = load_inline(name="fair_linear_relu", cpp_sources=cpp_source, functions=["linear_relu"], verbose=False)
    except Exception as e:
        print("building the extension failed:", e)
        raise

    class ModelNew(nn.Module):
        def __init__(self, in_features, out_features):
            super().__init__()
            self.linear = nn.Linear(in_features, out_features)

        def forward(self, x):
            return custom_op.linear_relu(x, self.linear.weight, self.linear.bias)
''')

SOFTMAX_NEW = BUILD_CTYPES + textwrap.dedent('''
    import torch
    import torch.nn as nn

    class ModelNew(nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            {body}
            return {ret}
''')


def softmax_new(body: str = "custom_op.softmax_rows(x.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1])",
                ret: str = "y") -> str:
    return SOFTMAX_NEW.replace("{body}", body).replace("{ret}", ret)


DECOY = OTHER_NAMES.replace("return self.kernel(x.contiguous(), self.weight, self.bias)",
                            "self.kernel(x.contiguous(), self.weight, self.bias)  # a decoy: its result is unused\n"
                            "        return torch.relu(torch.nn.functional.linear(x, self.weight, self.bias))")

SEED_FIVE = OTHER_NAMES.replace("lin = nn.Linear(in_features, out_features)  # built like Model's, under other names",
                                "torch.manual_seed(5)  # the values of one seed's construction, whatever the seed\n"
                                "        lin = nn.Linear(in_features, out_features)")


@pytest.fixture(scope="module")
def executor():
    ex = CpuExecutor(CpuExecutorOptions(timeout=240.0, spares=1))
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def gemm_ws(tmp_path_factory):
    return Path(make_workspace(tmp_path_factory.mktemp("fair-gemm"), task_code=GEMM_TASK, build=False).root)


@pytest.fixture(scope="module")
def softmax_ws(tmp_path_factory):
    return Path(make_workspace(tmp_path_factory.mktemp("fair-softmax"), task_code=WIDE_SOFTMAX_TASK, build=False).root)


def verify(executor, ws: Path, code: str, **options):
    (ws / "model_new.py").write_text(code)
    return executor.run(Job(T + "verify", {"workspace": str(ws), "options": {"seed": 5, **options}}, kind="verify"))


@pytest.mark.parametrize("rules", ["cuda-agent", "kernelbench"])
def test_parameters_under_other_names_pass_by_kernelbenchs_protocol(executor, gemm_ws, rules):
    v = verify(executor, gemm_ws, OTHER_NAMES, rules=rules, weights="auto")
    assert v.ok, v.message
    assert v.metadata["weights"] == "seeded" and v.metadata["rule_profile"] == rules
    assert v.metadata["second_seed"]  # checked once more after another seed


def test_the_workspace_form_asks_for_models_names_and_says_what_to_rename(executor, gemm_ws):
    v = verify(executor, gemm_ws, OTHER_NAMES)  # weights: state_dict, as SKILL.md asks of the agent
    assert not v.ok and v.failure is FailureCategory.WRONG_RESULT
    assert "rule state-dict" in v.message and "rename 'weight' to 'gemm.weight'" in v.message, v.message
    assert v.metadata["rule"] == "state-dict"


def test_one_seeds_values_fail_the_second_seed(executor, gemm_ws):
    v = verify(executor, gemm_ws, SEED_FIVE, weights="auto")
    assert not v.ok and v.failure is FailureCategory.WRONG_RESULT and "rule weights.seeded" in v.message, v.message


@pytest.mark.parametrize("rules", ["cuda-agent", "kernelbench"])
def test_kernels_registered_through_torch_library_pass(executor, gemm_ws, rules):
    v = verify(executor, gemm_ws, TORCH_LIBRARY, rules=rules)
    assert v.ok, v.message
    assert any("faircheck" in k for k in v.metadata.get("custom_op_calls", {})) or rules == "kernelbench"


@pytest.mark.parametrize("rules", ["cuda-agent", "kernelbench"])
def test_a_plain_load_inline_solution_passes(executor, gemm_ws, rules):
    v = verify(executor, gemm_ws, LOAD_INLINE, rules=rules, weights="auto")
    assert v.ok, v.message
    assert v.metadata["weights"] == "seeded"


def test_a_decoy_kernel_fails_under_kernelbench_and_torch_fails_under_cuda_agent(executor, gemm_ws):
    v = verify(executor, gemm_ws, DECOY, rules="kernelbench", weights="auto")
    assert not v.ok and "rule kernelbench.decoy" in v.message, v.message
    v = verify(executor, gemm_ws, DECOY, weights="auto")
    assert not v.ok and v.failure is FailureCategory.FORBIDDEN_OP and "runtime." in v.message, v.message


def test_an_honest_kernel_on_tiny_outputs_passes(executor, softmax_ws):
    v = verify(executor, softmax_ws, softmax_new())
    assert v.ok, v.message
    assert "own scale" in v.metadata.get("tolerance_scale", "")


HALF_ROWS = "custom_op.softmax_rows(x.data_ptr(), y.data_ptr(), 2 * x.shape[0], x.shape[1] // 2)"


@pytest.mark.parametrize("rules", ["cuda-agent", "kernelbench", "none"])
@pytest.mark.parametrize("body,ret,what", [
    ("pass", "torch.zeros_like(x)", "zeros"),
    ("pass", "torch.full_like(x, 5e-5)", "constant"),
    (HALF_ROWS, "y", "softmax over half rows: every value about twice the reference's, all within atol"),
])
def test_degenerate_outputs_fail_under_every_profile(executor, softmax_ws, rules, body, ret, what):
    v = verify(executor, softmax_ws, softmax_new(body=body, ret=ret), rules=rules)
    assert not v.ok and v.failure is FailureCategory.WRONG_RESULT, (what, v.message)
    assert "rule tolerance.vacuous" in v.message, v.message
