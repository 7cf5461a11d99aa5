"""Data types shared by every package. Plain dataclasses, JSON round-trippable, no torch."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, enums, tuples and paths turned into JSON-ready values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "__fspath__"):
        return str(obj)
    return obj


class FailureCategory(str, enum.Enum):
    """Why a candidate earned no positive reward."""

    NONE = "none"
    COMPILE_ERROR = "compile_error"
    WRONG_RESULT = "wrong_result"
    FORBIDDEN_OP = "forbidden_op"
    TIMEOUT = "timeout"
    CRASH = "crash"
    MISSING = "missing"  # no candidate produced at all
    # the infrastructure failed (policy endpoint down after its retries): no result at all,
    # neither scored nor rewarded, and redone when the run is resumed
    INFRA_ERROR = "infra_error"


INFRA_ERROR = FailureCategory.INFRA_ERROR.value  # also the finish_reason of such an episode


# --- tasks -----------------------------------------------------------------------


@dataclass
class Task:
    """A PyTorch program to accelerate, in KernelBench format (Model, get_inputs, get_init_inputs)."""

    id: str
    source: str  # dataset plugin or origin, e.g. "kernelbench", "ops6k", "torch#1"
    code: str  # full text of model.py
    name: str = ""
    level: int | None = None
    category: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return to_jsonable(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Task":
        return cls(**{k: d[k] for k in d if k in {f.name for f in dataclasses.fields(cls)}})


# --- build, verify, profile, reward ----------------------------------------------


@dataclass
class CompileResult:
    ok: bool
    artifact: str | None = None  # path of the built library / extension
    errors: list[str] = field(default_factory=list)  # trimmed first errors, "file:line: message"
    log: str = ""  # tail of the full log
    seconds: float = 0.0
    cached: bool = False
    rebuilt_units: list[str] = field(default_factory=list)


@dataclass
class CheckResult:
    """One correctness check (one input draw, or one static rule)."""

    name: str
    passed: bool
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    where: str = ""  # e.g. "output[0] at index (3, 17)"
    message: str = ""


@dataclass
class VerifyResult:
    ok: bool
    failure: FailureCategory = FailureCategory.NONE
    message: str = ""
    checks: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)  # dtypes, precision flags, device


@dataclass
class Timing:
    """A timing of one callable: median and spread over ``iterations``."""

    median_ms: float
    spread: float = 0.0  # relative (IQR / median)
    iterations: int = 0
    method: str = ""
    samples_ms: list[float] = field(default_factory=list)
    attempts: int = 1  # measurements made; more than one when a noisy one was repeated
    mode_reason: str = ""  # why a task's timings switched to the profiler's steadier mode
    warmup_ms: float = 0.0  # how long the profiler warmed up before timing (0: not recorded)


@dataclass
class ProfileResult:
    ok: bool
    candidate: Timing | None = None
    eager: Timing | None = None
    compile: Timing | None = None
    failure: FailureCategory = FailureCategory.NONE
    message: str = ""
    seconds: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)  # gpu, torch version, precision policy

    def speedup_vs_eager(self) -> float | None:
        if self.candidate and self.eager and self.candidate.median_ms > 0:
            return self.eager.median_ms / self.candidate.median_ms
        return None

    def speedup_vs_compile(self) -> float | None:
        if self.candidate and self.compile and self.candidate.median_ms > 0:
            return self.compile.median_ms / self.candidate.median_ms
        return None


@dataclass
class CandidateOutcome:
    """Everything known about one candidate solution: what a reward function scores."""

    compile: CompileResult | None = None
    verify: VerifyResult | None = None
    profile: ProfileResult | None = None

    @property
    def failure(self) -> FailureCategory:
        if self.compile is not None and not self.compile.ok:
            return FailureCategory.COMPILE_ERROR
        if self.verify is None:
            return FailureCategory.MISSING
        if not self.verify.ok:
            return self.verify.failure
        if self.profile is not None and not self.profile.ok:
            return self.profile.failure
        return FailureCategory.NONE

    @property
    def correct(self) -> bool:
        return self.failure is FailureCategory.NONE and self.verify is not None and self.verify.ok


@dataclass
class RewardResult:
    value: float
    reward: str  # name of the reward function
    correct: bool = False
    failure: FailureCategory = FailureCategory.NONE
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    raw: dict[str, Any] = field(default_factory=dict)  # times, spreads, errors for reports


# --- agent trajectories -----------------------------------------------------------


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_arguments: str = ""  # exactly as the model produced them
    error: str | None = None  # set when the call could not be parsed


@dataclass
class ToolResult:
    call_id: str
    name: str
    content: str
    ok: bool = True
    truncated: bool = False
    seconds: float = 0.0


@dataclass
class Turn:
    index: int
    assistant: str = ""  # text the model wrote this turn (reasoning + answer)
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)
    response_span: tuple[int, int] | None = None  # [start, end) in Trajectory.response_ids
    seconds: float = 0.0


@dataclass
class Candidate:
    """A solution the agent verified during its episode."""

    turn: int
    files: dict[str, str]  # relative path -> text (model_new.py, kernels/*)
    outcome: CandidateOutcome
    reward: RewardResult | None = None

    @property
    def speedup_vs_compile(self) -> float | None:
        p = self.outcome.profile
        return p.speedup_vs_compile() if p else None


@dataclass
class Trajectory:
    """One episode, token-exact when the policy is token-level.

    ``response_ids`` holds every token after the prompt: model tokens (loss mask 1) and
    tool-output tokens (loss mask 0). ``rollout_logprobs`` aligns with ``response_ids``
    (0.0 at masked positions).
    """

    id: str
    task_id: str
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    best: Candidate | None = None
    reward: RewardResult | None = None
    finish_reason: str = ""  # "done", "max_turns", "context", "no_tool_call", "error", "infra_error"
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def infra_error(self) -> bool:
        """The episode ended because the infrastructure failed, not the model: not a result."""
        return self.finish_reason == INFRA_ERROR

    def to_dict(self) -> dict:
        return to_jsonable(self)
