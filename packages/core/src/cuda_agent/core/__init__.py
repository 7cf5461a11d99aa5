"""cuda-agent core: shared types, hook specs, plugin manager, config, logs, CLI."""

from .errors import ConfigError, CudaAgentError, PluginError, TaskError
from .hookspecs import hookimpl
from .types import (
    Candidate,
    CandidateOutcome,
    CheckResult,
    CompileResult,
    FailureCategory,
    ProfileResult,
    RewardResult,
    Task,
    Timing,
    ToolCall,
    ToolResult,
    Trajectory,
    Turn,
    VerifyResult,
)

__version__ = "0.1.0"

__all__ = [
    "Candidate",
    "CandidateOutcome",
    "CheckResult",
    "CompileResult",
    "ConfigError",
    "CudaAgentError",
    "FailureCategory",
    "PluginError",
    "ProfileResult",
    "RewardResult",
    "Task",
    "TaskError",
    "Timing",
    "ToolCall",
    "ToolResult",
    "Trajectory",
    "Turn",
    "VerifyResult",
    "hookimpl",
]
