"""Verification on the CPU backend with real g++-built kernels."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from cuda_agent.core.types import FailureCategory  # noqa: E402
from cuda_agent.sandbox.judge.op_guard import ForbiddenOpError, GuardOptions, forward_guard  # noqa: E402
from cuda_agent.sandbox.judge.inputs import draw_inputs  # noqa: E402
from cuda_agent.sandbox.judge.jobs import VerifyOptions, verify_file, verify_workspace  # noqa: E402
from cuda_agent.sandbox.judge.comparison import compare_outputs  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_verify_support import LINEAR_NEW, LINEAR_TASK, make_workspace, relu_new  # noqa: E402


@pytest.fixture(scope="module")
def relu_ws(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("relu"))


@pytest.fixture(scope="module")
def linear_ws(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("linear"), task_code=LINEAR_TASK, model_new=LINEAR_NEW.replace("{name}", "fc"))


def run(ws, model_new: str | None = None, **opts):
    if model_new is not None:
        p = Path(ws.root) / "model_new.py"
        p.write_text(model_new)
    opts.setdefault("seed", 3)
    return verify_workspace(str(ws.root), "cpu", VerifyOptions(**opts))


def test_correct_candidate_passes_and_records_metadata(relu_ws):
    r = run(relu_ws, relu_new("relu"))
    assert r.ok, r.message
    assert r.failure is FailureCategory.NONE
    runs = [c for c in r.checks if c.name.startswith("input[")]
    assert len(runs) == 5 and all(c.passed for c in runs)
    assert len({c.name for c in runs}) == 5  # five different seeds
    assert r.metadata["inputs"] == [{"shape": [64, 33], "dtype": "float32"}]
    assert r.metadata["outputs"] == {"shape": [64, 33], "dtype": "float32"}
    assert r.metadata["precision_policy"] == "fp32-strict"
    assert "precision_flags" in r.metadata
    phases = r.metadata["phase_seconds"]  # where the job's time went
    assert {"static_checks", "load", "inputs", "reference", "candidate", "compare"} <= set(phases)
    assert all(v >= 0 for v in phases.values()) and sum(phases.values()) <= r.seconds + 1e-3
    json.dumps(r.metadata)  # JSON-ready


def test_wrong_values_fail(relu_ws):
    r = run(relu_ws, relu_new("relu_off"))
    assert not r.ok and r.failure is FailureCategory.WRONG_RESULT
    assert "index" in r.message and "atol=0.01" in r.message


def test_tolerance_is_configurable(relu_ws):
    r = run(relu_ws, relu_new("relu_off"), atol=1.0, rtol=0.0)
    assert r.ok, r.message


def test_nan_where_reference_has_none_fails(relu_ws):
    r = run(relu_ws, relu_new("relu_nan"))
    assert not r.ok and r.failure is FailureCategory.WRONG_RESULT
    assert "NaN" in r.message


def test_unwritten_output_shows_as_nan(relu_ws):
    r = run(relu_ws, relu_new("relu_half"))
    assert not r.ok and r.failure is FailureCategory.WRONG_RESULT
    assert "got nan" in r.message


def test_output_structure_mismatch_fails(relu_ws):
    r = run(relu_ws, relu_new("relu", "(y,)"))
    assert not r.ok and r.failure is FailureCategory.WRONG_RESULT
    assert "expected a tensor" in r.message


@pytest.mark.parametrize(
    "ret,op,rule",
    [
        ("y.relu()", "torch.Tensor.relu", "runtime.tensor-method"),
        ("torch.nn.functional.relu(y)", "torch.nn.functional.relu", "runtime.functional"),
        ("torch.matmul(y, y.t())", "torch.matmul", "runtime.torch-function"),
        ("y + 0", "torch.Tensor.add", "runtime.tensor-method"),
        ("y.t().contiguous()", "torch.Tensor.contiguous", "runtime.tensor-method"),
    ],
)
def test_forbidden_ops_are_refused_naming_the_rule(relu_ws, ret, op, rule):
    r = run(relu_ws, relu_new("relu", ret))
    assert not r.ok and r.failure is FailureCategory.FORBIDDEN_OP, r.message
    assert op in r.message and rule in r.message


def test_views_and_creation_are_allowed(relu_ws):
    r = run(relu_ws, relu_new("relu", "y.view(-1).view(y.shape)[:, :].reshape(y.size(0), y.size(1)).T.T"))
    assert r.ok, r.message


def test_state_dict_loaded_strictly(linear_ws):
    r = run(linear_ws, LINEAR_NEW.replace("{name}", "fc"))
    assert r.ok, r.message  # ModelNew's own random init differs: passing proves the load
    bad = run(linear_ws, LINEAR_NEW.replace("{name}", "lin"))
    assert not bad.ok and bad.failure is FailureCategory.WRONG_RESULT
    assert "state_dict" in bad.message and "fc.weight" in bad.message


def test_fallback_cheat_is_refused_statically(relu_ws):
    cheat = relu_new("relu")
    assert "        kernels.relu(x, y, x.numel())\n" in cheat
    cheat = cheat.replace(
        "        kernels.relu(x, y, x.numel())\n",
        "        try:\n            kernels.relu(x, y, x.numel())\n        except Exception:\n"
        "            return torch.relu(x)\n",
    )
    r = run(relu_ws, cheat)
    assert not r.ok and r.failure is FailureCategory.FORBIDDEN_OP
    assert "static.fallback" in r.message and "model_new.py:" in r.message


def test_reference_model_call_is_refused(relu_ws):
    cheat = relu_new("relu").replace("from cuda_agent_runtime", "from model import Model\nfrom cuda_agent_runtime")
    r = run(relu_ws, cheat)
    assert not r.ok and r.failure is FailureCategory.FORBIDDEN_OP
    assert "static.reference-model" in r.message


def test_guard_records_swallowed_violations():
    x = torch.randn(4, 4)
    with forward_guard(GuardOptions()) as g:
        try:
            torch.matmul(x, x)
        except ForbiddenOpError:
            pass
    assert g.violations and g.violations[0].op == "torch.matmul"
    assert torch.relu(x).shape == x.shape  # the guard is gone afterwards


def test_guard_allowlist_is_configurable():
    x = torch.randn(4, 4)
    with forward_guard(GuardOptions(allow=["matmul", "aten.mm"])) as g:
        torch.matmul(x, x)
    assert not g.violations
    with forward_guard(GuardOptions(deny=["empty_like"])) as g:
        with pytest.raises(ForbiddenOpError):
            torch.empty_like(x)


def test_missing_build_is_a_compile_error(tmp_path):
    ws = make_workspace(tmp_path, build=False)
    r = verify_workspace(str(ws.root), "cpu", VerifyOptions(seed=1))
    assert not r.ok and r.failure is FailureCategory.COMPILE_ERROR


def test_crash_in_forward(relu_ws):
    r = run(relu_ws, relu_new("relu").replace("kernels.relu(x, y, x.numel())", "kernels.relu(x, y)"))
    assert not r.ok and r.failure is FailureCategory.CRASH
    assert "TypeError" in r.message


def test_python_level_timeout(relu_ws):
    r = run(relu_ws, relu_new("relu").replace("        y = torch.empty_like(x)\n", "        while True:\n            pass\n"),
            timeout_s=1.0, num_inputs=1)
    assert not r.ok and r.failure is FailureCategory.TIMEOUT


def test_fresh_seeds_when_none_given(relu_ws):
    (Path(relu_ws.root) / "model_new.py").write_text(relu_new("relu"))
    a = verify_workspace(str(relu_ws.root), "cpu", VerifyOptions(num_inputs=1))
    b = verify_workspace(str(relu_ws.root), "cpu", VerifyOptions(num_inputs=1))
    assert a.ok and b.ok and a.metadata["seed"] != b.metadata["seed"]


def test_single_file_candidate(relu_ws, tmp_path):
    # a single file builds its own kernel (as load_inline does) in the job's private temp folder;
    # it sees no file of the host's /tmp, only its own copy
    shutil.copy(Path(relu_ws.root) / "model.py", tmp_path / "ref.py")
    (tmp_path / "solution.py").write_text(textwrap.dedent('''
        import ctypes
        import os
        import subprocess
        import tempfile
        import torch
        import torch.nn as nn

        _SRC = r"""
        #include <cstdint>
        extern "C" void relu(const float* x, float* y, int64_t n) {
            for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
        }
        """
        _dir = tempfile.mkdtemp()
        with open(os.path.join(_dir, "k.cpp"), "w") as f:
            f.write(_SRC)
        subprocess.run(["g++", "-O2", "-shared", "-fPIC", os.path.join(_dir, "k.cpp"), "-o", os.path.join(_dir, "k.so")],
                       check=True)
        _lib = ctypes.CDLL(os.path.join(_dir, "k.so"))
        _lib.relu.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                _lib.relu(x.data_ptr(), y.data_ptr(), x.numel())
                return y
    '''))
    r = verify_file(str(tmp_path / "solution.py"), str(tmp_path / "ref.py"), "cpu", VerifyOptions(seed=2))
    assert r.ok, r.message


def test_inputs_never_zero_and_differ_per_seed():
    def get_inputs():
        return [torch.zeros(8, 8), torch.randn(8, 8), torch.randint(0, 5, (4,))]

    a = draw_inputs(get_inputs, 1)
    b = draw_inputs(get_inputs, 2)
    assert a.replaced_zeros == [0]
    assert bool(a.values[0].any()) and bool(b.values[0].any())
    assert not torch.equal(a.values[0], b.values[0]) and not torch.equal(a.values[1], b.values[1])
    again = draw_inputs(get_inputs, 1)
    assert torch.equal(a.values[1], again.values[1])  # a seed reproduces its draw


def test_compare_outputs_rules():
    ref = torch.tensor([1.0, float("nan"), float("inf")])
    assert compare_outputs(ref, ref.clone(), 1e-2, 1e-2).ok
    assert not compare_outputs(ref, torch.tensor([1.0, 0.0, float("inf")]), 1e-2, 1e-2).ok
    assert not compare_outputs(torch.ones(3), torch.tensor([1.0, float("inf"), 1.0]), 1e-2, 1e-2).ok
    assert not compare_outputs(torch.ones(3), torch.ones(3, dtype=torch.float64), 1e-2, 1e-2).ok
    assert compare_outputs([torch.ones(2), 3], [torch.ones(2) + 1e-3, 3], 1e-2, 1e-2).ok
    assert not compare_outputs([torch.ones(2)], [torch.ones(2), torch.ones(2)], 1e-2, 1e-2).ok


def test_finite_statistics_are_taken_in_chunks_without_an_index_tensor(monkeypatch):
    """The tolerance.vacuous rule's statistics of a reference (and the constant-output check)
    equal the masked-index way of taking them, across chunk boundaries, NaN and Inf included;
    and they make no temporary of the tensor's size (a 6.4 GB output asked for 24 GiB)."""
    from cuda_agent.sandbox.judge import comparison

    g = torch.Generator().manual_seed(3)
    t = torch.randn(7, 301, generator=g) * 1e-4
    t[0, 5], t[3, 7], t[6, 300] = float("nan"), float("inf"), -float("inf")
    monkeypatch.setattr(comparison, "CHUNK", 64)  # 33 chunks
    st = comparison.finite_stats(t, 1e-4)
    fin = t[torch.isfinite(t)]
    assert st.count == fin.numel() == t.numel() - 3
    assert (st.low, st.high) == (float(fin.min()), float(fin.max()))
    assert st.largest == float(fin.abs().max())
    assert st.above == int((fin.abs() > 1e-4).sum())
    scale = comparison.reference_scale(t, 1.0)
    assert scale == float(fin.abs().max())
    # a constant output where the reference is not is still refused, a scaled copy passes
    const = torch.where(torch.isfinite(t), torch.zeros_like(t), t)
    assert "constant" in compare_outputs(t, const, 1.0, 0.0).message
    assert compare_outputs(t, t * (1 + 1e-7), 1.0, 0.0).ok

    seen = []
    real_where = torch.where

    def where(*a, **k):
        out = real_where(*a, **k)
        seen.append(out.numel())
        return out

    monkeypatch.setattr(torch, "where", where)
    comparison.finite_stats(t)
    assert seen and max(seen) <= 64


def test_one_job_that_verifies_then_profiles_times_the_candidate_with_the_references_weights(linear_ws, tmp_path):
    # verification gives ModelNew the weights of a Model built after its own seed; profiling
    # compares timed outputs with a Model built after the baseline seed, so the candidate is
    # built again with those weights first (else every model with parameters failed the spot check)
    from cuda_agent.sandbox.judge.tasks import evaluate

    (Path(linear_ws.root) / "model_new.py").write_text(LINEAR_NEW.replace("{name}", "fc"))
    v, p = evaluate(str(linear_ws.root), "cpu", {"num_inputs": 1, "extra_draws": []},
                    {"num_input_sets": 1, "attempts": 1, "compile_baseline": False, "hopeless_factor": 0,
                     "baseline_cache_dir": str(tmp_path / "baselines")})
    assert v.ok, v.message
    assert p is not None and p.ok, p.message
    assert p.metadata["spot_check"] == "passed"
    # both sides recorded the settings they timed under, and they agree
    base, cand = p.metadata["baseline_flags"], p.metadata["candidate_flags"]
    assert base["cudnn_allow_tf32"] is False and cand["cudnn_allow_tf32"] is False
    assert base["grad_enabled"] is False and cand["grad_enabled"] is False
    assert base["deterministic_algorithms"] is False and cand["deterministic_algorithms"] is False
    assert "env:CUDA_DEVICE_MAX_CONNECTIONS" in cand and base["torch_threads"] == cand["torch_threads"]
    assert "timing_flags_differ" not in p.metadata, p.metadata.get("timing_flags_differ")


def test_the_one_pass_comparison_agrees_with_the_full_walk(monkeypatch):
    """An output within the tolerance everywhere is accepted by a few passes without waiting
    on each chunk; its error figures equal the full walk's. Anything non-finite on either side
    (an Inf reference against a finite output included, whose tolerance is Inf too) is left to
    the full walk, which says where and why."""
    from cuda_agent.sandbox.judge import comparison

    monkeypatch.setattr(comparison, "CHUNK", 50)  # 9 chunks, the last one short
    g = torch.Generator().manual_seed(5)
    ref = torch.randn(13, 33, generator=g)
    out = ref + (torch.rand(13, 33, generator=g) - 0.5) * 1e-2
    fast = comparison.compare_tensors(ref, out, 1e-2, 1e-2, "output")
    walked = []
    monkeypatch.setattr(comparison, "_all_within", lambda *a: walked.append(1))
    slow = comparison.compare_tensors(ref, out, 1e-2, 1e-2, "output")
    assert walked and fast.ok and slow.ok
    assert (fast.max_abs_err, fast.max_rel_err) == (slow.max_abs_err, slow.max_rel_err) and fast.max_abs_err > 0
    monkeypatch.undo()
    monkeypatch.setattr(comparison, "CHUNK", 50)

    inf, nan = float("inf"), float("nan")
    cases = [  # (reference value, output value, accepted)
        (inf, 1.0, False), (1.0, inf, False), (inf, inf, True), (inf, -inf, False),
        (nan, nan, True), (nan, 1.0, False), (1.0, nan, False), (3e38, -3e38, False),
    ]
    for rv, ov, accepted in cases:
        r, o = ref.clone(), ref.clone()
        r[7, 20], o[7, 20] = rv, ov
        assert comparison._all_within(o.reshape(-1), r.reshape(-1), r.numel(), torch.float32, 1e-2, 1e-2) is None
        got = comparison.compare_tensors(r, o, 1e-2, 1e-2, "output")
        assert got.ok is accepted, (rv, ov, got.message)
        if not accepted:
            assert "(7, 20)" in got.message
    # a half-precision output is compared in float32, as the full walk compares it
    h = ref.half()
    assert comparison._all_within(h.reshape(-1), h.reshape(-1), h.numel(), torch.float32, 0.0, 0.0) == (0.0, 0.0, True)
    assert comparison.compare_tensors(h, h.clone(), 0.0, 0.0, "output").ok

    # the pass also says whether the tolerance can see the reference at all, as reference_scale
    # says; where it cannot (softmax over wide rows), the output is still compared at its scale
    tiny = torch.rand(13, 33, generator=g) * 1e-4
    for t, atol in ((ref, 1e-2), (ref, 10.0), (tiny, 1e-2), (tiny, 1e-5)):
        got = comparison._all_within(t.reshape(-1), t.reshape(-1), t.numel(), torch.float32, atol, 0.0)
        assert got is not None and got[2] is (comparison.reference_scale(t, atol) is None), (atol, got)
    assert "constant" in comparison.compare_tensors(tiny, torch.full_like(tiny, 5e-5), 1e-2, 1e-2, "output").message
    assert "own scale" in comparison.compare_tensors(tiny, tiny.flip(0), 1e-2, 1e-2, "output").message
    assert comparison.compare_tensors(tiny, tiny * (1 + 1e-4), 1e-2, 1e-2, "output").ok
