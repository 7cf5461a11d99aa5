"""Shared helpers for the verification/profiling tests: real CPU workspaces with g++ kernels."""

from __future__ import annotations

import textwrap
from pathlib import Path

from cuda_agent.core.types import Task

RELU_TASK = textwrap.dedent(
    '''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.relu(x)

    def get_inputs():
        return [torch.randn(64, 33)]

    def get_init_inputs():
        return []
    '''
)

LINEAR_TASK = textwrap.dedent(
    '''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, in_features, out_features):
            super().__init__()
            self.fc = nn.Linear(in_features, out_features)

        def forward(self, x):
            return self.fc(x)

    def get_inputs():
        return [torch.randn(16, 24)]

    def get_init_inputs():
        return [24, 8]
    '''
)

# kernels for both tasks; several deliberately broken variants
KERNELS_CPP = textwrap.dedent(
    r'''
    #include <cstdint>
    #include <cmath>
    extern "C" void relu(const float* x, float* y, int64_t n) {
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
    }
    extern "C" void relu_off(const float* x, float* y, int64_t n) {
        for (int64_t i = 0; i < n; ++i) y[i] = (x[i] > 0.f ? x[i] : 0.f) + (i == n / 2 ? 0.5f : 0.f);
    }
    extern "C" void relu_nan(const float* x, float* y, int64_t n) {
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
        y[n - 1] = NAN;
    }
    extern "C" void relu_half(const float* x, float* y, int64_t n) {  // forgets the second half
        for (int64_t i = 0; i < n / 2; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
    }
    extern "C" void linear(const float* x, const float* w, const float* b, float* y,
                           int64_t m, int64_t k, int64_t n) {
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                float acc = b[j];
                for (int64_t t = 0; t < k; ++t) acc += x[i * k + t] * w[j * k + t];
                y[i * n + j] = acc;
            }
    }
    '''
)

RELU_NEW = textwrap.dedent(
    '''
    import torch
    import torch.nn as nn
    from cuda_agent_runtime import load_kernels

    kernels = load_kernels()

    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            y = torch.empty_like(x)
            kernels.{fn}(x, y, x.numel())
            return {ret}
    '''
)

LINEAR_NEW = textwrap.dedent(
    '''
    import torch
    import torch.nn as nn
    from cuda_agent_runtime import load_kernels

    kernels = load_kernels()

    class ModelNew(nn.Module):
        def __init__(self, in_features, out_features):
            super().__init__()
            self.{name} = nn.Linear(in_features, out_features)

        def forward(self, x):
            m, k = x.shape
            w = self.{name}.weight
            y = torch.empty(m, w.shape[0], dtype=x.dtype, device=x.device)
            kernels.linear(x, w, self.{name}.bias, y, m, k, w.shape[0])
            return y
    '''
)


HOOKED_RELU_NEW = '''
import time
import torch
import torch.nn as nn
from cuda_agent_runtime import load_kernels

kernels = load_kernels()
{at_import}

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        {in_forward}
        y = torch.empty_like(x)
        kernels.relu(x, y, x.numel())
        return {ret}
'''


def hooked_relu_new(at_import: str = "", in_forward: str = "pass", ret: str = "y") -> str:
    """The g++ ReLU candidate with extra code at import and in ``forward`` (one line), for
    candidates that try something besides computing the result."""
    return HOOKED_RELU_NEW.format(at_import=at_import, in_forward=in_forward, ret=ret)


def relu_new(fn: str = "relu", ret: str = "y") -> str:
    return RELU_NEW.replace("{fn}", fn).replace("{ret}", ret)


def make_workspace(tmp: Path, task_code: str = RELU_TASK, model_new: str | None = None, kernels: str = KERNELS_CPP, build: bool = True):
    """A real CPU workspace (template, runtime loader) with g++-built kernels."""
    from cuda_agent.sandbox.compilers.gxx import GxxCompiler
    from cuda_agent.sandbox.workspace.workspace import create_workspace

    ws = create_workspace(Task(id="t", source="test", code=task_code), tmp / "ws", backend="cpu", compiler="gxx")
    (ws.root / "kernels" / "k.cpp").write_text(kernels)
    (ws.root / "model_new.py").write_text(model_new if model_new is not None else relu_new())
    if build:
        res = GxxCompiler(GxxCompiler.Options()).build(Path(ws.root))
        assert res.ok, res.errors or res.log
    return ws
