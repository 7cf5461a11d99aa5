"""Extra input draws in verification: inputs from get_inputs() may cover too little of the
input space (KernelBench 19_ReLU draws torch.rand: all positive), so verification also runs
the floating-point inputs from other distributions."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cuda_agent.core.errors import ConfigError  # noqa: E402
from cuda_agent.core.types import FailureCategory  # noqa: E402
from cuda_agent.sandbox.judge.jobs import VerifyOptions, verify_workspace  # noqa: E402
from cuda_agent.sandbox.judge.draws import all_finite, extra_draw_inputs, nudged  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_verify_support import make_workspace  # noqa: E402

POSITIVE_RELU_TASK = textwrap.dedent(
    '''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, x):
            return torch.relu(x)

    def get_inputs():
        return [torch.rand(64, 33)]  # all positive, as in KernelBench 19_ReLU

    def get_init_inputs():
        return []
    '''
)

LOG_TASK = textwrap.dedent(
    '''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, x):
            return torch.log(x)

    def get_inputs():
        return [torch.rand(64, 33) + 0.5]

    def get_init_inputs():
        return []
    '''
)

KERNELS = textwrap.dedent(
    r'''
    #include <cstdint>
    #include <cmath>
    extern "C" void relu(const float* x, float* y, int64_t n) {
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
    }
    extern "C" void copy(const float* x, float* y, int64_t n) {  // "ReLU" that trusts positive inputs
        for (int64_t i = 0; i < n; ++i) y[i] = x[i];
    }
    extern "C" void logf_(const float* x, float* y, int64_t n) {
        for (int64_t i = 0; i < n; ++i) y[i] = std::log(x[i]);
    }
    '''
)

CANDIDATE = textwrap.dedent(
    '''
    import torch
    import torch.nn as nn
    from cuda_agent_runtime import load_kernels

    kernels = load_kernels()

    class ModelNew(nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            kernels.{fn}(x, y, x.numel())
            return y
    '''
)


def candidate(fn: str) -> str:
    return CANDIDATE.replace("{fn}", fn)


@pytest.fixture(scope="module")
def relu_ws(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("posrelu"), task_code=POSITIVE_RELU_TASK, model_new=candidate("relu"),
                          kernels=KERNELS)


@pytest.fixture(scope="module")
def log_ws(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("log"), task_code=LOG_TASK, model_new=candidate("logf_"), kernels=KERNELS)


def verify(ws, fn: str, **opts):
    (Path(ws.root) / "model_new.py").write_text(candidate(fn))
    opts.setdefault("seed", 5)
    return verify_workspace(str(ws.root), "cpu", VerifyOptions(**opts))


def test_identity_relu_passed_the_get_inputs_draws_alone(relu_ws):
    r = verify(relu_ws, "copy", extra_draws=[])
    assert r.ok, r.message  # the hole: torch.rand inputs never reach ReLU's negative branch


def test_identity_relu_fails_on_an_extra_draw(relu_ws):
    r = verify(relu_ws, "copy")
    assert not r.ok and r.failure is FailureCategory.WRONG_RESULT
    assert r.message.startswith("wrong result on an extra input draw (standard normal):"), r.message
    runs = [c for c in r.checks if c.name.startswith("input[")]
    assert len(runs) == 5 and all(c.passed for c in runs)  # the five get_inputs() draws pass
    assert r.metadata["extra_draws"][0]["status"] == "failed"


def test_identity_relu_fails_on_the_wide_draw_alone(relu_ws):
    r = verify(relu_ws, "copy", extra_draws=["wide"])
    assert not r.ok and "extra input draw (uniform on [-8, 8], mixed signs)" in r.message


def test_correct_relu_passes_every_draw(relu_ws):
    r = verify(relu_ws, "relu")
    assert r.ok, r.message
    assert [e["status"] for e in r.metadata["extra_draws"]] == ["passed", "passed"]
    assert "2 extra draws" in r.message
    extra = [c for c in r.checks if c.name.startswith("extra[")]
    assert len(extra) == 2 and all(c.passed for c in extra)


def test_draws_outside_the_reference_domain_are_skipped(log_ws):
    r = verify(log_ws, "logf_")
    assert r.ok, r.message
    log = r.metadata["extra_draws"]
    assert [e["status"] for e in log] == ["skipped", "skipped"]
    assert all("not finite" in e["reason"] for e in log)
    assert "2 skipped" in r.message


def test_extra_draw_inputs_keep_shapes_dtypes_and_non_float_inputs():
    idx = torch.tensor([3, 1, 2])
    values = [torch.rand(4, 5), idx, 7, torch.rand(3, dtype=torch.float64), torch.rand(2, 3).t()]
    out, refilled = extra_draw_inputs(values, "normal", 11, "cpu")
    assert refilled == 3
    assert out[1] is idx and out[2] == 7
    for a, b in ((values[0], out[0]), (values[3], out[3]), (values[4], out[4])):
        assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
    assert bool((out[0] < 0).any()) and not bool((values[0] < 0).any())
    wide, _ = extra_draw_inputs(values, "wide", 11, "cpu")
    assert float(wide[0].abs().max()) > 1.5 and float(wide[0].abs().max()) <= 8.0
    again, _ = extra_draw_inputs(values, "normal", 11, "cpu")
    assert torch.equal(again[0], out[0])  # seeded


def test_nudge_keeps_signs_and_stays_within_a_few_ulps():
    x = torch.randn(1000)
    (y,) = nudged([x], 3)
    assert torch.equal(torch.sign(x), torch.sign(y)) and not torch.equal(x, y)
    assert float(((y - x).abs() / x.abs()).max()) <= 5 * torch.finfo(torch.float32).eps
    assert all_finite([y, 1.0, {"a": torch.ones(2)}]) and not all_finite((torch.tensor([float("nan")]),))


def test_unknown_draw_is_a_config_error():
    with pytest.raises(ConfigError, match="extra_draws"):
        VerifyOptions(extra_draws=["cauchy"])
