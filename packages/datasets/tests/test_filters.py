from __future__ import annotations

import dataclasses

import pytest
import torch

from cuda_agent.datasets.kernelbench import read_kernelbench
from cuda_agent.datasets.synthesis.filters import FilterOptions, check_candidate, init_filters, screen, stochastic_calls
from cuda_agent.datasets.synthesis.similarity import Decontaminator, structure_tokens

from datasets_testdata import model_code


def _state(**kw):
    kw = {"compile": False, "min_ms": 0.0, "max_ms": 1000.0} | kw
    return init_filters({"filters": dataclasses.asdict(FilterOptions(**kw))}, "cpu")


def _check(code, state=None, decon=None):
    """Every filter in this process: the static ones, then (when they pass) the run filters."""
    static = screen(code, decon)
    return check_candidate(code, state or _state()) if static["ok"] else static


def test_a_good_model_passes():
    code = model_code("self.lin = nn.Linear(16, 8)", "return torch.tanh(self.lin(x))")
    r = _check(code)
    assert r["ok"], r
    assert r["output_shapes"] == [[4, 8]] and r["eager_ms"] >= 0


@pytest.mark.parametrize(
    "init,forward,inputs,expected",
    [
        ("self.d = nn.Dropout(p=0.3)", "return self.d(x)", "[torch.rand(4, 16)]", "stochastic"),
        ("pass", "return x + torch.randn_like(x)", "[torch.rand(4, 16)]", "stochastic"),
        ("pass", "return torch.reshape(x, (5, 5, 5))", "[torch.rand(4, 16)]", "eager"),
        ("pass", "return torch.log(x - 2.0)", "[torch.rand(4, 16)]", "nonfinite"),
        ("self.calls = 0", "self.calls += 1\n        return x * self.calls", "[torch.rand(4, 16)]", "nondeterministic"),
        ("pass", "return torch.softmax(x, dim=1).sum(dim=1)", "[torch.rand(4, 16)]", "constant"),
        ("pass", "return x * 0.0 + 1.0", "[torch.rand(4, 16)]", "constant"),
        ("pass", "return torch.softmax(x, dim=1)", "[torch.rand(4, 4096)]", "indistinguishable"),
        ("pass", "return 'not a tensor'", "[torch.rand(4, 16)]", "eager"),
    ],
)
def test_filters_remove_bad_candidates(init, forward, inputs, expected):
    r = _check(model_code(init, forward, inputs))
    assert not r["ok"] and r["filter"] == expected, r


def test_invalid_and_time_window():
    assert _check("def f(:\n")["filter"] == "invalid"
    assert _check("import torch\n")["filter"] == "invalid"
    code = model_code("pass", "return torch.relu(x)")
    r = _check(code, _state(min_ms=500.0, max_ms=1000.0))
    assert r["filter"] == "time_window" and "outside [500, 1000] ms" in r["reason"]


def test_compile_filter():
    code = model_code("self.lin = nn.Linear(16, 8)", "return F.gelu(self.lin(x))")
    r = check_candidate(code, _state(compile=True, compile_backend="aot_eager"))
    assert r["ok"] and "compile_s" in r, r

    calls = []

    @torch._dynamo.register_backend
    def _failing_backend(gm, example_inputs):  # a compiler that cannot handle the graph
        calls.append(1)
        raise RuntimeError("backend cannot lower this graph")

    r = check_candidate(code, _state(compile=True, compile_backend="_failing_backend"))
    assert calls and not r["ok"] and r["filter"] == "compile", r


def test_stochastic_scan_ignores_inputs_and_p0():
    code = model_code("self.d = nn.Dropout(p=0)", "return self.d(x)")
    assert stochastic_calls(code) == []  # torch.rand in get_inputs is fine, p=0 dropout is the identity
    assert stochastic_calls(model_code("pass", "return torch.bernoulli(x)")) == ["bernoulli"]


def test_decontamination_against_kernelbench(kb_root):
    kb = read_kernelbench(kb_root)
    d = Decontaminator.from_codes([(t.id, t.code) for t in kb], 0.9)
    assert len(d.refs) == 250
    problem = next(t for t in kb if t.id == "L2/1_Conv2D_ReLU_BiasAdd")
    bad, m = d.is_contaminated(problem.code)
    assert bad and m.score == 1.0 and m.ref_id == problem.id
    # renaming every local name and changing the sizes does not hide a copy
    renamed = (problem.code.replace("in_channels", "cin").replace("out_channels", "cout")
               .replace("self.conv", "self.c0").replace("128", "64").replace('"""', "'''"))
    bad, m = d.is_contaminated(renamed)
    assert bad and m.ref_id == problem.id and m.score > 0.95
    novel = model_code(
        "pass",
        "y = torch.cumsum(x, dim=1)\n        y = torch.tril(torch.matmul(y, y.transpose(-2, -1)))\n"
        "        return torch.logsumexp(F.hardtanh(y, -0.5, 0.5), dim=-1)",
        "[torch.rand(8, 32, 16)]",
    )
    bad, m = d.is_contaminated(novel)
    assert not bad and m.score < 0.9
    # the static filters use the same references
    r = _check(problem.code.replace("batch_size = 128", "batch_size = 2").replace("height = width = 128", "height = width = 8"),
               decon=d)
    assert r["filter"] == "similar" and r["closest"] == problem.id


def test_structure_tokens_abstract_names():
    a = structure_tokens("import torch\nx = torch.relu(a1) * 3\n")
    b = structure_tokens("import torch\ny = torch.relu(zz) * 7\n")
    c = structure_tokens("import torch\ny = torch.sigmoid(zz) * 7\n")
    assert a == b and a != c and "API:relu" in a
