"""Static checks on kernel sources and the candidate module (CorrectnessCheck plugins)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from cuda_agent.core.plugins import get_plugin_manager
from cuda_agent.sandbox.judge.checks import (
    FallbackCheck,
    GuardTamperingCheck,
    KernelTorchOpsCheck,
    ReferenceModelCheck,
    run_static_checks,
    strip_cxx,
)

CLEAN_CU = textwrap.dedent(r'''
    #include <torch/extension.h>
    #include <ATen/cuda/CUDAContext.h>
    // at::matmul would be wrong here, but this is a comment
    /* torch::relu(x) in a block comment */
    __global__ void k(const float* __restrict__ x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = fmaxf(x[i], 0.f);
    }
    torch::Tensor run(torch::Tensor x) {
        TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "x must be a contiguous CUDA tensor");
        auto y = torch::empty_like(x);
        auto z = torch::zeros({x.size(0)}, x.options().dtype(torch::kFloat32));
        const at::cuda::OptionalCUDAGuard guard(x.device());
        auto stream = at::cuda::getCurrentCUDAStream();
        k<<<(x.numel() + 255) / 256, 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
        const char* msg = "at::matmul in a string";
        return y;
    }
''')

DIRTY_CU = textwrap.dedent(r'''
    #include <torch/extension.h>
    torch::Tensor run(torch::Tensor x, torch::Tensor w) {
        auto y = at::matmul(x, w);
        auto s = x.sum();
        y = torch::nn::functional::relu(y);
        return at::native::add(y, s);
    }
''')


def ws_with(tmp: Path, kernels: dict[str, str] | None = None, model_new: str = "") -> Path:
    (tmp / "kernels").mkdir(parents=True, exist_ok=True)
    for name, text in (kernels or {}).items():
        (tmp / "kernels" / name).write_text(text)
    (tmp / "model_new.py").write_text(model_new or "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
    return tmp


def test_clean_kernel_passes(tmp_path):
    ws = ws_with(tmp_path, {"relu.cu": CLEAN_CU, "relu_binding.cpp": "#include <torch/extension.h>\n"})
    assert KernelTorchOpsCheck().check(ws) == []


def test_torch_ops_in_kernel_sources_are_refused(tmp_path):
    ws = ws_with(tmp_path, {"bad.cu": DIRTY_CU})
    found = KernelTorchOpsCheck().check(ws)
    text = "\n".join(found)
    for what in ("at::matmul", ".sum()", "torch::nn::functional::relu", "at::native::add"):
        assert what in text, what
    assert all("rule static.kernel-torch-op" in v and v.startswith("kernels/bad.cu:") for v in found)
    assert any(v.startswith("kernels/bad.cu:4:") for v in found)  # line numbers


def test_allowlist_option(tmp_path):
    ws = ws_with(tmp_path, {"bad.cu": "auto s = x.sum();\n"})
    assert KernelTorchOpsCheck().check(ws)
    assert KernelTorchOpsCheck(KernelTorchOpsCheck.Options(allow=["sum"])).check(ws) == []


def test_cxx_strings_in_a_single_file_solution(tmp_path):
    sol = 'from torch.utils.cpp_extension import load_inline\nsrc = """\n#include <torch/extension.h>\n' \
          'torch::Tensor f(torch::Tensor x) { return at::relu(x); }\n"""\n'
    (tmp_path / "sol.py").write_text(sol)
    found = KernelTorchOpsCheck().check(tmp_path, "sol.py")
    assert found and "at::relu" in found[0] and "sol.py (C++ string):4" in found[0]


def test_reference_model_rules(tmp_path):
    for src in ("from model import Model\n", "import model\n", "x = Model\n", "import importlib\n",
                "exec('print(1)')\n", "from model import get_inputs\n"):
        ws = ws_with(tmp_path, model_new=src)
        found = ReferenceModelCheck().check(ws)
        assert found and "rule static.reference-model" in found[0], src
    ok = ws_with(tmp_path, model_new="import torch\nfrom cuda_agent_runtime import load_kernels\nclass ModelNew(torch.nn.Module):\n    pass\n")
    assert ReferenceModelCheck().check(ok) == []


def test_fallback_rules(tmp_path):
    """A try/except is a fallback when its handler produces the result another way."""
    src = "def forward(x):\n    try:\n        return k(x)\n    except Exception:\n        return x\n"
    found = FallbackCheck().check(ws_with(tmp_path, model_new=src))
    assert found == [f"model_new.py:4: the except branch returns a value (a second way to produce the result) "
                     f"(rule static.fallback: {FallbackCheck.why})"]
    for bad in ("import torch\ndef f(x):\n    try:\n        y = k(x)\n    except Exception:\n        y = torch.relu(x)\n    return y\n",
                "def f(x):\n    try:\n        y = k(x)\n    except Exception:\n        y = x * 0\n    return y\n"):
        assert FallbackCheck().check(ws_with(tmp_path, model_new=bad)), bad
    for fine in ("def f(x):\n    try:\n        return k(x)\n    except Exception as e:\n        raise RuntimeError('k') from e\n",
                 "from torch.utils.cpp_extension import load_inline\ntry:\n    mod = load_inline(name='a', cpp_sources='')\n"
                 "except Exception as e:\n    print('build failed', e)\n    raise\n",
                 "try:\n    import prebuilt as mod\nexcept ImportError:\n    from torch.utils.cpp_extension import load_inline\n"
                 "    mod = load_inline(name='a', cpp_sources='')\n"):
        assert FallbackCheck().check(ws_with(tmp_path, model_new=fine)) == [], fine
    found = FallbackCheck().check(ws_with(tmp_path, model_new="import contextlib\nwith contextlib.suppress(Exception):\n    pass\n"))
    assert found and "suppress" in found[0]


def test_guard_tampering_rules(tmp_path):
    for src in ("import torch\ntorch._C._disable_torch_function_subclass()\n", "import inspect\n", "import gc\n",
                "from torch.overrides import TorchFunctionMode\n", "import sys\nsys._getframe(1)\n",
                "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n",
                "import torch\ntorch.library.Library('aten', 'IMPL')\n", "import torch as t\ngetattr(t, 'o' + 'ps')\n"):
        found = GuardTamperingCheck().check(ws_with(tmp_path, model_new=src))
        assert found and "rule static.guard-tampering" in found[0], src
    for fine in ("import torch\nimport torch.nn as nn\nimport ctypes\n",
                 "import torch\n@torch.library.custom_op('mylib::relu', mutates_args=())\ndef relu(x: torch.Tensor) -> torch.Tensor:\n"
                 "    return x\n",
                 "custom_op = object()\nclass ModelNew:\n    def forward(self, x):\n        return custom_op\n"):
        assert GuardTamperingCheck().check(ws_with(tmp_path, model_new=fine)) == [], fine


def test_checks_are_plugins_and_run_together(tmp_path):
    comps = get_plugin_manager().components("correctness_check")
    assert {"kernel_torch_ops", "no_reference_model", "no_fallback", "no_guard_tampering"} <= set(comps)
    ws = ws_with(tmp_path, {"bad.cu": DIRTY_CU}, model_new="from model import Model\n")
    results = {r.name: r for r in run_static_checks(ws)}
    assert not results["static:kernel_torch_ops"].passed
    assert not results["static:no_reference_model"].passed
    assert results["static:no_fallback"].passed
    only = run_static_checks(ws, names=["no_fallback"])
    assert [r.name for r in only] == ["static:no_fallback"]


def test_strip_cxx_keeps_lines():
    src = 'a // c1\n/* c2\n c3 */ b "s//x" \'c\'\n'
    out = strip_cxx(src)
    assert out.count("\n") == src.count("\n") and "c1" not in out and "s//x" not in out and "b" in out
