import pytest

from cuda_agent.core.types import (
    CandidateOutcome,
    CompileResult,
    FailureCategory,
    ProfileResult,
    Timing,
    VerifyResult,
)
from cuda_agent.evaluation.metrics import (
    TaskResult,
    best_result,
    compute_metrics,
    group_metrics,
    histogram,
    is_faster,
    result_from_outcome,
)


def ok(task_id, level, t, t_eager, t_compile):
    return TaskResult(
        task_id=task_id,
        level=level,
        correct=True,
        failure="none",
        t_candidate_ms=t,
        t_eager_ms=t_eager,
        t_compile_ms=t_compile,
        speedup_vs_eager=t_eager / t,
        speedup_vs_compile=t_compile / t,
    )


def bad(task_id, level, failure):
    return TaskResult(task_id=task_id, level=level, correct=False, failure=failure)


def test_margin_versus_strict():
    # 3% faster: strictly faster, not faster with the 5% margin
    r = ok("a", 1, 0.97, 1.0, 1.0)
    assert is_faster(r, "eager", 0.0)
    assert not is_faster(r, "eager", 0.05)
    # just under 5% less time is not "more than 5%"
    r = ok("b", 1, 0.951, 1.0, 1.0)
    assert not is_faster(r, "compile", 0.05)
    r = ok("c", 1, 0.949, 1.0, 1.0)
    assert is_faster(r, "compile", 0.05)
    # equal time is not strictly faster
    assert not is_faster(ok("d", 1, 1.0, 1.0, 1.0), "eager", 0.0)
    # incorrect solutions are never faster, whatever their numbers
    r = ok("e", 1, 0.1, 1.0, 1.0)
    r.correct = False
    assert not is_faster(r, "eager", 0.0)


def test_faster_from_speedup_only():
    r = TaskResult("x", correct=True, failure="none", speedup_vs_compile=1.04, speedup_vs_eager=1.06)
    # 1 - 1/1.04 = 0.0385 < 0.05; 1 - 1/1.06 = 0.0566 > 0.05
    assert not is_faster(r, "compile", 0.05)
    assert is_faster(r, "compile", 0.0)
    assert is_faster(r, "eager", 0.05)


def test_group_metrics_hand_computed():
    results = [
        ok("1", 1, 1.0, 2.0, 4.0),  # 2x eager, 4x compile
        ok("2", 1, 1.0, 0.5, 1.02),  # 0.5x eager, 1.02x compile (strict only)
        ok("3", 1, 1.0, 1.1, 0.5),  # 1.1x eager, 0.5x compile
        bad("4", 1, "compile_error"),
        bad("5", 1, "wrong_result"),
    ]
    m = group_metrics(results)
    assert m["n"] == 5 and m["n_correct"] == 3
    assert m["pass_rate"] == pytest.approx(0.6)
    # shares are over all tasks of the group
    assert m["n_faster_eager"] == 2 and m["faster_eager"] == pytest.approx(0.4)
    assert m["n_faster_eager_strict"] == 2
    assert m["n_faster_compile"] == 1 and m["faster_compile"] == pytest.approx(0.2)
    assert m["n_faster_compile_strict"] == 2 and m["faster_compile_strict"] == pytest.approx(0.4)
    # geometric means over the correct solutions only
    assert m["geomean_vs_eager"] == pytest.approx((2.0 * 0.5 * 1.1) ** (1 / 3))
    assert m["geomean_vs_compile"] == pytest.approx((4.0 * 1.02 * 0.5) ** (1 / 3))
    assert m["failures"]["compile_error"] == 1
    assert m["failures"]["wrong_result"] == 1
    assert m["failures"]["forbidden_op"] == 0
    assert m["speedup_vs_compile_quantiles"]["median"] == pytest.approx(1.02)


def test_per_level_and_overall():
    results = [
        ok("a", 1, 1.0, 3.0, 3.0),
        bad("b", 1, "timeout"),
        ok("c", 2, 2.0, 1.0, 1.0),
        ok("d", 3, 1.0, 1.0, 8.0),
        bad("e", 3, "forbidden_op"),
        bad("f", None, "crash"),
    ]
    m = compute_metrics(results)
    assert list(m) == ["L1", "L2", "L3", "other", "overall"]
    assert m["L1"]["pass_rate"] == 0.5
    assert m["L2"]["geomean_vs_compile"] == pytest.approx(0.5)
    assert m["L3"]["geomean_vs_compile"] == pytest.approx(8.0)
    assert m["other"]["n"] == 1 and m["other"]["pass_rate"] == 0
    o = m["overall"]
    assert o["n"] == 6 and o["n_correct"] == 3
    assert o["geomean_vs_compile"] == pytest.approx((3.0 * 0.5 * 8.0) ** (1 / 3))
    assert o["n_faster_compile"] == 2
    assert o["failures"] == {
        "compile_error": 0,
        "wrong_result": 0,
        "forbidden_op": 1,
        "timeout": 1,
        "crash": 1,
        "missing": 0,
    }


def test_empty_group_has_no_rates():
    m = group_metrics([bad("a", 1, "compile_error")])
    assert m["pass_rate"] == 0 and m["geomean_vs_compile"] is None
    assert group_metrics([])["pass_rate"] is None


def test_best_result_picks_fastest_correct():
    a = ok("t", 1, 1.0, 1.0, 1.5)
    b = ok("t", 1, 1.0, 1.0, 2.5)
    c = bad("t", 1, "wrong_result")
    best = best_result([a, c, b])
    assert best.speedup_vs_compile == 2.5 and best.correct
    assert best.candidates == 3
    none_ok = best_result([bad("t", 1, "compile_error"), bad("t", 1, "timeout")])
    assert not none_ok.correct and none_ok.failure == "timeout"


def test_histogram_bins():
    h = histogram([0.1, 0.9, 1.0, 1.04, 3.0, 100.0])
    counts = {(b["lo"], b["hi"]): b["count"] for b in h}
    assert counts[(0.0, 0.5)] == 1
    assert counts[(0.8, 0.95)] == 1
    assert counts[(0.95, 1.05)] == 2
    assert counts[(2.0, 4.0)] == 1
    assert counts[(4.0, None)] == 1
    assert sum(b["count"] for b in h) == 6


def test_result_from_outcome():
    t = lambda ms: Timing(median_ms=ms)  # noqa: E731
    good = CandidateOutcome(
        compile=CompileResult(ok=True),
        verify=VerifyResult(ok=True),
        profile=ProfileResult(ok=True, candidate=t(2.0), eager=t(4.0), compile=t(3.0), metadata={"gpu": "X"}),
    )
    r = result_from_outcome("L1/1", good, level=1)
    assert r.correct and r.failure == "none"
    assert r.speedup_vs_eager == 2.0 and r.speedup_vs_compile == 1.5
    assert r.metadata["profile"]["gpu"] == "X"
    broken = CandidateOutcome(compile=CompileResult(ok=False, errors=["k.cu:3: error: oops"]))
    r = result_from_outcome("L1/2", broken)
    assert not r.correct and r.failure == "compile_error" and "oops" in r.message
    wrong = CandidateOutcome(
        compile=CompileResult(ok=True),
        verify=VerifyResult(ok=False, failure=FailureCategory.FORBIDDEN_OP, message="torch.matmul used"),
    )
    r = result_from_outcome("L1/3", wrong)
    assert r.failure == "forbidden_op" and r.message == "torch.matmul used"
    assert r.level is None and TaskResult.from_dict(r.to_dict()).to_dict()["level"] is None  # "L1/3" names no level
