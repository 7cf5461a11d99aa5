"""Reward functions: the milestone ladder with the 5% rule, raw speedup, failures, raw numbers."""

from __future__ import annotations

import math

import pytest

from cuda_agent.core.errors import ConfigError
from cuda_agent.core.types import (
    CandidateOutcome,
    CheckResult,
    CompileResult,
    FailureCategory,
    ProfileResult,
    Timing,
    VerifyResult,
)
from cuda_agent.rewards import MilestoneReward, SpeedupReward, faster, geomean, improvement
from cuda_agent.rewards.functions import MilestoneOptions, SpeedupOptions


def outcome(t: float | None = 1.0, eager: float = 1.0, compile_: float = 1.0, **kw) -> CandidateOutcome:
    profile = None
    if t is not None:
        profile = ProfileResult(
            ok=True,
            candidate=Timing(median_ms=t, spread=0.01, iterations=100, method="cuda_events"),
            eager=Timing(median_ms=eager, spread=0.02, iterations=100),
            compile=Timing(median_ms=compile_, spread=0.03, iterations=100),
            metadata={"gpu": "H200", "precision": "fp32"},
        )
    return CandidateOutcome(
        compile=kw.get("compile", CompileResult(ok=True, seconds=1.5, cached=True)),
        verify=kw.get("verify", VerifyResult(ok=True, checks=[CheckResult("input 1", True, max_abs_err=1e-6,
                                                                           max_rel_err=2e-6)])),
        profile=kw.get("profile", profile),
    )


M = MilestoneReward()
S = SpeedupReward()


# --- the 5% rule --------------------------------------------------------------------------


@pytest.mark.parametrize("t0", [1.0, 0.1, 2.0, 0.01, 10.0, 100.0, 3e-3, 123.456])
def test_exactly_five_percent_is_not_faster(t0):
    assert not faster(t0 * 0.95, t0)
    assert faster(t0 * 0.9499, t0)
    assert not faster(t0 * 0.9501, t0)
    assert not faster(t0, t0)
    assert not faster(t0 * 1.2, t0)


def test_improvement_and_geomean():
    assert improvement(0.5, 1.0) == 0.5
    assert improvement(2.0, 1.0) == -1.0
    with pytest.raises(ValueError):
        improvement(1.0, 0.0)
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([2.0, None, -1.0, math.inf, 8.0]) == pytest.approx(4.0)
    assert geomean([]) is None


# --- milestone ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "t, eager, compile_, want",
    [
        (1.0, 1.0, 1.0, 1.0),  # correct, no faster
        (0.95, 1.0, 0.5, 1.0),  # exactly 5% faster than eager: not faster
        (0.9499, 1.0, 2.0, 3.0),  # just over 5% faster than both
        (0.9499, 1.0, 0.99, 2.0),  # faster than eager, within 5% of compile
        (0.95, 1.0, 1.0, 1.0),  # exactly 5% against both
        (0.5, 1.0, 0.5263157894736842, 2.0),  # exactly 5% faster than compile (0.5 = 0.95 * 0.526...)
        (0.1, 1.0, 0.2, 3.0),
        (2.0, 1.0, 0.5, 1.0),  # slower than both
        (0.5, 0.4, 10.0, 1.0),  # faster than compile but not eager: 3 needs eager too
    ],
)
def test_milestone_ladder(t, eager, compile_, want):
    r = M.score(outcome(t, eager, compile_))
    assert r.value == want
    assert r.correct and r.failure is FailureCategory.NONE
    assert r.speedup_vs_eager == pytest.approx(eager / t)
    assert r.speedup_vs_compile == pytest.approx(compile_ / t)


def test_milestone_compile_boundary_exact():
    # compile 1.0 ms, candidate 0.95 ms: exactly 5% -> 2 (faster than eager 2.0 ms) not 3
    assert M.score(outcome(0.95, 2.0, 1.0)).value == 2.0
    assert M.score(outcome(0.9499999, 2.0, 1.0)).value == 3.0


def test_milestone_custom_values_and_margin():
    r = MilestoneReward(MilestoneOptions(margin=0.0, beats_compile=10.0)).score(outcome(0.99, 1.0, 1.0))
    assert r.value == 10.0


def test_correct_but_not_profiled_earns_the_correct_milestone():
    r = M.score(outcome(None))
    assert r.value == 1.0 and r.correct and r.speedup_vs_compile is None
    assert S.score(outcome(None)).value == 1.0  # speedup: parity


# --- failures ------------------------------------------------------------------------------


def failures():
    bad_compile = CompileResult(ok=False, errors=["kernels/a.cu:3: error: expected ';'"], seconds=2.0)
    wrong = VerifyResult(ok=False, failure=FailureCategory.WRONG_RESULT, message="input 2 of 5 differs",
                         checks=[CheckResult("input 2", False, max_abs_err=0.31, max_rel_err=0.5, where="(12, 40)")])
    forbidden = VerifyResult(ok=False, failure=FailureCategory.FORBIDDEN_OP, message="torch.nn.functional.relu called")
    timeout = VerifyResult(ok=False, failure=FailureCategory.TIMEOUT, message="timed out after 60 s",
                           metadata={"reason": "timeout", "details": "long traceback"})
    crash = VerifyResult(ok=False, failure=FailureCategory.CRASH,
                         message="crashed: segmentation fault (signal 11)", metadata={"reason": "crash"})
    prof_fail = ProfileResult(ok=False, failure=FailureCategory.TIMEOUT, message="timed out after 300 s",
                              metadata={"reason": "timeout", "details": "x" * 100})
    return [
        ("compile", CandidateOutcome(compile=bad_compile), FailureCategory.COMPILE_ERROR),
        ("wrong", outcome(verify=wrong, profile=None), FailureCategory.WRONG_RESULT),
        ("forbidden", outcome(verify=forbidden, profile=None), FailureCategory.FORBIDDEN_OP),
        ("timeout", outcome(verify=timeout, profile=None), FailureCategory.TIMEOUT),
        ("crash", outcome(verify=crash, profile=None), FailureCategory.CRASH),
        ("profile-timeout", outcome(profile=prof_fail), FailureCategory.TIMEOUT),
        ("missing", CandidateOutcome(), FailureCategory.MISSING),
    ]


@pytest.mark.parametrize("name, out, category", failures(), ids=[f[0] for f in failures()])
def test_failures_score_minus_one_with_their_category(name, out, category):
    for fn in (M, S):
        r = fn.score(out)
        assert r.value == -1.0
        assert not r.correct
        assert r.failure is category
        assert r.raw["failure"] == category.value


def test_raw_numbers_are_kept():
    name, out, _ = failures()[1]
    r = M.score(out)
    assert r.raw["max_abs_err"] == 0.31 and r.raw["max_rel_err"] == 0.5
    assert r.raw["verify_message"] == "input 2 of 5 differs"
    r = M.score(failures()[0][1])
    assert r.raw["compile_errors"] == ["kernels/a.cu:3: error: expected ';'"]
    assert r.raw["compile_seconds"] == 2.0
    r = M.score(failures()[3][1])
    assert r.raw["job_failure"] == "timeout"
    r = M.score(failures()[5][1])
    assert r.raw["profile_message"] == "timed out after 300 s"
    assert "details" not in r.raw["profile_metadata"]  # long worker output stays out of reports

    r = S.score(outcome(0.5, 1.0, 0.8))
    raw = r.raw
    assert raw["t_candidate_ms"] == 0.5 and raw["t_eager_ms"] == 1.0 and raw["t_compile_ms"] == 0.8
    assert raw["spread_candidate"] == 0.01 and raw["spread_eager"] == 0.02 and raw["spread_compile"] == 0.03
    assert raw["profile_metadata"] == {"gpu": "H200", "precision": "fp32"}
    assert raw["compile_cached"] is True and raw["max_abs_err"] == 1e-6


# --- speedup -------------------------------------------------------------------------------------


def test_speedup_reward():
    r = S.score(outcome(0.5, 1.0, 0.8))
    assert r.value == pytest.approx(1.6) and r.reward == "speedup"
    r = SpeedupReward(SpeedupOptions(baseline="eager")).score(outcome(0.5, 1.0, 0.8))
    assert r.value == pytest.approx(2.0)
    r = SpeedupReward(SpeedupOptions(cap=1.5)).score(outcome(0.1, 1.0, 1.0))
    assert r.value == 1.5
    r = SpeedupReward(SpeedupOptions(incorrect=-2.0)).score(failures()[1][1])
    assert r.value == -2.0
    # slower than compile is a speedup below one, not a penalty
    assert S.score(outcome(2.0, 1.0, 1.0)).value == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="baseline"):
        SpeedupReward(SpeedupOptions(baseline="cudnn"))


def test_rewards_are_plugins_chosen_in_config():
    from cuda_agent.core.config import compose
    from cuda_agent.core.plugins import get_plugin_manager

    pm = get_plugin_manager()
    assert pm.get("reward", "milestone") is MilestoneReward
    assert pm.get("reward", "speedup") is SpeedupReward
    cfg = compose([], ["reward.name=speedup", "reward.options.cap=4.0"])
    r = pm.create("reward", cfg.reward)
    assert isinstance(r, SpeedupReward) and r.options.cap == 4.0
    assert compose([]).reward.name == "milestone"
    with pytest.raises(ConfigError):
        compose([], ["reward.name=milestones"])
