"""The paper's reward functions: milestone (-1/1/2/3) and raw speedup against compile."""

from __future__ import annotations

from dataclasses import dataclass

from cuda_agent.core.interfaces import RewardFunction
from cuda_agent.core.types import CandidateOutcome, FailureCategory, RewardResult

from .speedup import faster


def _raw(outcome: CandidateOutcome) -> dict:
    raw: dict = {"failure": outcome.failure.value}
    c, v, p = outcome.compile, outcome.verify, outcome.profile
    if c is not None:
        raw["compile_seconds"] = c.seconds
        raw["compile_cached"] = c.cached
        if c.errors:
            raw["compile_errors"] = c.errors[:5]
    if v is not None:
        raw["verify_message"] = v.message
        raw["verify_seconds"] = v.seconds
        if not v.ok and v.metadata.get("reason"):
            raw["job_failure"] = v.metadata["reason"]  # timeout, crash, cuda_error, oom, exception
        errs = [ch.max_abs_err for ch in v.checks if ch.max_abs_err is not None]
        if errs:
            raw["max_abs_err"] = max(errs)
        rels = [ch.max_rel_err for ch in v.checks if ch.max_rel_err is not None]
        if rels:
            raw["max_rel_err"] = max(rels)
    if p is not None:
        raw["profile_seconds"] = p.seconds
        if p.ok:  # a speedup measured on an unsteady host is marked, not believed silently
            raw["trusted"] = not (p.metadata or {}).get("unsteady")
            if not raw["trusted"]:
                raw["unsteady"] = str(p.metadata["unsteady"])[:300]
        for label, timing in (("candidate", p.candidate), ("eager", p.eager), ("compile", p.compile)):
            if timing is not None:
                raw[f"t_{label}_ms"] = timing.median_ms
                raw[f"spread_{label}"] = timing.spread
        raw["profile_metadata"] = {k: v for k, v in p.metadata.items() if k != "details"}
        if not p.ok:
            raw["profile_message"] = p.message
    return raw


def _speedups(outcome: CandidateOutcome) -> tuple[float | None, float | None]:
    p = outcome.profile
    if p is None or not p.ok:
        return None, None
    return p.speedup_vs_eager(), p.speedup_vs_compile()


@dataclass
class MilestoneOptions:
    margin: float = 0.05  # "faster" means more than this fraction lower time
    incorrect: float = -1.0
    correct: float = 1.0
    beats_eager: float = 2.0
    beats_compile: float = 3.0


class MilestoneReward(RewardFunction):
    name = "milestone"
    description = "-1 wrong or no build; 1 correct; 2 also >5% faster than eager; 3 also >5% faster than torch.compile."
    Options = MilestoneOptions

    def score(self, outcome: CandidateOutcome) -> RewardResult:
        o = self.options
        s_eager, s_compile = _speedups(outcome)
        base = dict(reward=self.name, speedup_vs_eager=s_eager, speedup_vs_compile=s_compile, raw=_raw(outcome))
        if not outcome.correct:
            return RewardResult(value=o.incorrect, correct=False, failure=outcome.failure, **base)
        p = outcome.profile
        value = o.correct
        if p is not None and p.ok and p.candidate is not None:
            t = p.candidate.median_ms
            if p.eager is not None and faster(t, p.eager.median_ms, o.margin):
                value = o.beats_eager
                if p.compile is not None and faster(t, p.compile.median_ms, o.margin):
                    value = o.beats_compile
        return RewardResult(value=value, correct=True, failure=FailureCategory.NONE, **base)


@dataclass
class SpeedupOptions:
    incorrect: float = -1.0
    baseline: str = "compile"  # "compile" or "eager"
    cap: float = 0.0  # clip the speedup at this value (0: no cap)


class SpeedupReward(RewardFunction):
    name = "speedup"
    description = "Raw speedup t_baseline / t (torch.compile by default); -1 when wrong or not built."
    Options = SpeedupOptions

    def __init__(self, options=None):
        super().__init__(options)
        if self.options.baseline not in ("compile", "eager"):
            from cuda_agent.core.errors import ConfigError

            raise ConfigError(
                f"reward speedup: baseline must be 'compile' or 'eager', got {self.options.baseline!r}"
            )

    def score(self, outcome: CandidateOutcome) -> RewardResult:
        o = self.options
        s_eager, s_compile = _speedups(outcome)
        base = dict(reward=self.name, speedup_vs_eager=s_eager, speedup_vs_compile=s_compile, raw=_raw(outcome))
        if not outcome.correct:
            return RewardResult(value=o.incorrect, correct=False, failure=outcome.failure, **base)
        s = s_compile if o.baseline == "compile" else s_eager
        if s is None:
            # correct but not profiled: no speed information, count as parity
            s = 1.0
        if o.cap > 0:
            s = min(s, o.cap)
        return RewardResult(value=s, correct=True, failure=FailureCategory.NONE, **base)
